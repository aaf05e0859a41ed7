#!/usr/bin/env bash
# Start the native stack (no Docker): Redis, toxiproxy (one proxy per app in front of
# Redis), four rate-limiter instances and nginx, all as the invoking user, everything
# under .run/. Waits until each is ready, then writes .run/stack.json.
#
#   scripts/local-up.sh                 # or: make local-up
#   LOCAL_POLICY_FILE=policies.json scripts/local-up.sh
#
# Settings: see scripts/lib/local-stack.sh. Stop with scripts/local-down.sh; restart one
# service of a running stack with scripts/local-service.sh.
set -euo pipefail

# shellcheck source=scripts/lib/local-stack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/local-stack.sh"

cd "$LS_ROOT"
ls_load_settings --env # (not --saved: a new stack takes the environment's settings)
ls_require_tools

# ---- already up? --------------------------------------------------------------------
running=()
for s in "${SERVICES[@]}"; do
    if ls_service_pid "$s" >/dev/null; then
        running+=("$s")
    fi
done
if ((${#running[@]} == ${#SERVICES[@]})) && [[ -f $STACK_JSON ]]; then
    ls_log "the native stack is already up (.run/stack.json); stop it first with: make local-down"
    cat "$STACK_JSON"
    exit 0
fi
if ((${#running[@]})); then
    ls_log "a partial native stack is running (${running[*]}): stopping it to start cleanly"
    ls_stop_all
fi
rm -f "$PID_DIR"/*.pid "$STACK_JSON" "$STACK_ENV"

# ---- ports free? --------------------------------------------------------------------
busy=()
for p in $(ls_all_ports); do
    if ls_port_busy "$p"; then
        busy+=("$p")
    fi
done
if ((${#busy[@]})); then
    ls_log "error: ports already in use on $LOCAL_HOST: ${busy[*]}"
    ls_log "(another stack or program holds them; the LOCAL_*_PORT settings in scripts/lib/local-stack.sh move ours)"
    if command -v ss >/dev/null 2>&1; then
        ss -ltnp 2>/dev/null | grep -E ":($(
            IFS='|'
            echo "${busy[*]}"
        ))\b" >&2 || true
    fi
    exit 1
fi

ls_build

# ---- start --------------------------------------------------------------------------
mkdir -p "$RUN_DIR" "$PID_DIR"
ls_save_settings

started=0
on_exit() {
    local rc=$?
    if ((rc != 0 && !started)); then
        ls_log ""
        ls_log "the native stack did not come up; stopping what was started"
        ls_print_log_tails ${LS_SPAWNED[@]+"${LS_SPAWNED[@]}"}
        ls_stop_all || true
        rm -f "$STACK_ENV" "$STACK_JSON"
    fi
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

deadline=$((SECONDS + LOCAL_READY_TIMEOUT))

ls_log "starting redis on $LOCAL_HOST:$LOCAL_REDIS_PORT"
ls_start redis
ls_wait_ready "$deadline" redis

ls_log "starting toxiproxy (API $LOCAL_HOST:$LOCAL_PROXY_API_PORT)"
ls_start toxiproxy
ls_wait_ready "$deadline" toxiproxy
ls_populate_proxies || ls_die "creating the toxiproxy proxies failed"
for a in "${APPS[@]}"; do
    ls_log "  proxy $a-redis: $LOCAL_HOST:$(ls_via_port "$a") -> $LOCAL_HOST:$LOCAL_REDIS_PORT"
done

ls_log "starting ${APPS[*]}"
for a in "${APPS[@]}"; do
    ls_start "$a"
done
ls_wait_ready "$deadline" "${APPS[@]}"

ls_log "starting nginx on $LOCAL_HOST:$LOCAL_NGINX_PORT"
ls_start nginx
ls_wait_ready "$deadline" nginx

ls_write_stack_json
started=1

ls_log ""
ls_log "native stack up: http://$LOCAL_HOST:$LOCAL_NGINX_PORT/api/  (logs in .run/*.log, details in .run/stack.json)"
ls_log "stop it with: make local-down"
