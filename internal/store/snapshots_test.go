package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// cutSnapshot accepts a snapshot_create of snapshot id (named name, of
// volume src) and, when finish, commits it READY.
func cutSnapshot(t testing.TB, s *Store, id, name, src string, finish bool) uint64 {
	t.Helper()
	var seq uint64
	err := s.Update(func(tx *Tx) error {
		sn := &Snapshot{ID: id, Name: name, SourceVolumeID: src, SourceDiskID: "disk-" + src, State: fsm.Absent}
		op := &Op{Event: fsm.SnapshotCreate, From: fsm.Absent, To: fsm.Ready}
		if err := tx.AcceptSnapshot(sn, op); err != nil {
			return err
		}
		seq = op.Seq
		if !finish {
			return nil
		}
		op.Status = OpSucceeded
		sn.State, sn.CloudID, sn.SizeBytes, sn.ReadyToUse, sn.Generation = fsm.Ready, "cloud-"+id, 64<<20, true, 1
		return tx.FinishSnapshot(sn, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// TestSnapshotRecordsFollowTheirLifecycle: a snapshot record is written
// with its op (ABSENT, active, named), finished READY by the op's step of
// the snapshot table, explained by its history, and removed with its name
// and notes by a snapshot_delete; every write that is not a step of the
// snapshot table, or that crosses the volume and snapshot records, is
// refused and writes nothing.
func TestSnapshotRecordsFollowTheirLifecycle(t *testing.T) {
	s, _ := openTemp(t, Options{NoSync: true})
	now := time.Now()
	seq := cutSnapshot(t, s, "snap-1", "vs-1", "vol-1", false)
	_ = s.View(func(tx *Tx) error {
		sn, err := tx.Snapshot("snap-1")
		id, _ := tx.SnapshotIDByName("vs-1")
		active, _ := tx.ActiveOps()
		if err != nil || sn == nil || sn.State != fsm.Absent || sn.ActiveOp != seq || id != "snap-1" ||
			len(active) != 1 || active[0].SnapshotID != "snap-1" || active[0].VolumeID != "" || active[0].Subject() != "snap-1" {
			t.Errorf("accepted: %+v, %v; name -> %q; active %+v", sn, err, id, active)
		}
		if vid, _ := tx.VolumeIDByName("vs-1"); vid != "" {
			t.Errorf("a snapshot's name is in the volumes' name index: %q", vid)
		}
		return nil
	})

	refused := map[string]func(tx *Tx) error{
		"a snapshot_create finished in another state than READY": func(tx *Tx) error {
			sn, _ := tx.Snapshot("snap-1")
			op, _ := tx.Op(sn.ActiveOp)
			op.Status = OpSucceeded
			return tx.FinishSnapshot(sn, op) // still ABSENT
		},
		"a snapshot op labelled with a volume event": func(tx *Tx) error {
			sn, _ := tx.Snapshot("snap-1")
			op, _ := tx.Op(sn.ActiveOp)
			op.Event, op.To, op.Status, sn.State = fsm.Create, fsm.Created, OpSucceeded, fsm.Created
			return tx.FinishSnapshot(sn, op)
		},
		"a snapshot_delete finishing a snapshot that was never cut": func(tx *Tx) error {
			sn, _ := tx.Snapshot("snap-1")
			op, _ := tx.Op(sn.ActiveOp)
			// A legal step of the table, but the stored snapshot is ABSENT.
			op.Event, op.From, op.To, op.Status, sn.State = fsm.SnapshotDelete, fsm.Ready, fsm.Absent, OpSucceeded, fsm.Absent
			return tx.FinishSnapshot(sn, op)
		},
		"a snapshot's op accepted on a volume": func(tx *Tx) error {
			return tx.Accept(&Volume{ID: "vol-x", State: fsm.Absent}, &Op{Event: fsm.SnapshotCreate, From: fsm.Absent, To: fsm.Ready})
		},
		"a volume's op accepted on a snapshot": func(tx *Tx) error {
			return tx.AcceptSnapshot(&Snapshot{ID: "snap-x", State: fsm.Absent}, &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created})
		},
		"a new snapshot record that is not a snapshot_create": func(tx *Tx) error {
			return tx.AcceptSnapshot(&Snapshot{ID: "snap-x", State: fsm.Ready}, &Op{Event: fsm.SnapshotDelete, From: fsm.Ready, To: fsm.Absent})
		},
		"a forget of a snapshot that is not READY": func(tx *Tx) error {
			return tx.ReconcileSnapshot(&Snapshot{ID: "snap-y", State: fsm.Absent}, fsm.Forget, fsm.NoGuard, "gone", now)
		},
		"a rebuild under a volume guard": func(tx *Tx) error {
			return tx.ReconcileSnapshot(&Snapshot{ID: "snap-y", State: fsm.Ready}, fsm.Rebuild, fsm.Detached, "rebuilt", now)
		},
		"a reconciliation recorded under an op's event": func(tx *Tx) error {
			// A step of the table (ABSENT -> READY), but no op cut it.
			return tx.ReconcileSnapshot(&Snapshot{ID: "snap-z", State: fsm.Ready}, fsm.SnapshotCreate, fsm.NoGuard, "found", now)
		},
	}
	for name, write := range refused {
		if err := s.Update(write); !errors.Is(err, fsm.ErrIllegal) {
			t.Errorf("%s: %v, want a refusal wrapping fsm.ErrIllegal", name, err)
		}
	}
	// An op finishes only the record it was accepted on: the snapshot's
	// op, rewritten as a volume's, would put its step in the volume's
	// history.
	crossed := map[string]func(tx *Tx) error{
		"a snapshot finished with its op rewritten as a volume's": func(tx *Tx) error {
			sn, _ := tx.Snapshot("snap-1")
			op, _ := tx.Op(sn.ActiveOp)
			op.SnapshotID, op.VolumeID, op.Status, sn.State = "", "vol-1", OpSucceeded, fsm.Ready
			return tx.FinishSnapshot(sn, op)
		},
		"a volume finished with its op rewritten as a snapshot's": func(tx *Tx) error {
			v := &Volume{ID: "vol-c", State: fsm.Absent}
			op := &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created}
			if err := tx.Accept(v, op); err != nil {
				return err
			}
			op.VolumeID, op.SnapshotID, op.Status, v.State = "", "snap-1", OpSucceeded, fsm.Created
			return tx.Finish(v, op)
		},
	}
	for name, write := range crossed {
		if err := s.Update(write); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// The op finishes READY; the history explains it.
	err := s.Update(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-1")
		op, _ := tx.Op(sn.ActiveOp)
		op.Status, op.FinishedAt = OpSucceeded, now
		sn.State, sn.CloudID, sn.Generation = fsm.Ready, "cloud-1", 1
		return tx.FinishSnapshot(sn, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-1")
		h, _ := tx.History("snap-1")
		counts, _ := tx.CountSnapshotsByState()
		if sn.State != fsm.Ready || sn.ActiveOp != 0 || sn.LastOp != seq || len(h) != 1 || h[0].Event != fsm.SnapshotCreate ||
			h[0].To != fsm.Ready || h[0].Generation != 1 || counts[fsm.Ready] != 1 {
			t.Errorf("cut: %+v, history %+v, counts %v", sn, h, counts)
		}
		if vh, _ := tx.History("vol-1"); len(vh) != 0 {
			t.Errorf("the snapshot's op is in its source volume's history: %+v", vh)
		}
		return nil
	})

	// One namespace: a snapshot id is no volume's, and the reverse.
	if err := s.Update(func(tx *Tx) error {
		return tx.Accept(&Volume{ID: "snap-1", State: fsm.Absent}, &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created})
	}); err == nil || !strings.Contains(err.Error(), "taken") {
		t.Errorf("a volume under a snapshot's id: %v", err)
	}
	if err := s.Update(func(tx *Tx) error {
		if err := tx.Reconcile(&Volume{ID: "vol-2", State: fsm.Created}, fsm.Rebuild, fsm.Detached, "rebuilt", now); err != nil {
			return err
		}
		return tx.ReconcileSnapshot(&Snapshot{ID: "vol-2", State: fsm.Ready}, fsm.Rebuild, fsm.NoGuard, "rebuilt", now)
	}); err == nil || !strings.Contains(err.Error(), "taken") {
		t.Errorf("a snapshot rebuilt under a volume's id: %v", err)
	}
	if err := s.Update(func(tx *Tx) error {
		if err := tx.Reconcile(&Volume{ID: "vol-2", State: fsm.Created}, fsm.Rebuild, fsm.Detached, "rebuilt", now); err != nil {
			return err
		}
		return tx.AcceptSnapshot(&Snapshot{ID: "vol-2", State: fsm.Absent}, &Op{Event: fsm.SnapshotCreate, From: fsm.Absent, To: fsm.Ready})
	}); err == nil || !strings.Contains(err.Error(), "taken") {
		t.Errorf("a snapshot taken under a volume's id: %v", err)
	}

	// A snapshot_delete removes the record, the name and the notes.
	err = s.Update(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-1")
		if err := tx.AddNote(sn.ID, HistoryEntry{Time: now, Event: fsm.Rebuild, To: fsm.Ready, Outcome: "a note"}); err != nil {
			return err
		}
		op := &Op{Event: fsm.SnapshotDelete, From: fsm.Ready, To: fsm.Absent}
		if err := tx.AcceptSnapshot(sn, op); err != nil {
			return err
		}
		op.Status, sn.State = OpSucceeded, fsm.Absent
		return tx.FinishSnapshot(sn, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-1")
		id, _ := tx.SnapshotIDByName("vs-1")
		h, _ := tx.History("snap-1")
		for _, l := range h {
			if l.OpSeq == 0 {
				t.Errorf("a note outlived its snapshot: %+v", l)
			}
		}
		if sn != nil || id != "" {
			t.Errorf("deleted: %+v, name -> %q", sn, id)
		}
		return nil
	})
}

// TestSnapshotReconcileRebuildsAndForgets: a record rebuilt from the
// provider is READY with its name and a history line saying so; a forget
// removes it.
func TestSnapshotReconcileRebuildsAndForgets(t *testing.T) {
	s, _ := openTemp(t, Options{NoSync: true})
	now := time.Now()
	err := s.Update(func(tx *Tx) error {
		return tx.ReconcileSnapshot(&Snapshot{ID: "snap-2", Name: "vs-2", SourceVolumeID: "vol-9", CloudID: "c2", State: fsm.Ready},
			fsm.Rebuild, fsm.NoGuard, "rebuilt from the provider's snapshot c2", now)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-2")
		id, _ := tx.SnapshotIDByName("vs-2")
		h, _ := tx.History("snap-2")
		if sn == nil || sn.State != fsm.Ready || sn.Generation != 1 || id != "snap-2" || len(h) != 1 || h[0].Event != fsm.Rebuild {
			t.Errorf("rebuilt: %+v, name -> %q, history %+v", sn, id, h)
		}
		return nil
	})
	err = s.Update(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-2")
		sn.State = fsm.Absent
		return tx.ReconcileSnapshot(sn, fsm.Forget, fsm.NoGuard, "the provider has no snapshot c2", now)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		sn, _ := tx.Snapshot("snap-2")
		id, _ := tx.SnapshotIDByName("vs-2")
		if sn != nil || id != "" {
			t.Errorf("forgotten: %+v, name -> %q", sn, id)
		}
		return nil
	})
}

// TestSnapshotOpsArePrunedExceptTheLast: retention prunes a snapshot's old
// ops but keeps its last (its history explains its state) and its active.
func TestSnapshotOpsArePrunedExceptTheLast(t *testing.T) {
	s, _ := openTemp(t, Options{OpRetention: 2, NoSync: true})
	last := cutSnapshot(t, s, "snap-old", "old", "vol-1", true)
	active := cutSnapshot(t, s, "snap-busy", "busy", "vol-1", false)
	var newest []uint64
	for i := range 6 {
		newest = append(newest, cutSnapshot(t, s, fmt.Sprintf("snap-%d", i), fmt.Sprint(i), "vol-1", true))
	}
	var kept []uint64
	_ = s.View(func(tx *Tx) error {
		return tx.ForEachOp(func(op *Op) bool { kept = append(kept, op.Seq); return true })
	})
	// Every snapshot here has one op, its last: none may go.
	if want := len(newest) + 2; len(kept) != want {
		t.Errorf("kept ops %v, want all %d (each is a snapshot's last or active op)", kept, want)
	}
	_ = s.View(func(tx *Tx) error {
		for id, seq := range map[string]uint64{"snap-old": last, "snap-busy": 0} {
			h, _ := tx.History(id)
			if (seq == 0) != (len(h) == 0) || (seq != 0 && h[len(h)-1].OpSeq != seq) {
				t.Errorf("history of %s: %+v", id, h)
			}
		}
		if op, _ := tx.Op(active); op == nil || !op.Status.Active() {
			t.Errorf("the active op %d was pruned: %+v", active, op)
		}
		return nil
	})
}

// TestMigratesSchema2File: a file of schema 2 (no snapshot buckets) reads
// read-only as a file without snapshots, and a read-write open migrates it
// to schema 3 in place, keeping every volume record; then it takes
// snapshots, and opens again without a migration.
func TestMigratesSchema2File(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csid.db")
	writeFixture(t, path, 4, Options{NoSync: true})
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range snapshotBuckets {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, u64(2))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	ro, err := OpenReadOnly(path, Options{})
	if err != nil {
		t.Fatalf("read-only open of a schema 2 file: %v", err)
	}
	_ = ro.View(func(tx *Tx) error {
		sn, err := tx.Snapshot("snap-0")
		n := 0
		ferr := tx.ForEachSnapshot("", func(*Snapshot) bool { n++; return true })
		id, nerr := tx.SnapshotIDByName("x")
		if sn != nil || err != nil || n != 0 || ferr != nil || id != "" || nerr != nil {
			t.Errorf("snapshots of a schema 2 file: %+v %v, %d %v, %q %v", sn, err, n, ferr, id, nerr)
		}
		return nil
	})
	ro.Close()
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.MigratedFrom() != 2 {
		t.Errorf("MigratedFrom = %d, want 2", s.MigratedFrom())
	}
	cutSnapshot(t, s, "snap-9", "vs-9", "vol-00000000000000000001", true)
	_ = s.View(func(tx *Tx) error {
		v, err := tx.Volume("vol-00000000000000000001")
		if err != nil || v == nil || v.State != fsm.Created {
			t.Errorf("a volume after the migration: %+v, %v", v, err)
		}
		return nil
	})
	s.Close()
	s, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.MigratedFrom() != 0 {
		t.Errorf("migrated again from %d", s.MigratedFrom())
	}
	_ = s.View(func(tx *Tx) error {
		if sn, err := tx.Snapshot("snap-9"); err != nil || sn == nil || sn.State != fsm.Ready {
			t.Errorf("the snapshot after a reopen: %+v, %v", sn, err)
		}
		return nil
	})
}
