package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Snapshots run through the engine as volumes do: CreateSnapshot and
// DeleteSnapshot are ops of the snapshot (its own record, its own active
// op, the snapshot lifecycle's steps), idempotent by name, joined when
// repeated, resumed after a crash and compensated on failure. A snapshot's
// ops and its source volume's do not wait for each other: the provider
// orders a snapshot and a resize or a delete of one disk, and a snapshot
// outlives its volume.

// planSnapshotCreate plans a CreateSnapshot: the snapshot of this name is
// the answer when it is of the same volume (joined while it is being cut),
// another volume's is AlreadyExists; else a new snapshot of an existing
// volume is accepted.
func (p *planner) planSnapshotCreate(a *SnapshotCreateArgs, raw []byte, fp string) (decision, error) {
	id, err := p.tx.SnapshotIDByName(a.Name)
	if err != nil {
		return decision{}, err
	}
	if id != "" {
		s, err := p.tx.Snapshot(id)
		if err != nil {
			return decision{}, err
		}
		if s != nil {
			if d, ok, err := p.snapshotByName(s, a, fp); ok || err != nil {
				return d, err
			}
		}
	}
	v, err := p.tx.Volume(a.SourceVolumeID)
	if err != nil {
		return decision{}, err
	}
	if v == nil || v.State == fsm.Absent {
		return rejectf(NotFound, "volume %s does not exist", a.SourceVolumeID)
	}
	if v.DiskID == "" {
		return rejectf(Conflict, "volume %s has no disk here: snapshots are taken by the controller", v.ID)
	}
	if outsideZones(v.Zone, a.Zones) {
		return rejectf(Exhausted, "volume %s is in zone %s; a snapshot of it is accessible there only, outside the requested topology %v", v.ID, v.Zone, a.Zones)
	}
	if id, err = p.freeID(p.newSnapID); err != nil {
		return decision{}, err
	}
	s := &store.Snapshot{ID: id, Name: a.Name, SourceVolumeID: v.ID, SourceDiskID: v.DiskID, Zone: v.Zone,
		Parameters: maps.Clone(a.Parameters), State: fsm.Absent, CreatedAt: p.now, UpdatedAt: p.now}
	return p.acceptSnapshotStep(s, fsm.SnapshotCreate, raw, fp)
}

// snapshotByName answers a CreateSnapshot whose name snapshot s holds: ok
// is false when s is no answer (a failed cut left it behind: it cannot, a
// failed create removes its record; kept for safety).
func (p *planner) snapshotByName(s *store.Snapshot, a *SnapshotCreateArgs, fp string) (decision, bool, error) {
	if s.ActiveOp != 0 {
		active, err := p.activeOp("snapshot "+s.ID, s.ActiveOp)
		if err != nil {
			return decision{}, true, err
		}
		switch {
		case active.Event == fsm.SnapshotCreate && active.Fingerprint == fp:
			return decision{kind: join, seq: active.Seq}, true, nil
		case active.Event == fsm.SnapshotCreate:
			d, err := rejectf(Exists, "snapshot %q is being taken of volume %s with other arguments", a.Name, s.SourceVolumeID)
			return d, true, err
		default:
			d, err := rejectf(Busy, "snapshot %q (%s) has operation %d (%s) in progress; retry later", a.Name, s.ID, active.Seq, active.Event)
			return d, true, err
		}
	}
	if s.State != fsm.Ready {
		return decision{}, false, nil
	}
	if s.SourceVolumeID != a.SourceVolumeID {
		d, err := rejectf(Exists, "snapshot %q already exists as %s, of volume %s", a.Name, s.ID, s.SourceVolumeID)
		return d, true, err
	}
	if !maps.Equal(s.Parameters, a.Parameters) {
		d, err := rejectf(Exists, "snapshot %q already exists as %s, with other parameters", a.Name, s.ID)
		return d, true, err
	}
	if outsideZones(s.Zone, a.Zones) {
		d, err := rejectf(Exists, "snapshot %q already exists as %s, in zone %s, outside the requested topology", a.Name, s.ID, s.Zone)
		return d, true, err
	}
	return decision{kind: done, snap: s}, true, nil
}

// outsideZones reports whether zone is not among the zones asked for (none
// asked: any zone does).
func outsideZones(zone string, zones []string) bool {
	return len(zones) > 0 && zone != "" && !slices.Contains(zones, zone)
}

