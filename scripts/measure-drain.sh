#!/usr/bin/env bash
# How fast an outage's journals drain: with the native stack up (make local-up), stops
# Redis, sends N requests (default 100 000) with keys never seen before (all validly
# signed, from 4096 addresses) so that every one is a local grant of its own key, starts
# Redis again and polls every app's /status (bin/drain, loadtest/cmd/drain) until every
# journal is empty and every breaker closed. Prints the time from Redis' first answer to that,
# and how often each breaker opened again meanwhile (a bounce).
#
#   scripts/measure-drain.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-100000}
# shellcheck source=scripts/lib/stack-json.sh
. scripts/lib/stack-json.sh
read_stack_json .run/stack.json
go build -o bin/flood ./loadtest/cmd/flood
go build -o bin/drain ./loadtest/cmd/drain
scripts/local-service.sh stop redis >/dev/null
sleep 2
bin/flood -n "$n" -valid 1
# shellcheck disable=SC1091
REDIS_PASSWORD=$(. .run/stack.env && echo "${REDIS_PASSWORD:-}")
export REDIS_PASSWORD
# drain starts its clock at Redis' first answer, while local-service.sh still polls for it.
admins=$(IFS=,; echo "${STACK_APP_ADMINS[*]}")
bin/drain -redis "$STACK_REDIS_ADDR" -admins "$admins" &
drain=$!
scripts/local-service.sh start redis >/dev/null
wait "$drain"
