package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
)

// Exec is what an executor gets: the op (read-only), the volume (or
// snapshot) as it was when the op was accepted, and a way to record
// progress.
type Exec struct {
	// Op is the op being executed. Executors must not modify it.
	Op *store.Op
	// Volume is the volume record as it was when the op was accepted (a
	// volume's op).
	Volume store.Volume
	// Snapshot is the snapshot record as it was when the op was accepted
	// (a snapshot's op).
	Snapshot store.Snapshot
	// Log carries the volume id, op and event.
	Log zerolog.Logger

	e *Engine
}

// Checkpoint durably records progress of the op (for example the id of a
// cloud operation about to be waited on, or "formatting started"), so that
// an execution resumed after a crash can tell where the last one got to.
// An error (the state file cannot be written) is transient: return it, and
// the attempt is retried.
func (x *Exec) Checkpoint(key, value string) error {
	return x.CheckpointAll(map[string]string{key: value})
}

// CheckpointAll is Checkpoint of several keys, in one commit.
func (x *Exec) CheckpointAll(kv map[string]string) error {
	cp := maps.Clone(x.Op.Checkpoints)
	if cp == nil {
		cp = map[string]string{}
	}
	maps.Copy(cp, kv)
	o := *x.Op
	o.Checkpoints = cp
	if err := x.e.st.Update(func(tx *store.Tx) error { return tx.UpdateOp(&o) }); err != nil {
		return fmt.Errorf("checkpoint %v of op %d: %w", slices.Sorted(maps.Keys(kv)), x.Op.Seq, err)
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
// failures, each attempt within the event's deadline), compensates a failed
// forward op, and commits the outcome. It leaves the op active in the store
// only when csid shuts down: every other path ends in a committed outcome.
func (e *Engine) run(f *flight) {
	defer e.workers.Done()
	op := f.op
	lc := e.log.With().Uint64("op", op.Seq).Str("event", string(op.Event))
	if op.SnapshotID != "" {
		lc = lc.Str("snapshot", op.SnapshotID)
	} else {
		lc = lc.Str("volume", op.VolumeID)
	}
	log := lc.Logger()
	x := &Exec{Op: op, Volume: f.vol, Snapshot: f.snap, Log: log, e: e}
	exec := e.cfg.Executors[op.Event]

	if exec == nil {
		e.fail(f, x, nil, Errorf(Unsupported, "no executor for %s in this mode", op.Event), false, log)
		return
	}
	if op.Status == store.OpCompensating {
		e.fail(f, x, exec, &Error{Kind: kindOfCode(op.Code), Msg: op.Message}, false, log)
		return
	}
	for {
		res, err, ok := e.attempt(f, x, exec)
		if !ok {
			e.interrupted(f, x, exec, log)
			return
		}
		if err == nil {
			crash.Point(crash.OpsBeforeCommit)
			e.succeed(f, res, log)
			return
		}
		kind := KindOf(err)
		if kind == Transient && op.Attempts+1 < e.cfg.Retry.MaxAttempts {
			delay := e.cfg.Retry.Delay(op.Attempts + 1)
			log.Warn().Err(err).Int("attempt", op.Attempts+1).Float64("retry_in_seconds", delay.Seconds()).Msg("op failed; retrying")
			e.recordAttempt(f, err, delay, log)
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
		oe := &Error{Kind: kind, Msg: err.Error()}
		if kind == Transient {
			oe.Msg = fmt.Sprintf("%s (gave up after %d attempts)", oe.Msg, op.Attempts+1)
		}
		e.fail(f, x, exec, oe, kind == Transient, log)
		return
	}
}

// attempt runs the executor once, holding a worker slot and within the
// event's deadline. ok is false when the op's own context ended (shutdown
// or a negation) before or during the attempt. An attempt that outlives
// its deadline is a transient error that names the deadline; the executor's
// error says what it was waiting on.
func (e *Engine) attempt(f *flight, x *Exec, exec Executor) (res Result, err error, ok bool) {
	select {
	case e.sem <- struct{}{}:
	case <-f.ctx.Done():
		return Result{}, nil, false
	case <-e.draining:
		return Result{}, nil, false
	}
	defer func() { <-e.sem }()
	crash.Point(crash.OpsBeforeEffect)
	limit := e.cfg.Deadlines.of(f.event)
	ctx, cancel := context.WithTimeoutCause(f.ctx, limit, errDeadline)
	defer cancel()
	err = contained(x, "Execute", func() (err error) {
		res, err = exec.Execute(ctx, x)
		return err
	})
	if f.ctx.Err() != nil {
		return Result{}, nil, false
	}
	if err != nil && errors.Is(context.Cause(ctx), errDeadline) {
		err = Mark(fmt.Errorf("%s did not finish within its deadline of %v: %w", f.event, limit, err), Transient)
	}
	return res, err, true
}

// contained runs one call of an executor, turning a panic into the
// Internal error of that attempt (logged with its stack): a bug in one
// effect fails its op, which compensates as any failed op does, and
// leaves the engine, its worker slot and every other volume going,
// without a restart.
func contained(x *Exec, what string, call func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			x.Log.Error().Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).Msgf("the executor's %s panicked", what)
			err = Mark(fmt.Errorf("%s %s panicked: %v", x.Op.Event, what, p), Internal)
		}
	}()
	return call()
}

