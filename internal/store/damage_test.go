package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
)

// writeFixture writes a state file like a busy csid's: n volumes created
// by ops, a third of them with a queued resize and a note, and one create
// still in flight. With 60 volumes the volumes bucket needs a branch page.
func writeFixture(t testing.TB, path string, n int, opts Options) {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	for i := range n {
		id := fmt.Sprintf("vol-%020d", i)
		v := &Volume{ID: id, Name: fmt.Sprintf("pvc-%d", i), State: fsm.Absent, Parameters: map[string]string{"type": "ssd"},
			Capability: Capability{AccessType: "mount", FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER"}, CreatedAt: now}
		if err := s.Update(func(tx *Tx) error {
			return tx.Accept(v.Clone(), &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created, CreatedAt: now})
		}); err != nil {
			t.Fatal(err)
		}
		if i == n-1 {
			break // left in flight
		}
		err := s.Update(func(tx *Tx) error {
			v, err := tx.Volume(id)
			if err != nil {
				return err
			}
			op, err := tx.Op(v.ActiveOp)
			if err != nil {
				return err
			}
			op.Status, op.FinishedAt = OpSucceeded, now
			v.State, v.DiskID, v.CapacityBytes, v.Generation = fsm.Created, fmt.Sprintf("disk-%016x", i), 64<<20, 1
			if err := tx.Finish(v, op); err != nil {
				return err
			}
			if i%3 != 0 {
				return nil
			}
			if err := tx.PutResize(&Resize{VolumeID: id, TargetBytes: 128 << 20, Status: ResizeQueued, QueuedAt: now, UpdatedAt: now}); err != nil {
				return err
			}
			return tx.AddNote(id, HistoryEntry{Time: now, Event: fsm.Expand, Guard: fsm.Deferred, From: fsm.Created, To: fsm.Created,
				Generation: 1, Outcome: "queued resize to 134217728 bytes"})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot of the first volume, cut, after every volume's op.
	cutSnapshot(t, s, fixtureSnapshot, "vs-0", "vol-00000000000000000000", true)
}

// fixtureSnapshot is the snapshot writeFixture cuts.
const fixtureSnapshot = "snap-00000000000000000000"

// readEverything reads every record the way csid does at start and when
// inspected.
func readEverything(s *Store) error {
	return s.View(func(tx *Tx) error {
		if _, err := tx.ActiveOps(); err != nil {
			return err
		}
		if err := tx.ForEachVolume("", func(v *Volume) bool { _, _ = tx.Resize(v.ID); return true }); err != nil {
			return err
		}
		if _, err := tx.CountVolumesByState(); err != nil {
			return err
		}
		if _, err := tx.CountSnapshotsByState(); err != nil {
			return err
		}
		if err := tx.ForEachSnapshot("", func(s *Snapshot) bool { _, _ = tx.SnapshotIDByName(s.Name); return true }); err != nil {
			return err
		}
		if err := tx.ForEachOp(func(*Op) bool { return true }); err != nil {
			return err
		}
		if _, err := tx.Histories(); err != nil {
			return err
		}
		return tx.ForEachResize(func(*Resize) bool { return true })
	})
}

// fileMeta reads the page size and the high-water mark (in pages) of the
// meta page bbolt uses.
func fileMeta(t testing.TB, raw []byte) (pageSize, pages int) {
	t.Helper()
	le := binary.LittleEndian
	meta := func(off int) (ps, pgid, txid uint64) {
		m := raw[off+16:]
		return uint64(le.Uint32(m[8:])), le.Uint64(m[40:]), le.Uint64(m[48:])
	}
	ps, pgid, txid := meta(0)
	if _, pgid1, txid1 := meta(int(ps)); txid1 > txid {
		pgid = pgid1
	}
	return int(ps), int(pgid)
}

// tryOpen opens a copy of raw read-write and read-only, and reads every
// record. It fails the test if anything panics, if a refusal is not the
// clear one, or if a refusal modified the file.
func tryOpen(t *testing.T, dir, name string, raw []byte) (err error) {
	t.Helper()
	path := filepath.Join(dir, name)
	for _, readOnly := range []bool{true, false} {
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		open := Open
		if readOnly {
			open = OpenReadOnly
		}
		s, oerr := open(path, Options{LockTimeout: 100 * time.Millisecond})
		if oerr != nil {
			if !errors.Is(oerr, ErrCorrupt) || !strings.Contains(oerr.Error(), path) || !strings.Contains(oerr.Error(), "csid state verify --db "+path) {
				t.Fatalf("%s (read-only %v): the refusal is not the clear one: %v", name, readOnly, oerr)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, raw) {
				t.Fatalf("%s: refusing the file modified it", name)
			}
			err = oerr
			continue
		}
		rerr := readEverything(s)
		s.Close()
		if err == nil {
			err = rerr
		}
	}
	return err
}

// TestDamagedFileIsRefusedNotPanicked: files cut short (to half, 16384 and
// 8192 bytes: each made csid exit with a panic from bbolt) and files with a
// bit flipped in every page header are refused with the clear message, or
// read, but never panic.
func TestDamagedFileIsRefusedNotPanicked(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "fixture.db")
	writeFixture(t, src, 60, Options{})
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	ps, pages := fileMeta(t, raw)
	if pages < 8 {
		t.Fatalf("the fixture holds %d pages; it should need branch pages", pages)
	}
	for _, n := range []int{len(raw) / 2, 16384, 8192, 4096, 100} {
		err := tryOpen(t, dir, fmt.Sprintf("cut-%d", n), raw[:n])
		if err == nil || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("a file cut to %d bytes: %v, want a refusal that says it was truncated", n, err)
		}
	}
	refused := 0
	for page := 2; page < pages; page++ {
		for _, field := range []struct {
			name string
			off  int
		}{{"id", 0}, {"flags", 8}, {"count", 10}, {"first-element", 16 + 4}} {
			b := bytes.Clone(raw)
			b[page*ps+field.off] ^= 0x10
			if err := tryOpen(t, dir, fmt.Sprintf("page-%d-%s", page, field.name), b); errors.Is(err, ErrCorrupt) {
				refused++
			}
		}
	}
	if refused == 0 {
		t.Fatal("no flipped bit in a page header was refused: the fixture's pages were not reached")
	}
}

// fixMetaChecksums recomputes the checksum of every bbolt meta page in raw
// (those that still carry bbolt's magic), so that the fuzzer's changes to
// the meta fields reach the checks behind the checksum.
func fixMetaChecksums(raw []byte) {
	le := binary.LittleEndian
	for _, off := range []int{0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536} {
		m := off + 16
		if len(raw) < m+64 || le.Uint32(raw[m:]) != 0xED0CDAED {
			continue
		}
		h := fnv.New64a()
		h.Write(raw[m : m+56])
		le.PutUint64(raw[m+56:], h.Sum64())
	}
}

// FuzzOpenAndRead opens any file as a state file, read-write and read-only,
// and reads every record: it may be refused, never panic. The seed corpus
// in testdata/fuzz/FuzzOpenAndRead (a small csid file, cut short at several
// lengths and with bits flipped in its meta, branch, leaf and inline
// bucket pages) runs with every `go test`; TestWriteFuzzSeeds rewrites it.
func FuzzOpenAndRead(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		raw = bytes.Clone(raw)
		fixMetaChecksums(raw)
		path := filepath.Join(t.TempDir(), "csid.db")
		for _, open := range []func(string, Options) (*Store, error){OpenReadOnly, Open} {
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := open(path, Options{LockTimeout: 100 * time.Millisecond, NoSync: true})
			if err != nil {
				continue
			}
			_ = readEverything(s)
			s.Close()
		}
	})
}

