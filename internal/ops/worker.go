package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

// Exec is what an executor gets: the op (read-only), the volume as it was
// when the op was accepted, and a way to record progress.
type Exec struct {
	// Op is the op being executed. Executors must not modify it.
	Op *store.Op
	// Volume is the volume record as it was when the op was accepted.
	Volume store.Volume
	// Log carries the volume id, op and event.
	Log zerolog.Logger

	e *Engine
}

// Checkpoint durably records progress of the op (for example the id of a
// cloud operation about to be waited on, or "formatting started"), so that
// an execution resumed after a crash can tell where the last one got to.
func (x *Exec) Checkpoint(key, value string) error {
	cp := maps.Clone(x.Op.Checkpoints)
	if cp == nil {
		cp = map[string]string{}
	}
	cp[key] = value
	o := *x.Op
	o.Checkpoints = cp
	if err := x.e.st.Update(func(tx *store.Tx) error { return tx.UpdateOp(&o) }); err != nil {
		return fmt.Errorf("checkpoint %s of op %d: %w", key, x.Op.Seq, err)
	}
	x.Op.Checkpoints = cp
	return nil
}

// Checkpointed returns a recorded checkpoint.
func (x *Exec) Checkpointed(key string) (string, bool) {
	v, ok := x.Op.Checkpoints[key]
	return v, ok
}

// run is the worker of one op: it executes the op (retrying transient
// failures), compensates a failed forward op, and commits the outcome.
func (e *Engine) run(f *flight) {
	defer e.workers.Done()
	op := f.op
	log := e.log.With().Uint64("op", op.Seq).Str("volume", op.VolumeID).Str("event", string(op.Event)).Logger()
	x := &Exec{Op: op, Volume: f.vol, Log: log, e: e}
	exec := e.cfg.Executors[op.Event]

	if exec == nil {
		e.fail(f, x, nil, Errorf(codes.Unimplemented, "no executor for %s in this mode", op.Event), false, log)
		return
	}
	if op.Status == store.OpCompensating {
		e.fail(f, x, exec, &Error{Code: codeFromName(op.Code), Msg: op.Message}, false, log)
		return
	}
	for {
		// A slot bounds the effects running at once; it is held for the
		// effect only, not through backoff or the commit.
		select {
		case e.sem <- struct{}{}:
		case <-f.ctx.Done():
			e.interrupted(f, x, exec, log)
			return
		case <-e.draining:
			e.abandon(f, log)
			return
		}
		crash.Point(crash.OpsBeforeEffect)
		res, err := exec.Execute(f.ctx, x)
		<-e.sem
		if err == nil {
			crash.Point(crash.OpsBeforeCommit)
			e.succeed(f, res, log)
			return
		}
		if f.ctx.Err() != nil {
			e.interrupted(f, x, exec, log)
			return
		}
		code, transient := classify(err)
		if transient && op.Attempts+1 < e.cfg.Retry.MaxAttempts {
			delay := e.cfg.Retry.Delay(op.Attempts + 1)
			log.Warn().Err(err).Int("attempt", op.Attempts+1).Dur("retry_in", delay).Msg("op failed; retrying")
			if err := e.recordAttempt(f, err, delay); err != nil {
				log.Error().Err(err).Msg("cannot record the attempt; leaving the op to the next start")
				e.abandon(f, log)
				return
			}
			select {
			case <-e.cfg.Clock.After(delay):
				continue
			case <-f.ctx.Done():
				e.interrupted(f, x, exec, log)
				return
			case <-e.draining:
				e.abandon(f, log)
				return
			}
		}
		oe := asError(err)
		oe = &Error{Code: code, Msg: oe.Msg}
		if transient {
			oe.Msg = fmt.Sprintf("%s (gave up after %d attempts)", oe.Msg, op.Attempts+1)
		}
		e.fail(f, x, exec, oe, transient, log)
		return
	}
}

// interrupted handles a worker whose context ended: by Close (the op stays
// queued for the next start) or by a negation (the op fails, compensated).
func (e *Engine) interrupted(f *flight, x *Exec, exec Executor, log zerolog.Logger) {
	cause := context.Cause(f.ctx)
	if errors.Is(cause, errShutdown) {
		e.abandon(f, log)
		return
	}
	e.fail(f, x, exec, Errorf(codes.Aborted, "%s of volume %s (operation %d) was %v", f.event, f.volumeID, f.seq, cause), false, log)
}

