// Package ops is csid's operation engine. CSI handlers submit transitions
// (a volume, an event, its arguments); the engine decides in one bbolt
// transaction whether the request is already satisfied, joins an identical
// op in flight, is refused, or becomes a new durable op, and then waits for
// the outcome. Workers perform the ops' effects through pluggable,
// idempotent executors, retry transient failures with backoff, compensate
// failed forward ops, and commit each outcome atomically with the volume
// record and its history. After a crash, Start resumes every op that was
// accepted before answering as ready.
//
// The engine knows no provider: executors report failures in the engine's
// own kinds (Kind), and Kind.Code alone maps them to gRPC codes.
//
// Rules of the engine (design.md, "The operation pipeline"):
//   - at most one op is active per volume; ops of different volumes run in
//     parallel, bounded by Config.Workers;
//   - an identical request joins the op in flight; a different one gets
//     Busy (Aborted), except that an inverse request (unpublish, unstage)
//     cancels its forward op, and a publish waits for a resize;
//   - an expand of an attached volume waits in the durable resize queue
//     (resize.go), and the commit of any op that leaves the volume
//     detached and idle starts it;
//   - no wedge: every attempt has a deadline (Config.Deadlines), a commit
//     the state file cannot take waits for the store and is retried, and
//     only shutdown leaves an op for the next start.
package ops

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
)

// Executor performs the effects of one event.
type Executor interface {
	// Execute performs the op's effect and reports its result. It must be
	// idempotent: after a crash at any point it is called again with the
	// same op (and the checkpoints it recorded), and must converge to the
	// same result without repeating a destructive step. Return an error
	// wrapped with Retryable (or a cloud.ErrTransient) for failures worth
	// retrying; any other error fails the op.
	Execute(ctx context.Context, x *Exec) (Result, error)
	// Compensate undoes whatever a failed or cancelled Execute of a forward
	// op (create, controller_publish, node_stage, node_publish,
	// snapshot_create) may have done, so that a failed op leaves nothing behind. It must be
	// idempotent. It is never called for other events.
	Compensate(ctx context.Context, x *Exec) error
}

// Adopter resolves, on a node, a volume the node's store has not seen: it
// returns a record in NODE_READY for a volume attached to this node, or an
// error (of kind NotFound for an unknown volume).
type Adopter func(ctx context.Context, volumeID string, args *NodeStageArgs) (*store.Volume, error)

// Observer receives the engine's events (metrics). Methods must be quick
// and must not use the store: OpFinished runs in the outcome's commit hook,
// before the op's waiters are answered.
type Observer interface {
	OpFinished(e fsm.Event, outcome string, took time.Duration)
	OpRetried(e fsm.Event)
	// OpWaited: a request for event e waits on op seq (of event on), which
	// it did not start: a repeated request joining its op in flight, or a
	// publish held until a resize has finished.
	OpWaited(e, on fsm.Event, seq uint64)
}

// Deadlines bound one attempt of an op, per event. An attempt that runs
// out of time is retried (it is transient) with a message naming what it
// waited on; host tools (mkfs, e2fsck, resize2fs) are never killed for it:
// the executor stops waiting, not the tool.
type Deadlines map[fsm.Event]time.Duration

// DefaultDeadlines are generous: a cloud's attach or a large mkfs can take
// minutes; a bind mount cannot.
func DefaultDeadlines() Deadlines {
	return Deadlines{
		fsm.Create: 10 * time.Minute, fsm.Delete: 10 * time.Minute,
		fsm.ControllerPublish: 5 * time.Minute, fsm.ControllerUnpublish: 5 * time.Minute,
		fsm.Expand: 10 * time.Minute, fsm.NodeStage: 15 * time.Minute, fsm.NodeUnstage: 5 * time.Minute,
		fsm.NodePublish: 2 * time.Minute, fsm.NodeUnpublish: 2 * time.Minute, fsm.NodeExpand: 15 * time.Minute,
		// A snapshot may copy a whole disk (no reflink where the provider
		// keeps its disks).
		fsm.SnapshotCreate: 30 * time.Minute, fsm.SnapshotDelete: 10 * time.Minute,
	}
}

