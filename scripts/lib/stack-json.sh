# shellcheck shell=bash
# read_stack_json FILE: parses the native stack's stack.json (make local-up) once and sets
#   STACK_REDIS_ADDR   Redis' host:port
#   STACK_APP_NAMES, STACK_APP_PIDS, STACK_APP_ADMINS   one element per app, in order
# Fails, saying why, when FILE is missing or not a stack's.
read_stack_json() {
    local out
    [[ -f $1 ]] || { echo "$1: no native stack (make local-up)" >&2; return 1; }
    out=$(python3 - "$1" <<'PY'
import json, shlex, sys
s = json.load(open(sys.argv[1]))
apps = s["apps"]
print("STACK_REDIS_ADDR=" + shlex.quote(s["redis_addr"]))
for var, field in (("STACK_APP_NAMES", "name"), ("STACK_APP_PIDS", "pid"), ("STACK_APP_ADMINS", "admin_url")):
    print(var + "=(" + " ".join(shlex.quote(str(a[field])) for a in apps) + ")")
PY
) || { echo "$1: not a stack.json" >&2; return 1; }
    eval "$out"
}
