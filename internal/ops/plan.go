package ops

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// decisionKind is what Submit does with a request.
type decisionKind int

const (
	// done: the request is already satisfied; answer with the volume.
	done decisionKind = iota
	// reject: answer with an error (after writing resize/note, if any).
	reject
	// accept: write the new op and run it; its outcome is the answer.
	accept
	// join: an identical op is in flight; its outcome is the answer.
	join
	// waitThenReplan: another op must finish first (a resize before a
	// publish); wait for it, then plan again.
	waitThenReplan
	// cancelThenReplan: the request negates the op in flight; cancel it,
	// wait for it, then plan again.
	cancelThenReplan
)

// decision is the planner's answer. The planner only reads; Submit carries
// the decision out (in the same transaction when it writes).
type decision struct {
	kind decisionKind
	vol  *store.Volume // done: the answer; accept: the volume to write
	// snap is vol for a snapshot's request: the answer, or the snapshot
	// to write.
	snap *store.Snapshot
	op   *store.Op // accept: the op to write
	seq  uint64    // join, wait, cancel: the op in flight
	err  *Error    // reject: the answer
	// resize and note are written with the decision: a deferred expand,
	// a raised resize target.
	resize *store.Resize
	note   *store.HistoryEntry
	// why explains a wait or cancel, for the caller's message if its
	// deadline comes first.
	why string
	// replan: once the op accepted or waited for has finished, plan the
	// request again rather than answer with its outcome (a publish that
	// started a resize; an expand, whose target may have risen).
	replan bool
}

func (d decision) writes() bool { return d.kind == accept || d.resize != nil || d.note != nil }

// planner applies the lifecycle rules to one request against the stored
// records. It is pure: it reads through tx and never writes.
type planner struct {
	tx     *store.Tx
	nodeID string
	now    time.Time
	newID  func() string
	// newSnapID draws snapshot ids.
	newSnapID func() string
	// adopted is the record a node adopts for a volume it has not seen
	// (node mode), resolved before the transaction; nil otherwise.
	adopted *store.Volume
}

func (p *planner) plan(req Request) (decision, error) {
	raw, fp := encodeArgs(req.Args)
	switch req.Event {
	case fsm.Create:
		return p.planCreate(req.Args.(*CreateArgs), raw, fp)
	case fsm.SnapshotCreate:
		return p.planSnapshotCreate(req.Args.(*SnapshotCreateArgs), raw, fp)
	case fsm.SnapshotDelete:
		return p.planSnapshotDelete(req, raw, fp)
	}
	v, err := p.tx.Volume(req.VolumeID)
	if err != nil {
		return decision{}, err
	}
	if v == nil && p.adopted != nil && p.adopted.ID == req.VolumeID {
		v = p.adopted
	}
	if v != nil && v.State == fsm.Absent && v.ActiveOp != 0 {
		if req.Event == fsm.Delete {
			// A delete does not cancel a create in flight, nor may it
			// answer "gone": the create may still make the disk.
			return rejectf(Busy, "volume %s is being created (operation %d); retry the delete once it has finished", v.ID, v.ActiveOp)
		}
		// Still being created: it does not exist yet for anyone but the
		// create request itself.
		v = nil
	}
	if v != nil {
		// Whether a resize is queued decides whether the volume may be
		// attached, and what its unpublish starts: a damaged entry stops
		// every request of the volume here, before anything is accepted.
		if _, err := p.tx.Resize(v.ID); err != nil {
			return decision{}, err
		}
	}
	var active *store.Op
	if v != nil && v.ActiveOp != 0 {
		if active, err = p.activeOp("volume "+v.ID, v.ActiveOp); err != nil {
			return decision{}, err
		}
	}
	switch req.Event {
	case fsm.Delete:
		return p.planDelete(req, v, active, raw, fp)
	case fsm.ControllerPublish:
		return p.planControllerPublish(req, v, active, raw, fp)
	case fsm.ControllerUnpublish:
		return p.planControllerUnpublish(req, v, active, raw, fp)
	case fsm.NodeStage:
		return p.planNodeStage(req, v, active, raw, fp)
	case fsm.NodeUnstage:
		return p.planNodeUnstage(req, v, active, raw, fp)
	case fsm.NodePublish:
		return p.planNodePublish(req, v, active, raw, fp)
	case fsm.NodeUnpublish:
		return p.planNodeUnpublish(req, v, active, raw, fp)
	case fsm.Expand:
		return p.planExpand(req, v, active, raw, fp)
	case fsm.NodeExpand:
		return p.planNodeExpand(req, v, active, raw, fp)
	}
	return decision{}, fmt.Errorf("ops: no rules for event %q", req.Event)
}