// abandon leaves the op active in the store (it resumes at the next start)
// and releases whoever waits on it.
func (e *Engine) abandon(f *flight, log zerolog.Logger) {
	log.Info().Msg("op left for the next start")
	e.mu.Lock()
	delete(e.flights, f.seq)
	e.mu.Unlock()
	f.err = ErrClosed
	close(f.done)
}

func (e *Engine) recordAttempt(f *flight, cause error, delay time.Duration) error {
	now := e.cfg.Clock.Now()
	o := *f.op
	o.Attempts++
	o.LastError = cause.Error()
	o.NextAttemptAt = now.Add(delay)
	err := e.st.Update(func(tx *store.Tx) error {
		if err := tx.UpdateOp(&o); err != nil {
			return err
		}
		if o.Event != fsm.Expand {
			return nil
		}
		r, err := tx.Resize(o.VolumeID)
		if err != nil || r == nil {
			return err
		}
		r.Attempts++
		r.LastError, r.UpdatedAt, r.NextAttemptAt = o.LastError, now, o.NextAttemptAt
		return tx.PutResize(r)
	})
	if err != nil {
		return err
	}
	*f.op = o
	msg := fmt.Sprintf("attempt %d failed: %s", o.Attempts, o.LastError)
	f.progress.Store(&msg)
	if e.cfg.Observer != nil {
		e.cfg.Observer.OpRetried(o.Event)
	}
	return nil
}

// fail compensates a forward op (if exec is set and the event has an
// inverse) and commits the failure. transient says the op gave up on a
// transient error (a failed resize then stays queued, to be tried later).
func (e *Engine) fail(f *flight, x *Exec, exec Executor, oe *Error, transient bool, log zerolog.Logger) {
	op := f.op
	if _, forward := fsm.Inverse(op.Event); forward && exec != nil {
		if op.Status != store.OpCompensating {
			o := *op
			o.Status, o.Code, o.Message = store.OpCompensating, oe.Code.String(), oe.Msg
			if err := e.st.Update(func(tx *store.Tx) error { return tx.UpdateOp(&o) }); err != nil {
				log.Error().Err(err).Msg("cannot record compensation; leaving the op to the next start")
				e.abandon(f, log)
				return
			}
			*op = o
		}
		log.Warn().Str("reason", oe.Msg).Msg("op failed; compensating")
		ctx := e.base // a negation cancelled f.ctx; compensation must still run
		for attempt := 1; ; attempt++ {
			select {
			case e.sem <- struct{}{}:
			case <-e.draining:
				e.abandon(f, log)
				return
			}
			err := exec.Compensate(ctx, x)
			<-e.sem
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				e.abandon(f, log) // shutdown: compensation resumes at the next start
				return
			}
			if _, tr := classify(err); tr && attempt < e.cfg.Retry.MaxAttempts {
				select {
				case <-e.cfg.Clock.After(e.cfg.Retry.Delay(attempt)):
					continue
				case <-e.draining:
					e.abandon(f, log)
					return
				}
			}
			log.Error().Err(err).Msg("compensation failed: effects of the op may remain (csid check reports them)")
			oe = &Error{Code: oe.Code, Msg: fmt.Sprintf("%s; undoing its partial effects also failed: %v", oe.Msg, err)}
			break
		}
	}
	now := e.cfg.Clock.Now()
	err := e.st.Update(func(tx *store.Tx) error {
		v, err := e.activeVolume(tx, op)
		if err != nil {
			return err
		}
		o := *op
		o.Status, o.Code, o.Message, o.FinishedAt = store.OpFailed, oe.Code.String(), oe.Msg, now
		if err := tx.Finish(v, &o); err != nil { // a failed create (ABSENT) leaves no record
			return err
		}
		if o.Event == fsm.Expand {
			if err := e.settleFailedResize(tx, v, &o, transient, now); err != nil {
				return err
			}
		}
		out := *v
		tx.OnCommit(func() { e.observe(op, "failed", now); e.deliver(f, out, oe) })
		return nil
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot commit the failure; leaving the op to the next start")
		e.abandon(f, log)
		return
	}
	log.Warn().Str("code", oe.Code.String()).Str("reason", oe.Msg).Msg("op failed")
}

