#!/usr/bin/env bash
# `make top [POLICY=<name>]`: the identities the running stack refused most over the last
# minute, summed over its four instances. Each instance's GET /admin/top (its own
# refusals per policy, a Space-Saving top of 16; see docs/OPERATIONS.md) is read with the
# stack's admin token, and the answers are summed per policy and identity into one table,
# most refused first: the sum, the sum of the errors (refused - error <= true <= refused
# where every instance lists the identity), and each instance's count, '-' where the
# identity is not among that instance's top (it was refused there at most as often as
# that instance's last entry).
#   native stack (.run/stack.json, or $LOCAL_RUN_DIR): admin ports and RL_ADMIN_TOKEN from
#     the settings local-up saved (.run/stack.env)
#   compose stack: the published admin ports (APP1_ADMIN_PORT..APP4_ADMIN_PORT, from the
#     environment or .env; 9091..9094 by default); RL_ADMIN_TOKEN from the environment,
#     else .env, else the demo stacks' token
# The first token of a comma-separated RL_ADMIN_TOKEN is sent. The native stack is read
# when it runs, else the compose stack; TOP_STACK=native or compose picks one; TOP_ROWS
# (16) bounds the rows per policy. Exit status 1 when an instance did not answer (what
# the others answered is still printed), 2 when no stack runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/running-stack.sh
source scripts/lib/running-stack.sh

die() {
    echo "top: $*" >&2
    exit 2
}

policy=${1:-}
rows=${TOP_ROWS:-16}
[[ $rows =~ ^[1-9][0-9]*$ ]] || die "TOP_ROWS=$rows: want a number of rows, at least 1"
[[ -z $policy || $policy =~ ^[A-Za-z0-9_.-]{1,64}$ ]] || die "POLICY=$policy: not a policy name"

# ---- which stack ----------------------------------------------------------------------
CURL=$(find_bin curl) || die "curl not found (apt-get install curl)"
rs_pick_stack TOP_STACK "${TOP_STACK:-}"

# admin URLs, one per app, and the token
# shellcheck disable=SC2034 # (pid: the native apps' pids, not needed here)
declare -A admin pid
rs_admin_urls
if [[ $stack == native ]]; then
    token=$(rs_native_setting RL_ADMIN_TOKEN)
else
    token=${RL_ADMIN_TOKEN:-}
    if [[ -z $token && -f .env ]]; then
        token=$(sed -n 's/^RL_ADMIN_TOKEN=//p' .env | tail -n 1)
    fi
    token=${token:-fleetlimit-demo-admin-token-change-me}
fi
token=${token%%,*}
[[ $token != *[\"\\]* ]] || die "RL_ADMIN_TOKEN holds a quote or a backslash"

# ---- ask every instance -----------------------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
query=
[[ -z $policy ]] || query="?policy=$policy"
fail=0
answers=()
for a in "${APPS[@]}"; do
    url="${admin[$a]}/admin/top$query"
    # The token goes through curl's config on stdin, not its command line (ps shows that).
    if code=$(printf 'header = "Authorization: Bearer %s"\n' "$token" |
        "$CURL" -sS --max-time 2 -K - -o "$tmp/$a.json" -w '%{http_code}' "$url" 2>"$tmp/$a.err"); then
        if [[ $code == 200 ]]; then
            answers+=("$a=$tmp/$a.json")
            continue
        fi
        detail="HTTP $code"
        [[ $code != 401 ]] || detail+=" (not this stack's RL_ADMIN_TOKEN?)"
    else
        detail=$(tr '\n' ' ' <"$tmp/$a.err")
    fi
    echo "top: $a did not answer ($url): $detail" >&2
    fail=1
done
((${#answers[@]} > 0)) || die "no instance of the $stack stack answered"

# ---- sum ----------------------------------------------------------------------------------
python3 - "$stack" "$rows" "${answers[@]}" <<'EOF'
import json, sys

stack, rows, answers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
apps = []
since = []
total = {}  # (policy, identity) -> [refused, error, {app: refused}]
for arg in answers:
    app, path = arg.split("=", 1)
    apps.append(app)
    with open(path) as f:
        d = json.load(f)
    since.append(d.get("since", "?"))
    for p in d.get("policies") or []:
        for e in p.get("top") or []:
            t = total.setdefault((p["policy"], e["identity"]), [0, 0, {}])
            t[0] += e["refused"]
            t[1] += e["error"]
            t[2][app] = e["refused"]

print(f"top: refusals over the last minute (since {min(since)}), the {stack} stack, summed over {' '.join(apps)}")
if not total:
    print("top: no refusals")
    sys.exit(0)
width = max(len("identity"), max(min(len(i), 48) for _, i in total))
pwidth = max(len("policy"), max(len(p) for p, _ in total))
print(f"{'policy':<{pwidth}}  {'identity':<{width}}  {'refused':>8}  {'error':>6}  " + "  ".join(f"{a:>6}" for a in apps))
shown = {}
for (policy, identity), (refused, error, per) in sorted(total.items(), key=lambda kv: (kv[0][0], -kv[1][0], kv[1][1], kv[0][1])):
    shown[policy] = shown.get(policy, 0) + 1
    if shown[policy] > rows:
        continue
    if len(identity) > 48:
        identity = identity[:45] + "..."
    cols = "  ".join(f"{per[a] if a in per else '-':>6}" for a in apps)
    print(f"{policy:<{pwidth}}  {identity:<{width}}  {refused:>8}  {error:>6}  {cols}")
for policy, n in sorted(shown.items()):
    if n > rows:
        print(f"top: {policy}: {n - rows} more identities not shown (TOP_ROWS={rows})")
EOF
exit "$fail"
