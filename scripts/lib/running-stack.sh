# shellcheck shell=bash
# Which demo stack runs, and its instances' admin URLs: for make reload and make top.
# Define die (prints, exits) first; the scripts run from the checkout.
#   rs_pick_stack NAME VALUE: sets stack to VALUE (NAME is the variable it came from, for
#     the error) when set, else native when the native stack runs, else compose when the
#     compose one does; dies when none runs.
#   rs_admin_urls: fills the associative arrays admin and pid (declare -A admin pid first)
#     with each app's admin URL and, native only, its pid (0: not running): native from
#     bin/localstack apps (the settings its up saved), compose from the published ports
#     (APP1_ADMIN_PORT.. from the environment or .env, 9091.. by default; FLEET_TOPOLOGY as
#     for make up).
#   rs_native_setting NAME: prints a setting the native stack's up saved.

# shellcheck source=scripts/lib/localstack.sh
source scripts/lib/localstack.sh
APPS=(app1 app2 app3 app4)
STACK_JSON=${LOCAL_RUN_DIR:-.run}/stack.json

# (bin/localstack is built only when a native stack left its stack.json: a compose user
# does not wait for it.)
rs_native_running() {
    [[ -f $STACK_JSON ]] || return 1
    local p
    while read -r _ p _; do
        [[ $p == 0 ]] || return 0
    done < <(localstack_run apps 2>/dev/null)
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

rs_native_setting() {
    localstack_run setting "$1" || die "no setting $1 of the native stack"
}

# admin and pid are the caller's associative arrays (shellcheck takes them for indexed ones).
# shellcheck disable=SC2004,SC2034
rs_admin_urls() {
    local a n var port lines
    case $stack in
    native)
        [[ -f $STACK_JSON ]] || die "no native stack is up ($STACK_JSON missing)"
        lines=$(localstack_run apps) || die "the native stack's apps: bin/localstack apps failed"
        while read -r a n port; do
            admin[$a]=$port
            pid[$a]=$n
        done <<<"$lines"
        ;;
    compose)
        # shellcheck source=scripts/lib/compose-topology.sh
        source scripts/lib/compose-topology.sh
        compose_topology "${FLEET_TOPOLOGY:-single}"
        for a in "${APPS[@]}"; do
            n=${a#app}
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