// planSnapshotDelete plans a DeleteSnapshot: an unknown snapshot is done;
// one being cut is Aborted (the CO learns its id only from CreateSnapshot's
// answer, so this is not the CO's delete of it).
func (p *planner) planSnapshotDelete(req Request, raw []byte, fp string) (decision, error) {
	s, err := p.tx.Snapshot(req.SnapshotID)
	if err != nil {
		return decision{}, err
	}
	if s == nil {
		return decision{kind: done, snap: &store.Snapshot{ID: req.SnapshotID, State: fsm.Absent}}, nil
	}
	if s.State == fsm.Absent && s.ActiveOp != 0 {
		return rejectf(Busy, "snapshot %s is being taken (operation %d); retry the delete once it has finished", s.ID, s.ActiveOp)
	}
	if s.ActiveOp != 0 {
		active, err := p.activeOp("snapshot "+s.ID, s.ActiveOp)
		if err != nil {
			return decision{}, err
		}
		return inFlight(active, fsm.SnapshotDelete, fp)
	}
	return p.acceptSnapshotStep(s, fsm.SnapshotDelete, raw, fp)
}

// acceptSnapshotStep accepts the request as a new op taking event e from
// the snapshot's state.
func (p *planner) acceptSnapshotStep(s *store.Snapshot, e fsm.Event, raw []byte, fp string) (decision, error) {
	op, err := p.stepOp(fsm.Snapshots, s.State, e, fsm.NoGuard, raw, fp)
	if err != nil {
		return decision{}, err
	}
	return decision{kind: accept, snap: s.Clone(), op: op}, nil
}

// freeID draws an id with draw that no volume or snapshot has.
func (p *planner) freeID(draw func() string) (string, error) {
	for tries := 0; tries < 9; tries++ {
		id := draw()
		v, err := p.tx.Volume(id)
		if err != nil {
			return "", err
		}
		s, err := p.tx.Snapshot(id)
		if err != nil {
			return "", err
		}
		if v == nil && s == nil {
			return id, nil
		}
	}
	return "", fmt.Errorf("ops: could not draw a free id")
}

// contentSource resolves the source of a create (nil without one) to the
// record it copies from, or refuses: a snapshot that is not READY, or a
// volume that does not exist, is NotFound.
func (p *planner) contentSource(a *CreateArgs) (*store.Source, *Error, error) {
	cs := a.Source
	switch {
	case cs == nil:
		return nil, nil, nil
	case cs.SnapshotID != "" && cs.VolumeID == "":
		s, err := p.tx.Snapshot(cs.SnapshotID)
		if err != nil {
			return nil, nil, err
		}
		if s == nil || s.State != fsm.Ready {
			return nil, Errorf(NotFound, "snapshot %s does not exist", cs.SnapshotID), nil
		}
		if s.ActiveOp != 0 {
			return nil, Errorf(Busy, "snapshot %s is being deleted (operation %d); it cannot be restored", s.ID, s.ActiveOp), nil
		}
		return &store.Source{SnapshotID: s.ID, CloudSnapshotID: s.CloudID, SizeBytes: s.SizeBytes}, nil, nil
	case cs.VolumeID != "" && cs.SnapshotID == "":
		v, err := p.tx.Volume(cs.VolumeID)
		if err != nil {
			return nil, nil, err
		}
		if v == nil || v.State == fsm.Absent || v.DiskID == "" {
			return nil, Errorf(NotFound, "volume %s does not exist", cs.VolumeID), nil
		}
		return &store.Source{VolumeID: v.ID, DiskID: v.DiskID, SizeBytes: v.CapacityBytes}, nil, nil
	}
	return nil, Errorf(Invalid, "a content source names exactly one snapshot or one volume"), nil
}

// sourcedSize is the size of a volume created from src: the source's when
// the caller asked for none, else the size asked, raised to the source's
// within the limit; a limit below the source's size is OutOfRange.
func sourcedSize(a *CreateArgs, src *store.Source) (int64, *Error) {
	if src == nil {
		return a.SizeBytes, nil
	}
	if a.LimitBytes > 0 && a.LimitBytes < src.SizeBytes {
		return 0, Errorf(OutOfRange, "%s holds %d bytes; a volume of at most %d bytes cannot hold it", src, src.SizeBytes, a.LimitBytes)
	}
	if a.RequiredBytes == 0 && a.LimitBytes == 0 {
		return src.SizeBytes, nil
	}
	return max(a.SizeBytes, src.SizeBytes), nil
}

// sourceOf is a create request's source as the volume record names it
// (without the provider's ids), for comparison.
func sourceOf(cs *ContentSource) *store.Source {
	if cs == nil {
		return nil
	}
	return &store.Source{SnapshotID: cs.SnapshotID, VolumeID: cs.VolumeID}
}

