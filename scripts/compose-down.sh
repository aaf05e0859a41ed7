#!/usr/bin/env bash
# `make down`: stop the compose stack, whichever topology it runs (volumes are kept).
# The topology's overlay (docker-compose.<topology>.yml) is added to COMPOSE_FILE so that
# its services stop in dependency order, the apps before the Sentinels before the data
# nodes (as orphans, compose would kill them after it stopped `redis`). It is
# FLEET_TOPOLOGY (make down TOPOLOGY=sentinel|cluster) when set; else, when COMPOSE_FILE is
# not set either, the one the project's containers show (a sentinel1 or a
# redis-cluster-init container). --remove-orphans removes whatever else is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

topology=${FLEET_TOPOLOGY:-}
if [[ -z $topology && -z ${COMPOSE_FILE:-} ]] && command -v docker >/dev/null 2>&1; then
    # compose's project name: the directory's, lower case, only [a-z0-9_-]
    project=${COMPOSE_PROJECT_NAME:-$(basename "$PWD")}
    project=$(tr '[:upper:]' '[:lower:]' <<<"$project" | tr -cd 'a-z0-9_-')
    services=$(docker ps -a --filter "label=com.docker.compose.project=$project" \
        --format '{{.Label "com.docker.compose.service"}}' 2>/dev/null) || services=
    if grep -qx sentinel1 <<<"$services"; then
        topology=sentinel
    elif grep -qx redis-cluster-init <<<"$services"; then
        topology=cluster
    fi
fi
# shellcheck source=scripts/lib/compose-topology.sh
source scripts/lib/compose-topology.sh
compose_topology "${topology:-single}"
exec scripts/compose.sh down --remove-orphans "$@"
