package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Source answers the questions of `csid inspect`: a live csid through its
// admin socket (admin.Client) or a state file (StoreSource). Both give the
// same answers for the same records.
type Source interface {
	// Info says which csid the source is.
	Info(ctx context.Context) (Info, error)
	// Volumes lists the volumes f selects, in id order, without history.
	Volumes(ctx context.Context, f VolumeFilter) (VolumeList, error)
	// Volume returns one volume with its history; ErrNotFound when there is
	// no such volume.
	Volume(ctx context.Context, id string) (Volume, error)
	// Ops lists the ops f selects, newest first.
	Ops(ctx context.Context, f OpFilter) (OpList, error)
	// Op returns one op; ErrNotFound when it does not exist (or was pruned).
	Op(ctx context.Context, seq uint64) (Op, error)
	// Resizes lists the deferred resizes in volume id order.
	Resizes(ctx context.Context) (ResizeList, error)
	// Snapshots lists the snapshots in id order, without history.
	Snapshots(ctx context.Context) (SnapshotList, error)
	// Snapshot returns one snapshot with its history; ErrNotFound when
	// there is no such snapshot.
	Snapshot(ctx context.Context, id string) (Snapshot, error)
	// Damaged checks every record and lists the damaged ones.
	Damaged(ctx context.Context) (DamageList, error)
}

// Reader is what the views read: a store's read-only transactions. A
// *store.Store is one.
type Reader interface {
	View(fn func(tx *store.Tx) error) error
}

// StoreSource answers from a store, through read-only transactions only.
type StoreSource struct {
	r    Reader
	info Info
}

var _ Source = (*StoreSource)(nil)

// NewStoreSource answers from r; info is what Info returns.
func NewStoreSource(r Reader, info Info) *StoreSource {
	return &StoreSource{r: r, info: info}
}

// Info returns the info the source was made with.
func (s *StoreSource) Info(ctx context.Context) (Info, error) { return s.info, ctx.Err() }

// Volumes lists volumes; see Source.
func (s *StoreSource) Volumes(ctx context.Context, f VolumeFilter) (VolumeList, error) {
	return read(ctx, s.r, func(tx *store.Tx) (VolumeList, error) { return ListVolumes(tx, f) })
}

// Volume returns one volume; see Source.
func (s *StoreSource) Volume(ctx context.Context, id string) (Volume, error) {
	return read(ctx, s.r, func(tx *store.Tx) (Volume, error) { return GetVolume(tx, id) })
}

// Ops lists ops; see Source.
func (s *StoreSource) Ops(ctx context.Context, f OpFilter) (OpList, error) {
	return read(ctx, s.r, func(tx *store.Tx) (OpList, error) { return ListOps(tx, f) })
}

// Op returns one op; see Source.
func (s *StoreSource) Op(ctx context.Context, seq uint64) (Op, error) {
	return read(ctx, s.r, func(tx *store.Tx) (Op, error) { return GetOp(tx, seq) })
}

// Resizes lists resizes; see Source.
func (s *StoreSource) Resizes(ctx context.Context) (ResizeList, error) {
	return read(ctx, s.r, ListResizes)
}

// Snapshots lists snapshots; see Source.
func (s *StoreSource) Snapshots(ctx context.Context) (SnapshotList, error) {
	return read(ctx, s.r, ListSnapshots)
}

// Snapshot returns one snapshot; see Source.
func (s *StoreSource) Snapshot(ctx context.Context, id string) (Snapshot, error) {
	return read(ctx, s.r, func(tx *store.Tx) (Snapshot, error) { return GetSnapshot(tx, id) })
}

// Damaged lists the damaged records; see Source.
func (s *StoreSource) Damaged(ctx context.Context) (DamageList, error) {
	return read(ctx, s.r, ListDamaged)
}

// Backuper writes a consistent copy of a state file; a *store.Store is one.
type Backuper interface {
	Backup(w io.Writer) (int64, error)
}

