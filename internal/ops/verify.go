package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Confirmer is asked, before a request is answered from a volume's record
// (the record says it is done already: a repeated NodeStageVolume or
// ControllerPublishVolume, a CreateVolume of an existing name), whether the
// host or the cloud agrees. A mount may have gone behind csid's back (an
// unmount by hand, a reboot), a disk may have been detached out of band;
// "already done" would then hand kubelet an empty directory, or report a
// disk attached that is not.
//
// It returns nil when the world agrees; or the correction that brings the
// record in line with what is there, which the engine records before
// planning the request again (and this time running it). An error means
// the answer cannot be confirmed now, and is the request's answer.
type Confirmer func(ctx context.Context, req Request, v *store.Volume) (*Correction, error)

// Correction is what a Confirmer found: the record as it should be, and the
// lifecycle step that takes the stored record there (a step that records
// what is, with no effect: rollback, adopt), with why.
type Correction struct {
	Volume *store.Volume
	Event  fsm.Event
	Guard  fsm.Guard
	Why    string
}

// ForgetUnmounted returns the record without the stage and targets that are
// no longer mounted (and the state that leaves), the guard of the rollback
// that takes the volume there, and a note saying what went; nil when
// everything the record names is mounted. A raw block volume's stage is no
// mount and is kept.
func ForgetUnmounted(v *store.Volume, mounted func(path string) bool) (*store.Volume, fsm.Guard, string) {
	nv := v.Clone()
	var gone []string
	for t := range v.Targets {
		if !mounted(t) {
			delete(nv.Targets, t)
			gone = append(gone, t)
		}
	}
	if v.Capability.AccessType != "block" && v.Stage != nil && v.Stage.Path != "" && !mounted(v.Stage.Path) {
		gone = append(gone, v.Stage.Path)
		nv.Stage, nv.Targets = nil, nil
	}
	if len(gone) == 0 {
		return nil, "", ""
	}
	slices.Sort(gone)
	guard := fsm.OtherTargets
	switch {
	case nv.Stage == nil:
		nv.State, nv.Targets, guard = fsm.NodeReady, nil, fsm.Unstaged
	case len(nv.Targets) == 0:
		nv.State, nv.Targets, guard = fsm.VolReady, nil, fsm.Unpublished
	}
	return nv, guard, "no longer mounted: " + strings.Join(gone, ", ")
}

// Forget drops a node's record of a volume it has nothing staged or
// published of any more (NODE_READY): the lifecycle's forget step to
// ABSENT, through tx.Reconcile. A node keeps a record only while the volume
// has a staging or a target here, so its state file does not grow with
// every volume it ever served; the ops that tell the volume's story stay
// within the store's op retention. Call it only for a store that holds
// this node's records alone (node mode); a record in any other state, or
// with an op in flight, is left as it is. It reports whether it forgot v.
func Forget(tx *store.Tx, v *store.Volume, why string, now time.Time) (bool, error) {
	if v.State != fsm.NodeReady || v.Stage != nil || len(v.Targets) > 0 || v.ActiveOp != 0 {
		return false, nil
	}
	nv := v.Clone()
	nv.State = fsm.Absent
	if err := tx.Reconcile(nv, fsm.Forget, fsm.NoGuard, why, now); err != nil {
		return false, err
	}
	return true, nil
}

// confirmedDone asks the Confirmer about a request the record says is
// done (d.vol; d.snap for a snapshot's request). It reports whether the
// answer stands; when it does not, the correction has been recorded
// (unless the volume moved on meanwhile) and the caller plans again.
func (e *Engine) confirmedDone(ctx context.Context, req Request, d decision) (bool, error) {
	if d.snap != nil {
		return e.confirmedSnapshot(ctx, d.snap)
	}
	v := d.vol
	if e.cfg.Confirm == nil || v == nil || v.State == fsm.Absent {
		return true, nil
	}
	fix, err := e.cfg.Confirm(ctx, req, v)
	if err != nil || fix == nil {
		return err == nil, err
	}
	now := e.cfg.Clock.Now()
	err = e.st.Update(func(tx *store.Tx) error {
		cur, err := tx.Volume(v.ID)
		if err != nil || cur == nil || cur.ActiveOp != 0 || cur.Generation != v.Generation {
			return err // it moved on meanwhile: plan again from what it is now
		}
		return tx.Reconcile(fix.Volume.Clone(), fix.Event, fix.Guard, fix.Why, now)
	})
	if err != nil {
		return false, fmt.Errorf("record that volume %s is not as its record says (%s): %w", v.ID, fix.Why, err)
	}
	e.log.Warn().Str("volume", v.ID).Str("event", string(req.Event)).Str("found", fix.Why).
		Msgf("%s: the record said done, but it is not; doing it again", req.Event)
	return false, nil
}
