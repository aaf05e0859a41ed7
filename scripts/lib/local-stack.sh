# shellcheck shell=bash
# Shared by scripts/local-up.sh, scripts/local-down.sh and scripts/local-service.sh: the
# native stack's settings, and how to start, check and stop each of its processes.
# Sourced, not executed.
#
# Services, in start order:
#   redis      redis-server with redis/redis.conf, 127.0.0.1:6390, data in .run/redis
#   toxiproxy  bin/toxiproxy-server, API on 127.0.0.1:8474, proxies appN-redis
#              127.0.0.1:1639N -> Redis (the fault-injection point for each app)
#   app1..app4 bin/ratelimiter, public 127.0.0.1:808N, admin 127.0.0.1:908N
#   nginx      nginx/nginx.conf.template rendered into .run/nginx/, 127.0.0.1:8080
# Each one runs in the background in its own session, stdout+stderr appended to
# .run/<name>.log, pid in .run/pids/<name>.pid.
#
# Settings (environment; local-up.sh saves them in .run/stack.env so that later calls of
# local-service.sh and local-down.sh use the same):
#   LOCAL_HOST=127.0.0.1  LOCAL_NGINX_PORT=8080  LOCAL_REDIS_PORT=6390
#   LOCAL_PROXY_API_PORT=8474  LOCAL_APP_PORT_BASE=8080 (appN on base+N)
#   LOCAL_ADMIN_PORT_BASE=9080 (appN admin on base+N)  LOCAL_VIA_PORT_BASE=16390
#   REDIS_PASSWORD (default: requirepass in redis/redis.conf)
#   LOCAL_POLICY_FILE (optional JSON policy file, passed to the apps as RL_POLICY_FILE)
#   RL_API_KEY_SECRET (default: the demo secret, fleetlimit-demo-secret-change-me)
#   LOCAL_READY_TIMEOUT=30 (seconds)  LOCAL_SKIP_BUILD=1 (use the binaries in bin/ as is)
#   LOCAL_REDIS_TIMEOUT=50ms (RL_REDIS_TIMEOUT of the apps)
#   LOCAL_LOG_LEVEL=debug (RL_LOG_LEVEL of the apps: debug logs a line per request)
#   LOCAL_REDIS_DIRECT=0 (1: the apps dial Redis itself, not their fault proxy; the chaos
#   suite's partition and latency faults then do not reach them)
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
SERVICES=(redis toxiproxy "${APPS[@]}" nginx)

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
    LOCAL_HOST=${LOCAL_HOST:-127.0.0.1}
    LOCAL_NGINX_PORT=${LOCAL_NGINX_PORT:-8080}
    LOCAL_REDIS_PORT=${LOCAL_REDIS_PORT:-6390}
    LOCAL_PROXY_API_PORT=${LOCAL_PROXY_API_PORT:-8474}
    LOCAL_APP_PORT_BASE=${LOCAL_APP_PORT_BASE:-8080}
    LOCAL_ADMIN_PORT_BASE=${LOCAL_ADMIN_PORT_BASE:-9080}
    LOCAL_VIA_PORT_BASE=${LOCAL_VIA_PORT_BASE:-16390}
    LOCAL_REDIS_DIRECT=${LOCAL_REDIS_DIRECT:-0}
    LOCAL_LOG_LEVEL=${LOCAL_LOG_LEVEL:-debug}
    LOCAL_READY_TIMEOUT=${LOCAL_READY_TIMEOUT:-30}
    LOCAL_REDIS_TIMEOUT=${LOCAL_REDIS_TIMEOUT:-50ms}
    LOCAL_POLICY_FILE=${LOCAL_POLICY_FILE:-}
    # The API-key secret (comma-separated; the first signs): the demo's unless set.
    RL_API_KEY_SECRET=${RL_API_KEY_SECRET:-fleetlimit-demo-secret-change-me}
    if [[ -n $LOCAL_POLICY_FILE ]]; then
        [[ -f $LOCAL_POLICY_FILE ]] || ls_die "LOCAL_POLICY_FILE=$LOCAL_POLICY_FILE: no such file"
        LOCAL_POLICY_FILE=$(cd "$(dirname "$LOCAL_POLICY_FILE")" && pwd)/$(basename "$LOCAL_POLICY_FILE")
    fi
    if [[ -z ${REDIS_PASSWORD:-} ]]; then
        REDIS_PASSWORD=$(awk '$1 == "requirepass" { print $2; exit }' "$LS_ROOT/redis/redis.conf")
        REDIS_PASSWORD=${REDIS_PASSWORD%\"}
        REDIS_PASSWORD=${REDIS_PASSWORD#\"}
    fi
    [[ -n $REDIS_PASSWORD ]] || ls_die "no Redis password (requirepass in redis/redis.conf or REDIS_PASSWORD)"
}

ls_save_settings() {
    mkdir -p "$RUN_DIR"
    {
        echo "# written by scripts/local-up.sh: the settings of the running native stack"
        local v
        for v in LOCAL_HOST LOCAL_NGINX_PORT LOCAL_REDIS_PORT LOCAL_PROXY_API_PORT \
            LOCAL_APP_PORT_BASE LOCAL_ADMIN_PORT_BASE LOCAL_VIA_PORT_BASE \
            LOCAL_READY_TIMEOUT LOCAL_REDIS_TIMEOUT LOCAL_POLICY_FILE REDIS_PASSWORD \
            RL_API_KEY_SECRET LOCAL_REDIS_DIRECT LOCAL_LOG_LEVEL; do
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

# Every TCP port the stack listens on.
ls_all_ports() {
    local a
    echo "$LOCAL_REDIS_PORT" "$LOCAL_PROXY_API_PORT" "$LOCAL_NGINX_PORT"
    for a in "${APPS[@]}"; do
        echo "$(ls_app_port "$a")" "$(ls_admin_port "$a")" "$(ls_via_port "$a")"
    done
}

ls_ports_of() {
    case $1 in
    redis) echo "$LOCAL_REDIS_PORT" ;;
    toxiproxy)
        local a
        echo "$LOCAL_PROXY_API_PORT"
        for a in "${APPS[@]}"; do ls_via_port "$a"; done
        ;;
    nginx) echo "$LOCAL_NGINX_PORT" ;;
    app*) echo "$(ls_app_port "$1")" "$(ls_admin_port "$1")" ;;
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
    redis) echo redis-server ;;
    toxiproxy) echo toxiproxy-server ;;
    nginx) echo nginx ;;
    app*) echo ratelimiter ;;
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
    local wipe=${1:-}
    mkdir -p "$RUN_DIR/redis"
    if [[ $wipe == --wipe ]]; then
        ls_log "redis: wiping its data ($RUN_DIR/redis)"
        rm -rf "${RUN_DIR:?}/redis"
        mkdir -p "$RUN_DIR/redis"
    fi
    ls_spawn redis "$REDIS_SERVER" "$LS_ROOT/redis/redis.conf" \
        --port "$LOCAL_REDIS_PORT" --bind "$LOCAL_HOST" --dir "$RUN_DIR/redis" \
        --daemonize no --protected-mode no --requirepass "$REDIS_PASSWORD"
}