// Backup writes a consistent copy of the state file to w (csid state
// backup), when the source's reader is a Backuper.
func (s *StoreSource) Backup(ctx context.Context, w io.Writer) (int64, error) {
	b, ok := s.r.(Backuper)
	if !ok {
		return 0, errors.New("this source cannot write a backup")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return b.Backup(w)
}

// read builds a view in one read-only transaction of r, unless ctx has
// ended already.
func read[T any](ctx context.Context, r Reader, build func(tx *store.Tx) (T, error)) (out T, err error) {
	if err := ctx.Err(); err != nil {
		return out, err
	}
	err = r.View(func(tx *store.Tx) error { out, err = build(tx); return err })
	return out, err
}

// CheckState returns an error naming the lifecycle states when s is not one
// ("" is fine: no filter).
func CheckState(s fsm.State) error {
	if s == "" || s.Valid() {
		return nil
	}
	names := make([]string, len(fsm.States))
	for i, x := range fsm.States {
		names[i] = string(x)
	}
	return fmt.Errorf("unknown state %q: one of %s", s, strings.Join(names, ", "))
}

// CheckOpSelect returns an error when s is not an OpSelect ("" is all).
func CheckOpSelect(s OpSelect) error {
	switch s {
	case "", OpsAll, OpsPending, OpsFailed:
		return nil
	}
	return fmt.Errorf("unknown op status %q: all, pending or failed", s)
}

// ListVolumes builds the volume list f selects from tx.
func ListVolumes(tx *store.Tx, f VolumeFilter) (VolumeList, error) {
	if err := CheckState(f.State); err != nil {
		return VolumeList{}, err
	}
	out := VolumeList{Volumes: []Volume{}}
	var ferr error
	err := tx.ForEachVolumeRecord("", func(v *store.Volume, bad *store.DamagedError) bool {
		if bad != nil {
			// Its state and node are unknown: listed whatever the filter.
			out.Volumes = append(out.Volumes, Volume{ID: bad.VolumeID, Damage: bad.Error()})
			return true
		}
		if (f.State != "" && v.State != f.State) || (f.Node != "" && v.Node() != f.Node) {
			return true
		}
		vv, err := volume(tx, v)
		if err != nil {
			ferr = err
			return false
		}
		out.Volumes = append(out.Volumes, vv)
		return true
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		return VolumeList{}, fmt.Errorf("list volumes: %w", err)
	}
	return out, nil
}

// GetVolume builds one volume, with its history, from tx; ErrNotFound when
// there is no record. A volume whose record is damaged has only its id and
// damage; history lines whose records are damaged are left out (ListDamaged
// names them).
func GetVolume(tx *store.Tx, id string) (Volume, error) {
	v, err := tx.Volume(id)
	if bad, ok := damage(err); ok {
		return Volume{ID: id, Damage: bad}, nil
	}
	if err != nil {
		return Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	if v == nil {
		return Volume{}, fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	out, err := volume(tx, v)
	if err != nil {
		return Volume{}, err
	}
	if out.History, err = history(tx, id); err != nil {
		return Volume{}, fmt.Errorf("history of volume %s: %w", id, err)
	}
	return out, nil
}

// history builds the history of a volume or snapshot.
func history(tx *store.Tx, id string) ([]HistoryLine, error) {
	hist, err := tx.History(id)
	if err != nil {
		return nil, err
	}
	out := make([]HistoryLine, len(hist))
	for i, h := range hist {
		out[i] = HistoryLine{Time: utc(h.Time), Event: h.Event, Guard: h.Guard, From: h.From, To: h.To,
			Op: h.OpSeq, Generation: h.Generation, Outcome: h.Outcome}
	}
	return out, nil
}

// volume builds the view of a record: its pending op, resize and last op
// are looked up in tx.
func volume(tx *store.Tx, v *store.Volume) (Volume, error) {
	out := Volume{
		ID: v.ID, Name: v.Name, State: v.State, DiskID: v.DiskID, CapacityBytes: v.CapacityBytes, Zone: v.Zone,
		AccessType: v.Capability.AccessType, FsType: v.Capability.FsType, MountFlags: slices.Clone(v.Capability.MountFlags),
		AccessMode: v.Capability.AccessMode, Parameters: cloneMap(v.Parameters),
		Generation: v.Generation, CreatedAt: utc(v.CreatedAt), UpdatedAt: utc(v.UpdatedAt),
	}
	if a := v.Attachment; a != nil {
		out.Node, out.ReadOnly, out.PublishContext = a.Node, a.ReadOnly, cloneMap(a.PublishContext)
	}
	if s := v.Stage; s != nil {
		out.StagingPath, out.Device = s.Path, s.Device
	}
	for _, p := range slices.Sorted(maps.Keys(v.Targets)) {
		out.Targets = append(out.Targets, Target{Path: p, ReadOnly: v.Targets[p].ReadOnly})
	}
	if src := v.Source; src != nil {
		out.Source = &ContentSource{SnapshotID: src.SnapshotID, VolumeID: src.VolumeID}
	}
	var err error
	if out.PendingOp, out.LastOp, out.Damage, err = recordOps(tx, "volume "+v.ID, v.ActiveOp, v.LastOp); err != nil {
		return Volume{}, err
	}
	r, err := tx.Resize(v.ID)
	if err != nil {
		if out.Damage, _ = damage(err); out.Damage == "" {
			return Volume{}, fmt.Errorf("volume %s: resize: %w", v.ID, err)
		}
	}
	if r != nil {
		rv := resize(r, v)
		out.Resize = &rv
	}
	return out, nil
}

// recordOps looks up the pending and last ops of the record of what (a
// volume or a snapshot, named). A damaged pending op is the record's
// damage; a damaged last op is lost history, nothing worse.
func recordOps(tx *store.Tx, what string, active, last uint64) (pending, lastOp *Op, damaged string, err error) {
	if pending, err = opBySeq(tx, active); err != nil {
		if damaged, _ = damage(err); damaged == "" {
			return nil, nil, "", fmt.Errorf("%s: pending op: %w", what, err)
		}
	}
	if lastOp, err = opBySeq(tx, last); err != nil {
		if _, ok := damage(err); !ok {
			return nil, nil, "", fmt.Errorf("%s: last op: %w", what, err)
		}
	}
	return pending, lastOp, damaged, nil
}

// damage returns the message of a damaged record's error.
func damage(err error) (string, bool) {
	var d *store.DamagedError
	if errors.As(err, &d) {
		return d.Error(), true
	}
	return "", false
}

// ListDamaged checks every record of tx and lists the damaged ones.
func ListDamaged(tx *store.Tx) (DamageList, error) {
	bad, err := tx.Damaged()
	if err != nil {
		return DamageList{}, fmt.Errorf("check the records: %w", err)
	}
	out := DamageList{Records: []DamagedRecord{}}
	for _, d := range bad {
		out.Records = append(out.Records, DamagedRecord{Record: d.Bucket + "/" + d.Key, Bucket: d.Bucket, Key: d.Key,
			VolumeID: d.VolumeID, SnapshotID: d.SnapshotID, Problem: d.Problem, Message: d.Error()})
	}
	return out, nil
}

// opBySeq returns the view of op seq, nil for 0 or an op no longer kept.
func opBySeq(tx *store.Tx, seq uint64) (*Op, error) {
	if seq == 0 {
		return nil, nil
	}
	op, err := tx.Op(seq)
	if err != nil || op == nil {
		return nil, err
	}
	o := opView(op)
	return &o, nil
}

// ListOps builds the op list f selects from tx, newest first.
func ListOps(tx *store.Tx, f OpFilter) (OpList, error) {
	if err := CheckOpSelect(f.Status); err != nil {
		return OpList{}, err
	}
	if f.Limit < 0 {
		return OpList{}, fmt.Errorf("negative op limit %d", f.Limit)
	}
	out := OpList{Ops: []Op{}}
	keep := func(op *store.Op) bool {
		if (f.VolumeID != "" && op.VolumeID != f.VolumeID) || (f.SnapshotID != "" && op.SnapshotID != f.SnapshotID) {
			return false
		}
		switch f.Status {
		case OpsPending:
			return op.Status.Active()
		case OpsFailed:
			return op.Status == store.OpFailed
		}
		return true
	}
	full := func() bool { return f.Limit > 0 && len(out.Ops) >= f.Limit }
	var err error
	if f.Status == OpsPending {
		// The active index is small; the ops bucket may hold thousands.
		var active []*store.Op
		active, err = tx.ActiveOps()
		for i := len(active) - 1; err == nil && i >= 0 && !full(); i-- {
			if keep(active[i]) {
				out.Ops = append(out.Ops, opView(active[i]))
			}
		}
	} else {
		err = tx.ForEachOp(func(op *store.Op) bool {
			if keep(op) {
				out.Ops = append(out.Ops, opView(op))
			}
			return !full()
		})
	}
	if err != nil {
		return OpList{}, fmt.Errorf("list ops: %w", err)
	}
	return out, nil
}

// GetOp builds one op from tx; ErrNotFound when it is not kept.
func GetOp(tx *store.Tx, seq uint64) (Op, error) {
	op, err := tx.Op(seq)
	if err != nil {
		return Op{}, fmt.Errorf("op %d: %w", seq, err)
	}
	if op == nil {
		return Op{}, fmt.Errorf("op %d: %w (ops are kept for the last 10000 sequences and each volume's last op)", seq, ErrNotFound)
	}
	return opView(op), nil
}

func opView(op *store.Op) Op {
	return Op{
		Seq: op.Seq, VolumeID: op.VolumeID, SnapshotID: op.SnapshotID, Event: op.Event, Guard: op.Guard, From: op.From, To: op.To,
		Status: string(op.Status), Generation: op.Generation, Attempts: op.Attempts, LastError: op.LastError,
		NextAttemptAt: utc(op.NextAttemptAt), Code: op.Code, Message: op.Message,
		Args: raw(op.Args), Result: raw(op.Result), Checkpoints: cloneMap(op.Checkpoints),
		CreatedAt: utc(op.CreatedAt), FinishedAt: utc(op.FinishedAt),
	}
}

// ListResizes builds the resize queue from tx, in volume id order.
func ListResizes(tx *store.Tx) (ResizeList, error) {
	out := ResizeList{Resizes: []Resize{}}
	var ferr error
	err := tx.ForEachResize(func(r *store.Resize) bool {
		v, err := tx.Volume(r.VolumeID)
		if _, ok := damage(err); ok {
			v, err = nil, nil // the volume's state is unknown
		}
		if err != nil {
			ferr = err
			return false
		}
		out.Resizes = append(out.Resizes, resize(r, v))
		return true
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		return ResizeList{}, fmt.Errorf("list resizes: %w", err)
	}
	return out, nil
}

// resize builds the view of a resize entry; v (its volume) may be nil.
func resize(r *store.Resize, v *store.Volume) Resize {
	out := Resize{VolumeID: r.VolumeID, Status: string(r.Status), TargetBytes: r.TargetBytes,
		Attempts: r.Attempts, LastError: r.LastError, QueuedAt: utc(r.QueuedAt), UpdatedAt: utc(r.UpdatedAt),
		NextAttemptAt: utc(r.NextAttemptAt)}
	if v != nil {
		out.CurrentBytes, out.VolumeState, out.Node = v.CapacityBytes, v.State, v.Node()
		if r.Status == store.ResizeRunning {
			// A running resize is its volume's active op (the expand the
			// engine started for it), so the op is not stored twice.
			out.OpSeq = v.ActiveOp
		}
	}
	return out
}

// utc makes times print the same whatever the reader's zone: a socket
// answer decoded and encoded again, and a state file read directly, give
// the same bytes.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

func raw(m json.RawMessage) json.RawMessage {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return slices.Clone(m)
}

func cloneMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// ListSnapshots builds the snapshot list from tx, in id order. A snapshot
// whose record is damaged is listed with its id and damage.
func ListSnapshots(tx *store.Tx) (SnapshotList, error) {
	out := SnapshotList{Snapshots: []Snapshot{}}
	var ferr error
	err := tx.ForEachSnapshot("", func(s *store.Snapshot) bool {
		sv, err := snapshot(tx, s)
		if err != nil {
			ferr = err
			return false
		}
		out.Snapshots = append(out.Snapshots, sv)
		return true
	})
	for _, d := range tx.Skipped() {
		if d.SnapshotID != "" {
			out.Snapshots = append(out.Snapshots, Snapshot{ID: d.SnapshotID, Damage: d.Error()})
		}
	}
	slices.SortStableFunc(out.Snapshots, func(a, b Snapshot) int { return strings.Compare(a.ID, b.ID) })
	if err == nil {
		err = ferr
	}
	if err != nil {
		return SnapshotList{}, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// GetSnapshot builds one snapshot, with its history, from tx; ErrNotFound
// when there is no record.
func GetSnapshot(tx *store.Tx, id string) (Snapshot, error) {
	s, err := tx.Snapshot(id)
	if bad, ok := damage(err); ok {
		return Snapshot{ID: id, Damage: bad}, nil
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if s == nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	out, err := snapshot(tx, s)
	if err != nil {
		return Snapshot{}, err
	}
	if out.History, err = history(tx, id); err != nil {
		return Snapshot{}, fmt.Errorf("history of snapshot %s: %w", id, err)
	}
	return out, nil
}

// snapshot builds the view of a snapshot record, with its pending and
// last ops.
func snapshot(tx *store.Tx, s *store.Snapshot) (Snapshot, error) {
	out := Snapshot{ID: s.ID, Name: s.Name, State: s.State, SourceVolumeID: s.SourceVolumeID, SourceDiskID: s.SourceDiskID,
		CloudID: s.CloudID, SizeBytes: s.SizeBytes, ReadyToUse: s.ReadyToUse, Zone: s.Zone, Parameters: cloneMap(s.Parameters),
		CutAt: utc(s.CutAt), Generation: s.Generation, CreatedAt: utc(s.CreatedAt), UpdatedAt: utc(s.UpdatedAt)}
	var err error
	if out.PendingOp, out.LastOp, out.Damage, err = recordOps(tx, "snapshot "+s.ID, s.ActiveOp, s.LastOp); err != nil {
		return Snapshot{}, err
	}
	return out, nil
}
