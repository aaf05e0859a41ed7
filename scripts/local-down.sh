#!/usr/bin/env bash
# Stop the native stack started by scripts/local-up.sh: only the processes whose pid files
# .run/pids/ lists (and that are still the programs it started). TERM, up to 10 s, then
# KILL. Removes the pid files, .run/stack.json and .run/stack.env; keeps the logs and
# Redis' data. Whatever LOCAL_TOPOLOGY the stack has: it stops every data node and
# Sentinel that left a pid file.
set -euo pipefail

# shellcheck source=scripts/lib/local-stack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/local-stack.sh"

shopt -s nullglob
pid_files=("$PID_DIR"/*.pid)
if ((${#pid_files[@]} == 0)); then
    ls_log "native stack: nothing to stop (no pid files in .run/pids/)"
    rm -f "$STACK_JSON" "$STACK_ENV"
    exit 0
fi

ls_log "stopping the native stack"
# Known services in a safe order, then anything else that left a pid file.
known=" ${SERVICES[*]} prometheus ${ALL_REDIS_NODES[*]} ${ALL_SENTINELS[*]} "
others=()
for f in "${pid_files[@]}"; do
    n=$(basename "$f" .pid)
    [[ $known == *" $n "* ]] || others+=("$n")
done
ls_stop prometheus nginx static "${APPS[@]}"
if ((${#others[@]})); then
    ls_log "  left alone (not a service of local-up.sh): ${others[*]/%/.pid}"
fi
ls_stop "${ALL_SENTINELS[@]}" # before the data nodes: no failover while they stop
ls_stop toxiproxy "${ALL_REDIS_NODES[@]}"
rm -f "$STACK_JSON" "$STACK_ENV"
ls_log "native stack stopped (logs kept in .run/)"
