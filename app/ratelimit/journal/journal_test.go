package journal_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/journal"
)

var jp = ratelimit.Policy{Name: "j", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Minute}

func TestJournalSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := ratelimit.IdentityOf("a"), ratelimit.IdentityOf("b")
	for i, g := range []struct {
		id ratelimit.Identity
		g  ratelimit.Grant
	}{{a, ratelimit.Grant{At: 1, Cost: 1, ID: "r1"}}, {a, ratelimit.Grant{At: 2, Cost: 2, ID: "r2"}}, {b, ratelimit.Grant{At: 3, Cost: 1, ID: "r3"}}} {
		if err := j.Append(jp, g.id, g.g); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	epoch := j.Rotate()
	pending, _ := j.Pending(epoch)
	if len(pending) != 2 {
		t.Fatalf("%d batches, want 2 (one per key)", len(pending))
	}
	for _, p := range pending {
		if p.Identity == b {
			j.Ack([]ratelimit.ReplayBatch{p}, []ratelimit.ReplayResult{{Replayed: 1}})
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// A torn last line, as a crash mid-write leaves it.
	f, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("G\t1\tj\tsliding_window_log\t10\t600")
	_ = f.Close()

	j2, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	st := j2.Stats()
	if j2.Len() != 2 || st.Reloaded != 3 || st.Corrupt != 1 || st.Epoch <= epoch {
		t.Fatalf("reopened: len %d stats %+v, want a's 2 grants (3 units), 1 corrupt line, a later epoch", j2.Len(), st)
	}
	got, _ := j2.Pending(st.Epoch)
	if len(got) != 1 || got[0].Identity != a || len(got[0].Grants) != 2 || got[0].Grants[1].ID != "r2" || got[0].Marker != "app1:"+strconv.FormatUint(epoch, 10) {
		t.Fatalf("reloaded batches %+v", got)
	}
}

func TestJournalAckEmptiesTheFile(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	_ = j.Append(jp, ratelimit.IdentityOf("a"), ratelimit.Grant{At: 1, Cost: 1, ID: "r1"})
	pending, _ := j.Pending(j.Rotate())
	j.Ack(pending, make([]ratelimit.ReplayResult, len(pending)))
	data, err := os.ReadFile(filepath.Join(dir, "journal.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "G\t") {
		t.Fatalf("file after every batch was applied:\n%s", data)
	}
}

func TestJournalOverflowIsCounted(t *testing.T) {
	j, err := journal.Open("", "app1", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range 5 {
		err := j.Append(jp, ratelimit.IdentityOf("a"), ratelimit.Grant{At: int64(i), Cost: 1, ID: "r"})
		if (i >= 2) != (err == journal.ErrFull) {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if s := j.Stats(); s.Granted != 2 || s.Overflow != 3 || s.Pending != 2 {
		t.Fatalf("stats %+v, want 2 journaled and 3 overflowed", s)
	}
}

// A journal whose file ends in damage (a torn acknowledgement, a 2 MiB tail
// of zeros without a newline, as a crash can leave it) opens, keeps the
// records before and between the damage, and counts what it skipped.
func TestJournalSkipsDamage(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := ratelimit.IdentityOf("a"), ratelimit.IdentityOf("b")
	_ = j.Append(jp, a, ratelimit.Grant{At: 1, Cost: 1, ID: "r1"})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("A\t5\tj\n") // a torn A record: 3 of its 5 fields
	_, _ = f.WriteString(strings.Repeat("x", 200<<10) + "\n")
	_ = f.Close()
	j2, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j2.Append(jp, b, ratelimit.Grant{At: 2, Cost: 1, ID: "r2"})
	_ = j2.Close()
	f, err = os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(make([]byte, 2<<20))
	_ = f.Close()

	j3, err := journal.Open(dir, "app1", 0, nil)
	if err != nil {
		t.Fatalf("open after damage: %v", err)
	}
	defer j3.Close()
	st := j3.Stats()
	if j3.Len() != 2 || st.Reloaded != 2 || st.Corrupt != 3 {
		t.Fatalf("len %d stats %+v, want both grants and 3 corrupt records (torn A, long line, zero tail)", j3.Len(), st)
	}
}

// Epochs name replay markers in Redis: a process that restarts without its
// journal (memory only, a container without its volume) must not reuse the
// last one's, or its batches would be refused as duplicates.
func TestJournalEpochsUniqueAcrossLifetimes(t *testing.T) {
	markers := map[string]bool{}
	for life := range 3 {
		j, err := journal.Open("", "app1", 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = j.Append(jp, ratelimit.IdentityOf("a"), ratelimit.Grant{At: 1, Cost: 1, ID: "r"})
		pending, _ := j.Pending(j.Rotate())
		for _, b := range pending {
			if markers[b.Marker] {
				t.Fatalf("life %d: marker %s already used by an earlier process", life, b.Marker)
			}
			markers[b.Marker] = true
		}
		_ = j.Close()
		time.Sleep(time.Millisecond)
	}
}
