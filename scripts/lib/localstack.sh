# shellcheck shell=bash
# bin/localstack, the native stack's command (chaos/cmd/localstack, package chaos/native),
# for the scripts that drive the native stack. Sourced, not executed.
#   localstack_build         builds bin/localstack (go build: a moment when nothing changed);
#                            with LOCAL_SKIP_BUILD=1 an existing one is used as it is
#   localstack_run ARGS...   runs it on this checkout
#   localstack_exec ARGS...  execs it on this checkout

LOCALSTACK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOCALSTACK_BIN=$LOCALSTACK_ROOT/bin/localstack
# shellcheck source=scripts/lib/find-bin.sh
. "$LOCALSTACK_ROOT/scripts/lib/find-bin.sh"

localstack_build() {
    if [[ ${LOCAL_SKIP_BUILD:-} == 1 && -x $LOCALSTACK_BIN ]]; then
        return 0
    fi
    local go
    go=$(find_bin go) || {
        echo "error: go not found in PATH (needed to build bin/localstack)" >&2
        return 1
    }
    [[ -x $LOCALSTACK_BIN ]] || echo "building bin/localstack" >&2
    (cd "$LOCALSTACK_ROOT/chaos" && "$go" build -o ../bin/localstack ./cmd/localstack) || {
        echo "error: go build ./cmd/localstack (in chaos/) failed" >&2
        return 1
    }
}

localstack_run() {
    localstack_build && "$LOCALSTACK_BIN" -root "$LOCALSTACK_ROOT" "$@"
}

localstack_exec() {
    localstack_build || exit 1
    exec "$LOCALSTACK_BIN" -root "$LOCALSTACK_ROOT" "$@"
}
