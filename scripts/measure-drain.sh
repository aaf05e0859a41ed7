#!/usr/bin/env bash
# How fast an outage's journals drain: with the native stack up (make local-up), stops
# Redis, sends N requests (default 100 000) with keys never seen before (all validly
# signed, from 4096 addresses) so that every one is a local grant of its own key, starts
# Redis again and polls every app's /status until every journal is empty and every breaker
# closed. Prints the time from Redis answering to that, and how often each breaker opened
# meanwhile (a bounce would show as more than one opening).
#
#   scripts/measure-drain.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-100000}
[[ -f .run/stack.json ]] || { echo "measure-drain: no native stack (make local-up)" >&2; exit 1; }
admins=$(python3 -c 'import json; print(" ".join(a["admin_url"] for a in json.load(open(".run/stack.json"))["apps"]))')
apps=$(wc -w <<<"$admins")
state() { # "<pending> <breaker> <opens>" per app, space separated
    local a
    for a in $admins; do
        curl -fsS "$a/status" | python3 -c 'import json,sys; l=json.load(sys.stdin)["limiter"]; print(l["journal"]["pending"], l["breaker"], l["breaker_opens"], end=" ")'
    done
    echo
}
go build -o bin/flood ./loadtest/cmd/flood
scripts/local-service.sh stop redis >/dev/null
sleep 2
bin/flood -n "$n" -valid 1
echo "before Redis returns: $(state)"
scripts/local-service.sh start redis >/dev/null
start=$(date +%s%N)
while :; do
    s=$(state)
    if [[ $(grep -o '[0-9]* [a-z]*' <<<"$s" | grep -c '^0 closed$') == "$apps" ]]; then
        break
    fi
    if (($(date +%s%N) - start > 60000000000)); then
        echo "not drained after 60 s: $s"
        exit 1
    fi
    sleep 0.1
done
echo "drained and closed $((($(date +%s%N) - start) / 1000000)) ms after Redis was ready: $s"
