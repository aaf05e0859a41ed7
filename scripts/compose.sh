#!/usr/bin/env bash
# Run compose with whichever CLI this machine has: `docker compose` (v2) when available,
# else `docker-compose` (v1, Debian's 1.29). COMPOSE="..." forces one.
#
#   scripts/compose.sh ARGS...     # e.g. scripts/compose.sh ps
#   scripts/compose.sh --which     # print the command; exit 1 if there is none
#   scripts/compose.sh --version   # 1 or 2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

detect() {
    if [[ -n ${COMPOSE:-} ]]; then
        echo "$COMPOSE"
    elif command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
        echo "docker compose"
    elif command -v docker-compose >/dev/null 2>&1; then
        echo "docker-compose"
    else
        return 1
    fi
}

if ! cmd=$(detect); then
    echo "no compose CLI found: install the compose v2 plugin, or Debian's v1:  apt-get install docker-compose" >&2
    exit 127
fi

case ${1:-} in
--which)
    echo "$cmd"
    exit 0
    ;;
--version)
    # v1 prints "docker-compose version 1.29.2, build unknown"; v2 "Docker Compose version v2.x"
    if $cmd version 2>/dev/null | grep -qE 'version v?2\.'; then echo 2; else echo 1; fi
    exit 0
    ;;
esac

# shellcheck disable=SC2086 # "docker compose" is two words on purpose
exec $cmd "$@"
