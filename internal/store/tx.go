package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// Tx is a transaction over the typed records. A Tx from View is read-only;
// write methods on it fail.
//
// Volumes change only through Accept (a new op; a new record only in
// ABSENT, for a create), Finish (the op's outcome, which is its history
// line) and Reconcile (a state reality already has, with a history note):
// there is no bare "put volume", and every state written is a step of the
// lifecycle table checked by internal/fsm, under its true event name.
//
// Reads check every record's seal (see codec.go). A lookup of a damaged
// record returns a *DamagedError; a scan never stops at one: it skips it
// and notes it, and Skipped returns what the transaction's scans skipped.
type Tx struct {
	tx      *bolt.Tx
	s       *Store
	skipped []*DamagedError
}

// Skipped returns the damaged records this transaction's scans skipped.
func (t *Tx) Skipped() []*DamagedError { return t.skipped }

// skip notes a damaged record a scan passed over.
func (t *Tx) skip(e *DamagedError) { t.skipped = append(t.skipped, t.attribute(e)) }

// attribute names the snapshot a damaged record belongs to where its key
// (an active-op entry's, a note's, an op's owner) is a snapshot's id,
// which damaged alone cannot tell from a volume's.
func (t *Tx) attribute(e *DamagedError) *DamagedError {
	if e.VolumeID == "" {
		return e
	}
	if b := t.tx.Bucket(bucketSnapshots); b != nil && b.Get([]byte(e.VolumeID)) != nil {
		e.SnapshotID, e.VolumeID = e.VolumeID, ""
	}
	return e
}

// OnCommit registers fn to run after the transaction has committed. Hooks
// run in commit order, on the committer, before any later write
// transaction begins (a read transaction, View, may begin before they have
// run and already see the commit); they must be quick and must not call
// Update.
func (t *Tx) OnCommit(fn func()) { t.tx.OnCommit(fn) }

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func fromU64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// decode checks the seal of the JSON record raw at key in bucket and
// decodes it into a new T; a *DamagedError when either fails.
func decode[T any](bucket, key, raw []byte) (*T, error) {
	payload, err := unseal(bucket, key, raw)
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := json.Unmarshal(payload, v); err != nil {
		return nil, damaged(bucket, key, "does not decode: "+err.Error())
	}
	return v, nil
}

// put writes v's JSON, sealed, at key in bucket.
func (t *Tx) put(bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.tx.Bucket(bucket).Put(key, seal(key, raw))
}

// putRaw writes an index entry's bytes, sealed.
func (t *Tx) putRaw(bucket, key, payload []byte) error {
	return t.tx.Bucket(bucket).Put(key, seal(key, payload))
}

// getRaw returns an index entry's bytes (nil when there is none), checked.
func (t *Tx) getRaw(bucket, key []byte) ([]byte, error) {
	raw := t.tx.Bucket(bucket).Get(key)
	if raw == nil {
		return nil, nil
	}
	return unseal(bucket, key, raw)
}

func checkID(id string) error {
	if id == "" || strings.IndexByte(id, 0) >= 0 {
		return fmt.Errorf("store: invalid volume id %q", id)
	}
	return nil
}

// Volume returns the volume with this id, or nil when there is none. The
// caller owns the returned record. A volume whose record or active-op
// entry is damaged is a *DamagedError.
func (t *Tx) Volume(id string) (*Volume, error) {
	key := []byte(id)
	raw := t.tx.Bucket(bucketVolumes).Get(key)
	if raw == nil {
		return nil, nil
	}
	v, err := t.s.volumes.decode(key, raw, true)
	if err != nil {
		return nil, err
	}
	if v.ActiveOp, err = t.activeOfKey(key); err != nil {
		return nil, err
	}
	return v, nil
}

// activeOf returns the op active on a volume, 0 if none.
func (t *Tx) activeOf(id string) (uint64, error) { return t.activeOfKey([]byte(id)) }

// activeOfKey is activeOf of the volume id key (the key escapes into the
// checksum: a caller that has it as bytes saves a copy).
func (t *Tx) activeOfKey(key []byte) (uint64, error) {
	raw, err := t.getRaw(bucketActive, key)
	switch {
	case err != nil:
		return 0, err
	case raw == nil:
		return 0, nil
	case len(raw) != 8:
		return 0, damaged(bucketActive, key, fmt.Sprintf("holds %d bytes, not an op's sequence number", len(raw)))
	}
	return fromU64(raw), nil
}

