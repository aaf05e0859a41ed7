#!/usr/bin/env bash
# Static checks of the deployment files (part of `make test`):
#   1. every shell script parses (bash -n);
#   2. nginx/nginx.conf (and the static site's nginx/static.conf) is what
#      scripts/render-nginx.sh compose makes of its template, and the app addresses it
#      names are the ones docker-compose.yml gives the apps;
#   3. the compose files' default Redis password is redis/redis.conf's, and the topology
#      overlays' Redis addresses are fixed addresses of their services;
#   4. `nginx -t` accepts the native rendering (the front's and the static site's), in a
#      temp dir, without root (when run as root, the front's is checked a second time as
#      the unprivileged user `nobody`);
#   5. the compose file, alone, with the chaos suite's overrides, with each topology
#      overlay (docker-compose.sentinel.yml, docker-compose.cluster.yml) and with the policy
#      file overlay (docker-compose.policies.yml), is valid for the
#      compose CLI this machine has (`docker compose config -q` or `docker-compose ...`;
#      neither talks to the Docker engine);
#   6. the Prometheus rules, their unit tests and the compose stack's Prometheus
#      configuration, with promtool (scripts/check-prometheus.sh).
# With CI set, a missing nginx, compose CLI or promtool is a failure; otherwise a notice.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail=0
ok() { echo "check-config: ok    $*"; }
bad() {
    echo "check-config: FAIL  $*" >&2
    fail=1
}
missing() {
    if [[ -n ${CI:-} ]]; then
        bad "$* (CI is set: a missing dependency is a failure)"
    else
        echo "check-config: SKIP  $*" >&2
    fi
}

# shellcheck source=scripts/lib/find-bin.sh
. scripts/lib/find-bin.sh

