package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// Tx is a transaction over the typed records. A Tx from View is read-only;
// write methods on it fail.
//
// Volumes change only through Accept (with a new op), Finish (with the op's
// outcome and a history entry) and Adopt (reconciliation, with a history
// entry): there is no bare "put volume".
type Tx struct {
	tx *bolt.Tx
	s  *Store
}

// OnCommit registers fn to run after the transaction has committed. Hooks
// run in commit order, on the committer, before any later transaction
// begins; they must be quick and must not call Update.
func (t *Tx) OnCommit(fn func()) { t.tx.OnCommit(fn) }

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func fromU64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func get[T any](b *bolt.Bucket, key []byte) (*T, error) {
	raw := b.Get(key)
	if raw == nil {
		return nil, nil
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("decode %s record %q: %w", b.Tx().DB().Path(), key, err)
	}
	return v, nil
}

func put(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

func checkID(id string) error {
	if id == "" || strings.IndexByte(id, 0) >= 0 {
		return fmt.Errorf("store: invalid volume id %q", id)
	}
	return nil
}

// Volume returns the volume with this id, or nil when there is none. The
// caller owns the returned record.
func (t *Tx) Volume(id string) (*Volume, error) {
	raw := t.tx.Bucket(bucketVolumes).Get([]byte(id))
	if raw == nil {
		return nil, nil
	}
	return t.s.volumes.decode(raw)
}

func (t *Tx) putVolume(v *Volume) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketVolumes).Put([]byte(v.ID), raw); err != nil {
		return err
	}
	t.s.volumes.remember(raw, v)
	return nil
}

// VolumeIDByName returns the id of the volume created with this name, or "".
func (t *Tx) VolumeIDByName(name string) string {
	return string(t.tx.Bucket(bucketNames).Get([]byte(name)))
}

// ForEachVolume calls fn for each volume in id order, starting after the id
// `after` ("" for the first); it stops when fn returns false.
func (t *Tx) ForEachVolume(after string, fn func(*Volume) bool) error {
	c := t.tx.Bucket(bucketVolumes).Cursor()
	var k, raw []byte
	if after == "" {
		k, raw = c.First()
	} else {
		k, raw = c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, raw = c.Next()
		}
	}
	for ; k != nil; k, raw = c.Next() {
		v := new(Volume)
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("decode volume %q: %w", k, err)
		}
		if !fn(v) {
			return nil
		}
	}
	return nil
}

// CountVolumes returns the number of volume records.
func (t *Tx) CountVolumes() int { return t.tx.Bucket(bucketVolumes).Stats().KeyN }

// Op returns the op with this sequence number, or nil.
func (t *Tx) Op(seq uint64) (*Op, error) {
	return get[Op](t.tx.Bucket(bucketOps), u64(seq))
}

// ForEachOp calls fn for each op, newest first, until fn returns false.
func (t *Tx) ForEachOp(fn func(*Op) bool) error {
	c := t.tx.Bucket(bucketOps).Cursor()
	for k, raw := c.Last(); k != nil; k, raw = c.Prev() {
		op := new(Op)
		if err := json.Unmarshal(raw, op); err != nil {
			return fmt.Errorf("decode op %d: %w", fromU64(k), err)
		}
		if !fn(op) {
			return nil
		}
	}
	return nil
}

// ActiveOps returns every op still queued or compensating, oldest first.
func (t *Tx) ActiveOps() ([]*Op, error) {
	var out []*Op
	c := t.tx.Bucket(bucketActive).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		op, err := t.Op(fromU64(k))
		if err != nil {
			return nil, err
		}
		if op == nil {
			return nil, fmt.Errorf("active index names op %d, which does not exist: %w", fromU64(k), ErrCorrupt)
		}
		out = append(out, op)
	}
	return out, nil
}

// Accept records a new op on volume v (a new volume when it has no record
// yet): it assigns op.Seq, marks the op queued and active, sets v.ActiveOp
// and writes both. v must have no active op.
func (t *Tx) Accept(v *Volume, op *Op) error {
	if err := checkID(v.ID); err != nil {
		return err
	}
	if v.ActiveOp != 0 {
		return fmt.Errorf("store: volume %s already has active op %d", v.ID, v.ActiveOp)
	}
	ops := t.tx.Bucket(bucketOps)
	seq, err := ops.NextSequence()
	if err != nil {
		return err
	}
	op.Seq, op.VolumeID, op.Status, op.Generation = seq, v.ID, OpQueued, v.Generation
	v.ActiveOp = seq
	if err := put(ops, u64(seq), op); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketActive).Put(u64(seq), []byte(v.ID)); err != nil {
		return err
	}
	if v.Name != "" {
		if err := t.tx.Bucket(bucketNames).Put([]byte(v.Name), []byte(v.ID)); err != nil {
			return err
		}
	}
	return t.putVolume(v)
}

// UpdateOp rewrites an active op (its attempts, last error, checkpoints or
// status while compensating). The volume is not touched.
func (t *Tx) UpdateOp(op *Op) error {
	if !op.Status.Active() {
		return fmt.Errorf("store: UpdateOp on finished op %d", op.Seq)
	}
	if t.tx.Bucket(bucketActive).Get(u64(op.Seq)) == nil {
		return fmt.Errorf("store: op %d is not active", op.Seq)
	}
	return put(t.tx.Bucket(bucketOps), u64(op.Seq), op)
}

