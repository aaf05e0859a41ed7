#!/usr/bin/env bash
# Start the native stack (no Docker): Redis, toxiproxy (one proxy per app in front of
# Redis), four rate-limiter instances, the static site and nginx (and prometheus when
# installed), all as the invoking user, everything under .run/. Waits until each is ready,
# then writes .run/stack.json.
#
#   scripts/local-up.sh                 # or: make local-up
#   LOCAL_POLICY_FILE=policies.json scripts/local-up.sh
#   LOCAL_TOPOLOGY=sentinel scripts/local-up.sh   # or: make local-up TOPOLOGY=sentinel
#   LOCAL_TOPOLOGY=cluster scripts/local-up.sh    # or: make local-up TOPOLOGY=cluster
#
# LOCAL_TOPOLOGY=sentinel puts a master, a replica and three Sentinels in place of the one
# Redis (the apps ask the Sentinels for the master); cluster, a Redis Cluster of six nodes
# (3 masters, a replica each), created on the first start. Both wait for the replicas to be
# in sync (and the Sentinels to know each other) before starting the apps.
#
# The work is bin/localstack's (chaos/cmd/localstack, package chaos/native), built here
# first. Settings (LOCAL_*, REDIS_PASSWORD, RL_API_KEY_SECRET, RL_ADMIN_TOKEN, ...):
# `bin/localstack help`, or chaos/native/settings.go. Stop with scripts/local-down.sh;
# restart one service of a running stack with scripts/local-service.sh.
set -euo pipefail

# shellcheck source=scripts/lib/localstack.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/localstack.sh"
localstack_exec -name "$0" up "$@"
