# shellcheck shell=bash
# Shared by scripts/local-up.sh, scripts/local-down.sh and scripts/local-service.sh: the
# native stack's settings, and how to start, check and stop each of its processes.
# Sourced, not executed.
#
# Services, in start order (LOCAL_TOPOLOGY=single, the default):
#   redis      redis-server with redis/redis.conf, 127.0.0.1:6390, data in .run/redis
#   toxiproxy  bin/toxiproxy-server, API on 127.0.0.1:8474, proxies appN-redis
#              127.0.0.1:1639N -> Redis (the fault-injection point for each app)
#   app1..app4 bin/ratelimiter, public 127.0.0.1:808N, admin 127.0.0.1:908N, Envoy's rate
#              limit service (RL_GRPC_ADDR) 127.0.0.1:708N
#   static     a second nginx serving nginx/site/ (nginx/static.conf.template rendered
#              into .run/static/), 127.0.0.1:8070: the upstream that is not Go, which
#              nginx protects with auth_request (docs/DOORS.md)
#   nginx      nginx/nginx.conf.template rendered into .run/nginx/, 127.0.0.1:8080; the
#              apps' gRPC balanced on 127.0.0.1:8090
#   prometheus Debian's /usr/bin/prometheus, when installed (LOCAL_PROMETHEUS), on
#              127.0.0.1:9089: scrapes every app's admin port and evaluates
#              prometheus/rules.yml; config .run/prometheus/prometheus.yml (written by
#              ls_start_prometheus), data in .run/prometheus/data
# Each one runs in the background in its own session, stdout+stderr appended to
# .run/<name>.log, pid in .run/pids/<name>.pid.
#
# LOCAL_TOPOLOGY=sentinel: a master, a replica and three Sentinels in place of the one Redis
#   redis, redis2  data nodes on 127.0.0.1:6390 and :6391 (redis starts as the master).
#              Each reads its own .run/sentinel/<name>/node.conf, which includes
#              redis/redis.conf and which Sentinel rewrites (CONFIG REWRITE) on a role
#              change, so a node restarted after a failover keeps its new role; data in
#              .run/sentinel/<name>/data. local-up.sh writes both files afresh (redis the
#              master, redis2 its replica), local-service.sh only when missing.
#   sentinel1..3  redis-server --sentinel on 127.0.0.1:26390-26392, monitoring the master
#              as `fleet` (quorum 2, down-after 1 s, failover-timeout 5 s), no password;
#              config in .run/sentinel/sentinelN/sentinel.conf (written afresh by
#              local-up.sh; Sentinel rewrites it)
#   toxiproxy  also has the proxy `replication` 127.0.0.1:16399 -> 127.0.0.1:6390, out of
#              the path until the chaos suite's failover-lag points the replica at it
#              (REPLICAOF) and then disables it, so that the replica falls behind. (A
#              replica configured through it from the start would not stay: Sentinel
#              re-points a replica whose master address is not the master's,
#              failover-timeout (5 s) after it notices, +fix-slave-config in its log.)
#   the apps find the master through the Sentinels (RL_REDIS_ADDRS = the Sentinels,
#              RL_REDIS_MASTER_NAME=fleet); the appN-redis proxies exist but are not in
#              their path.
# LOCAL_TOPOLOGY=cluster: a Redis Cluster of 3 masters with a replica each in place of redis
#   redis, redis2..redis6  127.0.0.1:6390-6395, cluster bus on port+10000; config in
#              .run/cluster/<name>/node.conf, cluster state (node id, slots) in
#              .run/cluster/<name>/nodes.conf, data in .run/cluster/<name>/data. local-up.sh
#              creates the cluster (redis-cli --cluster create, --cluster-replicas 1) when
#              no node knows another one yet, and otherwise starts the existing one.
#   toxiproxy  runs, without proxies (their ports 16391-16394 would be the bus ports of
#              redis2-redis5); the apps reach the nodes directly (RL_REDIS_ADDRS = all six).
# In both, local-up.sh waits, before it starts the apps, for the replicas to be in sync,
# for every Sentinel to know the replica and the two other Sentinels, or for every cluster
# node to report cluster_state:ok.
#
# Settings (environment; local-up.sh saves them in .run/stack.env so that later calls of
# local-service.sh and local-down.sh use the same):
#   LOCAL_TOPOLOGY=single (or sentinel, cluster; see above)
#   LOCAL_HOST=127.0.0.1  LOCAL_NGINX_PORT=8080  LOCAL_REDIS_PORT=6390 (the other data
#   nodes on the next ports)  LOCAL_SENTINEL_PORT_BASE=26390 (sentinelN on base+N-1)
#   LOCAL_PROXY_API_PORT=8474  LOCAL_APP_PORT_BASE=8080 (appN on base+N)
#   LOCAL_ADMIN_PORT_BASE=9080 (appN admin on base+N)  LOCAL_VIA_PORT_BASE=16390
#   (proxy appN-redis on base+N, proxy replication on base+9)
#   REDIS_PASSWORD (default: requirepass in redis/redis.conf)
#   LOCAL_POLICY_FILE (optional JSON policy file, passed to the apps as RL_POLICY_FILE)
#   LOCAL_POLICY_DIR (optional, with LOCAL_POLICY_FILE: each app reads its own policy file,
#   <dir>/<app>.json, a copy of LOCAL_POLICY_FILE made when the app starts and the copy is
#   missing; the chaos suite's reload-under-load changes them one app at a time)
#   LOCAL_STATIC_PORT=8070 (the static site)  LOCAL_RLS_PORT=8090 (nginx's gRPC listener)
#   LOCAL_GRPC_PORT_BASE=7080 (appN's RL_GRPC_ADDR on base+N)
#   LOCAL_RLS_CONFIG_DIR (default envoy/ratelimit: the apps' RL_RLS_CONFIG_DIR, a directory
#   of envoyproxy/ratelimit YAML files)
#   LOCAL_RLS_CONFIG_PER_APP_DIR (optional: each app reads its own RL_RLS_CONFIG_DIR,
#   <dir>/<app>/, laid out as a Kubernetes ConfigMap mount (..data -> ..<timestamp>/,
#   x.yaml -> ..data/x.yaml) with a copy of LOCAL_RLS_CONFIG_DIR's files, made when the app
#   starts and the copy is missing; the chaos suite's reload-under-load swaps ..data one app
#   at a time)
#   RL_API_KEY_SECRET (default: the demo secret, fleetlimit-demo-secret-change-me, which
#   the apps accept in demo mode only: RL_DEMO, default true here)
#   RL_ADMIN_TOKEN (the bearer token of the apps' /admin/* and /debug/*; default: the demo
#   token, fleetlimit-demo-admin-token-change-me, accepted in demo mode only)
#   LOCAL_READY_TIMEOUT=30 (seconds)  LOCAL_SKIP_BUILD=1 (use the binaries in bin/ as is)
#   LOCAL_REDIS_TIMEOUT=50ms (RL_REDIS_TIMEOUT of the apps)
#   LOCAL_LOG_LEVEL=debug (RL_LOG_LEVEL of the apps: debug logs a line per request)
#   LOCAL_GOMAXPROCS (GOMAXPROCS of each app and of toxiproxy; default: the cores divided
#   by the four apps, at least 1). Five Go processes on a small host, each with one P per
#   core, spend their CPU waking and parking threads against each other
#   (docs/MEASURING.md).
#   LOCAL_REDIS_DIRECT=0 (1: the apps dial Redis itself, not their fault proxy; the chaos
#   suite's partition and latency faults then do not reach them; single topology only,
#   the others always dial directly)
#   LOCAL_PROMETHEUS=auto (start prometheus when it is installed; 1: it must be; 0: never)
#   LOCAL_PROMETHEUS_PORT=9089 (off 9090, where a system Prometheus may listen)
#   LOCAL_RUN_DIR (default: .run in the checkout) holds the pids, logs, data, stack.env and
#   stack.json in place of .run/, so a second stack (a test's, on other ports) cannot collide
#   with the usual one; every call of the three scripts for that stack must set it.

