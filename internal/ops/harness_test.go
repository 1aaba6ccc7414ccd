package ops

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeExec is a behavioural executor: it performs no I/O, reports
// deterministic results, counts executions and compensations, can be gated
// (block until released) or made to fail, and asserts by itself that no two
// executions of one volume ever overlap.
type fakeExec struct {
	mu      sync.Mutex
	calls   map[fsm.Event]int
	comps   map[fsm.Event]int
	order   []string // "event volume" in execution order
	running map[string]int
	gates   map[fsm.Event]chan struct{}
	entered chan string // receives "event volume" when a gated Execute starts
	// fail, if set, may return an error for an execution.
	fail func(x *Exec) error
	// hang, if set, makes an execution it picks wait, like a cloud
	// operation that never finishes, until its context ends.
	hang func(x *Exec) bool

	overlaps atomic.Int64
}

// errTransient is a failure that may pass, as an executor reports it.
var errTransient = Mark(errors.New("transient: the backend is busy"), Transient)

func newFakeExec() *fakeExec {
	return &fakeExec{calls: map[fsm.Event]int{}, comps: map[fsm.Event]int{}, running: map[string]int{},
		gates: map[fsm.Event]chan struct{}{}, entered: make(chan string, 1024)}
}

// gate makes Execute of e block until the returned func is called.
func (x *fakeExec) gate(e fsm.Event) (release func()) {
	ch := make(chan struct{})
	x.mu.Lock()
	x.gates[e] = ch
	x.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			x.mu.Lock()
			delete(x.gates, e)
			x.mu.Unlock()
			close(ch)
		})
	}
}

func (x *fakeExec) count(e fsm.Event) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.calls[e]
}

func (x *fakeExec) compensations(e fsm.Event) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.comps[e]
}

// deferredExpand is how fakeExec counts an expand [deferred] (the op that
// records a queued target on the disk), apart from the resizes.
const deferredExpand fsm.Event = "expand [deferred]"

