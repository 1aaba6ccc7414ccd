package store

import (
	"bytes"
	"fmt"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// Snapshot records are kept as volume records are: sealed in their own
// bucket (snapshots, keyed by id), with a name index (snapnames: the CO's
// name -> id, for CreateSnapshot's idempotency), their op in flight marked
// in the active bucket and their notes in the history bucket. A file of
// schema 2, opened read-only, has no snapshot buckets: it reads as a file
// without snapshots.

// snapBucket returns a snapshot bucket, nil in a file of schema 2 opened
// read-only.
func (t *Tx) snapBucket(name []byte) *bolt.Bucket { return t.tx.Bucket(name) }

// Snapshot returns the snapshot with this id, or nil when there is none.
// The caller owns the returned record. A snapshot whose record or
// active-op entry is damaged is a *DamagedError.
func (t *Tx) Snapshot(id string) (*Snapshot, error) {
	b := t.snapBucket(bucketSnapshots)
	if b == nil {
		return nil, nil
	}
	key := []byte(id)
	return t.decodeSnapshot(key, b.Get(key))
}

// decodeSnapshot checks and decodes the snapshot record raw at key (nil
// for none), with its op in flight.
func (t *Tx) decodeSnapshot(key, raw []byte) (*Snapshot, error) {
	if raw == nil {
		return nil, nil
	}
	s, err := decode[Snapshot](bucketSnapshots, key, raw)
	if err == nil && s.ID != string(key) {
		err = damaged(bucketSnapshots, key, "holds the record of snapshot "+s.ID)
	}
	if err != nil {
		return nil, err
	}
	if s.ActiveOp, err = t.activeOfKey(key); err != nil {
		if d, ok := asDamaged(err); ok {
			d.SnapshotID, d.VolumeID = string(key), ""
		}
		return nil, err
	}
	return s, nil
}

// SnapshotIDByName returns the id of the snapshot created with this name,
// or "". A damaged entry is a *DamagedError: whether the name is taken is
// unknown.
func (t *Tx) SnapshotIDByName(name string) (string, error) {
	if t.snapBucket(bucketSnapNames) == nil {
		return "", nil
	}
	raw, err := t.getRaw(bucketSnapNames, []byte(name))
	return string(raw), err
}

// ForEachSnapshot calls fn for each snapshot in id order, starting after
// the id `after` ("" for the first); it stops when fn returns false. A
// damaged snapshot is skipped (see Skipped).
func (t *Tx) ForEachSnapshot(after string, fn func(*Snapshot) bool) error {
	b := t.snapBucket(bucketSnapshots)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	var k, raw []byte
	if after == "" {
		k, raw = c.First()
	} else if k, raw = c.Seek([]byte(after)); k != nil && string(k) == after {
		k, raw = c.Next()
	}
	for ; k != nil; k, raw = c.Next() {
		s, err := t.decodeSnapshot(k, raw)
		if t.skipDamaged(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !fn(s) {
			return nil
		}
	}
	return nil
}

// CountSnapshotsByState counts the snapshot records by state (a snapshot
// being cut is ABSENT). A damaged record is not counted (see Skipped).
func (t *Tx) CountSnapshotsByState() (map[fsm.State]int, error) {
	out := map[fsm.State]int{}
	err := t.ForEachSnapshot("", func(s *Snapshot) bool { out[s.State]++; return true })
	return out, err
}

func (t *Tx) putSnapshot(s *Snapshot) error { return t.put(bucketSnapshots, []byte(s.ID), s) }

// AcceptSnapshot records a new op on snapshot s, as Accept does for a
// volume: it assigns op.Seq, marks the op queued and active, and sets
// s.ActiveOp. s must have no active op. The record is written only when
// there is none yet (a snapshot_create, in ABSENT, with its name).
func (t *Tx) AcceptSnapshot(s *Snapshot, op *Op) error {
	if !op.Event.OfSnapshot() {
		return fmt.Errorf("store: a volume's op %s accepted on snapshot %s: %w", op.Event, s.ID, fsm.ErrIllegal)
	}
	op.VolumeID, op.SnapshotID = "", s.ID
	if err := t.acceptOp(s.ID, s.ActiveOp, s.Generation, op); err != nil {
		return err
	}
	s.ActiveOp = op.Seq
	if t.tx.Bucket(bucketSnapshots).Get([]byte(s.ID)) != nil {
		return nil
	}
	if s.State != fsm.Absent {
		return fmt.Errorf("store: a new record of snapshot %s in state %s: only a snapshot_create starts a record: %w",
			s.ID, s.State, fsm.ErrIllegal)
	}
	if err := t.notTakenBy(bucketVolumes, s.ID); err != nil {
		return err
	}
	if s.Name != "" {
		if err := t.putRaw(bucketSnapNames, []byte(s.Name), []byte(s.ID)); err != nil {
			return err
		}
	}
	return t.putSnapshot(s)
}

// FinishSnapshot records the outcome of a snapshot's op (succeeded or
// failed) together with the snapshot it leaves, and clears its active op,
// as Finish does for a volume. The op's step must be one of the snapshot
// lifecycle, from the stored state to s.State (or, failed, staying). A
// snapshot left ABSENT loses its record, name and notes.
func (t *Tx) FinishSnapshot(s *Snapshot, op *Op) error {
	if op.SnapshotID != s.ID {
		return fmt.Errorf("store: FinishSnapshot of snapshot %s with op %d of %s", s.ID, op.Seq, op.Subject())
	}
	if err := t.checkActive(s.ID, op); err != nil {
		return err
	}
	stored := fsm.Absent
	if cur, err := t.Snapshot(s.ID); err != nil {
		return err
	} else if cur != nil {
		stored = cur.State
	}
	if err := checkOutcome(fsm.Snapshots, op, stored, s.State, "snapshot "+s.ID); err != nil {
		return err
	}
	s.ActiveOp = 0
	prev := s.LastOp
	s.LastOp = op.Seq
	if err := t.finishOp(s.ID, op); err != nil {
		return err
	}
	if s.State == fsm.Absent {
		if err := t.removeSnapshot(s); err != nil {
			return err
		}
	} else if err := t.putSnapshot(s); err != nil {
		return err
	}
	return t.prune(op.Seq, prev)
}

// ReconcileSnapshot records a snapshot state that reality already has and
// no op made, as Reconcile does for a volume: a record rebuilt from the
// provider (rebuild), a record whose provider snapshot is gone (forget).
// The step from the stored state by event e under guard g must be one of
// the snapshot lifecycle to s.State; a step to ABSENT removes the record.
// The change is recorded in the snapshot's history under e's name with
// outcome. s must have no active op.
func (t *Tx) ReconcileSnapshot(s *Snapshot, e fsm.Event, g fsm.Guard, outcome string, now time.Time) error {
	if err := t.idle("snapshot", s.ID, s.ActiveOp, e); err != nil {
		return err
	}
	cur, err := t.Snapshot(s.ID)
	if err != nil {
		return err
	}
	from, gen := fsm.Absent, uint64(0)
	if cur != nil {
		from, gen = cur.State, cur.Generation
	}
	if err := fsm.Snapshots.Check(from, e, g, s.State); err != nil {
		return fmt.Errorf("store: snapshot %s: %w", s.ID, err)
	}
	if cur == nil {
		if err := t.notTakenBy(bucketVolumes, s.ID); err != nil {
			return err
		}
	}
	s.Generation, s.UpdatedAt = gen+1, now
	if s.CreatedAt.IsZero() {
		s.CreatedAt = now
	}
	if s.State == fsm.Absent {
		if cur == nil {
			return nil
		}
		return t.removeSnapshot(cur)
	}
	if s.Name != "" {
		if err := t.putRaw(bucketSnapNames, []byte(s.Name), []byte(s.ID)); err != nil {
			return err
		}
	}
	if err := t.putSnapshot(s); err != nil {
		return err
	}
	return t.AddNote(s.ID, HistoryEntry{Time: now, Event: e, Guard: g, From: from, To: s.State,
		Generation: s.Generation, Outcome: outcome})
}

// removeSnapshot deletes a snapshot's record, its name entry (if it names
// this snapshot; a damaged one stays for csid check) and its notes.
func (t *Tx) removeSnapshot(s *Snapshot) error {
	if err := t.tx.Bucket(bucketSnapshots).Delete([]byte(s.ID)); err != nil {
		return err
	}
	if err := t.dropName(bucketSnapNames, s.Name, s.ID); err != nil {
		return err
	}
	return t.deleteNotes(s.ID)
}

// deleteNotes deletes every history note of the volume or snapshot id.
func (t *Tx) deleteNotes(id string) error {
	prefix := historyPrefix(id)
	c := t.tx.Bucket(bucketHistory).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// damagedSnapshots checks every snapshot record and name entry, and notes
// the last op of each readable snapshot in owner.
func (t *Tx) damagedSnapshots(owner map[uint64]string) ([]*DamagedError, error) {
	b := t.snapBucket(bucketSnapshots)
	if b == nil {
		return nil, nil
	}
	var out []*DamagedError
	c := b.Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		s, err := decode[Snapshot](bucketSnapshots, k, raw)
		if err == nil && s.ID != string(k) {
			err = damaged(bucketSnapshots, k, "holds the record of snapshot "+s.ID)
		}
		if d, ok := asDamaged(err); ok {
			out = append(out, d)
			continue
		} else if err != nil {
			return nil, err
		}
		if s.LastOp != 0 {
			owner[s.LastOp] = s.ID
		}
	}
	return append(out, checkRaw(t, bucketSnapNames, nil)...), nil
}
