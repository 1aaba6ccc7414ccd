package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// flipRecord flips one bit of a stored value in a closed state file, with
// bbolt itself, as a bad block or a stray write would: at the first
// occurrence of at in the value (the start of the value when at is "").
func flipRecord(t *testing.T, path string, bucket, key []byte, at string, bit byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		v := bytes.Clone(b.Get(key))
		if v == nil {
			return fmt.Errorf("no %s/%q to flip", bucket, key)
		}
		i := bytes.Index(v, []byte(at))
		if i < 0 {
			return fmt.Errorf("%s/%q holds no %q", bucket, key, at)
		}
		v[i] ^= bit
		return b.Put(key, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEveryRecordKindIsChecked flips one bit in one record of each kind of
// a real state file. The record is never returned: a lookup answers a
// *DamagedError naming it, scans skip it and say so, the other volumes
// read as before, and Damaged lists exactly it, with its volume.
func TestEveryRecordKindIsChecked(t *testing.T) {
	const (
		vol    = "vol-00000000000000000003" // resize queued, a note
		active = "vol-00000000000000000007" // its create in flight
		other  = "vol-00000000000000000004"
	)
	cases := []struct {
		kind       string
		bucket     []byte
		key        []byte
		at         string
		bit        byte
		volume     string
		snapshot   string
		lookup     func(tx *Tx) error
		scanSkips  func(tx *Tx) error
		wantInScan string
	}{
		{kind: "volume (capacity 67108864 -> 77108864, as in the issue)", bucket: bucketVolumes, key: []byte(vol), at: "67108864", bit: 0x01, volume: vol,
			lookup: func(tx *Tx) error { _, err := tx.Volume(vol); return err },
			scanSkips: func(tx *Tx) error {
				return tx.ForEachVolume("", func(v *Volume) bool {
					if v.ID == vol {
						t.Errorf("ForEachVolume returned the damaged volume: capacity %d", v.CapacityBytes)
					}
					return true
				})
			}},
		{kind: "name index entry", bucket: bucketNames, key: []byte("pvc-3"), at: "vol", bit: 0x02,
			lookup: func(tx *Tx) error { _, err := tx.VolumeIDByName("pvc-3"); return err }},
		{kind: "active-op index entry", bucket: bucketActive, key: []byte(active), bit: 0x80, volume: active,
			lookup: func(tx *Tx) error { _, err := tx.Volume(active); return err },
			scanSkips: func(tx *Tx) error {
				ops, err := tx.ActiveOps()
				if len(ops) != 0 {
					t.Errorf("ActiveOps returned %d ops past a damaged index entry", len(ops))
				}
				return err
			}},
		{kind: "op in flight", bucket: bucketOps, key: u64(8), at: "create", bit: 0x04, volume: active,
			lookup: func(tx *Tx) error { _, err := tx.Op(8); return err },
			scanSkips: func(tx *Tx) error {
				ops, err := tx.ActiveOps()
				if len(ops) != 0 {
					t.Errorf("ActiveOps returned the damaged op: %+v", ops[0])
				}
				return err
			}},
		{kind: "finished op", bucket: bucketOps, key: u64(4), at: "succeeded", bit: 0x08, volume: vol,
			lookup:    func(tx *Tx) error { _, err := tx.Op(4); return err },
			scanSkips: func(tx *Tx) error { return tx.ForEachOp(func(*Op) bool { return true }) }},
		{kind: "resize", bucket: bucketResize, key: []byte(vol), at: "134217728", bit: 0x01, volume: vol,
			lookup: func(tx *Tx) error { _, err := tx.Resize(vol); return err },
			scanSkips: func(tx *Tx) error {
				return tx.ForEachResize(func(r *Resize) bool {
					if r.VolumeID == vol {
						t.Errorf("ForEachResize returned the damaged resize to %d", r.TargetBytes)
					}
					return true
				})
			}},
		{kind: "snapshot record", bucket: bucketSnapshots, key: []byte(fixtureSnapshot), at: "67108864", bit: 0x01, snapshot: fixtureSnapshot,
			lookup: func(tx *Tx) error { _, err := tx.Snapshot(fixtureSnapshot); return err },
			scanSkips: func(tx *Tx) error {
				return tx.ForEachSnapshot("", func(s *Snapshot) bool {
					t.Errorf("ForEachSnapshot returned the damaged snapshot: size %d", s.SizeBytes)
					return true
				})
			}},
		{kind: "snapshot name index entry", bucket: bucketSnapNames, key: []byte("vs-0"), at: "snap", bit: 0x02,
			lookup: func(tx *Tx) error { _, err := tx.SnapshotIDByName("vs-0"); return err }},
		{kind: "snapshot's finished op", bucket: bucketOps, key: u64(9), at: "snapshot_create", bit: 0x04, snapshot: fixtureSnapshot,
			lookup: func(tx *Tx) error { _, err := tx.Op(9); return err }},
		{kind: "history note", bucket: bucketHistory, key: historyKey(historyPrefix(vol), 0), at: "queued", bit: 0x20, volume: vol,
			scanSkips: func(tx *Tx) error {
				h, err := tx.History(vol)
				for _, l := range h {
					if l.OpSeq == 0 {
						t.Errorf("History returned the damaged note %+v", l)
					}
				}
				return err
			}},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "csid.db")
			writeFixture(t, path, 8, Options{NoSync: true})
			flipRecord(t, path, c.bucket, c.key, c.at, c.bit)
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("one damaged record stops the file from opening: %v", err)
			}
			defer s.Close()
			err = s.View(func(tx *Tx) error {
				if c.lookup != nil {
					err := c.lookup(tx)
					var d *DamagedError
					if !errors.As(err, &d) || d.Bucket != string(c.bucket) || !strings.Contains(err.Error(), "fails its checksum") {
						t.Errorf("lookup: %v, want the damaged %s record", err, c.bucket)
					}
				}
				if c.scanSkips != nil {
					if err := c.scanSkips(tx); err != nil {
						t.Errorf("a scan stopped at the damaged record: %v", err)
					}
					if sk := tx.Skipped(); len(sk) != 1 || sk[0].Bucket != string(c.bucket) {
						t.Errorf("the scan skipped %v, want the damaged %s record", sk, c.bucket)
					}
				}
				if v, err := tx.Volume(other); err != nil || v == nil || v.CapacityBytes != 64<<20 {
					t.Errorf("another volume: %+v, %v", v, err)
				}
				bad, err := tx.Damaged()
				if err != nil || len(bad) != 1 || bad[0].Bucket != string(c.bucket) || bad[0].VolumeID != c.volume || bad[0].SnapshotID != c.snapshot {
					t.Errorf("Damaged: %v, %v; want the %s record of volume %q, snapshot %q", bad, err, c.bucket, c.volume, c.snapshot)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMigratesSchema1File opens a real state file of schema 1 (records
// without checksums; testdata/schema1.db, written by csid at 706de40): it
// is sealed in place, every record reads as before, and it opens again as
// schema 2. A read-only open of a schema 1 file says how to migrate it.
func TestMigratesSchema1File(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "schema1.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "csid.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenReadOnly(path, Options{}); !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "start csid serve on it once") {
		t.Fatalf("read-only open of a schema 1 file: %v", err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.MigratedFrom() != 1 {
		t.Fatalf("MigratedFrom = %d, want 1", s.MigratedFrom())
	}
	check := func(s *Store) {
		t.Helper()
		err := s.View(func(tx *Tx) error {
			n := 0
			if err := tx.ForEachVolume("", func(v *Volume) bool { n++; return true }); err != nil {
				return err
			}
			active, err := tx.ActiveOps()
			if err != nil {
				return err
			}
			v, err := tx.Volume("vol-00000000000000000003")
			if err != nil {
				return err
			}
			r, err := tx.Resize(v.ID)
			if err != nil {
				return err
			}
			h, err := tx.History(v.ID)
			if err != nil {
				return err
			}
			id, err := tx.VolumeIDByName("pvc-3")
			if err != nil {
				return err
			}
			bad, err := tx.Damaged()
			if err != nil {
				return err
			}
			if n != 8 || len(active) != 1 || active[0].VolumeID != "vol-00000000000000000007" || v.State != fsm.Created ||
				v.CapacityBytes != 64<<20 || r == nil || r.TargetBytes != 128<<20 || len(h) != 2 || id != v.ID || len(bad) != 0 || len(tx.Skipped()) != 0 {
				t.Errorf("after the migration: %d volumes, active %v, volume %+v, resize %+v, history %v, name -> %q, damaged %v",
					n, active, v, r, h, id, bad)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(s)
	s.Close()
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.MigratedFrom() != 0 {
		t.Fatalf("migrated again from %d", s.MigratedFrom())
	}
	check(s)
}