func (x *fakeExec) Execute(ctx context.Context, ex *Exec) (Result, error) {
	id, ev := ex.Op.Subject(), ex.Op.Event
	if ex.Op.Guard == fsm.Deferred {
		ev = deferredExpand // a queued target recorded on the disk: not a resize
	}
	x.mu.Lock()
	x.calls[ev]++
	x.order = append(x.order, string(ev)+" "+id)
	x.running[id]++
	if x.running[id] > 1 {
		x.overlaps.Add(1)
	}
	gate := x.gates[ev]
	hang := x.hang != nil && x.hang(ex)
	x.mu.Unlock()
	defer func() {
		x.mu.Lock()
		x.running[id]--
		x.mu.Unlock()
	}()
	if hang {
		x.entered <- string(ev) + " " + id
		<-ctx.Done()
		return Result{}, fmt.Errorf("waiting for the cloud operation op-%d: %w", ex.Op.Seq, ctx.Err())
	}
	if gate != nil {
		x.entered <- string(ev) + " " + id
		select {
		case <-gate:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	if x.fail != nil {
		if err := x.fail(ex); err != nil {
			return Result{}, err
		}
	}
	return fakeResult(ex)
}

func fakeResult(ex *Exec) (Result, error) {
	switch ex.Op.Event {
	case fsm.Create:
		a, err := DecodeArgs[CreateArgs](ex.Op)
		if err != nil {
			return Result{}, err
		}
		return Result{DiskID: "disk-" + ex.Op.VolumeID, CapacityBytes: a.SizeBytes, Zone: "z1"}, nil
	case fsm.ControllerPublish:
		a, err := DecodeArgs[ControllerPublishArgs](ex.Op)
		if err != nil {
			return Result{}, err
		}
		return Result{PublishContext: map[string]string{"node": a.Node, "op": strconv.FormatUint(ex.Op.Seq, 10)}}, nil
	case fsm.NodeStage:
		return Result{Device: "/dev/fake/" + ex.Op.VolumeID}, nil
	case fsm.Expand:
		a, err := DecodeArgs[ExpandArgs](ex.Op)
		if err != nil || ex.Op.Guard == fsm.Deferred { // a queued target recorded: nothing grows
			return Result{}, err
		}
		return Result{CapacityBytes: a.RequiredBytes}, nil
	case fsm.SnapshotCreate:
		return Result{CloudSnapshotID: "cloud-" + ex.Op.SnapshotID, CapacityBytes: snapBytes, ReadyToUse: true,
			CutAt: ex.Op.CreatedAt}, nil
	}
	return Result{}, nil
}

// snapBytes is the size fakeExec reports for every snapshot.
const snapBytes = 3 * gib

func (x *fakeExec) Compensate(ctx context.Context, ex *Exec) error {
	x.mu.Lock()
	x.comps[ex.Op.Event]++
	x.mu.Unlock()
	return nil
}

func allEvents(ex Executor) map[fsm.Event]Executor {
	m := map[fsm.Event]Executor{}
	for _, e := range fsm.AllOpEvents() {
		m[e] = ex
	}
	return m
}

// harness is an engine on a real bbolt file, restartable.
type harness struct {
	t     testing.TB
	path  string
	st    *store.Store
	eng   *Engine
	ex    *fakeExec
	clock Clock
	cfg   func(*Config)
	sopts store.Options
	// waits receives the op of every request that waits on an op it did
	// not start (the engine's Observer.OpWaited).
	waits chan uint64
}

// waitObserver forwards OpWaited to a channel; the rest it ignores.
type waitObserver struct{ waits chan uint64 }

func (o waitObserver) OpFinished(fsm.Event, string, time.Duration) {}
func (o waitObserver) OpRetried(fsm.Event)                         {}
func (o waitObserver) OpWaited(_, _ fsm.Event, seq uint64) {
	select {
	case o.waits <- seq:
	default: // a test that does not read them (many waits) drops them
	}
}

func newHarness(t testing.TB, tweak ...func(*Config)) *harness {
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "csid.db"), ex: newFakeExec(), clock: RealClock{},
		waits: make(chan uint64, 64)}
	h.cfg = func(c *Config) {
		for _, f := range tweak {
			f(c)
		}
	}
	h.start()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) start() {
	st, err := store.Open(h.path, h.sopts)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := Config{Store: st, Executors: allEvents(h.ex), NodeID: "node-1", Clock: h.clock,
		Retry: &Backoff{Base: time.Millisecond, Cap: 4 * time.Millisecond, MaxAttempts: 4}, Log: zerolog.Nop(),
		Observer: waitObserver{h.waits}}
	h.cfg(&cfg)
	h.clock = cfg.Clock
	h.st, h.eng = st, New(cfg)
	if err := h.eng.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) stop() {
	if h.eng == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.eng.Close(ctx); err != nil {
		h.t.Error(err)
	}
	h.st.Close()
	h.eng = nil
}

// restartWith restarts with other store options.
func (h *harness) restartWith(o store.Options) {
	h.stop()
	h.sopts = o
	h.start()
}

// restart simulates a process restart: a new engine on the same file.
func (h *harness) restart() {
	h.stop()
	h.start()
}

// drainWaits forgets the waits reported so far.
func (h *harness) drainWaits() {
	for {
		select {
		case <-h.waits:
		default:
			return
		}
	}
}

func (h *harness) submit(req Request) (Outcome, error) {
	return h.eng.Submit(context.Background(), req)
}

func (h *harness) must(req Request) Outcome {
	h.t.Helper()
	out, err := h.submit(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", req.Event, req.VolumeID, err)
	}
	return out
}

