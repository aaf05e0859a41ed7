#!/usr/bin/env bash
# scripts/keys.sh N: print N new API keys, one per line, that the running stack accepts:
# signed with its RL_API_KEY_SECRET (the first of a comma-separated list). The secret is
# the native stack's (.run/stack.env, or $LOCAL_RUN_DIR/stack.env) when one is up, else
# RL_API_KEY_SECRET from the environment, else the one in .env (which compose reads),
# else the demo stacks' default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

n=${1:-1}
if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 100000)); then
    echo "keys: N must be a number from 1 to 100000, got '$n'" >&2
    exit 2
fi
secret=
stack_env=${LOCAL_RUN_DIR:-.run}/stack.env
if [[ -f $stack_env ]]; then
    secret=$(sed -n 's/^RL_API_KEY_SECRET=//p' "$stack_env" | tail -n 1)
    # stack.env holds printf %q values: undo the quoting without evaluating the file.
    [[ -z $secret ]] || secret=$(bash -c 'eval "printf %s $1"' _ "$secret")
fi
if [[ -z $secret ]]; then
    secret=${RL_API_KEY_SECRET:-}
fi
if [[ -z $secret && -f .env ]]; then
    secret=$(sed -n 's/^RL_API_KEY_SECRET=//p' .env | tail -n 1)
fi
secret=${secret:-fleetlimit-demo-secret-change-me}
RL_API_KEY_SECRET=$secret exec go run ./app/cmd/ratelimiter -keys "$n"