// activeOp reads the op in flight that the record of subject ("volume
// vol-...", "snapshot snap-...") names; one that does not exist is an
// error.
func (p *planner) activeOp(subject string, seq uint64) (*store.Op, error) {
	op, err := p.tx.Op(seq)
	if err == nil && op == nil {
		err = fmt.Errorf("%s names active op %d, which does not exist", subject, seq)
	}
	return op, err
}

// acceptStep accepts the request as a new op taking step (e, g) from the
// volume's state.
func (p *planner) acceptStep(v *store.Volume, e fsm.Event, g fsm.Guard, raw []byte, fp string) (decision, error) {
	op, err := p.stepOp(fsm.Volumes, v.State, e, g, raw, fp)
	if err != nil {
		return decision{}, err
	}
	return decision{kind: accept, vol: v.Clone(), op: op}, nil
}

// stepOp is the op of a request taking step (e, g) of lifecycle l from
// state s.
func (p *planner) stepOp(l *fsm.Lifecycle, s fsm.State, e fsm.Event, g fsm.Guard, raw []byte, fp string) (*store.Op, error) {
	step, err := l.Next(s, e, g)
	if err != nil {
		return nil, err // callers check legality first; this is a bug
	}
	return &store.Op{Event: step.Event, Guard: step.Guard, From: step.From, To: step.To,
		Args: raw, Fingerprint: fp, CreatedAt: p.now}, nil
}

func rejectf(k Kind, format string, args ...any) (decision, error) {
	return decision{kind: reject, err: Errorf(k, format, args...)}, nil
}

func doneWith(v *store.Volume) (decision, error) { return decision{kind: done, vol: v}, nil }

// inFlight answers a request that meets another op on its volume: join an
// identical one, otherwise Aborted.
func inFlight(active *store.Op, e fsm.Event, fp string) (decision, error) {
	if active.Event == e && active.Fingerprint == fp {
		return decision{kind: join, seq: active.Seq}, nil
	}
	return rejectf(Busy, "%s has operation %d (%s) in progress; retry later",
		subjectOf(active), active.Seq, active.Event)
}

// accessMismatch refuses a request for another access type (block or
// mount) than the volume was created or staged for, with the kind its
// RPC's table gives: InvalidArgument (Invalid) on the controller,
// FailedPrecondition (Conflict) on the node.
func accessMismatch(v *store.Volume, accessType string, k Kind) (decision, bool) {
	if v.Capability.AccessType == "" || accessType == "" || v.Capability.AccessType == accessType {
		return decision{}, false
	}
	d, _ := rejectf(k, "volume %s is a %s volume; it cannot be used with %s access",
		v.ID, v.Capability.AccessType, accessType)
	return d, true
}

// undoing reports whether the op in flight is the inverse of event e: a
// request that the record shows satisfied is not, while its inverse runs.
// Any other op in flight leaves the answer standing (a CO's retry of a
// publish is answered while the node stages the volume).
func undoing(active *store.Op, e fsm.Event) bool {
	inv, _ := fsm.Inverse(e)
	return active != nil && active.Event == inv
}

// undoingTarget is undoing for one target path of node_publish.
func undoingTarget(active *store.Op, target string) bool {
	if !undoing(active, fsm.NodePublish) {
		return false
	}
	a, err := DecodeArgs[NodeUnpublishArgs](active)
	return err != nil || a.TargetPath == target
}

// negates reports whether a request for e meets its forward event in
// flight; the caller checks that both are about the same slot (node, path).
func negates(active *store.Op, e fsm.Event) bool {
	f, ok := fsm.Forward(e)
	return ok && active != nil && active.Event == f
}

// cancelling is the answer of a request that negates the forward op in
// flight: cancel it, then plan again.
func cancelling(active *store.Op, what string) decision {
	return decision{kind: cancelThenReplan, seq: active.Seq,
		why: fmt.Sprintf("cancelling %s operation %d of volume %s", what, active.Seq, active.VolumeID)}
}