ls_start_toxiproxy() {
    ls_spawn toxiproxy "$LS_ROOT/bin/toxiproxy-server" -host "$LOCAL_HOST" -port "$LOCAL_PROXY_API_PORT"
}

# The proxies appN-redis, created (or left as they are, if they exist) through the API.
ls_populate_proxies() {
    local a body="[" sep=""
    for a in "${APPS[@]}"; do
        body+="$sep{\"name\":\"$a-redis\",\"listen\":\"$LOCAL_HOST:$(ls_via_port "$a")\","
        body+="\"upstream\":\"$LOCAL_HOST:$LOCAL_REDIS_PORT\",\"enabled\":true}"
        sep=","
    done
    body+="]"
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
        "RL_REDIS_URL=redis://:$(ls_urlencode "$REDIS_PASSWORD")@$LOCAL_HOST:$redis_port/0"
        "RL_REDIS_TIMEOUT=$LOCAL_REDIS_TIMEOUT"
        "RL_LOG_LEVEL=$LOCAL_LOG_LEVEL"
        "RL_EXPECTED_INSTANCES=${#APPS[@]}"
        "RL_DEBUG_HEADERS=true"
        "RL_TRUSTED_PROXIES=127.0.0.1/32,::1/128"
        "RL_JOURNAL_DIR=$RUN_DIR/$a/journal"
        "RL_API_KEY_SECRET=$RL_API_KEY_SECRET"
    )
    if [[ -n $LOCAL_POLICY_FILE ]]; then
        envs+=("RL_POLICY_FILE=$LOCAL_POLICY_FILE")
    fi
    # -u: settings from the caller's environment that would change the topology.
    ls_spawn "$a" env -u RL_REDIS_ADDRS -u RL_REDIS_MASTER_NAME -u RL_POLICY_FILE \
        "${envs[@]}" "$LS_ROOT/bin/ratelimiter"
}