func (t *Tx) putVolume(v *Volume) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	sealed := seal([]byte(v.ID), raw)
	if err := t.tx.Bucket(bucketVolumes).Put([]byte(v.ID), sealed); err != nil {
		return err
	}
	t.s.volumes.remember(sealed, v)
	return nil
}

// VolumeIDByName returns the id of the volume created with this name, or
// "". A damaged entry is a *DamagedError: whether the name is taken is
// unknown.
func (t *Tx) VolumeIDByName(name string) (string, error) {
	raw, err := t.getRaw(bucketNames, []byte(name))
	return string(raw), err
}

// ForEachVolume calls fn for each volume in id order, starting after the id
// `after` ("" for the first); it stops when fn returns false. It reads the
// decode cache but does not fill it: a scan would evict the records of the
// volumes with ops in flight. A damaged volume is skipped (see Skipped).
func (t *Tx) ForEachVolume(after string, fn func(*Volume) bool) error {
	return t.ForEachVolumeRecord(after, func(v *Volume, bad *DamagedError) bool {
		if bad != nil {
			t.skip(bad)
			return true
		}
		return fn(v)
	})
}

// ForEachVolumeRecord is ForEachVolume that also visits the damaged
// volumes, in their place: fn gets either a volume or the damage that
// stops csid from reading it (its record or its active-op entry).
func (t *Tx) ForEachVolumeRecord(after string, fn func(v *Volume, bad *DamagedError) bool) error {
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
		v, err := t.s.volumes.decode(k, raw, false)
		if err == nil {
			v.ActiveOp, err = t.activeOfKey(k)
		}
		bad, _ := asDamaged(err)
		if bad == nil && err != nil {
			return err
		}
		if bad != nil {
			v = nil
		}
		if !fn(v, bad) {
			return nil
		}
	}
	return nil
}

// CountVolumes returns the number of volume records.
func (t *Tx) CountVolumes() int { return t.tx.Bucket(bucketVolumes).Stats().KeyN }

// Op returns the op with this sequence number, or nil. A damaged record
// is a *DamagedError.
func (t *Tx) Op(seq uint64) (*Op, error) {
	return decodeOp(seq, t.tx.Bucket(bucketOps).Get(u64(seq)))
}

func decodeOp(seq uint64, raw []byte) (*Op, error) {
	if raw == nil {
		return nil, nil
	}
	op, err := decode[Op](bucketOps, u64(seq), raw)
	if err == nil && op.Seq != seq {
		return nil, damaged(bucketOps, u64(seq), fmt.Sprintf("is stored as op %d but says it is op %d", seq, op.Seq))
	}
	return op, err
}

