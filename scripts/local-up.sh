#!/usr/bin/env bash
# Start the native stack (no Docker): Redis, toxiproxy (one proxy per app in front of
# Redis), four rate-limiter instances and nginx, all as the invoking user, everything
# under .run/. Waits until each is ready, then writes .run/stack.json.
#
#   scripts/local-up.sh                 # or: make local-up
#   LOCAL_POLICY_FILE=policies.json scripts/local-up.sh
#   LOCAL_TOPOLOGY=sentinel scripts/local-up.sh   # or: make local-up TOPOLOGY=sentinel
#   LOCAL_TOPOLOGY=cluster scripts/local-up.sh    # or: make local-up TOPOLOGY=cluster
#
# LOCAL_TOPOLOGY=sentinel puts a master, a replica and three Sentinels in place of the one
# Redis (the apps ask the Sentinels for the master); cluster, a Redis Cluster of six nodes
# (3 masters, a replica each), created on the first start. Both wait for the replicas to be
# in sync (and the Sentinels to know each other) before starting the apps.
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
# Every service any topology has, to find what runs.
all_services=("${SERVICES[@]}")
for s in "${ALL_REDIS_NODES[@]}" "${ALL_SENTINELS[@]}"; do
    [[ " ${all_services[*]} " == *" $s "* ]] || all_services+=("$s")
done
running=()
for s in "${all_services[@]}"; do
    if ls_service_pid "$s" >/dev/null; then
        running+=("$s")
    fi
done
saved_topology=single # (a stack.env of before LOCAL_TOPOLOGY)
if [[ -f $STACK_ENV ]] && grep -q '^LOCAL_TOPOLOGY=' "$STACK_ENV"; then
    saved_topology=$(sed -n 's/^LOCAL_TOPOLOGY=//p' "$STACK_ENV")
fi
if ((${#running[@]})) && [[ -f $STACK_JSON && $saved_topology != "$LOCAL_TOPOLOGY" ]]; then
    ls_die "a native stack with LOCAL_TOPOLOGY=$saved_topology is up; stop it first with: make local-down"
fi
up=0
for s in "${SERVICES[@]}"; do
    if [[ " ${running[*]} " == *" $s "* ]]; then
        up=$((up + 1))
    fi
done
if ((up == ${#SERVICES[@]} && up == ${#running[@]})) && [[ -f $STACK_JSON ]]; then
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
dup=$(ls_all_ports | tr ' ' '\n' | sort | uniq -d | tr '\n' ' ')
[[ -z $dup ]] || ls_die "the LOCAL_*_PORT settings give two listeners the same port: $dup"
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

if [[ $LOCAL_TOPOLOGY == single ]]; then
    ls_log "starting redis on $LOCAL_HOST:$LOCAL_REDIS_PORT"
else
    ls_log "starting ${REDIS_NODES[*]} ($LOCAL_TOPOLOGY topology) on $LOCAL_HOST:$LOCAL_REDIS_PORT-$(ls_redis_port "${REDIS_NODES[-1]}")"
    ls_write_configs
fi
for n in "${REDIS_NODES[@]}"; do
    ls_start "$n"
done
ls_wait_ready "$deadline" "${REDIS_NODES[@]}"

ls_log "starting toxiproxy (API $LOCAL_HOST:$LOCAL_PROXY_API_PORT)"
ls_start toxiproxy
ls_wait_ready "$deadline" toxiproxy
ls_populate_proxies || ls_die "creating the toxiproxy proxies failed"
while read -r name port upstream; do
    ls_log "  proxy $name: $LOCAL_HOST:$port -> $LOCAL_HOST:$upstream"
done < <(ls_proxies)

case $LOCAL_TOPOLOGY in
sentinel)
    ls_wait_until "$deadline" "${REDIS_NODES[1]} replicates from ${REDIS_NODES[0]} (through the proxy $REPLICATION_PROXY)" \
        ls_check_replication
    ls_log "starting ${SENTINELS[*]} on $LOCAL_HOST:$LOCAL_SENTINEL_PORT_BASE-$(ls_sentinel_port "${SENTINELS[-1]}") (master name $MASTER_NAME)"
    for n in "${SENTINELS[@]}"; do
        ls_start "$n"
    done
    ls_wait_ready "$deadline" "${SENTINELS[@]}"
    ls_wait_until "$deadline" "every Sentinel knows ${REDIS_NODES[1]} and the other Sentinels" ls_check_sentinels
    ;;
cluster)
    state=$(ls_cluster_state) || ls_die "CLUSTER INFO failed on a node"
    case $state in
    new)
        ls_log "creating the cluster (3 masters, a replica each; output in $RUN_DIR/cluster-create.log)"
        if ! ls_create_cluster "$deadline"; then
            ls_print_log_tails cluster-create
            ls_die "redis-cli --cluster create failed"
        fi
        ;;
    mixed)
        ls_die "the cluster in $RUN_DIR/cluster is half new (some nodes know no other node): delete that directory to create a new one (its data goes with it)"
        ;;
    esac
    ls_wait_until "$deadline" "cluster_state:ok on every node, every master's replica in sync" ls_check_cluster
    ;;
esac

ls_log "starting ${APPS[*]}"
for a in "${APPS[@]}"; do
    ls_start "$a"
done
ls_wait_ready "$deadline" "${APPS[@]}"

ls_log "starting the static site on $LOCAL_HOST:$LOCAL_STATIC_PORT"
ls_start static
ls_wait_ready "$deadline" static

ls_log "starting nginx on $LOCAL_HOST:$LOCAL_NGINX_PORT (Envoy's rate limit service on $LOCAL_HOST:$LOCAL_RLS_PORT)"
ls_start nginx
ls_wait_ready "$deadline" nginx

if [[ $LOCAL_PROMETHEUS == 1 ]]; then
    ls_log "starting prometheus on $LOCAL_HOST:$LOCAL_PROMETHEUS_PORT (scrapes the apps' admin ports; LOCAL_PROMETHEUS=0: none)"
    ls_start prometheus
    ls_wait_ready "$deadline" prometheus
fi

ls_write_stack_json
started=1

ls_log ""
ls_log "native stack up: http://$LOCAL_HOST:$LOCAL_NGINX_PORT/api/  (logs in .run/*.log, details in .run/stack.json)"
if [[ $LOCAL_PROMETHEUS == 1 ]]; then
    ls_log "prometheus: http://$LOCAL_HOST:$LOCAL_PROMETHEUS_PORT/alerts  (rules: prometheus/rules.yml)"
fi
ls_log "stop it with: make local-down"