// errDeadline is the cause of an attempt's context that ran out of time.
var errDeadline = errors.New("op deadline")

// interrupted handles a worker whose context ended: by Close (the op stays
// queued for the next start) or by a negation (the op fails, compensated).
func (e *Engine) interrupted(f *flight, x *Exec, exec Executor, log zerolog.Logger) {
	cause := context.Cause(f.ctx)
	if errors.Is(cause, errShutdown) || cause == nil {
		e.abandon(f, log)
		return
	}
	e.fail(f, x, exec, Errorf(Busy, "%s of %s (operation %d) was %v", f.event, f.subject, f.seq, cause), false, log)
}

// abandon leaves the op active in the store (it resumes at the next start)
// and releases whoever waits on it. Only shutdown abandons an op.
func (e *Engine) abandon(f *flight, log zerolog.Logger) {
	log.Info().Msg("op left for the next start")
	e.release(f, Outcome{}, ErrClosed)
}

// recordAttempt records a failed attempt on the op (and its queued
// resize), for inspection and for the attempt count after a restart. It
// is best effort: when the state file cannot be written, the count goes
// on in memory and the retry is not held back.
func (e *Engine) recordAttempt(f *flight, cause error, delay time.Duration, log zerolog.Logger) {
	now := e.cfg.Clock.Now()
	o := *f.op
	o.Attempts++
	o.LastError = cause.Error()
	o.NextAttemptAt = now.Add(delay)
	err := e.st.Update(func(tx *store.Tx) error {
		if err := tx.UpdateOp(&o); err != nil {
			return err
		}
		return deferredResize{tx: tx, now: now}.attempted(&o, o.NextAttemptAt)
	})
	if err != nil {
		log.Warn().Err(err).Msg("cannot record the attempt; counting it in memory")
	}
	*f.op = o
	msg := fmt.Sprintf("attempt %d failed: %s", o.Attempts, o.LastError)
	f.progress.Store(&msg)
	if e.cfg.Observer != nil {
		e.cfg.Observer.OpRetried(o.Event)
	}
}

