#!/usr/bin/env bash
# make bench: starts a fresh redis-server (no persistence) on a free port, runs
# loadtest/cmd/bench against it (ours beside the peers and the redis-benchmark ceiling,
# all in one run) and stops it. Writes bench-out/results.json and docs/BENCHMARKS.md.
# Beside it, a native stack on free ports (its own run dir) serves one route with the
# limiter and one without, and the doors (a static site behind auth_request, Envoy's rate
# limit service), for the stack/* rows; BENCH_STACK=0 leaves it out. And a native Redis
# Cluster of three masters on free ports, for the cluster/* rows (our GCRA on it beside the
# single Redis); BENCH_CLUSTER=0 leaves it out. BENCH_MEM_KEYS=10000000 sizes the memory/*
# rows (keys each row writes; default 200 000; 10 million take about 2.5 GB of Redis).
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
# The redis-servers this script started, stopped on exit (after the stack, if it started one).
redis_pids=()
stack_up=0
cleanup() {
    if [[ $stack_up == 1 ]]; then scripts/local-down.sh >/dev/null 2>&1 || true; fi
    local pid
    for pid in "${redis_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${redis_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
# start_redis NAME PORT [redis-server flags]: a redis-server without persistence on
# 127.0.0.1:PORT, its files in $dir/NAME; fails, with its log, unless it answers PING
# within 5 s.
start_redis() {
    local name=$1 port=$2
    shift 2
    mkdir -p "$dir/$name"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir/$name" \
        --daemonize no --logfile "$dir/$name/redis.log" "$@" &
    redis_pids+=($!)
    for _ in $(seq 1 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "bench: redis-server ($name) did not start on 127.0.0.1:$port; its log:" >&2
    cat "$dir/$name/redis.log" >&2 || true
    exit 1
}
start_redis redis "$port"

cluster_args=()
if [[ ${BENCH_CLUSTER:-1} == 1 ]]; then
    # Three masters without replicas, on free ports whose cluster bus ports (+10000) are
    # free too; the same node settings as the tests' (app/ratelimit/internal/redistest).
    read -r -a cports <<<"$(python3 -c '
import random, socket
found = []
while len(found) < 3:
    p = random.randrange(20000, 50000)
    socks = []
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); socks.append(s)
        if p not in found:
            found.append(p)
    except OSError:
        pass
    finally:
        for s in socks: s.close()
print(*found)
')"
    caddrs=()
    for p in "${cports[@]}"; do
        start_redis "cluster-$p" "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 2000
        caddrs+=("127.0.0.1:$p")
    done
    if ! redis-cli --cluster create "${caddrs[@]}" --cluster-yes >"$dir/cluster-create.log" 2>&1; then
        echo "bench: redis-cli --cluster create ${caddrs[*]} failed:" >&2
        cat "$dir/cluster-create.log" >&2
        exit 1
    fi
    for p in "${cports[@]}"; do
        for i in $(seq 1 200); do
            redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
            if [[ $i == 200 ]]; then
                echo "bench: the Cluster (${caddrs[*]}) is not ok after 20 s at 127.0.0.1:$p:" >&2
                redis-cli -p "$p" cluster info >&2 || true
                exit 1
            fi
            sleep 0.1
        done
    done
    cluster_args=(-cluster "$(IFS=,; echo "${caddrs[*]}")")
fi

stack_args=()
if [[ ${BENCH_STACK:-1} == 1 ]]; then
    # Ports: nginx base, Redis base+1, toxiproxy API base+2, apps base+3..6,
    # admin base+7..10, fault proxies base+11..14 (unused: the apps dial Redis), the
    # static site base+15, nginx's gRPC base+16, the apps' gRPC base+17..20.
    base=$(python3 -c '
import random, socket
for _ in range(200):
    b = random.randrange(20000, 60000)
    try:
        socks = []
        for p in range(b, b + 21):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(b); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
')
    cat >"$dir/policies.json" <<'JSON'
{"policies": [{"name": "bench", "algorithm": "gcra", "limit": 100000000, "window": "1s"},
              {"name": "bench-lease", "algorithm": "gcra", "limit": 100000000, "window": "1s", "lease": "50ms"}],
 "routes": [{"pattern": "/api/bench-on", "policies": ["bench"]},
            {"pattern": "/api/bench-lease", "policies": ["bench-lease"]},
            {"pattern": "/api/bench-off", "policies": []},
            {"pattern": "/api/*", "policies": ["bench"]}],
 "checks": [{"pattern": "/static/*", "policies": ["bench"]}]}
JSON
    mkdir -p "$dir/rls"
    cat >"$dir/rls/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: key
    rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: gcra}
YAML
    export LOCAL_RUN_DIR=$dir/stack LOCAL_POLICY_FILE=$dir/policies.json LOCAL_REDIS_DIRECT=1 \
        LOCAL_LOG_LEVEL=info LOCAL_PROMETHEUS=0 LOCAL_NGINX_PORT=$base LOCAL_REDIS_PORT=$((base + 1)) \
        LOCAL_PROXY_API_PORT=$((base + 2)) LOCAL_APP_PORT_BASE=$((base + 2)) \
        LOCAL_ADMIN_PORT_BASE=$((base + 6)) LOCAL_VIA_PORT_BASE=$((base + 10)) \
        LOCAL_STATIC_PORT=$((base + 15)) LOCAL_RLS_PORT=$((base + 16)) LOCAL_GRPC_PORT_BASE=$((base + 16)) \
        LOCAL_RLS_CONFIG_DIR=$dir/rls
    stack_up=1
    scripts/local-up.sh >"$dir/stack-up.log" 2>&1 || { cat "$dir/stack-up.log" >&2; exit 1; }
    # The stack's Redis asks for REDIS_PASSWORD, by default redis/redis.conf's (bin/localstack help).
    STACK_REDIS_PASSWORD=${REDIS_PASSWORD:-$(awk '$1 == "requirepass" { print $2; exit }' redis/redis.conf)}
    STACK_REDIS_PASSWORD=${STACK_REDIS_PASSWORD%\"}
    STACK_REDIS_PASSWORD=${STACK_REDIS_PASSWORD#\"}
    export STACK_REDIS_PASSWORD
    # The apps' pids, for their CPU per request.
    app_pids=$(cat "$dir"/stack/pids/app*.pid | paste -sd, -)
    stack_args=(-stack "http://127.0.0.1:$base" -stack-redis "127.0.0.1:$((base + 1))" -rls "127.0.0.1:$((base + 16))"
        -stack-pids "$app_pids")
fi
stamp=$dir/started
touch "$stamp"
mem_args=()
if [[ -n ${BENCH_MEM_KEYS:-} ]]; then mem_args=(-mem-keys "$BENCH_MEM_KEYS"); fi
bin/bench -redis "127.0.0.1:$port" "${stack_args[@]}" "${cluster_args[@]}" "${mem_args[@]}" "$@"

# Tracing off must cost the decision path nothing: the service's instrumented limiter with
# no tracing, with tracing off (what a deployment without OTEL_* runs), and on (sampled,
# unsampled), after the stack is down. Into bench-out/tracing.txt, and appended to
# docs/BENCHMARKS.md when this run wrote it.
wrote=0
if [[ docs/BENCHMARKS.md -nt $stamp ]]; then wrote=1; fi
cleanup
trap - EXIT
mkdir -p bench-out
(cd app && go test -run '^$' -bench BenchmarkDecisionTracing -benchmem -count 5 ./internal/service/) |
    grep '^Benchmark' >bench-out/tracing.txt
if ((wrote)); then
    {
        echo
        echo "## Tracing on the decision path"
        echo
        echo "The service's decision (in memory) with no tracing wrapper, with tracing off (no"
        echo "\`OTEL_*\` set: nothing installed), and on (sampled, unsampled); five runs each"
        echo "(\`go test -bench BenchmarkDecisionTracing -benchmem ./app/internal/service/\`):"
        echo
        echo '```'
        cat bench-out/tracing.txt
        echo '```'
    } >>docs/BENCHMARKS.md
fi
