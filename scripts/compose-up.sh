#!/usr/bin/env bash
# `make up`: build the app image, start the compose stack, then wait until every service
# is healthy (a service without a healthcheck: running). compose v2: `up -d --wait`.
# compose v1 has no --wait: poll `docker inspect`. The first healthcheck runs one interval
# (30 s, see docker-compose.yml) after a container starts, so this takes about 30 s.
#   COMPOSE_WAIT_TIMEOUT=180 (seconds)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

compose=scripts/compose.sh
version=$($compose --version)
timeout=${COMPOSE_WAIT_TIMEOUT:-180}

show_failure() {
    echo "" >&2
    echo "the compose stack is not healthy:" >&2
    $compose ps >&2 || true
    $compose logs --tail 40 >&2 || true
}

# app1..app4 share one image and one build section: build it once, here, rather than
# once per service (compose v1 would run the same build four times with `up --build`).
$compose build app1

if [[ $version == 2 ]]; then
    if ! $compose up -d --wait; then
        show_failure
        exit 1
    fi
else
    $compose up -d
    echo "waiting for every service's first healthcheck (about 30 s)"
    deadline=$((SECONDS + timeout))
    while :; do
        ids=$($compose ps -q)
        [[ -n $ids ]] || { echo "no containers are running" >&2; show_failure; exit 1; }
        pending=() failed=()
        for id in $ids; do
            # name, then the health status (or the plain state for a service without one)
            read -r name state < <(docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}-unchecked{{end}}' "$id")
            case $state in
            healthy | running-unchecked) ;;
            unhealthy | exited | dead) failed+=("${name#/}:$state") ;;
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
$compose ps
echo ""
echo "compose stack up: http://localhost:${NGINX_PORT:-8080}/api/   (make down to stop)"