// finishSnapshot commits a snapshot's op: its outcome (oe nil: succeeded,
// with res folded into the record) with the snapshot it leaves.
func (e *Engine) finishSnapshot(tx *store.Tx, f *flight, op *store.Op, now time.Time, res Result, oe *Error) error {
	s, err := tx.Snapshot(op.SnapshotID)
	if err != nil {
		return err
	}
	if s == nil || s.ActiveOp != op.Seq || s.Generation != op.Generation {
		return fmt.Errorf("op %d: snapshot %s no longer names it as active at generation %d: %w",
			op.Seq, op.SnapshotID, op.Generation, store.ErrCorrupt)
	}
	o := *op
	o.FinishedAt = now
	outcome := "failed"
	if oe == nil {
		outcome, o.Status = "succeeded", store.OpSucceeded
		o.Result, _ = json.Marshal(res)
		if op.Event == fsm.SnapshotCreate {
			s.CloudID, s.SizeBytes, s.ReadyToUse, s.CutAt = res.CloudSnapshotID, res.CapacityBytes, res.ReadyToUse, res.CutAt
		}
		s.State, s.Generation, s.UpdatedAt = op.To, s.Generation+1, now
	} else {
		o.Status, o.Code, o.Message = store.OpFailed, oe.Kind.Code().String(), oe.Msg
	}
	if err := tx.FinishSnapshot(s, &o); err != nil { // a failed snapshot_create (ABSENT) leaves no record
		return err
	}
	e.onOutcome(tx, f, op, outcome, now, Outcome{Snapshot: *s}, oe, nil, nil)
	return nil
}

// confirmedSnapshot asks the provider about a snapshot its record says is
// READY (a repeated CreateSnapshot). When it is gone, the record is
// forgotten (unless it moved on meanwhile) and the caller plans again.
func (e *Engine) confirmedSnapshot(ctx context.Context, s *store.Snapshot) (bool, error) {
	if e.cfg.ConfirmSnapshot == nil || s.State != fsm.Ready {
		return true, nil
	}
	gone, err := e.cfg.ConfirmSnapshot(ctx, s)
	if err != nil || gone == "" {
		return err == nil, err
	}
	now := e.cfg.Clock.Now()
	err = e.st.Update(func(tx *store.Tx) error {
		cur, err := tx.Snapshot(s.ID)
		if err != nil || cur == nil || cur.ActiveOp != 0 || cur.Generation != s.Generation {
			return err // it moved on meanwhile: plan again from what it is now
		}
		cur.State = fsm.Absent
		return tx.ReconcileSnapshot(cur, fsm.Forget, fsm.NoGuard, gone, now)
	})
	if err != nil {
		return false, fmt.Errorf("record that snapshot %s is gone (%s): %w", s.ID, gone, err)
	}
	e.log.Warn().Str("snapshot", s.ID).Str("found", gone).Msg("snapshot_create: the record said READY, but the provider has no such snapshot; taking it again")
	return false, nil
}

// Snapshot returns a snapshot's record, or nil when it does not exist (or
// is still being cut: it exists for nobody but its creator yet). An error
// is an *Error: DataLoss for a damaged record.
func (e *Engine) Snapshot(id string) (*store.Snapshot, error) {
	var s *store.Snapshot
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		s, err = tx.Snapshot(id)
		return err
	})
	if err != nil {
		return nil, readError("read snapshot "+id, err)
	}
	if s == nil || s.State != fsm.Ready {
		return nil, nil
	}
	return s, nil
}

// ListSnapshots returns up to max READY snapshots (0: all) in id order
// after the id `after`, only those of volume source when it is set, and
// the id to continue after ("" when there are no more). Snapshots being
// cut are left out, and so are those whose records are damaged (csid
// check reports them).
func (e *Engine) ListSnapshots(after string, max int, source string) ([]store.Snapshot, string, error) {
	var out []store.Snapshot
	next := ""
	err := e.st.View(func(tx *store.Tx) error {
		return tx.ForEachSnapshot(after, func(s *store.Snapshot) bool {
			if s.State != fsm.Ready || (source != "" && s.SourceVolumeID != source) {
				return true
			}
			if max > 0 && len(out) == max {
				next = out[len(out)-1].ID
				return false
			}
			out = append(out, *s)
			return true
		})
	})
	if err != nil {
		return nil, "", readError("list snapshots", err)
	}
	return out, next, nil
}
