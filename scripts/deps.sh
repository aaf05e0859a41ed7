#!/usr/bin/env bash
# `make deps`: the system programs the tests and the native stack need.
#   redis-server, redis-cli  (Debian: redis-server)
#   nginx                    (Debian: nginx-light)
#   curl                     (make reload, make top, the stack test)
#   gcc + libc headers       (go test -race needs cgo)
#   promtool                 (Debian: prometheus; make test checks prometheus/rules.yml with
#                            it; the native stack also runs its prometheus when present)
# Missing ones are installed with apt-get when we are root and apt-get exists; otherwise
# this prints exactly what to install and exits 1.
set -euo pipefail

# shellcheck source=scripts/lib/find-bin.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/find-bin.sh"
have() { find_bin "$1" >/dev/null; }

pkgs=()
have redis-server || pkgs+=(redis-server)
have redis-cli || pkgs+=(redis-tools)
have nginx || pkgs+=(nginx-light)
have curl || pkgs+=(curl)
# cgo for -race: a compiler and the C library headers.
if ! have gcc || [[ ! -e /usr/include/stdlib.h ]]; then
    pkgs+=(gcc libc6-dev)
fi
# promtool comes with the server. The policy-rc.d below keeps the package's own service
# (a system Prometheus on :9090) from starting; the stacks run theirs on other ports.
have promtool || pkgs+=(prometheus)

if ((${#pkgs[@]} == 0)); then
    echo "deps: redis-server, redis-cli, nginx, curl, gcc and promtool are installed"
    exit 0
fi

# de-duplicate
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | awk '!seen[$0]++')

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: missing packages: ${pkgs[*]}" >&2
    echo "install them with:" >&2
    echo "  sudo apt-get install -y ${pkgs[*]}" >&2
    exit 1
fi

echo "deps: installing ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep the packages' init scripts from starting system-wide redis (6379) and nginx (80):
# the tests and stacks run their own instances on their own ports.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    added_policy=1
fi
cleanup() { if ((added_policy)); then rm -f "$policy"; fi; }
trap cleanup EXIT

apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
echo "deps: installed ${pkgs[*]}"