func (p *planner) planCreate(a *CreateArgs, raw []byte, fp string) (decision, error) {
	id, err := p.tx.VolumeIDByName(a.Name)
	if err != nil {
		return decision{}, err
	}
	if id != "" {
		v, err := p.tx.Volume(id)
		if err != nil {
			return decision{}, err
		}
		if v != nil {
			if v.ActiveOp != 0 {
				active, err := p.tx.Op(v.ActiveOp)
				if err != nil {
					return decision{}, err
				}
				if active != nil && active.Event == fsm.Create {
					if active.Fingerprint == fp {
						return decision{kind: join, seq: active.Seq}, nil
					}
					return rejectf(Exists, "volume %q is being created with other arguments", a.Name)
				}
			}
			if v.State != fsm.Absent {
				if why := createIncompatible(v, a); why != "" {
					return rejectf(Exists, "volume %q already exists as %s, %s", a.Name, v.ID, why)
				}
				return doneWith(v)
			}
		}
	}
	src, refused, err := p.contentSource(a)
	if err != nil || refused != nil {
		return decision{kind: reject, err: refused}, err
	}
	size, refused := sourcedSize(a, src)
	if refused != nil {
		return decision{kind: reject, err: refused}, nil
	}
	if size != a.SizeBytes {
		// The op creates the size the source needs; the request's
		// fingerprint stays its idempotency key.
		sized := *a
		sized.SizeBytes = size
		raw, _ = encodeArgs(&sized)
	}
	if id, err = p.freeID(p.newID); err != nil {
		return decision{}, err
	}
	v := &store.Volume{ID: id, Name: a.Name, State: fsm.Absent, Parameters: maps.Clone(a.Parameters),
		Capability: a.Capability, Source: src, CreatedAt: p.now, UpdatedAt: p.now}
	return p.acceptStep(v, fsm.Create, fsm.NoGuard, raw, fp)
}

// createIncompatible says why an existing volume does not satisfy a create
// request with its name, or "" when it does.
func createIncompatible(v *store.Volume, a *CreateArgs) string {
	switch {
	case a.RequiredBytes > 0 && v.CapacityBytes < a.RequiredBytes:
		return fmt.Sprintf("of %d bytes, smaller than the %d bytes required", v.CapacityBytes, a.RequiredBytes)
	case a.LimitBytes > 0 && v.CapacityBytes > a.LimitBytes:
		return fmt.Sprintf("of %d bytes, larger than the %d bytes limit", v.CapacityBytes, a.LimitBytes)
	case !maps.Equal(v.Parameters, a.Parameters):
		return "with other parameters"
	case v.Capability.AccessType != a.Capability.AccessType:
		return fmt.Sprintf("with access type %s", v.Capability.AccessType)
	case len(a.Zones) > 0 && v.Zone != "" && !slices.Contains(a.Zones, v.Zone):
		return fmt.Sprintf("in zone %s, outside the requested topology", v.Zone)
	case !v.Source.Same(sourceOf(a.Source)):
		if v.Source == nil {
			return "empty, not from a content source"
		}
		return "from " + v.Source.String()
	}
	return ""
}

func (p *planner) planDelete(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	if v == nil {
		return doneWith(&store.Volume{ID: req.VolumeID, State: fsm.Absent})
	}
	if active != nil {
		return inFlight(active, fsm.Delete, fp)
	}
	if _, err := fsm.Next(v.State, fsm.Delete, fsm.NoGuard); err != nil {
		return rejectf(Conflict, "volume %s is %s on node %s; unpublish it before deleting it",
			v.ID, v.State, v.Node())
	}
	return p.acceptStep(v, fsm.Delete, fsm.NoGuard, raw, fp)
}

