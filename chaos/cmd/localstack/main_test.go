package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: the commands that need no running process: help, usage errors,
// and the service commands on a stack whose up saved its settings but
// whose processes are gone.
func TestRun(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir()
	getenv := func(k string) string {
		if k == "LOCAL_RUN_DIR" {
			return runDir
		}
		return ""
	}
	call := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"-root", root, "-name", "local-service.sh"}, args...), getenv, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"help"}, 0, "  LOCAL_TOPOLOGY (single)\n", ""},
		{nil, 2, "", "usage: local-service.sh [-root DIR]"},
		{[]string{"launch"}, 2, "", "usage: local-service.sh"},
		{[]string{"up", "now"}, 2, "", "usage: local-service.sh up (no arguments"},
		{[]string{"status"}, 1, "", "error: no native stack is up (" + filepath.Join(runDir, "stack.env") + " missing): run make local-up\n"},
		{[]string{"down"}, 0, "", "native stack: nothing to stop"},
	} {
		code, stdout, stderr := call(tc.args...)
		if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.errs) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout, stderr, tc.code, tc.stdout, tc.errs)
		}
	}

	// A stack up saved the settings of, whose processes are gone.
	if err := os.WriteFile(filepath.Join(runDir, "stack.env"), []byte("LOCAL_TOPOLOGY=cluster\nLOCAL_ADMIN_PORT_BASE=20000\nLOCAL_PROMETHEUS=0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	usage := "usage: local-service.sh status | start NAME [--wipe] | stop NAME | restart NAME [--wipe]\n" +
		"NAME: redis redis2 redis3 redis4 redis5 redis6 toxiproxy app1 app2 app3 app4 static nginx   (--wipe: redis redis2 redis3 redis4 redis5 redis6 only, start without its data)\n"
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"start"}, 2, "", usage},
		{[]string{"start", "sentinel1"}, 2, "", usage},
		{[]string{"restart", "app1", "--wipe"}, 2, "", usage},
		{[]string{"stop", "redis3", "--wip"}, 2, "", usage},
		{[]string{"apps"}, 0, "app1 0 http://127.0.0.1:20001\napp2 0 http://127.0.0.1:20002\napp3 0 http://127.0.0.1:20003\napp4 0 http://127.0.0.1:20004\n", ""},
		{[]string{"setting", "LOCAL_TOPOLOGY"}, 0, "cluster\n", ""},
		{[]string{"setting", "LOCAL_SKIP_BUILD"}, 1, "", "error: LOCAL_SKIP_BUILD: not a saved setting"},
		{[]string{"status"}, 0, "redis      down\nredis2     down\n", ""},
	} {
		code, stdout, stderr := call(tc.args...)
		if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.errs) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout, stderr, tc.code, tc.stdout, tc.errs)
		}
	}

	// A bad setting stops up before anything starts, naming it.
	bad := func(k string) string {
		if k == "LOCAL_TOPOLOGY" {
			return "ring"
		}
		return getenv(k)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-root", root, "up"}, bad, &stdout, &stderr); code != 1 ||
		stderr.String() != "error: LOCAL_TOPOLOGY=ring: want single, sentinel or cluster\n" {
		t.Errorf("up with a bad topology: exit %d, stderr %q", code, stderr.String())
	}
}