// read returns what get reads in a read transaction; an error fails the test.
func read[T any](h *harness, get func(*store.Tx) (T, error)) T {
	h.t.Helper()
	var out T
	if err := h.st.View(func(tx *store.Tx) error { var err error; out, err = get(tx); return err }); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func (h *harness) volume(id string) *store.Volume {
	h.t.Helper()
	return read(h, func(tx *store.Tx) (*store.Volume, error) { return tx.Volume(id) })
}

func (h *harness) resize(id string) *store.Resize {
	h.t.Helper()
	return read(h, func(tx *store.Tx) (*store.Resize, error) { return tx.Resize(id) })
}

func (h *harness) history(id string) []store.HistoryEntry {
	h.t.Helper()
	return read(h, func(tx *store.Tx) ([]store.HistoryEntry, error) { return tx.History(id) })
}

const gib = int64(1) << 30

var mountCap = store.Capability{AccessType: "mount", FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER"}

func createReq(name string, size int64) Request {
	return Request{Event: fsm.Create, Args: &CreateArgs{Name: name, SizeBytes: size, RequiredBytes: size, Capability: mountCap}}
}

func publishReq(id, node string) Request {
	return Request{VolumeID: id, Event: fsm.ControllerPublish, Args: &ControllerPublishArgs{Node: node, Capability: mountCap}}
}

func unpublishReq(id string) Request {
	return Request{VolumeID: id, Event: fsm.ControllerUnpublish, Args: &ControllerUnpublishArgs{Node: "node-1"}}
}

func stageReq(id, path string) Request {
	return Request{VolumeID: id, Event: fsm.NodeStage, Args: &NodeStageArgs{StagingPath: path, Capability: mountCap}}
}

func unstageReq(id, path string) Request {
	return Request{VolumeID: id, Event: fsm.NodeUnstage, Args: &NodeUnstageArgs{StagingPath: path}}
}

func nodePublishReq(id, target string) Request {
	return Request{VolumeID: id, Event: fsm.NodePublish, Args: &NodePublishArgs{TargetPath: target, StagingPath: "/stage/" + id, Capability: mountCap}}
}

func nodeUnpublishReq(id, target string) Request {
	return Request{VolumeID: id, Event: fsm.NodeUnpublish, Args: &NodeUnpublishArgs{TargetPath: target}}
}

func expandReq(id string, size int64) Request {
	return Request{VolumeID: id, Event: fsm.Expand, Args: &ExpandArgs{RequiredBytes: size}}
}

func deleteReq(id string) Request { return Request{VolumeID: id, Event: fsm.Delete} }

func snapshotReq(name, source string) Request {
	return Request{Event: fsm.SnapshotCreate, Args: &SnapshotCreateArgs{Name: name, SourceVolumeID: source}}
}

func deleteSnapshotReq(id string) Request { return Request{SnapshotID: id, Event: fsm.SnapshotDelete} }

// restoreReq creates a volume from a snapshot (or, with volume, from a
// volume); size 0 asks for no size.
func restoreReq(name string, src ContentSource, size int64) Request {
	a := &CreateArgs{Name: name, SizeBytes: max(size, gib), RequiredBytes: size, Capability: mountCap, Source: &src}
	return Request{Event: fsm.Create, Args: a}
}

func (h *harness) snapshot(id string) *store.Snapshot {
	h.t.Helper()
	return read(h, func(tx *store.Tx) (*store.Snapshot, error) { return tx.Snapshot(id) })
}

func wantCode(t testing.TB, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("want %s, got %v", code, err)
	}
}

// checkInvariants asserts design.md's invariants on the store: every volume
// in a lifecycle state with a history of legal transitions whose last entry
// explains it (lines between may have been pruned with their ops); targets
// only on a published volume; no op left active; no resize entry waiting on
// a detached idle volume, unless it backs off after a failure (the commit
// that detached the volume starts the resize); the executor never ran two
// ops of one volume at once.
func checkInvariants(t testing.TB, h *harness) {
	t.Helper()
	if n := h.ex.overlaps.Load(); n != 0 {
		t.Errorf("two executions of one volume overlapped %d times", n)
	}
	err := h.st.View(func(tx *store.Tx) error {
		active, err := tx.ActiveOps()
		if err != nil {
			return err
		}
		if len(active) != 0 {
			t.Errorf("%d ops left active, first: %+v", len(active), active[0])
		}
		histories, err := tx.Histories()
		if err != nil {
			return err
		}
		if err := checkSnapshots(t, tx, histories); err != nil {
			return err
		}
		return tx.ForEachVolume("", func(v *store.Volume) bool {
			if !v.State.Valid() || v.State == fsm.Absent {
				t.Errorf("volume %s in state %q", v.ID, v.State)
			}
			hist := histories[v.ID]
			if len(hist) == 0 {
				t.Errorf("volume %s has no history", v.ID)
				return true
			}
			for i, e := range hist {
				if e.Outcome != "ok" {
					continue
				}
				step, err := fsm.Next(e.From, e.Event, e.Guard)
				if err != nil || step.To != e.To {
					t.Errorf("volume %s history entry %d is not a legal transition: %+v", v.ID, i, e)
				}
			}
			if r, err := tx.Resize(v.ID); err != nil || (r != nil && v.State == fsm.Created && r.NextAttemptAt.IsZero()) {
				t.Errorf("volume %s is detached and idle, and its resize waits: %+v, %v", v.ID, r, err)
			}
			if last := &hist[len(hist)-1]; last.To != v.State {
				t.Errorf("volume %s is %s but its history ends with %+v", v.ID, v.State, last)
			}
			checkHistoryChain(t, "volume "+v.ID, v.Generation, v.State, hist)
			if len(v.Targets) > 0 != (v.State == fsm.Published) {
				t.Errorf("volume %s is %s with %d targets", v.ID, v.State, len(v.Targets))
			}
			return true
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkHistoryChain checks that a record's history explains every change
// of its state (what: "volume vol-...", "snapshot snap-..."; gen and
// state: the record's): each line carries the generation it left the
// record at (every change of state moves the generation on), the lines of
// one generation agree on the state it stands for, each line starts from
// the state of its own generation or the one before, and the latest
// generation is the record's, in its state. A state written without its
// history line breaks the chain.
func checkHistoryChain(t testing.TB, what string, gen uint64, state fsm.State, hist []store.HistoryEntry) {
	t.Helper()
	at := map[uint64]fsm.State{} // generation -> the state it stands for
	top := uint64(0)
	for _, e := range hist {
		if s, ok := at[e.Generation]; ok && s != e.To {
			t.Errorf("%s: history lines of generation %d end in %s and %s", what, e.Generation, s, e.To)
		}
		at[e.Generation] = e.To
		top = max(top, e.Generation)
	}
	for _, e := range hist {
		if prev, ok := at[e.Generation-1]; ok && e.From != prev && e.From != e.To {
			t.Errorf("%s: %+v starts from %s, but generation %d is %s", what, e, e.From, e.Generation-1, prev)
		}
	}
	if top != gen || at[top] != state {
		t.Errorf("%s is %s at generation %d, but its history ends at generation %d in %s", what, state, gen, top, at[top])
	}
}

// checkSnapshots asserts the invariants of the snapshots: every snapshot
// READY, cut at the provider, with a history of legal steps of the
// snapshot lifecycle that ends in its state at its generation and
// explains every change of its state (checkHistoryChain).
func checkSnapshots(t testing.TB, tx *store.Tx, histories map[string][]store.HistoryEntry) error {
	t.Helper()
	return tx.ForEachSnapshot("", func(s *store.Snapshot) bool {
		if s.State != fsm.Ready || s.CloudID == "" {
			t.Errorf("snapshot %s is %s, cloud id %q", s.ID, s.State, s.CloudID)
		}
		hist := histories[s.ID]
		if len(hist) == 0 {
			t.Errorf("snapshot %s has no history", s.ID)
			return true
		}
		for i, e := range hist {
			if e.Outcome != "ok" && e.OpSeq != 0 {
				continue
			}
			if step, err := fsm.Snapshots.Next(e.From, e.Event, e.Guard); err != nil || step.To != e.To {
				t.Errorf("snapshot %s history entry %d is not a step of the snapshot lifecycle: %+v", s.ID, i, e)
			}
		}
		if last := hist[len(hist)-1]; last.To != s.State || last.Generation != s.Generation {
			t.Errorf("snapshot %s is %s at generation %d but its history ends with %+v", s.ID, s.State, s.Generation, last)
		}
		checkHistoryChain(t, "snapshot "+s.ID, s.Generation, s.State, hist)
		return true
	})
}

func waitEntered(t testing.TB, x *fakeExec, want string) {
	t.Helper()
	select {
	case got := <-x.entered:
		if !strings.HasPrefix(got, want) {
			t.Fatalf("executor entered %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("executor never entered %q", want)
	}
}
