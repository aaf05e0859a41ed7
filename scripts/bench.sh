#!/usr/bin/env bash
# make bench: starts a fresh redis-server (no persistence) on a free port, runs
# loadtest/cmd/bench against it (ours beside the peers and the redis-benchmark ceiling,
# all in one run) and stops it. Writes bench-out/results.json and docs/BENCHMARKS.md.
#
#   scripts/bench.sh [flags for loadtest/cmd/bench]   (make bench BENCH_ARGS="-cell 5s")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/find-bin.sh
. scripts/lib/find-bin.sh
for bin in redis-server redis-cli redis-benchmark; do
    path=$(find_bin "$bin") || { echo "bench: $bin not found (apt-get install redis-server)" >&2; exit 1; }
    PATH=$PATH:$(dirname "$path")
done
export PATH
go build -o bin/bench ./loadtest/cmd/bench
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no \
    --logfile "$dir/redis.log" &
redis=$!
trap 'kill "$redis" 2>/dev/null; wait "$redis" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
done
bin/bench -redis "127.0.0.1:$port" "$@"