// ForEachOp calls fn for each op, newest first, until fn returns false.
// A damaged op is skipped (see Skipped).
func (t *Tx) ForEachOp(fn func(*Op) bool) error {
	c := t.tx.Bucket(bucketOps).Cursor()
	for k, raw := c.Last(); k != nil; k, raw = c.Prev() {
		op, err := decodeOp(fromU64(k), raw)
		if t.skipDamaged(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !fn(op) {
			return nil
		}
	}
	return nil
}

// skipDamaged notes err and reports true when it is a damaged record.
func (t *Tx) skipDamaged(err error) bool {
	if bad, ok := asDamaged(err); ok {
		t.skip(bad)
		return true
	}
	return false
}

// ActiveOps returns every op still queued or compensating, oldest first.
// An entry of the active index that is damaged, or names an op that is
// damaged or missing, is skipped (see Skipped): its volume is damaged.
func (t *Tx) ActiveOps() ([]*Op, error) {
	var out []*Op
	c := t.tx.Bucket(bucketActive).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		seq, err := t.activeOfKey(k)
		if t.skipDamaged(err) {
			continue
		}
		op, err := t.Op(seq)
		if bad, ok := asDamaged(err); ok {
			bad.VolumeID = string(k)
			t.skip(bad)
			continue
		}
		if err != nil {
			return nil, err
		}
		if op == nil || op.Subject() != string(k) {
			t.skip(damaged(bucketActive, k, fmt.Sprintf("names op %d, which is not an op of this volume or snapshot", seq)))
			continue
		}
		out = append(out, op)
	}
	slices.SortFunc(out, func(a, b *Op) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// Accept records a new op on volume v: it assigns op.Seq, marks the op
// queued and active, and sets v.ActiveOp. v must have no active op. The
// volume record itself is written only when it has none yet (a create, or
// an adoption in the same transaction): an existing volume does not change
// until the op finishes.
func (t *Tx) Accept(v *Volume, op *Op) error {
	if op.Event.OfSnapshot() {
		return fmt.Errorf("store: a snapshot's op %s accepted on volume %s: %w", op.Event, v.ID, fsm.ErrIllegal)
	}
	op.VolumeID, op.SnapshotID = v.ID, ""
	if err := t.acceptOp(v.ID, v.ActiveOp, v.Generation, op); err != nil {
		return err
	}
	v.ActiveOp = op.Seq
	if t.tx.Bucket(bucketVolumes).Get([]byte(v.ID)) != nil {
		return nil
	}
	if v.State != fsm.Absent {
		return fmt.Errorf("store: a new record of volume %s in state %s: only a create starts a record (reconciliation uses Reconcile): %w",
			v.ID, v.State, fsm.ErrIllegal)
	}
	if err := t.notTakenBy(bucketSnapshots, v.ID); err != nil {
		return err
	}
	if v.Name != "" {
		if err := t.putRaw(bucketNames, []byte(v.Name), []byte(v.ID)); err != nil {
			return err
		}
	}
	return t.putVolume(v)
}

// acceptOp writes op, queued, as the active op of the volume or snapshot
// id (whose record says it has activeOp in flight), planned against
// generation gen: it assigns op.Seq.
func (t *Tx) acceptOp(id string, activeOp, gen uint64, op *Op) error {
	if err := checkID(id); err != nil {
		return err
	}
	if active, err := t.activeOf(id); err != nil {
		return err
	} else if activeOp != 0 || active != 0 {
		return fmt.Errorf("store: %s already has an active op", id)
	}
	seq, err := t.tx.Bucket(bucketOps).NextSequence()
	if err != nil {
		return err
	}
	op.Seq, op.Status, op.Generation = seq, OpQueued, gen
	if err := t.put(bucketOps, u64(seq), op); err != nil {
		return err
	}
	return t.putRaw(bucketActive, []byte(id), u64(seq))
}

// notTakenBy refuses a new record under id when the other kind of record
// (bucket: volumes or snapshots) holds it: volume and snapshot ids are one
// namespace, which the active index and the notes share.
func (t *Tx) notTakenBy(bucket []byte, id string) error {
	b := t.tx.Bucket(bucket)
	if b == nil || b.Get([]byte(id)) == nil {
		return nil
	}
	return fmt.Errorf("store: id %s is taken by a record in %s", id, bucket)
}

// UpdateOp rewrites an active op (its attempts, last error, checkpoints or
// status while compensating). The volume is not touched.
func (t *Tx) UpdateOp(op *Op) error {
	if !op.Status.Active() {
		return fmt.Errorf("store: UpdateOp on finished op %d", op.Seq)
	}
	if active, err := t.activeOf(op.Subject()); err != nil {
		return err
	} else if active != op.Seq {
		return fmt.Errorf("store: op %d is not active", op.Seq)
	}
	return t.put(bucketOps, u64(op.Seq), op)
}

// Finish records the outcome of op (which must be finished: succeeded or
// failed) together with the volume it leaves, and clears the volume's
// active op. The op record is the transition's history line. A volume left
// in state ABSENT loses its record, name, notes and resize entry.
func (t *Tx) Finish(v *Volume, op *Op) error {
	if op.SnapshotID != "" || op.VolumeID != v.ID {
		return fmt.Errorf("store: Finish of volume %s with op %d of %s", v.ID, op.Seq, op.Subject())
	}
	if err := t.checkActive(v.ID, op); err != nil {
		return err
	}
	if err := t.checkFinish(v, op); err != nil {
		return err
	}
	v.ActiveOp = 0
	prev := v.LastOp
	v.LastOp = op.Seq
	if err := t.finishOp(v.ID, op); err != nil {
		return err
	}
	if v.State == fsm.Absent {
		if err := t.remove(v); err != nil {
			return err
		}
	} else if err := t.putVolume(v); err != nil {
		return err
	}
	return t.prune(op.Seq, prev)
}

// checkActive checks that op is finished and is the active op of the
// volume or snapshot id.
func (t *Tx) checkActive(id string, op *Op) error {
	if op.Status.Active() {
		return fmt.Errorf("store: Finish with op %d still %s", op.Seq, op.Status)
	}
	if a, err := t.activeOf(id); err != nil {
		return err
	} else if a != op.Seq {
		return fmt.Errorf("store: %s has active op %d, not %d", id, a, op.Seq)
	}
	return nil
}

// finishOp writes a finished op and clears the active marker of id.
func (t *Tx) finishOp(id string, op *Op) error {
	if err := t.put(bucketOps, u64(op.Seq), op); err != nil {
		return err
	}
	return t.tx.Bucket(bucketActive).Delete([]byte(id))
}

// checkFinish holds an op's outcome to the lifecycle table: the op's step
// (From, Event, Guard, To) is one looplab takes, the stored volume is in
// the op's From state, and the record written is in To (succeeded) or
// still in From (failed).
func (t *Tx) checkFinish(v *Volume, op *Op) error {
	stored := fsm.Absent
	if cur, err := t.Volume(v.ID); err != nil {
		return err
	} else if cur != nil {
		stored = cur.State
	}
	return checkOutcome(fsm.Volumes, op, stored, v.State, "volume "+v.ID)
}

// checkOutcome holds an op's outcome to its lifecycle l: the op's step is
// one of l, the record what (a volume or snapshot) is stored in the op's
// From state, and is written in To (succeeded) or still in From (failed).
func checkOutcome(l *fsm.Lifecycle, op *Op, stored, written fsm.State, what string) error {
	if err := l.Check(op.From, op.Event, op.Guard, op.To); err != nil {
		return fmt.Errorf("store: op %d: %w", op.Seq, err)
	}
	want := op.To
	if op.Status != OpSucceeded {
		want = op.From
	}
	if stored != op.From || written != want {
		return fmt.Errorf("store: op %d (%s from %s to %s, %s) would write %s from %s to %s: %w",
			op.Seq, op.Event, op.From, op.To, op.Status, what, stored, written, fsm.ErrIllegal)
	}
	return nil
}

// dropName deletes the entry of name in the name index bucket if it names
// id; a damaged entry stays, for csid check to report.
func (t *Tx) dropName(bucket []byte, name, id string) error {
	if name == "" {
		return nil
	}
	if owner, err := t.getRaw(bucket, []byte(name)); err == nil && string(owner) == id {
		return t.tx.Bucket(bucket).Delete([]byte(name))
	}
	return nil
}

// Reconcile records a state that reality already has and no op made: a
// node adopting a volume, a controller rebuilding a record from the cloud,
// a rollback after a mount vanished, a node forgetting a volume. The step
// from the stored state (ABSENT when there is no record) by event e under
// guard g must be one the lifecycle table (looplab) takes to v.State; a
// step to ABSENT removes the record. The volume's generation moves on, and
// the change is recorded in its history under e's name with outcome. v
// must have no active op.
func (t *Tx) Reconcile(v *Volume, e fsm.Event, g fsm.Guard, outcome string, now time.Time) error {
	if err := t.idle("volume", v.ID, v.ActiveOp, e); err != nil {
		return err
	}
	cur, err := t.Volume(v.ID)
	if err != nil {
		return err
	}
	from, gen := fsm.Absent, uint64(0)
	if cur != nil {
		from, gen = cur.State, cur.Generation
	}
	if err := fsm.Check(from, e, g, v.State); err != nil {
		return fmt.Errorf("store: volume %s: %w", v.ID, err)
	}
	if cur == nil {
		if err := t.notTakenBy(bucketSnapshots, v.ID); err != nil {
			return err
		}
	}
	v.Generation, v.UpdatedAt = gen+1, now
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	if v.State == fsm.Absent {
		if cur == nil {
			return nil
		}
		return t.remove(cur)
	}
	if cur != nil && cur.Name != v.Name {
		if err := t.dropName(bucketNames, cur.Name, v.ID); err != nil {
			return err
		}
	}
	if v.Name != "" {
		if err := t.putRaw(bucketNames, []byte(v.Name), []byte(v.ID)); err != nil {
			return err
		}
	}
	if err := t.putVolume(v); err != nil {
		return err
	}
	return t.AddNote(v.ID, HistoryEntry{Time: now, Event: e, Guard: g, From: from, To: v.State,
		Generation: v.Generation, Outcome: outcome})
}

// idle checks the id of a volume or snapshot (kind) that is to be
// reconciled, and that it has no op in flight (activeOp is what its
// record says): a reconciliation is left to the op.
func (t *Tx) idle(kind, id string, activeOp uint64, e fsm.Event) error {
	if err := checkID(id); err != nil {
		return err
	}
	if slices.Contains(fsm.AllOpEvents(), e) {
		// An op's event is recorded by its op (Finish); a reconciliation
		// records what csid found, under the event that says so.
		return fmt.Errorf("store: %s %s: %s is an op's event, not a reconciliation's: %w", kind, id, e, fsm.ErrIllegal)
	}
	if active, err := t.activeOf(id); err != nil {
		return err
	} else if activeOp != 0 || active != 0 {
		return fmt.Errorf("store: %s %s has an active op; it is left to the op", kind, id)
	}
	return nil
}

func (t *Tx) remove(v *Volume) error {
	if err := t.tx.Bucket(bucketVolumes).Delete([]byte(v.ID)); err != nil {
		return err
	}
	if err := t.dropName(bucketNames, v.Name, v.ID); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketResize).Delete([]byte(v.ID)); err != nil {
		return err
	}
	return t.deleteNotes(v.ID)
}

// prune keeps the ops bucket bounded. Ops out of the retention window (more
// than OpRetention older than the newest) are deleted, except each volume's
// last op and ops still active. A cursor in the meta bucket remembers how
// far pruning got, so each call does a few steps; an op kept as a volume's
// last op when the cursor passed it is deleted when the volume's next op
// finishes (prev), or when the volume is deleted.
func (t *Tx) prune(latest, prev uint64) error {
	meta, ops := t.tx.Bucket(bucketMeta), t.tx.Bucket(bucketOps)
	cursor := uint64(1)
	if raw := meta.Get(keyPruned); len(raw) == 8 {
		cursor = fromU64(raw)
	}
	if prev != 0 && prev < cursor {
		if err := ops.Delete(u64(prev)); err != nil {
			return err
		}
	}
	if latest <= t.s.opts.OpRetention {
		return nil
	}
	limit, start := latest-t.s.opts.OpRetention, cursor
	for ; cursor <= limit && cursor < start+4; cursor++ {
		raw := ops.Get(u64(cursor))
		if raw == nil {
			continue
		}
		payload, err := unseal(bucketOps, u64(cursor), raw)
		var o struct {
			VolumeID   string   `json:"volumeID"`
			SnapshotID string   `json:"snapshotID"`
			Status     OpStatus `json:"status"`
		}
		if err != nil || json.Unmarshal(payload, &o) != nil {
			continue // damaged: kept for csid check to report
		}
		if o.Status.Active() || t.isLastOp(o.VolumeID, o.SnapshotID, cursor) {
			continue // finishing, or becoming superseded, deletes it later
		}
		if err := ops.Delete(u64(cursor)); err != nil {
			return err
		}
	}
	return meta.Put(keyPruned, u64(cursor))
}

// isLastOp reports whether seq is the last op of volume id (or, for a
// snapshot's op, of snapshot snapID); when the record is damaged it may
// be, and the op is kept.
func (t *Tx) isLastOp(id, snapID string, seq uint64) bool {
	if snapID != "" {
		s, err := t.Snapshot(snapID)
		return err != nil || s != nil && s.LastOp == seq
	}
	v, err := t.Volume(id)
	return err != nil || v != nil && v.LastOp == seq
}

func historyPrefix(id string) []byte { return append([]byte(id), 0) }

// AddNote adds a history line that no op explains (a deferred resize
// request, an adoption, a dropped resize) to a volume's history, dropping
// the volume's oldest note beyond the history limit.
//
// A volume's notes are keyed by the volume id and a per-volume index, so a
// note is added with one seek for the newest and one delete of the note
// that falls out of the window, whatever the history's length.
func (t *Tx) AddNote(id string, h HistoryEntry) error {
	if err := checkID(id); err != nil {
		return err
	}
	notes := t.tx.Bucket(bucketHistory)
	prefix := historyPrefix(id)
	next := uint64(0)
	c := notes.Cursor()
	k, _ := c.Seek(historyKey(prefix, math.MaxUint64))
	if k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	if k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8 {
		next = fromU64(k[len(prefix):]) + 1
	}
	if err := t.put(bucketHistory, historyKey(prefix, next), h); err != nil {
		return err
	}
	if limit := uint64(t.s.opts.HistoryLimit); next >= limit {
		return notes.Delete(historyKey(prefix, next-limit))
	}
	return nil
}

func historyKey(prefix []byte, n uint64) []byte {
	return append(append(make([]byte, 0, len(prefix)+8), prefix...), u64(n)...)
}

// History returns a volume's (or a snapshot's) history, oldest first: its
// finished ops (as lines) and its notes, the newest HistoryLimit of them. It scans the ops
// bucket (bounded by OpRetention plus each volume's last op): meant for
// inspection, not for a hot path.
func (t *Tx) History(id string) ([]HistoryEntry, error) {
	all, err := t.histories(func(v string) bool { return v == id })
	return all[id], err
}

// Histories returns every volume's history (see History) in one scan.
func (t *Tx) Histories() (map[string][]HistoryEntry, error) {
	return t.histories(func(string) bool { return true })
}

func (t *Tx) histories(want func(string) bool) (map[string][]HistoryEntry, error) {
	out := map[string][]HistoryEntry{}
	c := t.tx.Bucket(bucketOps).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		op, err := decodeOp(fromU64(k), raw)
		if t.skipDamaged(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if op.Status.Active() || !want(op.Subject()) {
			continue
		}
		out[op.Subject()] = append(out[op.Subject()], op.HistoryEntry())
	}
	nc := t.tx.Bucket(bucketHistory).Cursor()
	for k, raw := nc.First(); k != nil; k, raw = nc.Next() {
		i := bytes.IndexByte(k, 0)
		if i < 0 || !want(string(k[:i])) {
			continue
		}
		h, err := decode[HistoryEntry](bucketHistory, k, raw)
		if t.skipDamaged(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[string(k[:i])] = append(out[string(k[:i])], *h)
	}
	for id, hist := range out {
		// Lines in time order; at equal times an op before a note, ops by
		// sequence (the sort is stable and ops were appended first).
		slices.SortStableFunc(hist, func(a, b HistoryEntry) int { return a.Time.Compare(b.Time) })
		if n := len(hist) - t.s.opts.HistoryLimit; n > 0 {
			hist = hist[n:]
		}
		out[id] = hist
	}
	return out, nil
}

// Resize returns the deferred resize of a volume, or nil. A damaged entry
// is a *DamagedError: whether a resize is queued is unknown.
func (t *Tx) Resize(id string) (*Resize, error) {
	return decodeResize([]byte(id), t.tx.Bucket(bucketResize).Get([]byte(id)))
}

func decodeResize(key, raw []byte) (*Resize, error) {
	if raw == nil {
		return nil, nil
	}
	r, err := decode[Resize](bucketResize, key, raw)
	if err == nil && r.VolumeID != string(key) {
		return nil, damaged(bucketResize, key, fmt.Sprintf("names volume %s", r.VolumeID))
	}
	return r, err
}

// PutResize writes a resize queue entry.
func (t *Tx) PutResize(r *Resize) error {
	if err := checkID(r.VolumeID); err != nil {
		return err
	}
	return t.put(bucketResize, []byte(r.VolumeID), r)
}

// DeleteResize removes a volume's resize queue entry, if any.
func (t *Tx) DeleteResize(id string) error {
	return t.tx.Bucket(bucketResize).Delete([]byte(id))
}

// ForEachResize calls fn for each resize queue entry in volume id order,
// until fn returns false. A damaged entry is skipped (see Skipped).
func (t *Tx) ForEachResize(fn func(*Resize) bool) error {
	c := t.tx.Bucket(bucketResize).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		r, err := decodeResize(k, raw)
		if t.skipDamaged(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !fn(r) {
			return nil
		}
	}
	return nil
}