// of is the deadline of an attempt of event e: the configured one, else the
// default, else ten minutes.
func (d Deadlines) of(e fsm.Event) time.Duration {
	if v, ok := d[e]; ok && v > 0 {
		return v
	}
	if v, ok := DefaultDeadlines()[e]; ok {
		return v
	}
	return 10 * time.Minute
}

// Config configures an Engine.
type Config struct {
	Store     *store.Store
	Executors map[fsm.Event]Executor
	// NodeID is the node this process serves ("" for a controller).
	NodeID string
	// Adopt, if set, lets node_stage adopt volumes unknown to the store.
	Adopt Adopter
	// Confirm, if set, checks with the host or the cloud a request the
	// record says is done, before it is answered from the record.
	Confirm Confirmer
	// Forget says the store holds this node's records alone (node mode):
	// a volume that node_unstage leaves with nothing staged or published
	// here is forgotten in the same commit (fsm.Forget; see Forget). In
	// all-in-one mode the record is also the controller's, and stays.
	Forget bool
	Clock  Clock
	Retry  *Backoff
	// Workers bounds the ops executing at once (default 64).
	Workers int
	// SweepInterval is the period of the resize queue's safety net
	// (default 30s); the queue is otherwise event-driven.
	SweepInterval time.Duration
	// DrainTimeout bounds how long Close lets running effects finish
	// before cancelling them (default 10s).
	DrainTimeout time.Duration
	// Deadlines bound each attempt of an op, by event (DefaultDeadlines
	// for the events it leaves out).
	Deadlines Deadlines
	Log       zerolog.Logger
	Observer  Observer
	// NewID draws volume ids (default "vol-" and 20 random hex digits).
	NewID func() string
	// NewSnapshotID draws snapshot ids (default "snap-" and 20 random hex
	// digits). Snapshot and volume ids must never meet: the store keeps
	// them in one namespace.
	NewSnapshotID func() string
	// ConfirmSnapshot, if set, asks the provider whether a snapshot the
	// record says is READY (a repeated CreateSnapshot) is still there: it
	// returns why not ("" when it is), and the engine then forgets the
	// record and takes the snapshot again.
	ConfirmSnapshot func(ctx context.Context, s *store.Snapshot) (gone string, err error)

	// inCommit, if set, runs first inside every transaction in which a
	// worker commits an op's progress or outcome (what: "commit the
	// outcome", ...). Tests only: a panic or an error there, as a bug
	// would make one.
	inCommit func(event fsm.Event, what string)
}

// Engine runs ops. Create it with New, then Start it.
type Engine struct {
	cfg Config
	st  *store.Store
	log zerolog.Logger

	mu      sync.Mutex
	flights map[uint64]*flight
	closed  bool

	ready    atomic.Bool
	draining chan struct{} // closed by Close: no new attempts
	base     context.Context
	stop     context.CancelCauseFunc
	workers  sync.WaitGroup
	runners  *spawner // the workers' goroutines, kept for the next op
	sem      chan struct{}
	sweeper  sync.WaitGroup
}

// keepRunnersIdle is how long a worker's goroutine waits for the next op
// before it ends.
const keepRunnersIdle = 10 * time.Second

// errShutdown is the cause of worker contexts cancelled by Close.
var errShutdown = errors.New("csid is shutting down")

// flight is an active op in memory: its worker, and everyone waiting on it.
// seq, event and subject never change; op belongs to the worker alone.
type flight struct {
	seq   uint64
	event fsm.Event
	// subject is the op's volume ("volume vol-...") or snapshot, for
	// messages.
	subject string
	op      *store.Op // the worker's copy
	// vol (or snap, for a snapshot's op) is the record the op was
	// accepted on.
	vol    store.Volume
	snap   store.Snapshot
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	// out and err are the outcome, set before done is closed.
	out Outcome
	err *Error
	// progress says how the op's attempts went ("attempt 2 failed: ...",
	// "waiting to commit the outcome: ..."), for callers whose deadline
	// comes first.
	progress atomic.Pointer[string]
}

