#!/usr/bin/env bash
# The Prometheus files, checked with promtool (part of `make test`, through
# scripts/check-config.sh):
#   1. promtool check rules prometheus/rules.yml    (syntax, PromQL, templates)
#   2. promtool test rules prometheus/rules_test.yml (series fed to every alert: it fires
#      where it should and not where it should not)
#   3. promtool check config prometheus/prometheus.yml (the compose stack's configuration,
#      which loads the rules)
# promtool comes with Debian's `prometheus` package (make deps installs it). With CI set, a
# missing promtool is a failure; otherwise a notice.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/find-bin.sh
. scripts/lib/find-bin.sh

if ! promtool=$(find_bin promtool); then
    if [[ -n ${CI:-} ]]; then
        echo "check-prometheus: FAIL  promtool not installed (apt-get install prometheus; CI is set: a missing dependency is a failure)" >&2
        exit 1
    fi
    echo "check-prometheus: SKIP  promtool not installed (apt-get install prometheus, or make deps): the rules are not checked" >&2
    exit 0
fi

fail=0
check() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then
        echo "check-prometheus: ok    $what"
    else
        echo "$out" >&2
        echo "check-prometheus: FAIL  $what" >&2
        fail=1
    fi
}
check "promtool check rules prometheus/rules.yml" "$promtool" check rules prometheus/rules.yml
check "promtool test rules prometheus/rules_test.yml" "$promtool" test rules prometheus/rules_test.yml
check "promtool check config prometheus/prometheus.yml" "$promtool" check config prometheus/prometheus.yml
exit "$fail"