// TestWriteFuzzSeeds writes FuzzOpenAndRead's seed corpus when
// CSID_WRITE_FUZZ_SEEDS=1: a csid file of 1 KiB pages (small seeds) with
// volumes, ops, notes and resizes, cut short and with bits flipped.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("CSID_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set CSID_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz/FuzzOpenAndRead")
	}
	src := filepath.Join(t.TempDir(), "seed.db")
	writeFixture(t, src, 6, Options{pageSize: 1024, NoSync: true})
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	ps, pages := fileMeta(t, raw)
	raw = raw[:ps*pages] // what lies past the high-water mark is free space
	seeds := map[string][]byte{"whole": raw}
	for _, n := range []int{len(raw) / 2, 3 * ps, 2 * ps, ps, 100} {
		seeds[fmt.Sprintf("cut-%d", n)] = raw[:n]
	}
	flips := map[string]int{
		"meta0-root": 16 + 16, "meta1-pgid": ps + 16 + 40, "meta0-txid": 16 + 48,
		"root-page-id": 3 * ps, "page4-flags": 4*ps + 8, "page5-count": 5*ps + 10,
		"page6-element-pos": 6*ps + 16 + 4, "last-page-key": (pages-1)*ps + 40,
	}
	for name, off := range flips {
		b := bytes.Clone(raw)
		b[off] ^= 0x21
		seeds["flip-"+name] = b
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzOpenAndRead")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range seeds {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d seeds of a %d-byte file (%d pages of %d bytes)", len(seeds), len(raw), pages, ps)
}
