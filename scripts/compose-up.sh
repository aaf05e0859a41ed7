#!/usr/bin/env bash
# `make up`: build the app image, start the compose stack, then wait until every service
# is healthy (a service without a healthcheck: running; a one-shot one without a
# healthcheck, such as redis-cluster-init: exited 0). compose v2: `up -d --wait`.
# compose v1 has no --wait: poll `docker inspect`. The first healthcheck runs one interval
# (30 s, see docker-compose.yml) after a container starts, so this takes about 30 s.
#   COMPOSE_WAIT_TIMEOUT=180 (seconds)
#   FLEET_TOPOLOGY=single (default; or sentinel, cluster: make up TOPOLOGY=...) adds
#     docker-compose.<topology>.yml to COMPOSE_FILE (docker-compose.yml unless set). With
#     sentinel it also waits until every Sentinel knows the replica and the other two.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

compose=scripts/compose.sh
topology=${FLEET_TOPOLOGY:-single}
# shellcheck source=scripts/lib/compose-topology.sh
source scripts/lib/compose-topology.sh
compose_topology "$topology"
version=$($compose --version)
timeout=${COMPOSE_WAIT_TIMEOUT:-180}

show_failure() {
    echo "" >&2
    echo "the compose stack is not healthy:" >&2
    $compose ps >&2 || true
    $compose logs --tail 40 >&2 || true
}

# no_registry runs a compose command that may pull images; when it fails because no
# registry answers (an air-gapped engine), it says in one line what to do about it.
no_registry() {
    local out rc=0
    out=$(mktemp)
    "$@" 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
    if ((rc != 0)) && grep -qiE 'no such host|registry-1\.docker\.io|failed to resolve source metadata|pull access denied|TLS handshake timeout|i/o timeout' "$out"; then
        echo "make up: no container registry is reachable to pull the images: run \`make offline-images\` once (local stand-ins, see scripts/offline-images.sh), then make up again" >&2
    fi
    rm -f "$out"
    return "$rc"
}

# app1..app4 share one image and one build section: build it once, here, rather than
# once per service (compose v1 would run the same build four times with `up --build`).
no_registry $compose build app1

if [[ $version == 2 ]]; then
    if ! no_registry $compose up -d --wait; then
        show_failure
        exit 1
    fi
else
    if ! no_registry $compose up -d; then
        show_failure
        exit 1
    fi
    echo "waiting for every service's first healthcheck (about 30 s)"
    deadline=$((SECONDS + timeout))
    while :; do
        ids=$($compose ps -q)
        [[ -n $ids ]] || { echo "no containers are running" >&2; show_failure; exit 1; }
        pending=() failed=()
        for id in $ids; do
            # name, then the health status (or the plain state for a service without one),
            # then the exit code
            read -r name state code < <(docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}-unchecked{{end}} {{.State.ExitCode}}' "$id")
            [[ ! ($state == exited-unchecked && $code == 0) ]] || state=completed # a one-shot service
            [[ $state != exited-unchecked ]] || state="exited($code)"
            case $state in
            healthy | running-unchecked | completed) ;;
            unhealthy | exited* | dead*) failed+=("${name#/}:$state") ;;
            *) pending+=("${name#/}:$state") ;;
            esac
        done
        if ((${#failed[@]})); then
            echo "failed: ${failed[*]}" >&2
            show_failure
            exit 1
        fi
        ((${#pending[@]})) || break
        if ((SECONDS >= deadline)); then
            echo "not healthy after ${timeout}s: ${pending[*]}" >&2
            show_failure
            exit 1
        fi
        sleep 2
    done
fi
# Sentinel: a failover needs every Sentinel to know the replica (from the master's INFO,
# which a Sentinel reads when it connects and then every 10 s) and the other Sentinels.
if [[ $topology == sentinel ]]; then
    echo "waiting for the Sentinels to know the replica and each other"
    deadline=$((SECONDS + timeout))
    declare -A sentinel_ids
    for s in sentinel1 sentinel2 sentinel3; do
        sentinel_ids[$s]=$($compose ps -q "$s")
    done
    while :; do
        waiting=()
        for s in sentinel1 sentinel2 sentinel3; do
            # master0:name=fleet,status=ok,address=...:6379,slaves=1,sentinels=3
            info=$(docker exec "${sentinel_ids[$s]}" redis-cli -p 26379 info sentinel 2>/dev/null | tr -d '\r') || true
            grep -qE '^master0:name=fleet,status=ok,.*,slaves=1,sentinels=3$' <<<"$info" || waiting+=("$s")
        done
        ((${#waiting[@]})) || break
        if ((SECONDS >= deadline)); then
            echo "not within ${timeout}s: ${waiting[*]} do not know the replica and two other Sentinels" >&2
            show_failure
            exit 1
        fi
        sleep 2
    done
fi
$compose ps
echo ""
what="compose stack up"
[[ $topology == single ]] || what+=" (topology $topology)"
echo "$what: http://localhost:${NGINX_PORT:-8080}/api/   (make down to stop)"
echo "the doors: http://localhost:${NGINX_PORT:-8080}/static/ (auth_request), localhost:${RLS_PORT:-8090} (Envoy's rate limit service, gRPC)"