// New builds an engine. It does nothing until Start.
func New(cfg Config) *Engine {
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.Retry == nil {
		cfg.Retry = &Backoff{}
	}
	cfg.Retry.defaults()
	if cfg.Workers <= 0 {
		cfg.Workers = 64
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 30 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.NewID == nil {
		cfg.NewID = newVolumeID
	}
	if cfg.NewSnapshotID == nil {
		cfg.NewSnapshotID = newSnapshotID
	}
	base, stop := context.WithCancelCause(context.Background())
	draining := make(chan struct{})
	return &Engine{cfg: cfg, st: cfg.Store, log: cfg.Log, flights: map[uint64]*flight{},
		draining: draining, base: base, stop: stop,
		sem: make(chan struct{}, cfg.Workers), runners: newSpawner(draining, keepRunnersIdle)}
}

// newVolumeID draws a volume id: "vol-" and 20 hex digits, the first 12
// the Unix time in milliseconds and the last 8 random. Ids of volumes made
// close in time sort together, so concurrent creates (and deletes of
// recent volumes) share the volumes bucket's last pages instead of each
// rewriting a random leaf (BenchmarkCreateDeleteExisting). Two ids drawn
// in one millisecond differ in 32 random bits.
func newVolumeID() string { return "vol-" + timeSortedHex() }

// newSnapshotID draws a snapshot id: "snap-" and 20 hex digits, as a
// volume id's.
func newSnapshotID() string { return "snap-" + timeSortedHex() }

// timeSortedHex is 20 hex digits: the Unix time in milliseconds (12), then
// 32 random bits (8).
func timeSortedHex() string {
	var b [10]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// Start resumes every op left queued or compensating by an earlier run, and
// starts the resize queue's safety net. The engine answers Ready once the
// resumed ops are running again (not necessarily finished: a resumed op is
// joined by the CO's retry).
func (e *Engine) Start(ctx context.Context) error {
	var active []*store.Op
	recs := map[uint64]*record{}
	var damaged []*store.DamagedError
	err := e.st.View(func(tx *store.Tx) error {
		ops, err := tx.ActiveOps()
		if err != nil {
			return err
		}
		for _, op := range ops {
			r, err := activeRecord(tx, op)
			if d := (*store.DamagedError)(nil); errors.As(err, &d) {
				damaged = append(damaged, d)
				continue
			}
			if err != nil {
				return err
			}
			if r == nil {
				return fmt.Errorf("op %d is active but %s does not name it: %w", op.Seq, subjectOf(op), store.ErrCorrupt)
			}
			active = append(active, op)
			recs[op.Seq] = r
		}
		damaged = append(damaged, tx.Skipped()...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("recover ops: %w", err)
	}
	for _, d := range damaged {
		// Not resumed, and not failed: the volume's RPCs answer DataLoss
		// until the record is restored.
		e.log.Error().Str("volume", d.VolumeID).Str("snapshot", d.SnapshotID).Str("record", d.Bucket+"/"+d.Key).Str("problem", d.Problem).
			Msg("a damaged record: its op is not resumed, and csid does not act on its volume or snapshot; csid check says what to do")
	}
	for _, op := range active {
		e.log.Info().Uint64("op", op.Seq).Str("volume", op.VolumeID).Str("snapshot", op.SnapshotID).Str("event", string(op.Event)).
			Str("status", string(op.Status)).Int("attempts", op.Attempts).Msg("resuming op")
		e.mu.Lock()
		e.launchLocked(op, recs[op.Seq])
		e.mu.Unlock()
	}
	e.sweeper.Add(1)
	go e.sweep()
	e.ready.Store(true)
	e.log.Info().Int("resumed", len(active)).Msg("operation engine ready")
	return nil
}

// Started reports whether Start has finished and Close has not begun.
func (e *Engine) Started() bool { return e.ready.Load() }

// Ready reports whether the engine can take work: Start has finished,
// Close has not begun, and the store takes writes (store.Health). Probe
// answers it.
func (e *Engine) Ready() bool { return e.ready.Load() && e.st.Health() == nil }

// Submit runs one request to its outcome, or until ctx ends. See the package
// comment for the rules. Errors are *Error values (their kind's gRPC code is
// what a caller sees).
func (e *Engine) Submit(ctx context.Context, req Request) (Outcome, error) {
	if err := argsType(req.Event, req.Args); err != nil {
		return Outcome{}, Errorf(Internal, "%v", err)
	}
	if !e.ready.Load() {
		if e.isClosed() {
			return Outcome{}, ErrClosed
		}
		return Outcome{}, ErrNotReady
	}
	if err := e.st.Health(); err != nil {
		return Outcome{}, Errorf(Transient, "%v; csid takes requests again once it can write its state; retry", err)
	}
	if e.cfg.Executors[req.Event] == nil {
		return Outcome{}, Errorf(Unsupported, "this csid does not serve %s (check --mode)", req.Event)
	}
	var adopted *store.Volume
	for {
		d, f, err := e.decide(req, adopted)
		if errors.Is(err, errAdopt) {
			if adopted, err = e.adopt(ctx, req); err != nil {
				return Outcome{}, err
			}
			continue
		}
		if err != nil {
			if e.isClosed() {
				return Outcome{}, ErrClosed
			}
			return Outcome{}, storeError(req, err)
		}
		switch d.kind {
		case done:
			if ok, err := e.confirmedDone(ctx, req, d); err != nil {
				return Outcome{}, asError(err)
			} else if !ok {
				continue // the world disagrees with the record, which is corrected: plan again
			}
			if d.snap != nil {
				return Outcome{Snapshot: *d.snap}, nil
			}
			return Outcome{Volume: *d.vol}, nil
		case reject:
			return Outcome{}, d.err
		case accept, join:
			if d.kind == join {
				e.waited(req, f)
			}
			out, err := e.await(ctx, f, d.why)
			if err != nil {
				return Outcome{}, blockedBy(req, f, err)
			}
			if d.replan {
				continue
			}
			return out, nil
		case waitThenReplan:
			e.waited(req, f)
			if _, err := e.await(ctx, f, d.why); err != nil {
				return Outcome{}, blockedBy(req, f, err)
			}
		case cancelThenReplan:
			f.cancel(fmt.Errorf("cancelled by %s", req.Event))
			if _, err := e.await(ctx, f, d.why); err != nil && ctx.Err() != nil {
				return Outcome{}, err
			}
		}
	}
}

// blockedBy is the answer of a request that waited for an op of another
// kind (a publish waiting for a resize) that did not succeed. An expand that
// waited for a resize shares its failure.
func blockedBy(req Request, f *flight, err error) error {
	if KindOf(err) == Busy || f.event == req.Event {
		return err
	}
	return Errorf(Busy, "%s: %s waited for %s (operation %d), which failed: %v; retry",
		f.subject, req.Event, f.event, f.seq, err)
}

// waited tells the Observer that req waits on an op it did not start.
func (e *Engine) waited(req Request, f *flight) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.OpWaited(req.Event, f.event, f.seq)
	}
}

var errAdopt = errors.New("adopt first")

// decide plans the request. It tries a read-only transaction first, and
// takes the group-committed write path only when the decision writes, or
// needs a flight it could not find.
func (e *Engine) decide(req Request, adopted *store.Volume) (decision, *flight, error) {
	now := e.cfg.Clock.Now()
	var d decision
	var f *flight
	err := e.st.View(func(tx *store.Tx) error {
		if adopted == nil && e.cfg.Adopt != nil && req.Event == fsm.NodeStage {
			if v, err := tx.Volume(req.VolumeID); err != nil {
				return err
			} else if v == nil {
				return errAdopt // a node meets this volume for the first time
			}
		}
		var err error
		p := planner{tx: tx, nodeID: e.cfg.NodeID, now: now, newID: e.cfg.NewID, newSnapID: e.cfg.NewSnapshotID, adopted: adopted}
		d, err = p.plan(req)
		return err
	})
	if err != nil {
		return d, nil, err
	}
	switch {
	case d.writes():
	case d.kind == done || d.kind == reject:
		return d, nil, nil
	default:
		if f = e.flight(d.seq); f != nil {
			return d, f, nil
		}
		// No flight: the op may have just finished, or have been accepted
		// by a commit whose hook has not launched it yet. The write path
		// looks again after every earlier commit's hooks have run.
	}
	if err = e.st.Update(func(tx *store.Tx) error {
		d, f = decision{}, nil
		return e.carryOut(tx, req, adopted, now, &d, &f)
	}); err != nil {
		return d, nil, err
	}
	if f == nil && d.kind != done && d.kind != reject && d.kind != accept {
		// The op is in the store without a worker (its last commit failed
		// for good): run it again rather than wedge the volume. Every
		// commit before ours has run its hooks, so no launch is pending.
		if f, err = e.resume(d.seq); err != nil {
			return d, nil, err
		}
	}
	if f == nil && d.kind != done && d.kind != reject {
		return d, nil, ErrClosed // accepted while Close ran: it resumes at the next start
	}
	return d, f, nil
}

// carryOut plans req again in the write transaction tx and writes what the
// decision writes: a queue entry or note, an adopted record, the accepted
// op. *f is set by the commit hook to the flight of the op accepted or met.
func (e *Engine) carryOut(tx *store.Tx, req Request, adopted *store.Volume, now time.Time, d *decision, f **flight) error {
	p := planner{tx: tx, nodeID: e.cfg.NodeID, now: now, newID: e.cfg.NewID, newSnapID: e.cfg.NewSnapshotID, adopted: adopted}
	var err error
	if *d, err = p.plan(req); err != nil {
		return err
	}
	if d.resize != nil {
		if err := tx.PutResize(d.resize); err != nil {
			return err
		}
	}
	if d.note != nil {
		if err := tx.AddNote(req.VolumeID, *d.note); err != nil {
			return err
		}
	}
	switch d.kind {
	case accept:
		if d.snap != nil {
			op, sn := d.op, d.snap
			if err := tx.AcceptSnapshot(sn, op); err != nil {
				return err
			}
			opCopy, rec := *op, &record{snap: sn.Clone()}
			tx.OnCommit(func() { *f = e.launchAccepted(&opCopy, rec) })
			return nil
		}
		if adopted != nil && d.vol.ID == adopted.ID {
			if err := e.recordAdoption(tx, adopted, d.vol, now); err != nil {
				return err
			}
		}
		op, vol := d.op, d.vol
		if err := tx.Accept(vol, op); err != nil {
			return err
		}
		opCopy, rec := *op, &record{vol: vol.Clone()}
		tx.OnCommit(func() { *f = e.launchAccepted(&opCopy, rec) })
	case join, waitThenReplan, cancelThenReplan:
		seq := d.seq
		tx.OnCommit(func() { *f = e.flight(seq) })
	}
	return nil
}

// recordAdoption writes the record of a volume a node meets for the first
// time (adopt: ABSENT -> NODE_READY), unless another request did so
// meanwhile; vol, the record the op is accepted on, takes its generation.
func (e *Engine) recordAdoption(tx *store.Tx, adopted, vol *store.Volume, now time.Time) error {
	if cur, err := tx.Volume(adopted.ID); err != nil || cur != nil {
		return err
	}
	a := *adopted
	if err := tx.Reconcile(&a, fsm.Adopt, fsm.NoGuard, "attached to this node", now); err != nil {
		return err
	}
	vol.Generation = a.Generation
	return nil
}

// resume starts a worker for an op that is active in the store but has
// none in this process (what Start does for every such op after a crash).
// It returns nil when the op is no longer active, or the engine is closing.
//
// It reads the store holding e.mu, after finding no flight: a worker leaves
// the map only in its outcome's commit hook, so a read that starts after
// that sees the op finished, and two callers cannot both launch it.
func (e *Engine) resume(seq uint64) (*flight, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.flights[seq]; f != nil || e.closed {
		return f, nil
	}
	var op *store.Op
	var r *record
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		if op, err = tx.Op(seq); err != nil || op == nil || !op.Status.Active() {
			op = nil
			return err
		}
		if r, err = activeRecord(tx, op); err != nil || r == nil {
			op = nil
		}
		return err
	})
	if err != nil || op == nil {
		return nil, err
	}
	e.log.Warn().Uint64("op", seq).Str("volume", op.VolumeID).Str("snapshot", op.SnapshotID).Str("event", string(op.Event)).
		Msg("op had no worker; resuming it")
	return e.launchLocked(op, r), nil
}

