#!/usr/bin/env bash
# `make reload`: every instance of the running stack re-reads its policy file and, when it
# serves Envoy's rate limit service, its RLS configuration directory (SIGHUP; the service
# validates the files first and keeps what runs when they are bad), then each instance's
# policy version and RLS configuration version are printed from its /status, with the
# reason when a bad file changed nothing.
#   native stack (.run/stack.json, or $LOCAL_RUN_DIR): SIGHUP to the pids in .run/pids/
#   compose stack: `compose kill -s HUP app1 app2 app3 app4`; /status on the published
#     admin ports (APP1_ADMIN_PORT..APP4_ADMIN_PORT, from the environment or .env;
#     9091..9094 by default); FLEET_TOPOLOGY (make reload TOPOLOGY=...) as for make up
# The native stack is reloaded when it runs, else the compose stack; RELOAD_STACK=native
# or compose picks one. Exit status 1 when an instance rejected its file or did not
# report the reload within RELOAD_TIMEOUT (10) seconds, 2 when no stack runs.
#
# The instances also re-read the files on their own when they change (within
# RL_HEARTBEAT_INTERVAL); this is for when that is not enough: a file that was replaced
# behind a bind mount, or an operator who wants the result now.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/running-stack.sh
source scripts/lib/running-stack.sh

die() {
    echo "reload: $*" >&2
    exit 2
}

# policy_status URL: the reload fields of URL/status on one line, separated by the ASCII
# unit separator (not whitespace: an empty field is kept): policy_reloads, policy_version,
# policy_file, policy_reload_error, then rls_config_reloads, rls_config_version,
# rls_config_dir, rls_config_reload_error (all four empty when the instance does not
# serve the rate limit service).
policy_status() {
    local body
    body=$("$CURL" -fsS --max-time 2 "$1/status" 2>/dev/null) || return 1
    python3 -c 'import json, sys
d = json.loads(sys.argv[1])
rls = "rls_config_version" in d
if rls:
    d["rls_config_reloads"] = str(d.get("rls_config_reloads") or 0)
print("\x1f".join(str(d.get(k) or "").replace("\x1f", " ").replace("\n", " ")
                for k in ("policy_reloads", "policy_version", "policy_file", "policy_reload_error",
                          "rls_config_reloads", "rls_config_version", "rls_config_dir", "rls_config_reload_error")))' "$body"
}

# ---- which stack ----------------------------------------------------------------------
CURL=$(find_bin curl) || die "curl not found (apt-get install curl)"
rs_pick_stack RELOAD_STACK "${RELOAD_STACK:-}"

# admin URLs (and the native stack's pids), one per app
declare -A admin pid
rs_admin_urls

# ---- signal -----------------------------------------------------------------------------
declare -A before before_rls
for a in "${APPS[@]}"; do
    before[$a]=unknown
    before_rls[$a]=""
    if line=$(policy_status "${admin[$a]}"); then
        IFS=$'\x1f' read -r reloads _ _ _ rls_reloads _ _ _ <<<"$line"
        before[$a]=$reloads
        before_rls[$a]=$rls_reloads
    fi
done
echo "reload: SIGHUP to every instance of the $stack stack"
case $stack in
native)
    for a in "${APPS[@]}"; do
        if [[ ${pid[$a]:-0} != 0 ]]; then
            kill -HUP "${pid[$a]}"
        else
            echo "reload: $a is not running" >&2
        fi
    done
    ;;
compose)
    scripts/compose.sh kill -s HUP "${APPS[@]}" >/dev/null
    ;;
esac

# ---- the outcome ------------------------------------------------------------------------
fail=0
deadline=$((SECONDS + ${RELOAD_TIMEOUT:-10}))
versions=() rls_versions=()
for a in "${APPS[@]}"; do
    url=${admin[$a]}
    reloads="" version="" file="" err=""
    rls_reloads="" rls_version="" rls_dir="" rls_err=""
    while :; do
        if line=$(policy_status "$url"); then
            IFS=$'\x1f' read -r reloads version file err rls_reloads rls_version rls_dir rls_err <<<"$line"
            # Both reloads are counted when they are done: the policy file's, and
            # the RLS configuration's when the instance serves it.
            if [[ ${before[$a]} != unknown && $reloads -gt ${before[$a]} &&
                (-z ${before_rls[$a]} || $rls_reloads -gt ${before_rls[$a]}) ]]; then
                break
            fi
        fi
        if ((SECONDS >= deadline)); then
            reloads=""
            break
        fi
        sleep 0.1
    done
    if [[ -z $reloads ]]; then
        printf '  %-6s did not report a reload within %ss (%s/status)\n' "$a" "${RELOAD_TIMEOUT:-10}" "$url"
        fail=1
        continue
    fi
    versions+=("$version")
    if [[ -n $err ]]; then
        printf '  %-6s policy version %s  REJECTED, the policies of that version stay: %s\n' "$a" "$version" "$err"
        fail=1
    else
        printf '  %-6s policy version %s  (%s)\n' "$a" "$version" "${file:-the embedded default: RL_POLICY_FILE is not set}"
    fi
    if [[ -z $rls_version ]]; then
        continue # no rate limit service (RL_GRPC_ADDR is not set)
    fi
    rls_versions+=("$rls_version")
    if [[ -n $rls_err ]]; then
        printf '  %-6s RLS config version %s  REJECTED, the configuration of that version stays: %s\n' "$a" "$rls_version" "$rls_err"
        fail=1
    else
        printf '  %-6s RLS config version %s  (%s)\n' "$a" "$rls_version" "$rls_dir"
    fi
done
distinct=$(printf '%s\n' ${versions[@]+"${versions[@]}"} | sort -u | wc -l)
if ((distinct > 1)); then
    echo "reload: the instances run $distinct different policy versions"
    fail=1
fi
distinct=$(printf '%s\n' ${rls_versions[@]+"${rls_versions[@]}"} | sort -u | wc -l)
if ((distinct > 1)); then
    echo "reload: the instances run $distinct different RLS configuration versions"
    fail=1
fi
exit "$fail"
