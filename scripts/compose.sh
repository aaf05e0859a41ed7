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
    # The output is read whole first: grep -q exiting early would kill the writer with
    # SIGPIPE, and pipefail would fail the test.
    out=$($cmd version 2>/dev/null || true)
    if grep -qE 'version v?2\.' <<<"$out"; then echo 2; else echo 1; fi
    exit 0
    ;;
esac

# The networks' address prefix (FLEET_NET_PREFIX in docker-compose.yml) for the commands
# that create networks: kept when set; else this project's own, when its networks exist;
# else the first of 10.213, 10.214, ... 10.254 that no other Docker network overlaps (a
# fixed subnet that another network on the host already holds fails `up` with "Pool
# overlaps with other one on this address space").
pick_prefix() {
    local project=${COMPOSE_PROJECT_NAME:-$(basename "$PWD")}
    docker network ls -q 2>/dev/null |
        xargs -r docker network inspect -f '{{.Name}} {{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null |
        python3 -c '
import ipaddress, re, sys
project = re.sub(r"[^a-z0-9_-]", "", sys.argv[1].lower())
nets = []
for line in sys.stdin:
    name, *subnets = line.split()
    for s in subnets:
        try:
            net = ipaddress.ip_network(s, strict=False)
        except ValueError:
            continue
        if name == project + "_front" and net.version == 4:
            a, b = str(net.network_address).split(".")[:2]
            print(a + "." + b)
            sys.exit(0)
        nets.append((name, net))
for second in range(213, 255):
    mine = [ipaddress.ip_network("10.%d.%d.0/24" % (second, third)) for third in (1, 2)]
    taken = [n for n, net in nets if any(net.version == 4 and net.overlaps(m) for m in mine)]
    if not taken:
        if second != 213:
            print("compose.sh: FLEET_NET_PREFIX=10.%d (10.213 overlaps another Docker network)" % second, file=sys.stderr)
        print("10.%d" % second)
        sys.exit(0)
sys.exit(1)
' "$project"
}
if [[ -z ${FLEET_NET_PREFIX:-} ]] && command -v python3 >/dev/null 2>&1 && command -v docker >/dev/null 2>&1; then
    for arg in "$@"; do
        case $arg in
        up | run | create)
            if prefix=$(pick_prefix); then export FLEET_NET_PREFIX=$prefix; fi
            break
            ;;
        esac
    done
fi

# shellcheck disable=SC2086 # "docker compose" is two words on purpose
exec $cmd "$@"
