#!/usr/bin/env bash
# Stop the native stack started by scripts/local-up.sh: only the processes whose pid files
# .run/pids/ lists (and that are still the programs it started). TERM, up to 10 s
# (LOCAL_STOP_TIMEOUT), then KILL. Removes the pid files, .run/stack.json and
# .run/stack.env; keeps the logs and Redis' data. Whatever LOCAL_TOPOLOGY the stack has: it
# stops every data node and Sentinel that left a pid file. (bin/localstack down.)
set -euo pipefail

# shellcheck source=scripts/lib/localstack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/localstack.sh"
localstack_exec -name "$0" down "$@"
