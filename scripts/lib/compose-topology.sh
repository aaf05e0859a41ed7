# shellcheck shell=bash
# Shared by scripts/compose-up.sh and scripts/compose-down.sh. Sourced, not executed.

# compose_topology TOPOLOGY: add the topology's overlay (docker-compose.<topology>.yml)
# to COMPOSE_FILE (docker-compose.yml unless set); single adds none. Exits 2 on an
# unknown one.
compose_topology() {
    case ${1:-single} in
    single) ;;
    sentinel | cluster)
        export COMPOSE_FILE=${COMPOSE_FILE:-docker-compose.yml}:docker-compose.$1.yml
        ;;
    *)
        echo "TOPOLOGY=$1: want single, sentinel or cluster" >&2
        exit 2
        ;;
    esac
}
