package ops

import (
	"fmt"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// deferredResize is the offline resize queue, all of it: the one place that
// knows what an expand of an attached volume becomes, when a queued resize
// runs, what holds a publish back, and what a failed resize leaves. The
// planner, the worker's commits and the sweep use it; it reads and writes
// through tx and nothing else.
//
// The rules (design.md, "Deferred offline resize"):
//   - an expand of a detached, idle volume runs now (an expand op);
//   - of an attached or busy volume it is queued in the store, merged to
//     the largest size asked, and answered with FailedPrecondition until
//     the volume is detached; a size at or below the queue's joins it;
//   - a target that rises on an idle volume is also recorded on the disk
//     (its resize-to tag), by an expand [deferred] op accepted in the same
//     transaction that queues it, before the answer: a rebuild of the
//     records from the cloud (a lost state file) finds the resize there.
//     The expand op that grows the disk clears the tag;
//   - the commit of any op that leaves the volume detached and idle
//     (succeeded, failed or compensated) starts the queued resize in the
//     same transaction, and so does a publish that finds one due;
//   - while a resize is queued or running the volume is not attached;
//   - a resize that fails transiently stays queued (retried after a
//     pause); one that fails for good is dropped with a history note.
type deferredResize struct {
	tx  *store.Tx
	now time.Time
}

// request plans an expand (ControllerExpandVolume) of volume v, which has op
// active in flight (nil when idle). The caller has checked the access type
// and that the size is a growth.
func (q deferredResize) request(v *store.Volume, a *ExpandArgs, active *store.Op) (decision, error) {
	r, err := q.tx.Resize(v.ID)
	if err != nil {
		return decision{}, err
	}
	merged := mergeResize(r, v.ID, a.RequiredBytes, q.now)
	raised := r == nil || merged.TargetBytes > r.TargetBytes

	if active != nil && active.Event == fsm.Expand && active.Guard == fsm.Deferred {
		// A queued target is being recorded on the disk: wait, and look
		// again (ours may raise it further).
		return decision{kind: waitThenReplan, seq: active.Seq,
			why: fmt.Sprintf("volume %s: a queued resize is being recorded (operation %d); retry", v.ID, active.Seq)}, nil
	}
	if active != nil && active.Event == fsm.Expand {
		// A resize is running. Ours joins it, or raises the target of the
		// one that runs next; either way wait and look again.
		d := decision{kind: waitThenReplan, seq: active.Seq,
			why: fmt.Sprintf("volume %s is being resized (operation %d); retry", v.ID, active.Seq)}
		if raised {
			merged.Status = store.ResizeRunning
			d.resize = merged
		}
		return d, nil
	}
	step, err := fsm.Next(v.State, fsm.Expand, fsm.NoGuard)
	if err != nil {
		return rejectf(Conflict, "volume %s is %s; it cannot be expanded now", v.ID, v.State)
	}
	if step.Deferred() || active != nil {
		return q.defer_(v, merged, raised, active)
	}
	d, err := q.start(v, merged)
	d.replan = true // answer once the grown size is recorded; a raised target may need another round
	return d, err
}

// defer_ is the answer to an expand that has to wait for the detach: the
// queue entry (when the target rose) and FailedPrecondition saying so.
// When the target rose on an idle volume, the answer waits for an expand
// [deferred] op, accepted with the queue entry, that records the target
// on the disk (then the request is planned again, and gets the answer).
// A busy volume's entry is not recorded on the disk: its op in flight
// starts the resize as soon as it leaves the volume detached.
func (q deferredResize) defer_(v *store.Volume, merged *store.Resize, raised bool, active *store.Op) (decision, error) {
	busy := fmt.Sprintf("is in use (%s on node %s)", v.State, v.Node())
	if active != nil {
		busy = fmt.Sprintf("has operation %d (%s) in progress", active.Seq, active.Event)
	}
	d := decision{kind: reject, err: Errorf(Conflict,
		"volume %s %s and this driver expands only detached volumes: a resize to %d bytes is queued "+
			"and runs as soon as the volume is unpublished (ControllerUnpublishVolume)",
		v.ID, busy, merged.TargetBytes)}
	if !raised {
		return d, nil
	}
	merged.Status = store.ResizeQueued
	note := &store.HistoryEntry{Time: q.now, Event: fsm.Expand, Guard: fsm.Deferred, From: v.State, To: v.State,
		Generation: v.Generation, Outcome: fmt.Sprintf("queued resize to %d bytes", merged.TargetBytes)}
	if active != nil || v.DiskID == "" {
		d.resize, d.note = merged, note
		return d, nil
	}
	raw, fp := encodeArgs(&ExpandArgs{RequiredBytes: merged.TargetBytes})
	p := planner{tx: q.tx, now: q.now}
	rec, err := p.acceptStep(v, fsm.Expand, fsm.Deferred, raw, fp)
	if err != nil {
		return decision{}, err
	}
	rec.resize, rec.note, rec.replan = merged, note, true
	return rec, nil
}

// beforePublish is what a ControllerPublishVolume of the detached, idle
// volume v meets: a queued resize is started first, and the publish is
// planned again once it is done. It returns ok=false when nothing is
// queued.
func (q deferredResize) beforePublish(v *store.Volume) (decision, bool, error) {
	r, err := q.tx.Resize(v.ID)
	if err != nil || r == nil {
		return decision{}, false, err
	}
	d, err := q.start(v, r)
	d.replan = true
	return d, true, err
}

// heldPublish is the answer to a publish that meets a running resize.
func heldPublish(v *store.Volume, active *store.Op) decision {
	return decision{kind: waitThenReplan, seq: active.Seq,
		why: fmt.Sprintf("volume %s is being resized (operation %d); it is attached once the resize has finished; retry", v.ID, active.Seq)}
}

// start accepts an expand op for the detached, idle volume v with queue
// entry r (which it marks running).
func (q deferredResize) start(v *store.Volume, r *store.Resize) (decision, error) {
	args := &ExpandArgs{RequiredBytes: r.TargetBytes}
	raw, fp := encodeArgs(args)
	p := planner{tx: q.tx, now: q.now}
	d, err := p.acceptStep(v, fsm.Expand, fsm.NoGuard, raw, fp)
	if err != nil {
		return d, err
	}
	rr := *r
	rr.Status, rr.UpdatedAt = store.ResizeRunning, q.now
	d.resize = &rr
	return d, nil
}

// afterCommit runs in the commit of every op's outcome (finished, after
// tx.Finish) and in the sweep (finished nil, for a resize that is due):
// when v is left detached and idle with a resize queued, the resize's op
// is accepted in the same transaction and returned, with v as it now is;
// the caller launches it once committed. A resize the volume has reached
// is removed. The commit of a failed resize does not start it again: it is
// due after its pause (see failed), for the sweep or the next publish.
func (q deferredResize) afterCommit(v *store.Volume, finished *store.Op) (*store.Op, error) {
	if v.State == fsm.Absent || v.ActiveOp != 0 {
		return nil, nil
	}
	r, err := q.tx.Resize(v.ID)
	if err != nil || r == nil {
		return nil, err
	}
	if r.TargetBytes <= v.CapacityBytes {
		return nil, q.tx.DeleteResize(v.ID)
	}
	if v.State != fsm.Created || (finished != nil && finished.Event == fsm.Expand && finished.Status != store.OpSucceeded) {
		return nil, nil
	}
	d, err := q.start(v, r)
	if err != nil {
		return nil, err
	}
	if err := q.tx.PutResize(d.resize); err != nil {
		return nil, err
	}
	if err := q.tx.Accept(d.vol, d.op); err != nil {
		return nil, err
	}
	*v = *d.vol
	return d.op, nil
}

// attempted records a failed attempt of a resize op on its queue entry,
// for inspection (not of an op recording a queued target on the disk).
func (q deferredResize) attempted(op *store.Op, next time.Time) error {
	if op.Event != fsm.Expand || op.Guard == fsm.Deferred {
		return nil
	}
	r, err := q.tx.Resize(op.VolumeID)
	if err != nil || r == nil {
		return err
	}
	r.Attempts++
	r.LastError, r.UpdatedAt, r.NextAttemptAt = op.LastError, q.now, next
	return q.tx.PutResize(r)
}

// failed decides what becomes of the queued resize of v whose expand op
// failed: after transient errors it stays queued and is tried again after
// retryAfter; after a permanent error it is dropped (the CO's next
// ControllerExpandVolume gets the error).
//
// An op that failed to record a queued target on the disk leaves the queue
// as it is: the resize still runs at the detach (a rebuild would not know
// of it).
func (q deferredResize) failed(v *store.Volume, op *store.Op, transient bool, retryAfter time.Duration) error {
	if op.Guard == fsm.Deferred {
		return nil
	}
	r, err := q.tx.Resize(v.ID)
	if err != nil || r == nil {
		return err
	}
	if !transient {
		if err := q.tx.DeleteResize(v.ID); err != nil {
			return err
		}
		return q.tx.AddNote(v.ID, store.HistoryEntry{Time: q.now, Event: fsm.Expand, From: v.State, To: v.State,
			OpSeq: op.Seq, Generation: v.Generation, Outcome: fmt.Sprintf("resize to %d bytes dropped: %s", r.TargetBytes, op.Message)})
	}
	r.Status, r.LastError, r.UpdatedAt = store.ResizeQueued, op.Message, q.now
	r.NextAttemptAt = q.now.Add(retryAfter)
	return q.tx.PutResize(r)
}

// due lists the queued resizes of detached, idle volumes that are due now,
// and when the next one that is not falls due (zero: none).
func (q deferredResize) due() (ids []string, next time.Time, err error) {
	err = q.tx.ForEachResize(func(r *store.Resize) bool {
		v, err := q.tx.Volume(r.VolumeID)
		if err != nil || v == nil || v.State != fsm.Created || v.ActiveOp != 0 {
			return true
		}
		if r.NextAttemptAt.After(q.now) {
			if next.IsZero() || r.NextAttemptAt.Before(next) {
				next = r.NextAttemptAt
			}
			return true
		}
		ids = append(ids, r.VolumeID)
		return true
	})
	return ids, next, err
}

// mergeResize folds a requested size into the queue entry: the larger wins.
func mergeResize(r *store.Resize, id string, size int64, now time.Time) *store.Resize {
	if r == nil {
		return &store.Resize{VolumeID: id, TargetBytes: size, Status: store.ResizeQueued, QueuedAt: now, UpdatedAt: now}
	}
	m := *r
	if size > m.TargetBytes {
		m.TargetBytes, m.UpdatedAt = size, now
	}
	return &m
}
