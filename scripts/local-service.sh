#!/usr/bin/env bash
# Start, stop or restart ONE service of a running native stack, with exactly the settings
# scripts/local-up.sh used (.run/stack.env), and keep .run/pids/ and .run/stack.json
# current. Meant for the chaos suite and for poking at the stack by hand:
#
#   scripts/local-service.sh status
#   scripts/local-service.sh stop app2             # TERM, 10 s, KILL
#   scripts/local-service.sh start app2            # after a crash or a kill -9
#   scripts/local-service.sh start redis --wipe    # Redis back WITHOUT its data
#   scripts/local-service.sh restart nginx
#   scripts/local-service.sh restart redis3 --wipe # (cluster topology)
#
# Services: redis toxiproxy app1 app2 app3 app4 nginx; with LOCAL_TOPOLOGY=sentinel also
# redis2 and sentinel1..sentinel3, with cluster redis2..redis6 (`status` lists them).
# `start` waits until the service is ready (LOCAL_READY_TIMEOUT, 30 s; a data node or
# Sentinel: answers PING, not yet back in its cluster or replicating) and exits non-zero,
# with the log's tail, if not. After a toxiproxy restart the proxies are created again.
# --wipe (any data node) starts it without its data; in the sentinel and cluster
# topologies it keeps the node's own config (its role as Sentinel last rewrote it; its
# cluster node id and slots). A former master that comes back after a failover is turned
# into a replica of the new one by the Sentinels (some seconds later) or the cluster.
set -euo pipefail

# shellcheck source=scripts/lib/local-stack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/local-stack.sh"

usage() {
    ls_log "usage: $0 status | start NAME [--wipe] | stop NAME | restart NAME [--wipe]"
    ls_log "NAME: ${SERVICES[*]}   (--wipe: ${REDIS_NODES[*]} only, start without its data)"
    exit 2
}

cd "$LS_ROOT"
[[ -f $STACK_ENV ]] || ls_die "no native stack is up (.run/stack.env missing): run make local-up"
ls_load_settings --saved
ls_require_tools

action=${1:-}
name=${2:-}
wipe=${3:-}

if [[ $action == status ]]; then
    for s in "${SERVICES[@]}"; do
        if pid=$(ls_service_pid "$s"); then
            if ls_probe "$s" >/dev/null 2>&1; then state=ready; else state="running, not ready"; fi
            printf '%-10s pid %-8s %s\n' "$s" "$pid" "$state"
        else
            printf '%-10s %s\n' "$s" "down"
        fi
    done
    exit 0
fi

[[ -n $name ]] || usage
[[ " ${SERVICES[*]} " == *" $name "* ]] || usage
[[ -z $wipe || ($wipe == --wipe && " ${REDIS_NODES[*]} " == *" $name "*) ]] || usage

do_stop() {
    ls_stop "$name"
    ls_write_stack_json
}

do_start() {
    if pid=$(ls_service_pid "$name"); then
        ls_die "$name is already running (pid $pid)"
    fi
    for p in $(ls_ports_of "$name"); do
        if ls_port_busy "$p"; then
            ls_die "$name: port $p is still in use"
        fi
    done
    ls_start "$name" "$wipe"
    if ! ls_wait_ready $((SECONDS + LOCAL_READY_TIMEOUT)) "$name"; then
        ls_print_log_tails "$name"
        exit 1
    fi
    if [[ $name == toxiproxy ]]; then
        ls_populate_proxies || ls_die "creating the toxiproxy proxies failed"
    fi
    ls_write_stack_json
}

case $action in
start) do_start ;;
stop) do_stop ;;
restart)
    do_stop
    do_start
    ;;
*) usage ;;
esac