// record is the volume or the snapshot an op runs on (one is set).
type record struct {
	vol  *store.Volume
	snap *store.Snapshot
}

// activeRecord reads the record of an active op, or nil when it does not
// name the op as its active op.
func activeRecord(tx *store.Tx, op *store.Op) (*record, error) {
	if op.SnapshotID != "" {
		s, err := tx.Snapshot(op.SnapshotID)
		if err != nil || s == nil || s.ActiveOp != op.Seq {
			return nil, err
		}
		return &record{snap: s}, nil
	}
	v, err := tx.Volume(op.VolumeID)
	if err != nil || v == nil || v.ActiveOp != op.Seq {
		return nil, err
	}
	return &record{vol: v}, nil
}

// subjectOf names an op's volume or snapshot, for messages.
func subjectOf(op *store.Op) string {
	if op.SnapshotID != "" {
		return "snapshot " + op.SnapshotID
	}
	return "volume " + op.VolumeID
}

func (e *Engine) adopt(ctx context.Context, req Request) (*store.Volume, error) {
	v, err := e.cfg.Adopt(ctx, req.VolumeID, req.Args.(*NodeStageArgs))
	if err != nil {
		return nil, asError(err)
	}
	now := e.cfg.Clock.Now()
	v.ID, v.State, v.ActiveOp, v.CreatedAt, v.UpdatedAt = req.VolumeID, fsm.NodeReady, 0, now, now
	return v, nil
}

