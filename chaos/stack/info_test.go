package stack

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/fleetlimit/fleetlimit/chaos/native"
)

// TestReadInfoOfNative: the stack.json package native writes reads into
// Info with every field the suite uses.
func TestReadInfoOfNative(t *testing.T) {
	n := native.Info{
		NginxURL: "http://127.0.0.1:8080", RedisAddr: "127.0.0.1:6390", RedisPID: 11,
		ProxyAPI: "http://127.0.0.1:8474", UpstreamURL: "http://127.0.0.1:8080/static/", RLSAddr: "127.0.0.1:8090",
		Apps: []native.App{{Name: "app1", URL: "http://127.0.0.1:8081", AdminURL: "http://127.0.0.1:9081", PID: 12,
			RedisVia: "127.0.0.1:16391", Proxy: "app1-redis"}},
		Topology:   "sentinel",
		RedisNodes: []native.Node{{Name: "redis", Addr: "127.0.0.1:6390", PID: 11}, {Name: "redis2", Addr: "127.0.0.1:6391"}},
		Sentinels:  []native.Node{{Name: "sentinel1", Addr: "127.0.0.1:26390", PID: 13}},
		MasterName: "fleet", ReplicationProxy: "replication",
	}
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stack.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Info{NginxURL: n.NginxURL, RedisAddr: n.RedisAddr, RedisPID: n.RedisPID, ProxyAPI: n.ProxyAPI, Apps: n.Apps,
		UpstreamURL: n.UpstreamURL, RLSAddr: n.RLSAddr, Topology: n.Topology, RedisNodes: n.RedisNodes,
		Sentinels: n.Sentinels, MasterName: n.MasterName, ReplicationProxy: n.ReplicationProxy}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadInfo:\n got %+v\nwant %+v", got, want)
	}
}