// fail compensates a forward op (if exec is set and the event has an
// inverse) and commits the failure. transient says the op gave up on a
// transient error (a failed resize then stays queued, to be tried later).
func (e *Engine) fail(f *flight, x *Exec, exec Executor, oe *Error, transient bool, log zerolog.Logger) {
	op := f.op
	if _, forward := fsm.Inverse(op.Event); forward && exec != nil {
		if op.Status != store.OpCompensating {
			o := *op
			o.Status, o.Code, o.Message = store.OpCompensating, oe.Kind.Code().String(), oe.Msg
			if !e.commit(f, "record the compensation", func(tx *store.Tx) error { return tx.UpdateOp(&o) }, log) {
				return
			}
			*op = o
		}
		log.Warn().Str("reason", oe.Msg).Msg("op failed; compensating")
		if err, ok := e.compensate(f, x, exec); !ok {
			e.abandon(f, log) // shutdown: compensation resumes at the next start
			return
		} else if err != nil {
			log.Error().Err(err).Msg("compensation failed: effects of the op may remain (csid check reports them)")
			oe = &Error{Kind: oe.Kind, Msg: fmt.Sprintf("%s; undoing its partial effects also failed: %v", oe.Msg, err)}
		}
	}
	now := e.cfg.Clock.Now()
	var out store.Volume
	var next *store.Op
	commit := func(tx *store.Tx) error {
		next = nil
		v, err := e.activeVolume(tx, op)
		if err != nil {
			return err
		}
		o := *op
		o.Status, o.Code, o.Message, o.FinishedAt = store.OpFailed, oe.Kind.Code().String(), oe.Msg, now
		if err := tx.Finish(v, &o); err != nil { // a failed create (ABSENT) leaves no record
			return err
		}
		q := deferredResize{tx: tx, now: now}
		if o.Event == fsm.Expand {
			if err := q.failed(v, &o, transient, e.cfg.Retry.Cap); err != nil {
				return err
			}
		}
		out = *v
		if next, err = q.afterCommit(v, &o); err != nil {
			return err
		}
		e.onOutcome(tx, f, op, "failed", now, Outcome{Volume: out}, oe, next, v)
		return nil
	}
	if op.SnapshotID != "" {
		commit = func(tx *store.Tx) error { return e.finishSnapshot(tx, f, op, now, Result{}, oe) }
	}
	if e.commit(f, "commit the failure", commit, log) {
		log.Warn().Str("code", oe.Kind.Code().String()).Str("reason", oe.Msg).Msg("op failed")
	}
}

// compensate runs the executor's Compensate until it succeeds, retrying
// transient failures. ok is false when csid shuts down meanwhile.
func (e *Engine) compensate(f *flight, x *Exec, exec Executor) (err error, ok bool) {
	for attempt := 1; ; attempt++ {
		select {
		case e.sem <- struct{}{}:
		case <-e.draining:
			return nil, false
		}
		// A negation cancelled f.ctx; compensation must still run, within
		// the event's deadline.
		ctx, cancel := context.WithTimeout(e.base, e.cfg.Deadlines.of(f.event))
		err = contained(x, "Compensate", func() error { return exec.Compensate(ctx, x) })
		cancel()
		<-e.sem
		if err == nil {
			return nil, true
		}
		if e.base.Err() != nil {
			return nil, false
		}
		if KindOf(err) != Transient || attempt >= e.cfg.Retry.MaxAttempts {
			return err, true
		}
		select {
		case <-e.cfg.Clock.After(e.cfg.Retry.Delay(attempt)):
		case <-e.draining:
			return nil, false
		}
	}
}

// succeed commits a successful op: the volume moves to the op's target
// state with the result folded in, atomically with the op's outcome and the
// history entry. A volume left detached with a pending resize starts the
// resize in the same transaction.
func (e *Engine) succeed(f *flight, res Result, log zerolog.Logger) {
	op := f.op
	now := e.cfg.Clock.Now()
	var next *store.Op
	commit := func(tx *store.Tx) error {
		next = nil
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
		if e.cfg.Forget && op.Event == fsm.NodeUnstage {
			if _, err := Forget(tx, v, "unstaged: nothing of it is left on this node", now); err != nil {
				return err
			}
		}
		out := *v
		if next, err = (deferredResize{tx: tx, now: now}).afterCommit(v, &o); err != nil {
			return err
		}
		e.onOutcome(tx, f, op, "succeeded", now, Outcome{Volume: out}, nil, next, v)
		return nil
	}
	if op.SnapshotID != "" {
		commit = func(tx *store.Tx) error { return e.finishSnapshot(tx, f, op, now, res, nil) }
	}
	if e.commit(f, "commit the outcome", commit, log) {
		log.Debug().Str("to", string(op.To)).Msg("op succeeded")
	}
}