# 1. shell syntax
scripts=(scripts/*.sh scripts/lib/*.sh)
[[ -f .ci/run ]] && scripts+=(.ci/run)
for f in "${scripts[@]}"; do
    bash -n "$f" || bad "bash -n $f"
done
ok "bash -n: ${#scripts[@]} scripts"

# 2. nginx/nginx.conf generated from the template, addresses in sync with compose
if diff -u nginx/nginx.conf <(scripts/render-nginx.sh compose) >/tmp/nginx-conf-drift.$$ 2>&1; then
    ok "nginx/nginx.conf matches nginx/nginx.conf.template"
else
    cat /tmp/nginx-conf-drift.$$ >&2
    bad "nginx/nginx.conf is stale: run make nginx-conf"
fi
rm -f /tmp/nginx-conf-drift.$$
if diff -u nginx/static.conf <(NGINX_TEMPLATE=nginx/static.conf.template scripts/render-nginx.sh compose) >/tmp/nginx-conf-drift.$$ 2>&1; then
    ok "nginx/static.conf matches nginx/static.conf.template"
else
    cat /tmp/nginx-conf-drift.$$ >&2
    bad "nginx/static.conf is stale: run make nginx-conf"
fi
rm -f /tmp/nginx-conf-drift.$$
for n in 1 2 3 4; do
    grep -q "server app$n:8080 " nginx/nginx.conf ||
        bad "nginx/nginx.conf does not name app$n:8080"
    grep -q "ipv4_address: \${FLEET_NET_PREFIX:-10.213}.1.1$n\$" docker-compose.yml ||
        bad "docker-compose.yml gives app$n no fixed address on the front network (nginx resolves its name once)"
done
ok "apps: nginx/nginx.conf names app1..app4, docker-compose.yml fixes their addresses"
if grep -q "server static:8080 " nginx/nginx.conf &&
    grep -q "ipv4_address: \${FLEET_NET_PREFIX:-10.213}.1.20\$" docker-compose.yml; then
    ok "static site: nginx/nginx.conf names static:8080, docker-compose.yml fixes its address"
else
    bad "nginx/nginx.conf does not name static:8080, or docker-compose.yml gives the static site no fixed address"
fi

# 3. password defaults
conf_pw=$(awk '$1 == "requirepass" { print $2; exit }' redis/redis.conf)
compose_files=(docker-compose*.yml)
mapfile -t compose_pw < <(grep -ohE '\$\{REDIS_PASSWORD:-[^}]*\}' "${compose_files[@]}" | sort -u)
if [[ ${#compose_pw[@]} -eq 1 && ${compose_pw[0]} == "\${REDIS_PASSWORD:-$conf_pw}" ]]; then
    ok "Redis password default: redis/redis.conf and ${compose_files[*]} agree"
else
    bad "the \${REDIS_PASSWORD:-...} defaults in ${compose_files[*]} (${compose_pw[*]}) differ from requirepass in redis/redis.conf ($conf_pw)"
fi

# 3b. the topology overlays: every Redis address the apps get (or the init service or
# the Sentinels use) is a node's fixed address in the same file
for f in docker-compose.sentinel.yml docker-compose.cluster.yml; do
    mapfile -t addrs < <(grep -E '^ *(RL_REDIS_ADDRS|NODES):|sentinel monitor ' "$f" |
        grep -oE '\$\{FLEET_NET_PREFIX:-10\.213\}\.2\.[0-9]+' | sort -u)
    missing_addrs=()
    for a in "${addrs[@]}"; do
        grep -qF "ipv4_address: $a" "$f" || missing_addrs+=("$a")
    done
    if ((${#addrs[@]} == 0)); then
        bad "$f: no Redis addresses found"
    elif ((${#missing_addrs[@]})); then
        bad "$f: no service has the fixed address ${missing_addrs[*]}"
    else
        ok "$f: the ${#addrs[@]} Redis addresses are fixed addresses of its services"
    fi
done

# 4. nginx -t on the native rendering
if nginx=$(find_bin nginx); then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    scripts/render-nginx.sh native "$tmp/nginx.conf" "$tmp/prefix"
    if out=$("$nginx" -t -q -p "$tmp/prefix/" -c "$tmp/nginx.conf" -e "$tmp/prefix/error.log" 2>&1); then
        ok "nginx -t (native rendering, as $(id -un))"
    else
        echo "$out" >&2
        bad "nginx -t (native rendering, as $(id -un))"
    fi
    NGINX_TEMPLATE=nginx/static.conf.template scripts/render-nginx.sh native "$tmp/static.conf" "$tmp/static"
    if out=$("$nginx" -t -q -p "$tmp/static/" -c "$tmp/static.conf" -e "$tmp/static/error.log" 2>&1); then
        ok "nginx -t (the static site's native rendering)"
    else
        echo "$out" >&2
        bad "nginx -t (the static site's native rendering)"
    fi
    if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null 2>&1 && id nobody >/dev/null 2>&1; then
        # As an ordinary user: a copy that user can read and write, rendered for it.
        utmp=$tmp/as-nobody
        mkdir -p "$utmp"
        NGINX_RUN_AS_ROOT=0 scripts/render-nginx.sh native "$utmp/nginx.conf" "$utmp/prefix"
        chmod 755 "$tmp"
        chown -R nobody "$utmp"
        if out=$(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
            "$nginx" -t -q -p "$utmp/prefix/" -c "$utmp/nginx.conf" -e "$utmp/prefix/error.log" 2>&1); then
            ok "nginx -t (native rendering, as nobody: no root needed)"
        else
            echo "$out" >&2
            bad "nginx -t (native rendering, as nobody)"
        fi
    fi
else
    missing "nginx not installed (apt-get install nginx-light): nginx -t not run"
fi

# 5. compose file
if compose=$(scripts/compose.sh --which 2>/dev/null); then
    # shellcheck disable=SC2086
    for files in "docker-compose.yml" \
        "docker-compose.yml docker-compose.chaos.yml docker-compose.toxiproxy.yml" \
        "docker-compose.yml docker-compose.sentinel.yml" \
        "docker-compose.yml docker-compose.cluster.yml" \
        "docker-compose.yml docker-compose.policies.yml"; do
        args=()
        for f in $files; do args+=(-f "$f"); done
        # (POLICY_DIR: docker-compose.policies.yml requires one)
        if out=$(COMPOSE_FILE='' POLICY_DIR=${POLICY_DIR:-.} $compose "${args[@]}" config -q 2>&1); then
            ok "$compose ${args[*]} config -q"
        else
            echo "$out" >&2
            bad "$compose ${args[*]} config -q"
        fi
    done
else
    missing "no compose CLI (apt-get install docker-compose): docker-compose.yml not validated"
fi

# 6. Prometheus
scripts/check-prometheus.sh || bad "the Prometheus files (scripts/check-prometheus.sh, above)"

if ((fail)); then
    echo "check-config: failed" >&2
    exit 1
fi