// settleFailedResize decides what becomes of a resize whose op failed: after
// transient errors it stays queued and is tried again later; after a
// permanent error it is dropped (the CO's next ControllerExpandVolume gets
// the error).
func (e *Engine) settleFailedResize(tx *store.Tx, v *store.Volume, op *store.Op, transient bool, now time.Time) error {
	r, err := tx.Resize(v.ID)
	if err != nil || r == nil {
		return err
	}
	if !transient {
		if err := tx.DeleteResize(v.ID); err != nil {
			return err
		}
		return tx.AddNote(v.ID, store.HistoryEntry{Time: now, Event: fsm.Expand, From: v.State, To: v.State,
			OpSeq: op.Seq, Generation: v.Generation, Outcome: fmt.Sprintf("resize to %d bytes dropped: %s", r.TargetBytes, op.Message)})
	}
	r.Status, r.LastError, r.UpdatedAt = store.ResizeQueued, op.Message, now
	r.NextAttemptAt = now.Add(e.cfg.Retry.Cap)
	return tx.PutResize(r)
}

// succeed commits a successful op: the volume moves to the op's target
// state with the result folded in, atomically with the op's outcome and the
// history entry. A volume left detached with a pending resize starts the
// resize in the same transaction.
func (e *Engine) succeed(f *flight, res Result, log zerolog.Logger) {
	op := f.op
	now := e.cfg.Clock.Now()
	err := e.st.Update(func(tx *store.Tx) error {
		v, err := e.activeVolume(tx, op)
		if err != nil {
			return err
		}
		if err := apply(v, op, res, now); err != nil {
			return err
		}
		o := *op
		o.Status, o.FinishedAt = store.OpSucceeded, now
		o.Result, _ = json.Marshal(res)
		if err := tx.Finish(v, &o); err != nil {
			return err
		}
		next, err := e.chainResize(tx, v, now)
		if err != nil {
			return err
		}
		out := *v
		var nextVol store.Volume
		if next != nil {
			nextVol = *v
		}
		tx.OnCommit(func() {
			e.observe(op, "succeeded", now)
			e.deliver(f, out, nil)
			if next != nil {
				e.launchAccepted(next, &nextVol)
			}
		})
		return nil
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot commit the outcome; leaving the op to the next start")
		e.abandon(f, log)
		return
	}
	log.Debug().Str("to", string(op.To)).Msg("op succeeded")
}

// observe reports a finished op to the Observer. It runs in the outcome's
// commit hook, before the waiters are released: whoever has the answer
// also finds the op counted.
func (e *Engine) observe(op *store.Op, outcome string, now time.Time) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.OpFinished(op.Event, outcome, now.Sub(op.CreatedAt))
	}
}

// chainResize runs in the commit of every op that succeeds, and in the
// sweep: when the op leaves the volume detached and idle with a resize
// queued, the resize's op is accepted in the same transaction (the moment
// ControllerUnpublishVolume commits, the resize is runnable). A resize
// reached by the op (an expand) is removed. A failed op leaves a queued
// resize to the next publish or expand, which start it first, or to the
// sweep.
func (e *Engine) chainResize(tx *store.Tx, v *store.Volume, now time.Time) (*store.Op, error) {
	if v.State == fsm.Absent {
		return nil, nil
	}
	r, err := tx.Resize(v.ID)
	if err != nil || r == nil {
		return nil, err
	}
	if r.TargetBytes <= v.CapacityBytes {
		return nil, tx.DeleteResize(v.ID)
	}
	if v.State != fsm.Created {
		return nil, nil
	}
	p := planner{tx: tx, now: now}
	d, err := p.startResize(v, r)
	if err != nil {
		return nil, err
	}
	if err := tx.PutResize(d.resize); err != nil {
		return nil, err
	}
	if err := tx.Accept(d.vol, d.op); err != nil {
		return nil, err
	}
	*v = *d.vol
	return d.op, nil
}

// activeVolume loads the volume of an op being committed and checks that
// the op is still its active op, planned against its current generation.
func (e *Engine) activeVolume(tx *store.Tx, op *store.Op) (*store.Volume, error) {
	v, err := tx.Volume(op.VolumeID)
	if err != nil {
		return nil, err
	}
	if v == nil || v.ActiveOp != op.Seq {
		return nil, fmt.Errorf("op %d: volume %s no longer names it as active: %w", op.Seq, op.VolumeID, store.ErrCorrupt)
	}
	if v.Generation != op.Generation {
		return nil, fmt.Errorf("op %d was planned against generation %d of volume %s, which is at %d: %w",
			op.Seq, op.Generation, v.ID, v.Generation, store.ErrCorrupt)
	}
	return v, nil
}