func (e *Engine) flight(seq uint64) *flight {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.flights[seq]
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// launchAccepted starts the worker of an op its transaction has just
// accepted, on its volume or snapshot r. It runs in the commit hook: the
// op is durable, nothing of it has run yet (crash point ops.queued). An op
// accepted while Close runs is left queued for the next start.
func (e *Engine) launchAccepted(op *store.Op, r *record) *flight {
	crash.Point(crash.OpsQueued)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	return e.launchLocked(op, r)
}

// launchLocked registers a flight for op on its volume or snapshot r and
// starts its worker, unless it has one already. e.mu held.
func (e *Engine) launchLocked(op *store.Op, r *record) *flight {
	if f := e.flights[op.Seq]; f != nil {
		return f
	}
	ctx, cancel := context.WithCancelCause(e.base)
	f := &flight{seq: op.Seq, event: op.Event, subject: subjectOf(op), op: op,
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	if r.snap != nil {
		f.snap = *r.snap
	} else {
		f.vol = *r.vol
	}
	e.flights[op.Seq] = f
	e.workers.Add(1)
	e.runners.spawn(func() { e.run(f) })
	return f
}

// await waits for a flight's outcome, or for ctx.
func (e *Engine) await(ctx context.Context, f *flight, why string) (Outcome, error) {
	select {
	case <-f.done:
		if f.err != nil {
			return Outcome{}, f.err
		}
		out := f.out
		out.OpSeq = f.seq
		return out, nil
	case <-ctx.Done():
		msg := why
		if msg == "" {
			msg = fmt.Sprintf("operation %d (%s of %s) is still running", f.seq, f.event, f.subject)
		}
		if p := f.progress.Load(); p != nil {
			msg += " (" + *p + ")"
		}
		return Outcome{}, Errorf(Busy, "%s; retry with the same arguments to wait for it", msg)
	}
}

// Close shuts the engine down in order: refuse new requests, let running
// effects finish within DrainTimeout (no new attempts start), then cancel
// the rest. Ops cut short stay queued in the store and resume at the next
// Start. Close does not close the store.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.ready.Store(false)
	close(e.draining)

	idle := make(chan struct{})
	go func() { e.workers.Wait(); e.sweeper.Wait(); close(idle) }()
	drain := time.NewTimer(e.cfg.DrainTimeout)
	defer drain.Stop()
	select {
	case <-idle:
	case <-drain.C:
	case <-ctx.Done():
	}
	e.stop(errShutdown)
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ops: workers still running at shutdown deadline: %w", ctx.Err())
	}
}