// Finish records the outcome of op (which must be finished: succeeded or
// failed) together with the volume it leaves and a history entry, and
// clears the volume's active op. A volume left in state ABSENT loses its
// record, name, history and resize entry.
func (t *Tx) Finish(v *Volume, op *Op, h HistoryEntry) error {
	if op.Status.Active() {
		return fmt.Errorf("store: Finish with op %d still %s", op.Seq, op.Status)
	}
	if v.ActiveOp != op.Seq {
		return fmt.Errorf("store: volume %s has active op %d, not %d", v.ID, v.ActiveOp, op.Seq)
	}
	v.ActiveOp = 0
	if err := put(t.tx.Bucket(bucketOps), u64(op.Seq), op); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketActive).Delete(u64(op.Seq)); err != nil {
		return err
	}
	if err := t.prune(op.Seq); err != nil {
		return err
	}
	if v.State == fsm.Absent {
		return t.remove(v)
	}
	if err := t.putVolume(v); err != nil {
		return err
	}
	return t.AppendHistory(v.ID, h)
}

// Adopt writes a volume record made by reconciliation (a node adopting a
// volume attached to it, a controller rebuilding records from the cloud),
// with the history entry that explains it. v must have no active op.
func (t *Tx) Adopt(v *Volume, h HistoryEntry) error {
	if err := checkID(v.ID); err != nil {
		return err
	}
	if v.ActiveOp != 0 {
		return fmt.Errorf("store: adopted volume %s has an active op", v.ID)
	}
	if v.Name != "" {
		if err := t.tx.Bucket(bucketNames).Put([]byte(v.Name), []byte(v.ID)); err != nil {
			return err
		}
	}
	if err := t.putVolume(v); err != nil {
		return err
	}
	return t.AppendHistory(v.ID, h)
}

func (t *Tx) remove(v *Volume) error {
	if err := t.tx.Bucket(bucketVolumes).Delete([]byte(v.ID)); err != nil {
		return err
	}
	names := t.tx.Bucket(bucketNames)
	if v.Name != "" && string(names.Get([]byte(v.Name))) == v.ID {
		if err := names.Delete([]byte(v.Name)); err != nil {
			return err
		}
	}
	if err := t.tx.Bucket(bucketResize).Delete([]byte(v.ID)); err != nil {
		return err
	}
	hist := t.tx.Bucket(bucketHistory)
	prefix := historyPrefix(v.ID)
	c := hist.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// prune drops finished ops that fell out of the retention window when op
// seq finished: a few per call, oldest first, skipping ops still active.
func (t *Tx) prune(seq uint64) error {
	if seq <= t.s.opts.OpRetention {
		return nil
	}
	limit := u64(seq - t.s.opts.OpRetention)
	ops, active := t.tx.Bucket(bucketOps), t.tx.Bucket(bucketActive)
	from := []byte{}
	for i := 0; i < 4; i++ {
		k, _ := ops.Cursor().Seek(from)
		for k != nil && active.Get(k) != nil && bytes.Compare(k, limit) <= 0 {
			from = u64(fromU64(k) + 1)
			k, _ = ops.Cursor().Seek(from)
		}
		if k == nil || bytes.Compare(k, limit) > 0 {
			return nil
		}
		if err := ops.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func historyPrefix(id string) []byte { return append([]byte(id), 0) }

// AppendHistory adds an entry to a volume's history, dropping the oldest
// beyond the history limit. Entries without an op (a deferred request) are
// written this way directly.
func (t *Tx) AppendHistory(id string, h HistoryEntry) error {
	if err := checkID(id); err != nil {
		return err
	}
	hist := t.tx.Bucket(bucketHistory)
	seq, err := hist.NextSequence()
	if err != nil {
		return err
	}
	prefix := historyPrefix(id)
	if err := put(hist, append(append([]byte{}, prefix...), u64(seq)...), h); err != nil {
		return err
	}
	// Count from the newest backwards; delete what lies beyond the limit.
	c := hist.Cursor()
	n := 0
	k, _ := c.Seek(append(append([]byte{}, prefix...), u64(seq)...))
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
		n++
		if n > t.s.opts.HistoryLimit {
			if err := c.Delete(); err != nil {
				return err
			}
		}
	}
	return nil
}

// History returns a volume's history, oldest first.
func (t *Tx) History(id string) ([]HistoryEntry, error) {
	var out []HistoryEntry
	prefix := historyPrefix(id)
	c := t.tx.Bucket(bucketHistory).Cursor()
	for k, raw := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, raw = c.Next() {
		var h HistoryEntry
		if err := json.Unmarshal(raw, &h); err != nil {
			return nil, fmt.Errorf("decode history of %s: %w", id, err)
		}
		out = append(out, h)
	}
	return out, nil
}

// Resize returns the deferred resize of a volume, or nil.
func (t *Tx) Resize(id string) (*Resize, error) {
	return get[Resize](t.tx.Bucket(bucketResize), []byte(id))
}

// PutResize writes a resize queue entry.
func (t *Tx) PutResize(r *Resize) error {
	if err := checkID(r.VolumeID); err != nil {
		return err
	}
	return put(t.tx.Bucket(bucketResize), []byte(r.VolumeID), r)
}

// DeleteResize removes a volume's resize queue entry, if any.
func (t *Tx) DeleteResize(id string) error {
	return t.tx.Bucket(bucketResize).Delete([]byte(id))
}

// ForEachResize calls fn for each resize queue entry in volume id order,
// until fn returns false.
func (t *Tx) ForEachResize(fn func(*Resize) bool) error {
	c := t.tx.Bucket(bucketResize).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		r := new(Resize)
		if err := json.Unmarshal(raw, r); err != nil {
			return fmt.Errorf("decode resize %q: %w", k, err)
		}
		if !fn(r) {
			return nil
		}
	}
	return nil
}

// CountResizes returns the number of resize queue entries.
func (t *Tx) CountResizes() int { return t.tx.Bucket(bucketResize).Stats().KeyN }