LS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUN_DIR=${LOCAL_RUN_DIR:-$LS_ROOT/.run}
[[ $RUN_DIR == /* ]] || RUN_DIR=$PWD/$RUN_DIR # the scripts cd to the checkout
PID_DIR=$RUN_DIR/pids
STACK_ENV=$RUN_DIR/stack.env
STACK_JSON=$RUN_DIR/stack.json
APPS=(app1 app2 app3 app4)
# Every data node and Sentinel any topology has (local-down.sh stops whichever of them
# left a pid file); ls_set_topology picks those of LOCAL_TOPOLOGY.
ALL_REDIS_NODES=(redis redis2 redis3 redis4 redis5 redis6)
ALL_SENTINELS=(sentinel1 sentinel2 sentinel3)
MASTER_NAME=fleet           # the name the Sentinels monitor the master under
REPLICATION_PROXY=replication # the toxiproxy proxy the replica starts replicating through
# The single topology's until ls_load_settings says otherwise.
REDIS_NODES=(redis)
SENTINELS=()
SERVICES=(redis toxiproxy "${APPS[@]}" static nginx)

ls_log() { printf '%s\n' "$*" >&2; }
ls_die() {
    ls_log "error: $*"
    exit 1
}

# ---- settings -----------------------------------------------------------------------

# ls_load_settings [--saved]: defaults <- environment; with --saved, the settings that
# local-up.sh saved for the running stack win over the environment.
ls_load_settings() {
    if [[ ${1:-} == --saved && -f $STACK_ENV ]]; then
        # shellcheck disable=SC1090
        source "$STACK_ENV"
    fi
    LOCAL_TOPOLOGY=${LOCAL_TOPOLOGY:-single}
    LOCAL_HOST=${LOCAL_HOST:-127.0.0.1}
    LOCAL_NGINX_PORT=${LOCAL_NGINX_PORT:-8080}
    LOCAL_REDIS_PORT=${LOCAL_REDIS_PORT:-6390}
    LOCAL_PROXY_API_PORT=${LOCAL_PROXY_API_PORT:-8474}
    LOCAL_APP_PORT_BASE=${LOCAL_APP_PORT_BASE:-8080}
    LOCAL_ADMIN_PORT_BASE=${LOCAL_ADMIN_PORT_BASE:-9080}
    LOCAL_VIA_PORT_BASE=${LOCAL_VIA_PORT_BASE:-16390}
    LOCAL_SENTINEL_PORT_BASE=${LOCAL_SENTINEL_PORT_BASE:-26390}
    LOCAL_REDIS_DIRECT=${LOCAL_REDIS_DIRECT:-0}
    LOCAL_LOG_LEVEL=${LOCAL_LOG_LEVEL:-debug}
    if [[ -z ${LOCAL_GOMAXPROCS:-} ]]; then
        LOCAL_GOMAXPROCS=$(($(nproc 2>/dev/null || echo 1) / 4))
        ((LOCAL_GOMAXPROCS >= 1)) || LOCAL_GOMAXPROCS=1
    fi
    LOCAL_READY_TIMEOUT=${LOCAL_READY_TIMEOUT:-30}
    LOCAL_REDIS_TIMEOUT=${LOCAL_REDIS_TIMEOUT:-50ms}
    LOCAL_POLICY_FILE=${LOCAL_POLICY_FILE:-}
    LOCAL_POLICY_DIR=${LOCAL_POLICY_DIR:-}
    LOCAL_PROMETHEUS=${LOCAL_PROMETHEUS:-auto}
    LOCAL_PROMETHEUS_PORT=${LOCAL_PROMETHEUS_PORT:-9089}
    case $LOCAL_PROMETHEUS in
    auto) if ls_find_bin prometheus >/dev/null; then LOCAL_PROMETHEUS=1; else LOCAL_PROMETHEUS=0; fi ;;
    0 | 1) ;;
    *) ls_die "LOCAL_PROMETHEUS=$LOCAL_PROMETHEUS: want auto, 1 or 0" ;;
    esac
    LOCAL_STATIC_PORT=${LOCAL_STATIC_PORT:-8070}
    LOCAL_RLS_PORT=${LOCAL_RLS_PORT:-8090}
    LOCAL_GRPC_PORT_BASE=${LOCAL_GRPC_PORT_BASE:-7080}
    LOCAL_RLS_CONFIG_DIR=${LOCAL_RLS_CONFIG_DIR:-$LS_ROOT/envoy/ratelimit}
    [[ -d $LOCAL_RLS_CONFIG_DIR ]] || ls_die "LOCAL_RLS_CONFIG_DIR=$LOCAL_RLS_CONFIG_DIR: no such directory"
    LOCAL_RLS_CONFIG_DIR=$(cd "$LOCAL_RLS_CONFIG_DIR" && pwd)
    LOCAL_RLS_CONFIG_PER_APP_DIR=${LOCAL_RLS_CONFIG_PER_APP_DIR:-}
    if [[ -n $LOCAL_RLS_CONFIG_PER_APP_DIR ]]; then
        mkdir -p "$LOCAL_RLS_CONFIG_PER_APP_DIR"
        LOCAL_RLS_CONFIG_PER_APP_DIR=$(cd "$LOCAL_RLS_CONFIG_PER_APP_DIR" && pwd)
    fi
    # The API-key secret (comma-separated; the first signs): the demo's unless set.
    RL_API_KEY_SECRET=${RL_API_KEY_SECRET:-fleetlimit-demo-secret-change-me}
    # The admin endpoints' bearer token (comma-separated; the first is the one scripts send).
    RL_ADMIN_TOKEN=${RL_ADMIN_TOKEN:-fleetlimit-demo-admin-token-change-me}
    if [[ -n $LOCAL_POLICY_FILE ]]; then
        [[ -f $LOCAL_POLICY_FILE ]] || ls_die "LOCAL_POLICY_FILE=$LOCAL_POLICY_FILE: no such file"
        LOCAL_POLICY_FILE=$(cd "$(dirname "$LOCAL_POLICY_FILE")" && pwd)/$(basename "$LOCAL_POLICY_FILE")
    fi
    if [[ -n $LOCAL_POLICY_DIR ]]; then
        [[ -n $LOCAL_POLICY_FILE ]] || ls_die "LOCAL_POLICY_DIR needs LOCAL_POLICY_FILE (the apps' first policies)"
        mkdir -p "$LOCAL_POLICY_DIR"
        LOCAL_POLICY_DIR=$(cd "$LOCAL_POLICY_DIR" && pwd)
    fi
    if [[ -z ${REDIS_PASSWORD:-} ]]; then
        REDIS_PASSWORD=$(awk '$1 == "requirepass" { print $2; exit }' "$LS_ROOT/redis/redis.conf")
        REDIS_PASSWORD=${REDIS_PASSWORD%\"}
        REDIS_PASSWORD=${REDIS_PASSWORD#\"}
    fi
    [[ -n $REDIS_PASSWORD ]] || ls_die "no Redis password (requirepass in redis/redis.conf or REDIS_PASSWORD)"
    ls_set_topology
}

# REDIS_NODES, SENTINELS and SERVICES (in start order) of LOCAL_TOPOLOGY.
ls_set_topology() {
    case $LOCAL_TOPOLOGY in
    single) REDIS_NODES=(redis) SENTINELS=() ;;
    sentinel) REDIS_NODES=(redis redis2) SENTINELS=("${ALL_SENTINELS[@]}") ;;
    cluster) REDIS_NODES=("${ALL_REDIS_NODES[@]}") SENTINELS=() ;;
    *) ls_die "LOCAL_TOPOLOGY=$LOCAL_TOPOLOGY: want single, sentinel or cluster" ;;
    esac
    if [[ $LOCAL_TOPOLOGY != single && ! $LOCAL_HOST =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
        # Sentinel (resolve-hostnames no) and the cluster announce addresses, not names.
        ls_die "LOCAL_TOPOLOGY=$LOCAL_TOPOLOGY needs LOCAL_HOST to be an IPv4 address, not $LOCAL_HOST"
    fi
    SERVICES=("${REDIS_NODES[@]}" ${SENTINELS[@]+"${SENTINELS[@]}"} toxiproxy "${APPS[@]}" static nginx)
    if [[ ${LOCAL_PROMETHEUS:-0} == 1 ]]; then SERVICES+=(prometheus); fi
}

ls_save_settings() {
    mkdir -p "$RUN_DIR"
    {
        echo "# written by scripts/local-up.sh: the settings of the running native stack"
        local v
        for v in LOCAL_TOPOLOGY LOCAL_HOST LOCAL_NGINX_PORT LOCAL_REDIS_PORT LOCAL_PROXY_API_PORT \
            LOCAL_APP_PORT_BASE LOCAL_ADMIN_PORT_BASE LOCAL_VIA_PORT_BASE LOCAL_SENTINEL_PORT_BASE \
            LOCAL_READY_TIMEOUT LOCAL_REDIS_TIMEOUT LOCAL_POLICY_FILE LOCAL_POLICY_DIR REDIS_PASSWORD \
            RL_API_KEY_SECRET RL_ADMIN_TOKEN LOCAL_REDIS_DIRECT LOCAL_LOG_LEVEL LOCAL_GOMAXPROCS \
            LOCAL_PROMETHEUS LOCAL_PROMETHEUS_PORT LOCAL_STATIC_PORT LOCAL_RLS_PORT LOCAL_GRPC_PORT_BASE \
            LOCAL_RLS_CONFIG_DIR LOCAL_RLS_CONFIG_PER_APP_DIR; do
            printf '%s=%q\n' "$v" "${!v}"
        done
    } >"$STACK_ENV.tmp"
    chmod 600 "$STACK_ENV.tmp"
    mv -f "$STACK_ENV.tmp" "$STACK_ENV"
}

# appN -> N
ls_app_index() { echo "${1#app}"; }
ls_app_port() { echo $((LOCAL_APP_PORT_BASE + $(ls_app_index "$1"))); }
ls_admin_port() { echo $((LOCAL_ADMIN_PORT_BASE + $(ls_app_index "$1"))); }
ls_via_port() { echo $((LOCAL_VIA_PORT_BASE + $(ls_app_index "$1"))); }
ls_grpc_port() { echo $((LOCAL_GRPC_PORT_BASE + $(ls_app_index "$1"))); }

# redis -> 1, redisN -> N; sentinelN -> N.
ls_node_index() {
    local n=${1#redis}
    n=${n#sentinel}
    echo "${n:-1}"
}
ls_redis_port() { echo $((LOCAL_REDIS_PORT + $(ls_node_index "$1") - 1)); }
ls_sentinel_port() { echo $((LOCAL_SENTINEL_PORT_BASE + $(ls_node_index "$1") - 1)); }
ls_replication_port() { echo $((LOCAL_VIA_PORT_BASE + 9)); }

# The toxiproxy proxies of the topology: "name listen-port upstream-port" lines.
ls_proxies() {
    local a
    [[ $LOCAL_TOPOLOGY != cluster ]] || return 0
    for a in "${APPS[@]}"; do
        echo "$a-redis $(ls_via_port "$a") $LOCAL_REDIS_PORT"
    done
    if [[ $LOCAL_TOPOLOGY == sentinel ]]; then
        echo "$REPLICATION_PROXY $(ls_replication_port) $LOCAL_REDIS_PORT"
    fi
}

# Every TCP port the stack listens on.
ls_all_ports() {
    local s
    for s in "${SERVICES[@]}"; do
        ls_ports_of "$s"
    done
}

ls_ports_of() {
    case $1 in
    redis | redis[2-6])
        local p
        p=$(ls_redis_port "$1")
        if [[ $LOCAL_TOPOLOGY == cluster ]]; then echo "$p" $((p + 10000)); else echo "$p"; fi
        ;;
    sentinel*) ls_sentinel_port "$1" ;;
    toxiproxy)
        local name port upstream
        echo "$LOCAL_PROXY_API_PORT"
        while read -r name port upstream; do echo "$port"; done < <(ls_proxies)
        ;;
    nginx) echo "$LOCAL_NGINX_PORT" "$LOCAL_RLS_PORT" ;;
    static) echo "$LOCAL_STATIC_PORT" ;;
    app*) echo "$(ls_app_port "$1")" "$(ls_admin_port "$1")" "$(ls_grpc_port "$1")" ;;
    prometheus) echo "$LOCAL_PROMETHEUS_PORT" ;;
    esac
}

# Something accepts connections on host:port (bash's /dev/tcp, no extra tool).
ls_port_busy() {
    (exec 3<>"/dev/tcp/$LOCAL_HOST/$1") 2>/dev/null
}

# ---- binaries -----------------------------------------------------------------------

# shellcheck source=scripts/lib/find-bin.sh
. "$(dirname "${BASH_SOURCE[0]}")/find-bin.sh"
ls_find_bin() { find_bin "$@"; }

ls_require_tools() {
    local missing=() pkgs=()
    REDIS_SERVER=$(ls_find_bin redis-server) || { missing+=(redis-server); pkgs+=(redis-server); }
    REDIS_CLI=$(ls_find_bin redis-cli) || { missing+=(redis-cli); pkgs+=(redis-server); }
    NGINX=$(ls_find_bin nginx) || { missing+=(nginx); pkgs+=(nginx-light); }
    CURL=$(ls_find_bin curl) || { missing+=(curl); pkgs+=(curl); }
    if ((${#missing[@]})); then
        ls_log "missing: ${missing[*]}"
        ls_log "install them with:  apt-get install redis-server nginx-light curl"
        ls_log "(or run: make deps)"
        exit 1
    fi
    if [[ $LOCAL_PROMETHEUS == 1 ]]; then
        PROMETHEUS=$(ls_find_bin prometheus) ||
            ls_die "LOCAL_PROMETHEUS=1 but prometheus is not installed (apt-get install prometheus; or LOCAL_PROMETHEUS=0)"
    fi
}

ls_build() {
    if [[ ${LOCAL_SKIP_BUILD:-} == 1 ]]; then
        ls_log "LOCAL_SKIP_BUILD=1: using bin/ratelimiter and bin/toxiproxy-server as they are"
    else
        local go
        go=$(ls_find_bin go) || ls_die "go not found in PATH (needed to build bin/ratelimiter)"
        ls_log "building bin/ratelimiter"
        (cd "$LS_ROOT" && "$go" build -o bin/ratelimiter ./app/cmd/ratelimiter) ||
            ls_die "go build ./app/cmd/ratelimiter failed"
        ls_log "building bin/toxiproxy-server"
        (cd "$LS_ROOT/chaos" && "$go" build -o ../bin/toxiproxy-server github.com/Shopify/toxiproxy/v2/cmd/server) ||
            ls_die "go build github.com/Shopify/toxiproxy/v2/cmd/server (in chaos/) failed"
    fi
    [[ -x $LS_ROOT/bin/ratelimiter ]] || ls_die "bin/ratelimiter missing"
    [[ -x $LS_ROOT/bin/toxiproxy-server ]] || ls_die "bin/toxiproxy-server missing"
}

# ---- pids ---------------------------------------------------------------------------

ls_pid_file() { echo "$PID_DIR/$1.pid"; }

# What the process's command line must contain for a recorded pid to still be ours.
ls_expected_cmd() {
    case $1 in
    redis* | sentinel*) echo redis-server ;;
    toxiproxy) echo toxiproxy-server ;;
    nginx | static) echo nginx ;;
    app*) echo ratelimiter ;;
    prometheus) echo prometheus ;;
    esac
}

# Alive and not a zombie.
ls_pid_running() {
    local pid=$1 stat
    [[ -r /proc/$pid/stat ]] || return 1
    stat=$(<"/proc/$pid/stat") 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# Print the pid of service $1 if its pid file names a live process that is still the
# program we started (guards against pid reuse); otherwise return 1.
ls_service_pid() {
    local f pid cmd
    f=$(ls_pid_file "$1")
    [[ -f $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    ls_pid_running "$pid" || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *"$(ls_expected_cmd "$1")"* ]] || return 1
    echo "$pid"
}

# ---- start --------------------------------------------------------------------------

# ls_spawn NAME CMD...: start CMD in the background, in its own session (so a Ctrl-C in
# the terminal that ran `make local-up` later does not reach it), output appended to
# .run/NAME.log, pid in .run/pids/NAME.pid. This script runs without job control, so the
# background subshell is not a process-group leader and setsid execs CMD in place: $! is
# CMD's own pid.
LS_SPAWNED=() # services started by this process, for the failure report
ls_spawn() {
    local name=$1
    shift
    LS_SPAWNED+=("$name")
    mkdir -p "$PID_DIR"
    local log=$RUN_DIR/$name.log
    local desc="$*"
    if [[ -n ${REDIS_PASSWORD:-} ]]; then # keep the password out of the log
        desc=${desc//"$(ls_urlencode "$REDIS_PASSWORD")"/"***"}
        desc=${desc//"$REDIS_PASSWORD"/"***"}
    fi
    printf '==== %s  %s starting: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$name" "$desc" >>"$log"
    (exec setsid "$@" </dev/null >>"$log" 2>&1) &
    echo $! >"$(ls_pid_file "$name")"
}

ls_start_redis() {
    local name=$1 wipe=${2:-}
    if [[ $LOCAL_TOPOLOGY == single ]]; then
        mkdir -p "$RUN_DIR/redis"
        if [[ $wipe == --wipe ]]; then
            ls_log "redis: wiping its data ($RUN_DIR/redis)"
            rm -rf "${RUN_DIR:?}/redis"
            mkdir -p "$RUN_DIR/redis"
        fi
        ls_spawn redis "$REDIS_SERVER" "$LS_ROOT/redis/redis.conf" \
            --port "$LOCAL_REDIS_PORT" --bind "$LOCAL_HOST" --dir "$RUN_DIR/redis" \
            --daemonize no --protected-mode no --requirepass "$REDIS_PASSWORD"
        return
    fi
    # sentinel, cluster: the data goes, the node's config (its role; its cluster node id
    # and slots) stays.
    local dir data
    dir=$(ls_node_dir "$name")
    data=$dir/data
    if [[ $wipe == --wipe ]]; then
        ls_log "$name: wiping its data ($data)"
        rm -rf "${data:?}"
    fi
    mkdir -p "$data"
    [[ -f $dir/node.conf ]] || ls_write_node_conf "$name"
    ls_spawn "$name" "$REDIS_SERVER" "$dir/node.conf" \
        --port "$(ls_redis_port "$name")" --bind "$LOCAL_HOST" --dir "$data" \
        --daemonize no --protected-mode no --requirepass "$REDIS_PASSWORD"
}

# The directory of a data node or Sentinel of the sentinel and cluster topologies (mode
# 700: the files in it hold the password).
ls_node_dir() {
    local top=$RUN_DIR/$LOCAL_TOPOLOGY
    [[ -d $top ]] || { mkdir -p "$top" && chmod 700 "$top"; }
    mkdir -p "$top/$1"
    echo "$top/$1"
}

# A string in a Redis config file: double-quoted, \ and " escaped.
ls_conf_quote() {
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# ls_write_node_conf NAME: the node's own config file, read by redis-server in place of
# redis/redis.conf (which it includes; the command line still sets port, bind, dir and
# requirepass, and wins). In the sentinel topology, redis starts as the master and redis2
# as its replica; Sentinel rewrites the file when it changes a node's role.
ls_write_node_conf() {
    local name=$1 dir port f
    dir=$(ls_node_dir "$name")
    port=$(ls_redis_port "$name")
    f=$dir/node.conf
    {
        echo "# written by scripts/lib/local-stack.sh for $name ($LOCAL_TOPOLOGY topology);"
        if [[ $LOCAL_TOPOLOGY == sentinel ]]; then
            echo "# Sentinel rewrites it (CONFIG REWRITE) when it changes the node's role."
        fi
        echo "include $(ls_conf_quote "$LS_ROOT/redis/redis.conf")"
        echo "masterauth $(ls_conf_quote "$REDIS_PASSWORD")"
        echo "# a replica's full sync starts at once, not after 5 s (Redis 7's default waits for more)"
        echo "repl-diskless-sync-delay 0"
        case $LOCAL_TOPOLOGY in
        sentinel)
            echo "replica-announce-ip $LOCAL_HOST"
            echo "replica-announce-port $port"
            if [[ $name != "${REDIS_NODES[0]}" ]]; then
                echo "replicaof $LOCAL_HOST $(ls_redis_port "${REDIS_NODES[0]}")"
            fi
            ;;
        cluster)
            echo "cluster-enabled yes"
            echo "cluster-config-file $(ls_conf_quote "$dir/nodes.conf")"
            echo "cluster-node-timeout 2000"
            echo "cluster-require-full-coverage no"
            echo "cluster-replica-validity-factor 0"
            echo "cluster-announce-ip $LOCAL_HOST"
            ;;
        esac
    } >"$f.tmp"
    chmod 600 "$f.tmp"
    mv -f "$f.tmp" "$f"
}

ls_start_sentinel() {
    local name=$1 dir
    dir=$(ls_node_dir "$name")
    [[ -f $dir/sentinel.conf ]] || ls_write_sentinel_conf "$name"
    ls_spawn "$name" "$REDIS_SERVER" "$dir/sentinel.conf" --sentinel \
        --port "$(ls_sentinel_port "$name")" --bind "$LOCAL_HOST" --dir "$dir" --daemonize no
}

# ls_write_sentinel_conf NAME: a Sentinel's config, monitoring the first data node as the
# master. Sentinel adds what it learns (its id, the replica, the other Sentinels, a new
# master) to it.
ls_write_sentinel_conf() {
    local name=$1 dir f
    dir=$(ls_node_dir "$name")
    f=$dir/sentinel.conf
    {
        echo "# written by scripts/lib/local-stack.sh for $name; Sentinel rewrites it."
        echo "sentinel resolve-hostnames no"
        echo "sentinel monitor $MASTER_NAME $LOCAL_HOST $(ls_redis_port "${REDIS_NODES[0]}") 2"
        echo "sentinel auth-pass $MASTER_NAME $(ls_conf_quote "$REDIS_PASSWORD")"
        echo "sentinel down-after-milliseconds $MASTER_NAME 1000"
        echo "sentinel failover-timeout $MASTER_NAME 5000"
        echo "sentinel parallel-syncs $MASTER_NAME 1"
    } >"$f.tmp"
    chmod 600 "$f.tmp"
    mv -f "$f.tmp" "$f"
}

# The configs local-up.sh starts a stack from: every node's and Sentinel's written afresh
# (in the sentinel topology: redis the master again, fresh Sentinels).
ls_write_configs() {
    local n
    [[ $LOCAL_TOPOLOGY != single ]] || return 0
    for n in "${REDIS_NODES[@]}"; do ls_write_node_conf "$n"; done
    for n in ${SENTINELS[@]+"${SENTINELS[@]}"}; do ls_write_sentinel_conf "$n"; done
}

ls_start_toxiproxy() {
    ls_spawn toxiproxy env GOMAXPROCS="$LOCAL_GOMAXPROCS" "$LS_ROOT/bin/toxiproxy-server" -host "$LOCAL_HOST" -port "$LOCAL_PROXY_API_PORT"
}

# The topology's proxies (appN-redis; in the sentinel topology also replication), created
# (or left as they are, if they exist) through the API.
ls_populate_proxies() {
    local name port upstream body="[" sep=""
    while read -r name port upstream; do
        body+="$sep{\"name\":\"$name\",\"listen\":\"$LOCAL_HOST:$port\","
        body+="\"upstream\":\"$LOCAL_HOST:$upstream\",\"enabled\":true}"
        sep=","
    done < <(ls_proxies)
    body+="]"
    [[ $body != "[]" ]] || return 0
    "$CURL" -fsS --max-time 5 -X POST -H 'Content-Type: application/json' \
        --data "$body" "http://$LOCAL_HOST:$LOCAL_PROXY_API_PORT/populate" >/dev/null
}

# Percent-encode for the userinfo part of a URL.
ls_urlencode() {
    local s=$1 out="" c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
        [a-zA-Z0-9.~_-]) out+=$c ;;
        *) out+=$(printf '%%%02X' "'$c") ;;
        esac
    done
    echo "$out"
}

# ls_rls_config_dir <app>: the app's RL_RLS_CONFIG_DIR. With LOCAL_RLS_CONFIG_PER_APP_DIR,
# <dir>/<app>/, made when missing as kubelet lays out a ConfigMap volume: the files in
# ..<timestamp>/, ..data a symlink to it, each file a symlink through ..data (an update
# writes a new ..<timestamp>/ and renames a new ..data over the old one).
ls_rls_config_dir() {
    local a=$1
    if [[ -z $LOCAL_RLS_CONFIG_PER_APP_DIR ]]; then
        echo "$LOCAL_RLS_CONFIG_DIR"
        return
    fi
    local dir=$LOCAL_RLS_CONFIG_PER_APP_DIR/$a
    if [[ ! -e $dir/..data ]]; then
        local ts f name
        ts=..$(date -u +%Y_%m_%d_%H_%M_%S.%N)
        rm -rf "$dir"
        mkdir -p "$dir/$ts"
        for f in "$LOCAL_RLS_CONFIG_DIR"/*.yaml "$LOCAL_RLS_CONFIG_DIR"/*.yml; do
            [[ -f $f ]] || continue
            name=$(basename "$f")
            cp "$f" "$dir/$ts/$name"
            ln -s "..data/$name" "$dir/$name"
        done
        ln -s "$ts" "$dir/..data"
    fi
    echo "$dir"
}

ls_start_app() {
    local a=$1
    mkdir -p "$RUN_DIR/$a/journal"
    # Through the app's fault proxy, unless LOCAL_REDIS_DIRECT=1 (make bench: the proxy's
    # hop is not part of the deployment it measures).
    local redis_port
    redis_port=$(ls_via_port "$a")
    if [[ $LOCAL_REDIS_DIRECT == 1 ]]; then redis_port=$LOCAL_REDIS_PORT; fi
    local envs=(
        "RL_INSTANCE=$a"
        "RL_LISTEN_ADDR=$LOCAL_HOST:$(ls_app_port "$a")"
        "RL_ADMIN_ADDR=$LOCAL_HOST:$(ls_admin_port "$a")"
        "RL_REDIS_TIMEOUT=$LOCAL_REDIS_TIMEOUT"
        "RL_LOG_LEVEL=$LOCAL_LOG_LEVEL"
        "GOMAXPROCS=$LOCAL_GOMAXPROCS"
        "RL_EXPECTED_INSTANCES=${#APPS[@]}"
        "RL_DEBUG_HEADERS=true"
        "RL_TRUSTED_PROXIES=127.0.0.1/32,::1/128"
        "RL_JOURNAL_DIR=$RUN_DIR/$a/journal"
        "RL_API_KEY_SECRET=$RL_API_KEY_SECRET"
        "RL_ADMIN_TOKEN=$RL_ADMIN_TOKEN"
        # The default secret and token are published: allowed only in demo mode
        # (RL_DEMO=false with a secret and a token of your own leaves it).
        "RL_DEMO=${RL_DEMO:-true}"
        # nginx overwrites X-Request-Id ($request_id): a resend is counted once.
        "RL_TRUST_REQUEST_ID=true"
        # The chaos suite's clock-step moves an instance's wall clock (RL_DEBUG_CLOCK,
        # POST /debug/clock on its admin port); off unless asked.
        "RL_DEBUG_CLOCK=${RL_DEBUG_CLOCK:-false}"
        "RL_GRPC_ADDR=$LOCAL_HOST:$(ls_grpc_port "$a")"
        "RL_RLS_CONFIG_DIR=$(ls_rls_config_dir "$a")"
        "RL_RLS_RESPONSE_HEADERS=true"
    )
    case $LOCAL_TOPOLOGY in
    single)
        envs+=("RL_REDIS_URL=redis://:$(ls_urlencode "$REDIS_PASSWORD")@$LOCAL_HOST:$redis_port/0")
        ;;
    sentinel) # the Sentinels have no password: go-redis sends RL_REDIS_PASSWORD to the master only
        envs+=("RL_REDIS_ADDRS=$(ls_addrs "${SENTINELS[@]}")" "RL_REDIS_MASTER_NAME=$MASTER_NAME"
            "RL_REDIS_PASSWORD=$REDIS_PASSWORD")
        ;;
    cluster)
        envs+=("RL_REDIS_ADDRS=$(ls_addrs "${REDIS_NODES[@]}")" "RL_REDIS_PASSWORD=$REDIS_PASSWORD")
        ;;
    esac
    local policy=$LOCAL_POLICY_FILE
    if [[ -n $LOCAL_POLICY_DIR ]]; then
        policy=$LOCAL_POLICY_DIR/$a.json
        [[ -f $policy ]] || cp "$LOCAL_POLICY_FILE" "$policy"
    fi
    if [[ -n $policy ]]; then
        envs+=("RL_POLICY_FILE=$policy")
    fi
    # -u: settings from the caller's environment that would change the topology.
    ls_spawn "$a" env -u RL_REDIS_URL -u RL_REDIS_ADDRS -u RL_REDIS_MASTER_NAME \
        -u RL_REDIS_USERNAME -u RL_REDIS_PASSWORD -u RL_POLICY_FILE -u RL_RLS_CONFIG_DIR \
        "${envs[@]}" "$LS_ROOT/bin/ratelimiter"
}

# host:port of data nodes or Sentinels, comma separated.
ls_addrs() {
    local n out="" sep=""
    for n in "$@"; do
        out+="$sep$(ls_addr "$n")"
        sep=,
    done
    echo "$out"
}

ls_addr() {
    case $1 in
    sentinel*) echo "$LOCAL_HOST:$(ls_sentinel_port "$1")" ;;
    *) echo "$LOCAL_HOST:$(ls_redis_port "$1")" ;;
    esac
}

ls_start_nginx() {
    "$LS_ROOT/scripts/render-nginx.sh" native "$RUN_DIR/nginx/nginx.conf" "$RUN_DIR/nginx"
    ls_spawn nginx "$NGINX" -p "$RUN_DIR/nginx/" -c "$RUN_DIR/nginx/nginx.conf" \
        -e "$RUN_DIR/nginx/error.log" -g 'daemon off;'
}

# ls_write_prometheus_config: .run/prometheus/prometheus.yml, what prometheus/prometheus.yml
# is to the compose stack: job fleetlimit, one target per app's admin port with the app's
# name as its instance, and the repository's prometheus/rules.yml.
ls_write_prometheus_config() {
    local a f=$RUN_DIR/prometheus/prometheus.yml
    mkdir -p "$RUN_DIR/prometheus"
    {
        echo "# written by scripts/lib/local-stack.sh (make local-up); see prometheus/prometheus.yml"
        echo "global:"
        echo "  scrape_interval: 5s"
        echo "  evaluation_interval: 5s"
        echo "rule_files:"
        echo "  - \"$LS_ROOT/prometheus/rules.yml\""
        echo "scrape_configs:"
        echo "  - job_name: fleetlimit"
        echo "    static_configs:"
        for a in "${APPS[@]}"; do
            echo "      - targets: [\"$LOCAL_HOST:$(ls_admin_port "$a")\"]"
            echo "        labels: {instance: $a}"
        done
    } >"$f.tmp"
    mv -f "$f.tmp" "$f"
}

ls_start_prometheus() {
    ls_write_prometheus_config
    ls_spawn prometheus "$PROMETHEUS" --config.file="$RUN_DIR/prometheus/prometheus.yml" \
        --storage.tsdb.path="$RUN_DIR/prometheus/data" --storage.tsdb.retention.time=2d \
        --web.listen-address="$LOCAL_HOST:$LOCAL_PROMETHEUS_PORT"
}

# The static site: a second nginx serving nginx/site/, under .run/static/.
ls_start_static() {
    NGINX_TEMPLATE="$LS_ROOT/nginx/static.conf.template" \
        "$LS_ROOT/scripts/render-nginx.sh" native "$RUN_DIR/static/nginx.conf" "$RUN_DIR/static"
    ls_spawn static "$NGINX" -p "$RUN_DIR/static/" -c "$RUN_DIR/static/nginx.conf" \
        -e "$RUN_DIR/static/error.log" -g 'daemon off;'
}

ls_start() {
    [[ " ${SERVICES[*]} " == *" $1 "* ]] || ls_die "unknown service: $1 (one of: ${SERVICES[*]})"
    case $1 in
    static) ls_start_static ;;
    redis*) ls_start_redis "$1" "${2:-}" ;;
    sentinel*) ls_start_sentinel "$1" ;;
    toxiproxy) ls_start_toxiproxy ;;
    app[1-4]) ls_start_app "$1" ;;
    nginx) ls_start_nginx ;;
    prometheus) ls_start_prometheus ;;
    esac
}

# ---- readiness ----------------------------------------------------------------------

# ls_cli NAME ARGS...: redis-cli against the data node or Sentinel NAME (the password of
# a data node through REDISCLI_AUTH, off the command line; none for a Sentinel).
ls_cli() {
    local name=$1
    shift
    case $name in
    sentinel*) env -u REDISCLI_AUTH "$REDIS_CLI" -h "$LOCAL_HOST" -p "$(ls_sentinel_port "$name")" "$@" ;;
    *) REDISCLI_AUTH=$REDIS_PASSWORD "$REDIS_CLI" -h "$LOCAL_HOST" -p "$(ls_redis_port "$name")" "$@" ;;
    esac
}

# ls_info_field TEXT FIELD: the value of FIELD:value in INFO (or CLUSTER INFO) output.
ls_info_field() {
    awk -F: -v f="$2" '$1 == f { sub(/\r$/, ""); print substr($0, length(f) + 2); exit }' <<<"$1"
}

ls_probe() {
    case $1 in
    redis* | sentinel*)
        [[ $(ls_cli "$1" ping 2>/dev/null) == PONG ]]
        ;;
    toxiproxy)
        "$CURL" -fsS --max-time 2 -o /dev/null "http://$LOCAL_HOST:$LOCAL_PROXY_API_PORT/version"
        ;;
    app*)
        "$CURL" -fsS --max-time 2 -o /dev/null "http://$LOCAL_HOST:$(ls_admin_port "$1")/readyz"
        ;;
    nginx)
        "$CURL" -fsS --max-time 2 -o /dev/null "http://$LOCAL_HOST:$LOCAL_NGINX_PORT/healthz"
        ;;
    prometheus)
        "$CURL" -fsS --max-time 2 -o /dev/null "http://$LOCAL_HOST:$LOCAL_PROMETHEUS_PORT/-/ready"
        ;;
    static)
        "$CURL" -fsS --max-time 2 -o /dev/null "http://$LOCAL_HOST:$LOCAL_STATIC_PORT/healthz"
        ;;
    esac
}

# ls_wait_ready DEADLINE NAME...: wait until every NAME answers its probe, failing fast
# when one of them exits. DEADLINE is a value of $SECONDS.
ls_wait_ready() {
    local deadline=$1 name pending
    shift
    pending=("$@")
    while ((${#pending[@]})); do
        local still=()
        for name in "${pending[@]}"; do
            if ls_probe "$name" >/dev/null 2>&1; then
                ls_log "  $name ready"
            elif ! ls_service_pid "$name" >/dev/null; then
                ls_log "error: $name exited during startup"
                return 1
            else
                still+=("$name")
            fi
        done
        pending=(${still[@]+"${still[@]}"})
        ((${#pending[@]})) || break
        if ((SECONDS >= deadline)); then
            ls_log "error: not ready within ${LOCAL_READY_TIMEOUT}s: ${pending[*]}"
            return 1
        fi
        sleep 0.2
    done
}

# ls_wait_until DEADLINE WHAT CHECK [ARGS...]: run CHECK until it succeeds, failing when
# DEADLINE (a value of $SECONDS) passes or a started data node or Sentinel exits. CHECK prints
# what it still waits for, which the failure report shows.
ls_wait_until() {
    local deadline=$1 what=$2 waiting n
    shift 2
    while :; do
        if waiting=$("$@" 2>&1); then
            ls_log "  $what"
            return 0
        fi
        for n in "${REDIS_NODES[@]}" ${SENTINELS[@]+"${SENTINELS[@]}"}; do
            if [[ -f $(ls_pid_file "$n") ]] && ! ls_service_pid "$n" >/dev/null; then
                ls_log "error: $n exited (waiting for: $what)"
                return 1
            fi
        done
        if ((SECONDS >= deadline)); then
            ls_log "error: not within ${LOCAL_READY_TIMEOUT}s: $what ($waiting)"
            return 1
        fi
        sleep 0.2
    done
}

# Sentinel topology: the replica (the second data node) replicates from the master (the
# first) with its link up, and the master lists it, at its own address, as online.
ls_check_replication() {
    local master=${REDIS_NODES[0]} replica=${REDIS_NODES[1]} info port
    port=$(ls_redis_port "$replica")
    info=$(ls_cli "$replica" info replication) || { echo "$replica does not answer"; return 1; }
    if [[ $(ls_info_field "$info" role) != slave ]]; then
        echo "$replica is not a replica"
        return 1
    fi
    if [[ $(ls_info_field "$info" master_link_status) != up ]]; then
        echo "$replica: master_link_status:$(ls_info_field "$info" master_link_status)"
        return 1
    fi
    info=$(ls_cli "$master" info replication) || { echo "$master does not answer"; return 1; }
    if ! grep -qE "^slave[0-9]+:ip=${LOCAL_HOST//./\\.},port=$port,state=online," <<<"$info"; then
        echo "$master does not list $LOCAL_HOST:$port as an online replica"
        return 1
    fi
}

# Sentinel topology: every Sentinel lists the replica (flags exactly "slave") and knows
# the other Sentinels. (A Sentinel reads the master's INFO, and so learns the replica, when
# it connects and then every 10 s: start the Sentinels once the replica is attached.)
ls_check_sentinels() {
    local s peers port want=$((${#SENTINELS[@]} - 1))
    port=$(ls_redis_port "${REDIS_NODES[1]}")
    for s in "${SENTINELS[@]}"; do
        peers=$(ls_cli "$s" sentinel sentinels "$MASTER_NAME" | awk 'NR % 2 == 1 && $0 == "name"' | wc -l) || true
        if ((peers != want)); then
            echo "$s knows $peers other Sentinels, want $want"
            return 1
        fi
        if ! ls_cli "$s" sentinel replicas "$MASTER_NAME" | awk -v port="$port" '
            NR % 2 == 1 { k = $0; next }
            k == "name" { p = "" }
            k == "port" { p = $0 }
            k == "flags" && p == port && $0 == "slave" { found = 1 }
            END { exit !found }'; then
            echo "$s does not list ${REDIS_NODES[1]} as a replica of $MASTER_NAME"
            return 1
        fi
    done
}

# Cluster topology: "new" when no node knows another one or has a slot (the cluster is to
# be created), "exists" when every node knows others, "mixed" otherwise.
ls_cluster_state() {
    local n info known slots fresh=0 old=0
    for n in "${REDIS_NODES[@]}"; do
        info=$(ls_cli "$n" cluster info) || return 1
        known=$(ls_info_field "$info" cluster_known_nodes)
        slots=$(ls_info_field "$info" cluster_slots_assigned)
        if [[ $known == 1 && $slots == 0 ]]; then
            fresh=$((fresh + 1))
        else
            old=$((old + 1))
        fi
    done
    if ((old == 0)); then
        echo new
    elif ((fresh == 0)); then
        echo exists
    else
        echo mixed
    fi
}

# ls_create_cluster DEADLINE: redis-cli --cluster create, 3 masters and a replica each;
# its output goes to .run/cluster-create.log.
ls_create_cluster() {
    local deadline=$1 n addrs=() log=$RUN_DIR/cluster-create.log
    for n in "${REDIS_NODES[@]}"; do addrs+=("$(ls_addr "$n")"); done
    printf '==== %s  redis-cli --cluster create %s --cluster-replicas 1 --cluster-yes\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${addrs[*]}" >>"$log"
    REDISCLI_AUTH=$REDIS_PASSWORD timeout $((deadline > SECONDS ? deadline - SECONDS : 1)) \
        "$REDIS_CLI" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >>"$log" 2>&1
}

# Cluster topology: every node says cluster_state:ok, knows every node and sees all slots
# served; every replica's link to its master is up and every master has an online replica.
ls_check_cluster() {
    local n info v
    for n in "${REDIS_NODES[@]}"; do
        info=$(ls_cli "$n" cluster info) || { echo "$n does not answer"; return 1; }
        v=$(ls_info_field "$info" cluster_state)
        [[ $v == ok ]] || { echo "$n: cluster_state:$v"; return 1; }
        v=$(ls_info_field "$info" cluster_known_nodes)
        [[ $v == "${#REDIS_NODES[@]}" ]] || { echo "$n: cluster_known_nodes:$v"; return 1; }
        v=$(ls_info_field "$info" cluster_slots_ok)
        [[ $v == 16384 ]] || { echo "$n: cluster_slots_ok:$v"; return 1; }
        info=$(ls_cli "$n" info replication) || { echo "$n does not answer"; return 1; }
        if [[ $(ls_info_field "$info" role) == slave ]]; then
            v=$(ls_info_field "$info" master_link_status)
            [[ $v == up ]] || { echo "$n (replica): master_link_status:$v"; return 1; }
        else
            v=$(ls_info_field "$info" connected_slaves)
            ((${v:-0} >= 1)) || { echo "$n (master): no replica"; return 1; }
            # Not grep -q: exiting at the first match would kill the writer with SIGPIPE,
            # and pipefail would fail the check.
            if grep -E '^slave[0-9]+:' <<<"$info" | grep -v 'state=online' >/dev/null; then
                echo "$n (master): a replica is not online yet"
                return 1
            fi
        fi
    done
}

# The last lines each NAME's log got since its latest start (the "====" line ls_spawn
# writes), so the output of earlier runs does not confuse the picture.
ls_print_log_tails() {
    local name
    for name in "$@"; do
        if [[ -f $RUN_DIR/$name.log ]]; then
            ls_log ""
            ls_log "---- last lines of .run/$name.log ----"
            awk '/^==== / { n = 0 } { line[n++] = $0 } END { for (i = (n > 30 ? n - 30 : 0); i < n; i++) print line[i] }' \
                "$RUN_DIR/$name.log" >&2 || true
        fi
    done
    if [[ " $* " == *" nginx "* && -s $RUN_DIR/nginx/error.log ]]; then
        ls_log ""
        ls_log "---- last lines of .run/nginx/error.log ----"
        tail -n 20 "$RUN_DIR/nginx/error.log" >&2 || true
    fi
}

# ---- stop ---------------------------------------------------------------------------

# ls_stop NAME...: TERM each (plus CONT, in case the chaos suite SIGSTOPped it), wait up
# to 10 s for all of them, then KILL what is left. Only pids recorded in .run/pids/ are
# touched; their pid files are removed.
ls_stop() {
    local name pid pids=() names=()
    for name in "$@"; do
        if pid=$(ls_service_pid "$name"); then
            kill -TERM "$pid" 2>/dev/null || true
            kill -CONT "$pid" 2>/dev/null || true
            pids+=("$pid")
            names+=("$name")
        elif [[ -f $(ls_pid_file "$name") ]]; then
            ls_log "  $name: was not running"
        fi
    done
    local deadline=$((SECONDS + ${LOCAL_STOP_TIMEOUT:-10})) i alive
    while :; do
        alive=0
        for i in "${!pids[@]}"; do
            if ls_pid_running "${pids[$i]}"; then
                alive=1
            fi
        done
        ((alive)) || break
        if ((SECONDS >= deadline)); then
            for i in "${!pids[@]}"; do
                if ls_pid_running "${pids[$i]}"; then
                    ls_log "  ${names[$i]} (pid ${pids[$i]}) ignored TERM for ${LOCAL_STOP_TIMEOUT:-10}s: KILL"
                    kill -KILL "${pids[$i]}" 2>/dev/null || true
                fi
            done
            sleep 0.2
            break
        fi
        sleep 0.1
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" 2>/dev/null || true # reap, when we are the parent
        ls_log "  ${names[$i]} (pid ${pids[$i]}) stopped"
    done
    for name in "$@"; do
        rm -f "$(ls_pid_file "$name")"
    done
}

# Stop everything: the front first, Redis last (the apps may talk to Redis on the way out).
# Every topology's Redis processes, whichever left a pid file; the Sentinels before the
# data nodes, so that they do not start a failover meanwhile.
ls_stop_all() {
    ls_stop prometheus nginx static "${APPS[@]}"
    ls_stop "${ALL_SENTINELS[@]}"
    ls_stop toxiproxy "${ALL_REDIS_NODES[@]}"
}

# ---- stack.json ---------------------------------------------------------------------

# ls_json_nodes NAME...: a JSON list of {"name", "addr", "pid"} (pid 0: not running).
ls_json_nodes() {
    local n pid sep=""
    printf '['
    for n in "$@"; do
        pid=$(ls_service_pid "$n") || pid=0
        printf '%s\n    {"name": "%s", "addr": "%s", "pid": %s}' "$sep" "$n" "$(ls_addr "$n")" "$pid"
        sep=,
    done
    printf '\n  ]'
}

# The single topology's keys, then "topology" and "redis_nodes" (every data node); for
# sentinel also "sentinels", "master_name" and "replication_proxy". In the cluster topology
# the apps have no proxy: their "redis_via" and "proxy" are "".
ls_write_stack_json() {
    local redis_pid a pid via proxy sep="" h=$LOCAL_HOST
    redis_pid=$(ls_service_pid redis) || redis_pid=0
    {
        printf '{\n'
        printf '  "nginx_url": "http://%s:%s",\n' "$h" "$LOCAL_NGINX_PORT"
        printf '  "redis_addr": "%s:%s",\n' "$h" "$LOCAL_REDIS_PORT"
        printf '  "redis_pid": %s,\n' "$redis_pid"
        printf '  "proxy_api": "http://%s:%s",\n' "$h" "$LOCAL_PROXY_API_PORT"
        printf '  "upstream_url": "http://%s:%s/static/",\n' "$h" "$LOCAL_NGINX_PORT"
        printf '  "rls_addr": "%s:%s",\n' "$h" "$LOCAL_RLS_PORT"
        # Not in the contract's keys: "" when the stack runs no prometheus.
        if [[ $LOCAL_PROMETHEUS == 1 ]]; then
            printf '  "prometheus_url": "http://%s:%s",\n' "$h" "$LOCAL_PROMETHEUS_PORT"
        else
            printf '  "prometheus_url": "",\n'
        fi
        printf '  "apps": [\n'
        for a in "${APPS[@]}"; do
            pid=$(ls_service_pid "$a") || pid=0
            via="$h:$(ls_via_port "$a")" proxy="$a-redis"
            if [[ $LOCAL_TOPOLOGY == cluster ]]; then via="" proxy=""; fi
            printf '%s    {"name": "%s", "url": "http://%s:%s", "admin_url": "http://%s:%s",\n' \
                "$sep" "$a" "$h" "$(ls_app_port "$a")" "$h" "$(ls_admin_port "$a")"
            printf '     "pid": %s, "redis_via": "%s", "proxy": "%s"}' "$pid" "$via" "$proxy"
            sep=$',\n'
        done
        printf '\n  ],\n'
        printf '  "topology": "%s",\n' "$LOCAL_TOPOLOGY"
        printf '  "redis_nodes": %s' "$(ls_json_nodes "${REDIS_NODES[@]}")"
        if [[ $LOCAL_TOPOLOGY == sentinel ]]; then
            printf ',\n  "sentinels": %s,\n' "$(ls_json_nodes "${SENTINELS[@]}")"
            printf '  "master_name": "%s",\n' "$MASTER_NAME"
            printf '  "replication_proxy": "%s"' "$REPLICATION_PROXY"
        fi
        printf '\n}\n'
    } >"$STACK_JSON.tmp"
    mv -f "$STACK_JSON.tmp" "$STACK_JSON"
}
