package journal

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

func sampleRecords() []record {
	p := ratelimit.Policy{Name: "gcra", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second, Burst: 20}
	id := store.IdentityOf("k:alice")
	st := contract.State{Now: 1_700_000_000_000_000, Tokens: 5, TAT: 1_700_000_001_000_000, TATRem: 3, WindowStart: 9, Current: 2, Previous: 1}
	st.Ages[3] = 4
	return []record{
		{kind: 'E', epoch: 42},
		{kind: 'G', epoch: 42, policy: p, identity: id, grant: store.Grant{At: 1_700_000_000_500_000, Cost: 2, ID: "0b6e2f"}},
		{kind: 'G', epoch: 42, policy: p, identity: id, grant: store.Grant{At: -1, Cost: 1}},
		{kind: 'A', epoch: 42, policy: ratelimit.Policy{Name: p.Name}, fingerprint: fingerprint(p), identity: id},
		{kind: 'X', policy: ratelimit.Policy{Name: p.Name}, fingerprint: fingerprint(p), identity: id, grant: store.Grant{At: 1700000000123456}},
		{kind: 'S', epoch: 42, policy: p, identity: id, valid: true, n: 3.5, confirmed: 77, state: st},
	}
}

// TestRecordRoundTrip: every kind of record reads back as written.
func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		line := appendRecord(nil, r)
		got, err := parseRecord(strings.TrimSuffix(string(line), "\n"))
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if got != r {
			t.Errorf("%q read back as %+v, want %+v", line, got, r)
		}
	}
}

// FuzzRecord: parsing never panics, and whatever parses is written back as
// the same line (the codec is symmetric, so a reloaded journal is the one
// written).
func FuzzRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(strings.TrimSuffix(string(appendRecord(nil, r)), "\n"))
	}
	f.Add("G\t1\tx")
	f.Add("S\t1\tgcra\tgcra\t1\t1\t0\t" + strings.Repeat("0", 64) + "\t1\tNaN")
	f.Fuzz(func(t *testing.T, line string) {
		r, err := parseRecord(line)
		if err != nil {
			return
		}
		if got := string(appendRecord(nil, r)); got != line+"\n" {
			t.Fatalf("%q parsed, but is written back as %q", line, got)
		}
	})
}

// FuzzLoad: a journal file of any bytes opens (nothing fatal), and a good
// record after the damage is still read.
func FuzzLoad(f *testing.F) {
	var good []byte
	for _, r := range sampleRecords() {
		good = appendRecord(good, r)
	}
	f.Add(good)
	f.Add([]byte("G\t1\tgcra\tgcra\t100\t10000000\t20\tzz\t1\t1\tx\n"))
	f.Add(append([]byte("S\t1\t"), make([]byte, 3<<20)...))
	last := sampleRecords()[2]
	last.epoch, last.identity = 7, store.IdentityOf("k:after")
	tail := appendRecord(nil, last)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		content := append(append(append([]byte{}, data...), '\n'), tail...)
		if err := os.WriteFile(filepath.Join(dir, journalFile), content, 0o600); err != nil {
			t.Fatal(err)
		}
		j, err := Open(dir, "fuzz", 0, logger)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer j.Close()
		found, units := false, uint64(0)
		pending, _ := j.Pending(^uint64(0))
		for _, b := range pending {
			found = found || b.Identity == last.identity
			for _, g := range b.Grants {
				units += uint64(g.Cost)
			}
		}
		if !found {
			t.Fatalf("the grant after %d bytes of damage was not read", len(data))
		}
		// Stats keeps Pending as a running count (read on every /status):
		// it must agree with the grants held, whatever the file held.
		if s := j.Stats(); s.Pending != units || s.Reloaded != units {
			t.Fatalf("stats pending %d, reloaded %d; the batches hold %d", s.Pending, s.Reloaded, units)
		}
		if err := j.Stats().Reconcile(); err != nil {
			t.Fatal(err)
		}
	})
}