func (p *planner) planControllerPublish(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*ControllerPublishArgs)
	if v == nil {
		return rejectf(NotFound, "volume %s does not exist", req.VolumeID)
	}
	want := capFingerprint(a.Capability, a.ReadOnly)
	if att := v.Attachment; att != nil && !undoing(active, fsm.ControllerPublish) {
		switch {
		case att.Node != a.Node:
			return rejectf(Conflict, "volume %s is published to node %s; it can be attached to one node at a time", v.ID, att.Node)
		case att.Fingerprint != "" && att.Fingerprint != want: // "": rebuilt, the original is unknown
			return rejectf(Exists, "volume %s is published to node %s with another capability or read-only flag", v.ID, a.Node)
		}
		return doneWith(v)
	}
	if active != nil {
		if active.Event == fsm.Expand {
			return heldPublish(v, active), nil
		}
		return inFlight(active, fsm.ControllerPublish, fp)
	}
	if _, err := fsm.Next(v.State, fsm.ControllerPublish, fsm.NoGuard); err != nil {
		return rejectf(Conflict, "volume %s is %s; it cannot be published now", v.ID, v.State)
	}
	if d, bad := accessMismatch(v, a.Capability.AccessType, Invalid); bad {
		return d, nil
	}
	// A resize queued on this detached volume runs first; the publish
	// attaches after it.
	if d, queued, err := (deferredResize{tx: p.tx, now: p.now}).beforePublish(v); queued || err != nil {
		return d, err
	}
	return p.acceptStep(v, fsm.ControllerPublish, fsm.NoGuard, raw, fp)
}

func (p *planner) planControllerUnpublish(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*ControllerUnpublishArgs)
	if v == nil {
		return doneWith(&store.Volume{ID: req.VolumeID, State: fsm.Absent})
	}
	if negates(active, fsm.ControllerUnpublish) {
		pa, err := DecodeArgs[ControllerPublishArgs](active)
		if err != nil {
			return decision{}, err
		}
		if a.Node == "" || a.Node == pa.Node {
			return cancelling(active, "publish"), nil
		}
	}
	if v.Attachment == nil || (a.Node != "" && a.Node != v.Attachment.Node) {
		return doneWith(v)
	}
	if active != nil {
		return inFlight(active, fsm.ControllerUnpublish, fp)
	}
	if _, err := fsm.Next(v.State, fsm.ControllerUnpublish, fsm.NoGuard); err != nil {
		return rejectf(Conflict, "volume %s is still %s on node %s; unpublish and unstage it on the node first",
			v.ID, v.State, v.Node())
	}
	return p.acceptStep(v, fsm.ControllerUnpublish, fsm.NoGuard, raw, fp)
}

func (p *planner) planNodeStage(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*NodeStageArgs)
	if v == nil {
		return rejectf(NotFound, "volume %s does not exist on this node", req.VolumeID)
	}
	want := capFingerprint(a.Capability)
	if st := v.Stage; st != nil && !undoing(active, fsm.NodeStage) {
		switch {
		case st.Path != "" && st.Path != a.StagingPath:
			return rejectf(Conflict, "volume %s is staged at %s, not at %s", v.ID, st.Path, a.StagingPath)
		case st.Fingerprint != "" && st.Fingerprint != want:
			return rejectf(Exists, "volume %s is staged at %s with another capability", v.ID, st.Path)
		}
		return doneWith(v)
	}
	if active != nil {
		return inFlight(active, fsm.NodeStage, fp)
	}
	if p.nodeID != "" && v.Node() != "" && v.Node() != p.nodeID {
		return rejectf(Conflict, "volume %s is published to node %s, not to this node (%s)", v.ID, v.Node(), p.nodeID)
	}
	if d, bad := accessMismatch(v, a.Capability.AccessType, Conflict); bad {
		return d, nil
	}
	if _, err := fsm.Next(v.State, fsm.NodeStage, fsm.NoGuard); err != nil {
		return rejectf(Conflict, "volume %s is %s: ControllerPublishVolume must succeed before NodeStageVolume", v.ID, v.State)
	}
	return p.acceptStep(v, fsm.NodeStage, fsm.NoGuard, raw, fp)
}

func (p *planner) planNodeUnstage(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*NodeUnstageArgs)
	if v == nil {
		return doneWith(&store.Volume{ID: req.VolumeID, State: fsm.Absent})
	}
	if negates(active, fsm.NodeUnstage) {
		sa, err := DecodeArgs[NodeStageArgs](active)
		if err != nil {
			return decision{}, err
		}
		if sa.StagingPath == a.StagingPath {
			return cancelling(active, "stage"), nil
		}
	}
	if v.Stage == nil || (v.Stage.Path != "" && v.Stage.Path != a.StagingPath) { // "": adopted block stage
		return doneWith(v)
	}
	if active != nil {
		return inFlight(active, fsm.NodeUnstage, fp)
	}
	if _, err := fsm.Next(v.State, fsm.NodeUnstage, fsm.NoGuard); err != nil {
		return rejectf(Conflict, "volume %s is still published at %d target(s); NodeUnpublishVolume them first",
			v.ID, len(v.Targets))
	}
	return p.acceptStep(v, fsm.NodeUnstage, fsm.NoGuard, raw, fp)
}