// deliver hands the outcome to everyone waiting. It runs in a commit hook,
// so no later transaction can see the op active without its flight.
func (e *Engine) deliver(f *flight, v store.Volume, err *Error) {
	e.mu.Lock()
	delete(e.flights, f.seq)
	e.mu.Unlock()
	f.out, f.err = v, err
	close(f.done)
}

// apply folds a successful op's result into the volume record.
func apply(v *store.Volume, op *store.Op, res Result, now time.Time) error {
	switch op.Event {
	case fsm.Create:
		v.DiskID, v.CapacityBytes, v.Zone = res.DiskID, res.CapacityBytes, res.Zone
	case fsm.ControllerPublish:
		a, err := DecodeArgs[ControllerPublishArgs](op)
		if err != nil {
			return err
		}
		v.Attachment = &store.Attachment{Node: a.Node, ReadOnly: a.ReadOnly,
			Fingerprint: capFingerprint(a.Capability, a.ReadOnly), PublishContext: res.PublishContext}
	case fsm.ControllerUnpublish:
		v.Attachment = nil
	case fsm.NodeStage:
		a, err := DecodeArgs[NodeStageArgs](op)
		if err != nil {
			return err
		}
		v.Stage = &store.Stage{Path: a.StagingPath, Fingerprint: capFingerprint(a.Capability), Device: res.Device}
		if res.CapacityBytes > v.CapacityBytes {
			v.CapacityBytes = res.CapacityBytes // the device grew (an offline resize); a node learns it here
		}
	case fsm.NodeUnstage:
		v.Stage = nil
	case fsm.NodePublish:
		a, err := DecodeArgs[NodePublishArgs](op)
		if err != nil {
			return err
		}
		if v.Targets == nil {
			v.Targets = map[string]store.Target{}
		}
		v.Targets[a.TargetPath] = store.Target{ReadOnly: a.ReadOnly, Fingerprint: capFingerprint(a.Capability, a.ReadOnly, a.StagingPath)}
	case fsm.NodeUnpublish:
		a, err := DecodeArgs[NodeUnpublishArgs](op)
		if err != nil {
			return err
		}
		delete(v.Targets, a.TargetPath)
		if len(v.Targets) == 0 {
			v.Targets = nil
		}
	case fsm.Expand, fsm.NodeExpand:
		if res.CapacityBytes > v.CapacityBytes {
			v.CapacityBytes = res.CapacityBytes
		}
	}
	v.State = op.To
	v.Generation++
	v.UpdatedAt = now
	return nil
}

// sweep is the resize queue's safety net: it starts queued resizes of
// detached, idle volumes that are due (after a failed attempt's backoff, or
// if anything ever left one behind).
func (e *Engine) sweep() {
	defer e.sweeper.Done()
	for {
		next := e.sweepOnce()
		wait := e.cfg.SweepInterval
		if !next.IsZero() {
			if d := next.Sub(e.cfg.Clock.Now()); d < wait {
				wait = max(d, time.Millisecond)
			}
		}
		select {
		case <-e.draining:
			return
		case <-e.cfg.Clock.After(wait):
		}
	}
}

// sweepOnce starts the due resizes and returns when the next one is due.
func (e *Engine) sweepOnce() time.Time {
	now := e.cfg.Clock.Now()
	var due []string
	var next time.Time
	_ = e.st.View(func(tx *store.Tx) error {
		return tx.ForEachResize(func(r *store.Resize) bool {
			v, err := tx.Volume(r.VolumeID)
			if err != nil || v == nil || v.State != fsm.Created || v.ActiveOp != 0 {
				return true
			}
			if r.NextAttemptAt.After(now) {
				if next.IsZero() || r.NextAttemptAt.Before(next) {
					next = r.NextAttemptAt
				}
				return true
			}
			due = append(due, r.VolumeID)
			return true
		})
	})
	for _, id := range due {
		if err := e.startQueuedResize(id, now); err != nil {
			e.log.Error().Err(err).Str("volume", id).Msg("cannot start queued resize")
		}
	}
	return next
}

func (e *Engine) startQueuedResize(id string, now time.Time) error {
	return e.st.Update(func(tx *store.Tx) error {
		v, err := tx.Volume(id)
		if err != nil || v == nil || v.State != fsm.Created || v.ActiveOp != 0 {
			return err
		}
		op, err := e.chainResize(tx, v, now)
		if err != nil || op == nil {
			return err
		}
		vol := *v
		tx.OnCommit(func() { e.launchAccepted(op, &vol) })
		return nil
	})
}

// codeFromName parses a stored gRPC code name.
func codeFromName(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	return codes.Internal
}