// onOutcome registers what follows the commit of an op's outcome: the
// metrics, the answer to its waiters and the launch of a resize the commit
// accepted (next, on volume after).
func (e *Engine) onOutcome(tx *store.Tx, f *flight, op *store.Op, outcome string, now time.Time,
	out Outcome, oe *Error, next *store.Op, after *store.Volume) {
	var nextRec *record
	if next != nil {
		nextRec = &record{vol: after.Clone()}
	}
	tx.OnCommit(func() {
		e.observe(op, outcome, now)
		e.release(f, out, oe)
		if next != nil {
			e.launchAccepted(next, nextRec)
		}
	})
}

// commit writes an op's progress or outcome with fn. When the state file
// cannot take the write (full, immutable, an I/O error), the worker keeps
// the op and its waiters, says so to whoever asks, waits for the store to
// be healthy again and commits then: a failed commit never strands an op.
// It returns false when csid shuts down first (the op is abandoned, to
// resume at the next start) or fn fails for good (a bug or a damaged
// record: the waiters get the error and the op stays in the store, for the
// next request or start to pick up).
func (e *Engine) commit(f *flight, what string, fn func(tx *store.Tx) error, log zerolog.Logger) bool {
	if hook := e.cfg.inCommit; hook != nil {
		inner := fn
		fn = func(tx *store.Tx) error { hook(f.event, what); return inner(tx) }
	}
	for {
		err := e.st.Update(fn)
		if err == nil {
			return true
		}
		if !errors.Is(err, store.ErrUnavailable) {
			log.Error().Err(err).Msgf("cannot %s", what)
			e.release(f, Outcome{}, Errorf(Internal, "operation %d (%s of %s): cannot %s: %v", f.seq, f.event, f.subject, what, err))
			return false
		}
		msg := fmt.Sprintf("waiting to %s: %v", what, err)
		f.progress.Store(&msg)
		log.Error().Err(err).Msgf("cannot %s; retrying once the state file takes writes", what)
		select {
		case <-e.st.Healthy():
		case <-e.draining:
			e.abandon(f, log)
			return false
		}
	}
}

// observe reports a finished op to the Observer. It runs in the outcome's
// commit hook, before the waiters are released: whoever has the answer
// also finds the op counted.
func (e *Engine) observe(op *store.Op, outcome string, now time.Time) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.OpFinished(op.Event, outcome, now.Sub(op.CreatedAt))
	}
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

// release ends a flight: it leaves the engine's map and everyone waiting
// gets the outcome (err nil) or the error. For an outcome it runs in the
// commit hook, so no later transaction can see the op finished while its
// flight is still registered, nor active without one.
func (e *Engine) release(f *flight, out Outcome, err *Error) {
	e.mu.Lock()
	delete(e.flights, f.seq)
	e.mu.Unlock()
	f.out, f.err = out, err
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
		if res.Device != "" && v.Stage != nil {
			v.Stage.Device = res.Device // proven now: a stale hint is replaced
		}
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
		// An expand [deferred] records a queued target; it grows nothing.
		if op.Guard != fsm.Deferred && res.CapacityBytes > v.CapacityBytes {
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
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		due, next, err = deferredResize{tx: tx, now: now}.due()
		return err
	})
	if err != nil {
		e.log.Error().Err(err).Msg("cannot read the resize queue")
	}
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
		op, err := deferredResize{tx: tx, now: now}.afterCommit(v, nil)
		if err != nil || op == nil {
			return err
		}
		rec := &record{vol: v.Clone()}
		tx.OnCommit(func() { e.launchAccepted(op, rec) })
		return nil
	})
}
