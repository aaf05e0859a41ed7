# shellcheck shell=bash
# Which demo stack runs, and its instances' admin URLs: for make reload and make top.
# Source scripts/lib/local-stack.sh first, and define die (prints, exits).
#   rs_pick_stack NAME VALUE: sets stack to VALUE (NAME is the variable it came from, for
#     the error) when set, else native when the native stack runs, else compose when the
#     compose one does; dies when none runs.
#   rs_admin_urls: fills the associative array admin (declare -A admin first) with each
#     app's admin URL: native from the saved settings (ls_load_settings --saved), compose
#     from the published ports (APP1_ADMIN_PORT.. from the environment or .env, 9091..
#     by default; FLEET_TOPOLOGY as for make up).

rs_native_running() {
    [[ -f $STACK_JSON ]] || return 1
    local a
    for a in "${APPS[@]}"; do
        ls_service_pid "$a" >/dev/null && return 0
    done
    return 1
}

rs_compose_running() {
    command -v docker >/dev/null 2>&1 || return 1
    [[ -n $(scripts/compose.sh ps -q app1 2>/dev/null) ]]
}

rs_pick_stack() {
    stack=$2
    if [[ -z $stack ]]; then
        if rs_native_running; then
            stack=native
        elif rs_compose_running; then
            stack=compose
        else
            die "no running stack: neither a native one ($STACK_JSON) nor the compose one (make local-up or make up)"
        fi
    fi
    case $stack in
    native | compose) ;;
    *) die "$1=$stack: want native or compose" ;;
    esac
}

# admin is the caller's associative array (shellcheck takes it for an indexed one).
# shellcheck disable=SC2004,SC2034
rs_admin_urls() {
    local a n var port
    case $stack in
    native)
        ls_load_settings --saved
        [[ -f $STACK_JSON ]] || die "no native stack is up ($STACK_JSON missing)"
        for a in "${APPS[@]}"; do
            admin[$a]="http://$LOCAL_HOST:$(ls_admin_port "$a")"
        done
        ;;
    compose)
        # shellcheck source=scripts/lib/compose-topology.sh
        source scripts/lib/compose-topology.sh
        compose_topology "${FLEET_TOPOLOGY:-single}"
        for a in "${APPS[@]}"; do
            n=$(ls_app_index "$a")
            var=APP${n}_ADMIN_PORT
            port=${!var:-}
            if [[ -z $port && -f .env ]]; then
                port=$(sed -n "s/^$var=//p" .env | tail -n 1)
            fi
            admin[$a]="http://127.0.0.1:${port:-909$n}"
        done
        ;;
    esac
}