ls_start_nginx() {
    "$LS_ROOT/scripts/render-nginx.sh" native "$RUN_DIR/nginx/nginx.conf" "$RUN_DIR/nginx"
    ls_spawn nginx "$NGINX" -p "$RUN_DIR/nginx/" -c "$RUN_DIR/nginx/nginx.conf" \
        -e "$RUN_DIR/nginx/error.log" -g 'daemon off;'
}

ls_start() {
    case $1 in
    redis) ls_start_redis "${2:-}" ;;
    toxiproxy) ls_start_toxiproxy ;;
    app[1-4]) ls_start_app "$1" ;;
    nginx) ls_start_nginx ;;
    *) ls_die "unknown service: $1 (one of: ${SERVICES[*]})" ;;
    esac
}

# ---- readiness ----------------------------------------------------------------------

ls_probe() {
    case $1 in
    redis)
        [[ $(REDISCLI_AUTH=$REDIS_PASSWORD "$REDIS_CLI" -h "$LOCAL_HOST" -p "$LOCAL_REDIS_PORT" ping 2>/dev/null) == PONG ]]
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
ls_stop_all() {
    ls_stop nginx "${APPS[@]}"
    ls_stop toxiproxy redis
}

# ---- stack.json ---------------------------------------------------------------------

ls_write_stack_json() {
    local redis_pid a pid sep="" h=$LOCAL_HOST
    redis_pid=$(ls_service_pid redis) || redis_pid=0
    {
        printf '{\n'
        printf '  "nginx_url": "http://%s:%s",\n' "$h" "$LOCAL_NGINX_PORT"
        printf '  "redis_addr": "%s:%s",\n' "$h" "$LOCAL_REDIS_PORT"
        printf '  "redis_pid": %s,\n' "$redis_pid"
        printf '  "proxy_api": "http://%s:%s",\n' "$h" "$LOCAL_PROXY_API_PORT"
        printf '  "apps": [\n'
        for a in "${APPS[@]}"; do
            pid=$(ls_service_pid "$a") || pid=0
            printf '%s    {"name": "%s", "url": "http://%s:%s", "admin_url": "http://%s:%s",\n' \
                "$sep" "$a" "$h" "$(ls_app_port "$a")" "$h" "$(ls_admin_port "$a")"
            printf '     "pid": %s, "redis_via": "%s:%s", "proxy": "%s-redis"}' \
                "$pid" "$h" "$(ls_via_port "$a")" "$a"
            sep=$',\n'
        done
        printf '\n  ]\n}\n'
    } >"$STACK_JSON.tmp"
    mv -f "$STACK_JSON.tmp" "$STACK_JSON"
}
