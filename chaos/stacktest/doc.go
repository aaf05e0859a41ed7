// Package stacktest holds the end-to-end test of the native stack: it starts
// scripts/local-up.sh from the checkout (Redis, toxiproxy, four instances of
// cmd/ratelimiter, nginx) in its own temp dir (LOCAL_RUN_DIR) on free ports,
// checks the contract's HTTP surface through nginx, kills and restarts Redis,
// and stops everything with scripts/local-down.sh.
//
// The test needs redis-server, redis-cli, nginx and curl; without them it
// skips, or fails when the environment variable CI is set (the rule of the
// Redis test helpers). The package has no code outside its tests.
package stacktest
