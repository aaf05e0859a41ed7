// Package native runs the native stack (make local-up, make local-down,
// scripts/local-service.sh): the demo's topology as plain processes of the
// invoking user, for machines without Docker, everything under the run
// directory (.run/ in the checkout, or LOCAL_RUN_DIR).
//
// Services, in start order (the single topology, the default):
//
//	redis       redis-server with redis/redis.conf, 127.0.0.1:6390, data in .run/redis
//	toxiproxy   bin/toxiproxy-server, API on 127.0.0.1:8474, proxies appN-redis
//	            127.0.0.1:1639N -> Redis (the fault-injection point for each app)
//	app1..app4  bin/ratelimiter, public 127.0.0.1:808N, admin 127.0.0.1:908N, Envoy's
//	            rate limit service (RL_GRPC_ADDR) 127.0.0.1:708N
//	static      a second nginx serving nginx/site/ (nginx/static.conf.template rendered
//	            into .run/static/), 127.0.0.1:8070: the upstream that is not Go, which
//	            nginx protects with auth_request (docs/DOORS.md)
//	nginx       nginx/nginx.conf.template rendered into .run/nginx/, 127.0.0.1:8080;
//	            the apps' gRPC balanced on 127.0.0.1:8090
//	prometheus  Debian's /usr/bin/prometheus, when installed (LOCAL_PROMETHEUS), on
//	            127.0.0.1:9089: scrapes every app's admin port and evaluates
//	            prometheus/rules.yml; config .run/prometheus/prometheus.yml, data in
//	            .run/prometheus/data
//
// Each one runs in the background in its own session, stdout and stderr
// appended to .run/<name>.log, its pid in .run/pids/<name>.pid.
//
// The sentinel topology has a master, a replica and three Sentinels in
// place of the one Redis:
//
//	redis, redis2  data nodes on 127.0.0.1:6390 and :6391 (redis starts as the
//	               master). Each reads its own .run/sentinel/<name>/node.conf, which
//	               includes redis/redis.conf and which Sentinel rewrites (CONFIG
//	               REWRITE) on a role change, so a node restarted after a failover
//	               keeps its new role; data in .run/sentinel/<name>/data. Up writes
//	               both files afresh (redis the master, redis2 its replica), Start
//	               only when missing.
//	sentinel1..3   redis-server --sentinel on 127.0.0.1:26390-26392, monitoring the
//	               master as "fleet" (quorum 2, down-after 1 s, failover-timeout 5 s),
//	               no password; config in .run/sentinel/sentinelN/sentinel.conf
//	               (written afresh by Up; Sentinel rewrites it)
//	toxiproxy      also has the proxy "replication" 127.0.0.1:16399 -> 127.0.0.1:6390,
//	               out of the path until the chaos suite's failover-lag points the
//	               replica at it (REPLICAOF) and then disables it, so that the replica
//	               falls behind. (A replica configured through it from the start would
//	               not stay: Sentinel re-points a replica whose master address is not
//	               the master's, failover-timeout (5 s) after it notices,
//	               +fix-slave-config in its log.)
//	the apps       find the master through the Sentinels (RL_REDIS_ADDRS = the
//	               Sentinels, RL_REDIS_MASTER_NAME=fleet); the appN-redis proxies
//	               exist but are not in their path.
//
// The cluster topology has a Redis Cluster of 3 masters with a replica each
// in place of redis:
//
//	redis, redis2..redis6  127.0.0.1:6390-6395, cluster bus on port+10000; config
//	               in .run/cluster/<name>/node.conf, cluster state (node id, slots)
//	               in .run/cluster/<name>/nodes.conf, data in
//	               .run/cluster/<name>/data. Up creates the cluster (redis-cli
//	               --cluster create, --cluster-replicas 1) when no node knows another
//	               one yet, and otherwise starts the existing one.
//	toxiproxy      runs, without proxies (their ports 16391-16394 would be the bus
//	               ports of redis2-redis5); the apps reach the nodes directly
//	               (RL_REDIS_ADDRS = all six).
//
// In both, Up waits, before it starts the apps, for the replica to be in
// sync and every Sentinel to know it and the two other Sentinels, or for
// every cluster node to report cluster_state:ok.
//
// The settings come from the environment (Load; Help lists them with
// their defaults). Up saves them in .run/stack.env, so that a later Start,
// Stop or Status (LoadSaved) acts with the same; Down needs none of them.
// Up writes .run/stack.json (Info), which Start and Stop keep current.
package native
