#!/usr/bin/env bash
# Start, stop or restart ONE service of a running native stack, with exactly the settings
# scripts/local-up.sh used (.run/stack.env), and keep .run/pids/ and .run/stack.json
# current. Meant for poking at the stack by hand (the chaos suite does the same through
# package chaos/native):
#
#   scripts/local-service.sh status
#   scripts/local-service.sh stop app2             # TERM, 10 s, KILL
#   scripts/local-service.sh start app2            # after a crash or a kill -9
#   scripts/local-service.sh start redis --wipe    # Redis back WITHOUT its data
#   scripts/local-service.sh restart nginx
#   scripts/local-service.sh restart redis3 --wipe # (cluster topology)
#
# Services: redis toxiproxy app1 app2 app3 app4 static nginx (prometheus when it runs); with
# LOCAL_TOPOLOGY=sentinel also redis2 and sentinel1..sentinel3, with cluster redis2..redis6
# (`status` lists them). `start` waits until the service is ready (LOCAL_READY_TIMEOUT,
# 30 s; a data node or Sentinel: answers PING, not yet back in its cluster or replicating)
# and exits non-zero, with the log's tail, if not. After a toxiproxy restart the proxies
# are created again. --wipe (any data node) starts it without its data; in the sentinel and
# cluster topologies it keeps the node's own config (its role as Sentinel last rewrote it;
# its cluster node id and slots). A former master that comes back after a failover is
# turned into a replica of the new one by the Sentinels (some seconds later) or the
# cluster. (bin/localstack status|start|stop|restart.)
set -euo pipefail

# shellcheck source=scripts/lib/localstack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/localstack.sh"
case ${1:-} in
status | start | stop | restart) localstack_exec -name "$0" "$@" ;;
*)
    # (the usage line, with the services, from bin/localstack)
    localstack_exec -name "$0" start
    ;;
esac
