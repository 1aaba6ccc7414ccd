package ops

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Verifier answers whether a path a node record names is really mounted. A
// node engine uses it before it answers a repeated NodeStage or NodePublish
// from its record: the mount may have gone behind csid's back (an unmount
// by hand, a cleanup tool), and "already done" would then hand kubelet an
// empty directory.
type Verifier func(ctx context.Context, path string) (mounted bool, err error)

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
// this node's records alone (node mode); a record in any other state is
// left as it is.
func Forget(tx *store.Tx, v *store.Volume, why string, now time.Time) error {
	if v.State != fsm.NodeReady || v.Stage != nil || len(v.Targets) > 0 {
		return nil
	}
	nv := v.Clone()
	nv.State = fsm.Absent
	return tx.Reconcile(nv, fsm.Forget, fsm.NoGuard, why, now)
}

// verifiedDone checks a request the record says is done (a repeated
// NodeStage or NodePublish) against the host. When the mount it answers
// from is gone, it rolls the record back (with a note) and reports false:
// the caller plans again, and this time runs the request.
func (e *Engine) verifiedDone(ctx context.Context, req Request, v *store.Volume) bool {
	if e.cfg.Verify == nil || (req.Event != fsm.NodeStage && req.Event != fsm.NodePublish) {
		return true
	}
	var path string
	switch a := req.Args.(type) {
	case *NodeStageArgs:
		if v.Capability.AccessType == "block" {
			return true
		}
		path = a.StagingPath
	case *NodePublishArgs:
		path = a.TargetPath
	}
	if ok, err := e.cfg.Verify(ctx, path); err != nil || ok {
		return true // cannot tell: answer as before
	}
	paths := []string{}
	if v.Stage != nil && v.Stage.Path != "" {
		paths = append(paths, v.Stage.Path)
	}
	for t := range v.Targets {
		paths = append(paths, t)
	}
	mounted := map[string]bool{}
	for _, p := range paths {
		ok, err := e.cfg.Verify(ctx, p)
		mounted[p] = ok || err != nil
	}
	now := e.cfg.Clock.Now()
	err := e.st.Update(func(tx *store.Tx) error {
		cur, err := tx.Volume(v.ID)
		if err != nil || cur == nil || cur.ActiveOp != 0 || cur.Generation != v.Generation {
			return err // it moved on meanwhile: plan again from what it is now
		}
		nv, guard, why := ForgetUnmounted(cur, func(p string) bool { return mounted[p] })
		if nv == nil {
			return nil
		}
		return tx.Reconcile(nv, fsm.Rollback, guard, why, now)
	})
	if err != nil {
		e.log.Error().Err(err).Str("volume", v.ID).Msg("cannot record that a mount is gone")
		return true
	}
	e.log.Warn().Str("volume", v.ID).Str("path", path).Msgf("%s: recorded as mounted, but it is not; doing it again", req.Event)
	return false
}