func (p *planner) planNodePublish(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*NodePublishArgs)
	if v == nil {
		return rejectf(NotFound, "volume %s does not exist on this node", req.VolumeID)
	}
	want := capFingerprint(a.Capability, a.ReadOnly, a.StagingPath)
	if t, ok := v.Targets[a.TargetPath]; ok && !undoingTarget(active, a.TargetPath) {
		if t.Fingerprint != "" && t.Fingerprint != want {
			return rejectf(Exists, "volume %s is published at %s with another capability or read-only flag", v.ID, a.TargetPath)
		}
		return doneWith(v)
	}
	if active != nil {
		return inFlight(active, fsm.NodePublish, fp)
	}
	if !fsm.Legal(v.State, fsm.NodePublish) {
		return rejectf(Conflict, "volume %s is %s: NodeStageVolume must succeed before NodePublishVolume", v.ID, v.State)
	}
	if d, bad := accessMismatch(v, a.Capability.AccessType, Conflict); bad {
		return d, nil
	}
	if v.Stage != nil && v.Stage.Path != "" && v.Stage.Path != a.StagingPath {
		return rejectf(Conflict, "volume %s is staged at %s, not at %s", v.ID, v.Stage.Path, a.StagingPath)
	}
	return p.acceptStep(v, fsm.NodePublish, fsm.NoGuard, raw, fp)
}

func (p *planner) planNodeUnpublish(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*NodeUnpublishArgs)
	if v == nil {
		return doneWith(&store.Volume{ID: req.VolumeID, State: fsm.Absent})
	}
	if negates(active, fsm.NodeUnpublish) {
		pa, err := DecodeArgs[NodePublishArgs](active)
		if err != nil {
			return decision{}, err
		}
		if pa.TargetPath == a.TargetPath {
			return cancelling(active, "publish"), nil
		}
	}
	if _, ok := v.Targets[a.TargetPath]; !ok {
		return doneWith(v)
	}
	if active != nil {
		return inFlight(active, fsm.NodeUnpublish, fp)
	}
	guard := fsm.OtherTargets
	if len(v.Targets) == 1 {
		guard = fsm.LastTarget
	}
	return p.acceptStep(v, fsm.NodeUnpublish, guard, raw, fp)
}

func (p *planner) planNodeExpand(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*NodeExpandArgs)
	if v == nil {
		return rejectf(NotFound, "volume %s does not exist on this node", req.VolumeID)
	}
	if active != nil {
		return inFlight(active, fsm.NodeExpand, fp)
	}
	_, published := v.Targets[a.VolumePath]
	staged := v.Stage != nil && v.Stage.Path == a.VolumePath
	if !fsm.Legal(v.State, fsm.NodeExpand) || (!published && !staged && v.Capability.AccessType != "block") {
		return rejectf(NotFound, "volume %s is not staged or published at %s", v.ID, a.VolumePath)
	}
	if v.Capability.AccessType == "block" {
		return doneWith(v) // a raw block volume has no filesystem to grow
	}
	return p.acceptStep(v, fsm.NodeExpand, fsm.NoGuard, raw, fp)
}

// planExpand plans a ControllerExpandVolume: the checks every expand gets,
// then the deferred resize queue's rules (resize.go).
func (p *planner) planExpand(req Request, v *store.Volume, active *store.Op, raw []byte, fp string) (decision, error) {
	a := req.Args.(*ExpandArgs)
	if v == nil {
		return rejectf(NotFound, "volume %s does not exist", req.VolumeID)
	}
	if d, bad := accessMismatch(v, a.AccessType, Invalid); bad {
		return d, nil
	}
	if a.LimitBytes > 0 && v.CapacityBytes > a.LimitBytes {
		return rejectf(OutOfRange, "volume %s has %d bytes; it cannot shrink to the %d bytes limit", v.ID, v.CapacityBytes, a.LimitBytes)
	}
	if a.RequiredBytes <= v.CapacityBytes {
		return doneWith(v)
	}
	return deferredResize{tx: p.tx, now: p.now}.request(v, a, active)
}
