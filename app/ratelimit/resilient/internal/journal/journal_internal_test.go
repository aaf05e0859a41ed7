package journal

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// A failed write (a full disk, a lost volume) is counted, not dropped
// silently: the grant stays in memory and the count shows in the stats.
func TestJournalWriteErrorCounted(t *testing.T) {
	j, err := Open(t.TempDir(), "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.mu.Lock()
	_ = j.f.Close() // every later write fails
	j.mu.Unlock()
	p := ratelimit.Policy{Name: "j", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute}
	for i := range 3 {
		if err := j.Append(p, store.IdentityOf("a"), store.Grant{At: int64(i), Cost: 1, ID: "r"}); err == nil {
			t.Fatal("append to a closed file: no error")
		}
	}
	if st := j.Stats(); st.WriteErrors != 3 || j.Len() != 3 {
		t.Fatalf("stats %+v, len %d: want 3 write errors and the 3 grants kept", st, j.Len())
	}
}
