#!/usr/bin/env bash
# What abuse costs the native stack: sends N requests (default 1 000 000), each with a key
# never seen before (half validly signed, half forged), from 4096 loopback addresses,
# first with Redis up, then with Redis stopped (the apps decide locally and journal), and
# prints each app's resident memory and Go heap, and Redis' memory, before and after each
# flood. Needs a running native stack (make local-up) with its defaults; Redis is started
# again at the end and the journals drain.
#
#   scripts/measure-abuse.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-1000000}
# shellcheck source=scripts/lib/stack-json.sh
. scripts/lib/stack-json.sh
read_stack_json .run/stack.json

redis_mem() {
    local port=${STACK_REDIS_ADDR##*:} pass
    pass=$(sed -n 's/^REDIS_PASSWORD=//p' .run/stack.env)
    REDISCLI_AUTH=$pass redis-cli -p "$port" info memory 2>/dev/null | tr -d '\r' |
        awk -F: '$1 == "used_memory_human" || $1 == "used_memory_peak_human" { printf "%s=%s ", $1, $2 }'
    echo "keys=$(REDISCLI_AUTH=$pass redis-cli -p "$port" dbsize 2>/dev/null)"
}
sample() {
    echo "== $1"
    local i name pid admin rss heap journal
    for i in "${!STACK_APP_NAMES[@]}"; do
        name=${STACK_APP_NAMES[i]} pid=${STACK_APP_PIDS[i]} admin=${STACK_APP_ADMINS[i]}
        rss=$(awk '/^VmRSS/ { print $2 / 1024 " MiB" }' "/proc/$pid/status")
        heap=$(curl -fsS "$admin/metrics" | awk '$1 == "go_memstats_heap_inuse_bytes" { printf "%.0f MiB", $2 / 1048576 }')
        journal=$(curl -fsS "$admin/status" | python3 -c 'import json,sys; l=json.load(sys.stdin)["limiter"]; j=l["journal"]; print(l["keys"], "local keys, journal", j["pending"], "pending,", j["overflow"], "overflow")')
        echo "  $name: RSS $rss, heap in use $heap, $journal"
    done
    if [[ $1 != *outage* ]]; then echo "  redis: $(redis_mem)"; fi
}

go build -o bin/flood ./loadtest/cmd/flood
sample "before"
bin/flood -n "$n"
sample "after $n new keys, Redis up"
scripts/local-service.sh stop redis >/dev/null
sleep 2
bin/flood -n "$n"
sample "after $n new keys, Redis down (outage)"
scripts/local-service.sh start redis >/dev/null
sleep 10
sample "10 s after Redis is back"
