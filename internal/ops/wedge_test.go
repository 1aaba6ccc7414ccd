package ops

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/testutil"
	"google.golang.org/grpc/codes"
)

// guard bounds a wait on something the engine must do on its own; it is
// not a synchronisation (the wait ends on the event itself).
const guard = 20 * time.Second

func waitFor[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("%s: still waiting after %v", what, guard)
		panic("unreachable")
	}
}

// onSmallFS is a harness whose state file lives on a small real ext4.
func onSmallFS(t *testing.T, tweak ...func(*Config)) (*harness, string) {
	dir := testutil.SmallFS(t, 16<<20)
	h := &harness{t: t, path: filepath.Join(dir, "csid.db"), ex: newFakeExec(), clock: RealClock{}, waits: make(chan uint64, 64)}
	h.cfg = func(c *Config) {
		for _, f := range tweak {
			f(c)
		}
	}
	h.start()
	t.Cleanup(h.stop)
	return h, dir
}

// TestOutcomeCommitWaitsForTheStateFile: an op whose outcome cannot be
// committed (the state file is immutable) keeps its worker and its waiters;
// callers are told why, Ready is false; once the file is writable again the
// op commits on its own and csid goes on, with no restart.
func TestOutcomeCommitWaitsForTheStateFile(t *testing.T) {
	h, _ := onSmallFS(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	release := h.ex.gate(fsm.ControllerPublish)
	out := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); out <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)

	testutil.SetImmutable(t, h.path, true)
	release() // the effect is done; its outcome cannot be written
	// Every write fails now, so a new request is refused, by the health
	// check or by its own commit, with Unavailable naming the state file
	// (not "shutting down", not "no worker"); and so is the CO's retry of
	// the publish.
	for _, req := range []Request{createReq("pvc-b", gib), publishReq(id, "node-1")} {
		_, err := h.submit(req)
		wantCode(t, err, codes.Unavailable)
		if !strings.Contains(err.Error(), h.path) || strings.Contains(err.Error(), "shutting down") {
			t.Errorf("%s while the state file is immutable: %v", req.Event, err)
		}
	}
	if h.eng.Ready() {
		t.Error("Ready is true while the state file cannot be written")
	}
	if herr := h.st.Health(); herr == nil || !strings.Contains(herr.Error(), h.path) {
		t.Errorf("store health: %v", herr)
	}
	select {
	case err := <-out:
		t.Fatalf("the publish was answered (%v) before its outcome was written", err)
	default:
	}

	testutil.SetImmutable(t, h.path, false)
	if err := waitFor(t, "the publish's outcome after the fault cleared", out); err != nil {
		t.Fatalf("the publish failed: %v", err)
	}
	if v := h.volume(id); v.State != fsm.NodeReady || v.ActiveOp != 0 {
		t.Fatalf("after the fault: %+v", v)
	}
	// And csid goes on: the whole lifecycle, no restart.
	h.must(stageReq(id, "/stage/"+id))
	h.must(nodePublishReq(id, "/target/"+id))
	if !h.eng.Ready() {
		t.Error("not ready after the fault cleared")
	}
	if n := h.ex.count(fsm.ControllerPublish); n != 1 {
		t.Errorf("the publish's effect ran %d times", n)
	}
	checkInvariants(t, h)
}

// TestFullStateFileSystemNeverStrandsAnOp: with the state file's file
// system full, requests fail or wait, never wedge; once space is freed,
// every request succeeds on retry and no op is left without a worker.
func TestFullStateFileSystemNeverStrandsAnOp(t *testing.T) {
	h, dir := onSmallFS(t)
	free := testutil.Fill(t, dir, "filler")
	// Write until a commit needs space that is not there: creates with
	// large parameters grow the file.
	params := map[string]string{"pad": strings.Repeat("p", 3000)}
	var failed error
	var names []string
	for i := 0; i < 5000 && failed == nil; i++ {
		name := fmt.Sprintf("pvc-%d", i)
		req := createReq(name, gib)
		req.Args.(*CreateArgs).Parameters = params
		names = append(names, name)
		_, err := h.submit(req)
		switch {
		case err == nil:
		case KindOf(err) == Transient:
			failed = err
		default:
			t.Fatalf("create %s on a full file system: %v (want OK or Unavailable)", name, err)
		}
	}
	if failed == nil {
		t.Fatal("no commit failed on a full file system")
	}
	for _, bad := range []string{"shutting down", "no worker"} {
		if strings.Contains(failed.Error(), bad) {
			t.Errorf("the failure says %q: %v", bad, failed)
		}
	}
	if h.eng.Ready() || h.st.Health() == nil {
		t.Error("Ready while commits fail")
	}
	free()
	waitFor(t, "the store healthy again", h.st.Healthy())
	// Every create is retried, as a CO does, and succeeds.
	for _, name := range names {
		req := createReq(name, gib)
		req.Args.(*CreateArgs).Parameters = params
		h.must(req)
	}
	if !h.eng.Ready() {
		t.Error("not ready after space was freed")
	}
	checkInvariants(t, h)
}

// TestPanicInAnOutcomeCommitStrandsNothing: a panic inside the transaction
// that commits an op's outcome (a bug) fails that commit alone: its caller
// is told, the op stays active in the store, other volumes go on, and the
// CO's retry runs the op again on a worker of its own, to its outcome; csid
// makes progress with no restart.
func TestPanicInAnOutcomeCommitStrandsNothing(t *testing.T) {
	var panics atomic.Int32
	h := newHarness(t, func(c *Config) {
		c.inCommit = func(ev fsm.Event, what string) {
			if ev == fsm.ControllerPublish && what == "commit the outcome" && panics.Add(1) == 1 {
				panic("a bug in the outcome's commit")
			}
		}
	})
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	_, err := h.submit(publishReq(id, "node-1"))
	wantCode(t, err, codes.Internal)
	if !strings.Contains(err.Error(), "a bug in the outcome's commit") {
		t.Errorf("the answer does not name the panic: %v", err)
	}
	if panics.Load() != 1 {
		t.Fatalf("the outcome's commit ran %d times, want 1 (the panic)", panics.Load())
	}
	if v := h.volume(id); v.State != fsm.Created || v.ActiveOp == 0 {
		t.Fatalf("after the panic the op must stay active on the volume, unfinished: %+v", v)
	}
	if !h.eng.Ready() || h.st.Health() != nil {
		t.Errorf("a panic in one transaction made csid not ready: %v", h.st.Health())
	}
	// Another volume's lifecycle goes on meanwhile.
	other := h.must(createReq("pvc-b", gib)).Volume.ID
	h.must(publishReq(other, "node-1"))
	// The CO's retry joins the op left in the store, which runs again.
	out := h.must(publishReq(id, "node-1"))
	if out.Volume.State != fsm.NodeReady || out.Volume.ActiveOp != 0 {
		t.Fatalf("the retried publish: %+v", out.Volume)
	}
	if n := h.ex.count(fsm.ControllerPublish); n != 3 {
		t.Errorf("controller_publish ran %d times, want 3 (twice for %s, once for %s)", n, id, other)
	}
	h.must(stageReq(id, "/stage/"+id))
	checkInvariants(t, h)
}

// TestAttemptDeadlineReleasesTheSlot: an effect that never finishes (a
// cloud operation that hangs) is cut off at its event's deadline: the
// caller learns what it waited on, the worker slot is released for other
// volumes, and the op fails after its attempts instead of holding on.
func TestAttemptDeadlineReleasesTheSlot(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Workers = 1
		c.Deadlines = Deadlines{fsm.ControllerPublish: 20 * time.Millisecond}
		c.Retry = &Backoff{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 2}
	})
	a := h.must(createReq("pvc-a", gib)).Volume.ID
	b := h.must(createReq("pvc-b", gib)).Volume.ID
	h.ex.hang = func(x *Exec) bool { return x.Op.Event == fsm.ControllerPublish && x.Op.VolumeID == a }
	errc := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(a, "node-1")); errc <- err }()
	waitEntered(t, h.ex, "controller_publish "+a)
	// The only slot is free again once a's attempt is cut off: an expand of
	// another volume runs.
	h.must(expandReq(b, 2*gib))
	err := waitFor(t, "the hung publish's answer", errc)
	wantCode(t, err, codes.Unavailable)
	for _, want := range []string{"deadline of 20ms", "waiting for the cloud operation", "gave up after 2 attempts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the answer does not say %q: %v", want, err)
		}
	}
	if v := h.volume(a); v.State != fsm.Created || v.ActiveOp != 0 {
		t.Fatalf("after the deadline: %+v", v)
	}
	checkInvariants(t, h)
}

// TestQueuedResizeRunsWhenThePublishInFlightFails: a resize queued while a
// publish was in flight runs in the commit of that publish's failure (the
// volume is left detached and idle), not at the next sweep.
func TestQueuedResizeRunsWhenThePublishInFlightFails(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SweepInterval = time.Hour })
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	release := h.ex.gate(fsm.ControllerPublish)
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.ControllerPublish {
			return Errorf(Exhausted, "node node-1 cannot take another disk")
		}
		return nil
	}
	pub := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); pub <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)
	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	release()
	wantCode(t, waitFor(t, "the failed publish", pub), codes.ResourceExhausted)
	// The failure's commit started the resize: by the time the publish is
	// answered, the resize is running or done.
	v, r := h.volume(id), h.resize(id)
	if v.CapacityBytes != 2*gib && (r == nil || r.Status != store.ResizeRunning || v.ActiveOp == 0) {
		t.Fatalf("the queued resize did not start with the failed publish's commit: %+v, queue %+v", v, r)
	}
	// An expand joins it (or finds it done).
	out := h.must(expandReq(id, 2*gib))
	if out.Volume.CapacityBytes != 2*gib || h.resize(id) != nil {
		t.Fatalf("after the failed publish: %+v, queue %+v", out.Volume, h.resize(id))
	}
	if n := h.ex.count(fsm.Expand); n != 1 {
		t.Fatalf("the resize ran %d times", n)
	}
	checkInvariants(t, h)
}

// TestPanicInAnExecutorFailsOnlyItsOp: a bug that panics inside an effect
// (Execute; Compensate is contained the same way) fails that op with
// Internal, naming the panic, and the op is compensated; the engine, its worker slot and other volumes go on,
// and the CO's retry runs the op again, without a restart.
func TestPanicInAnExecutorFailsOnlyItsOp(t *testing.T) {
	var panics atomic.Int32
	h := newHarness(t, func(c *Config) { c.Workers = 1 })
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.ControllerPublish && x.Op.VolumeID == id && panics.Add(1) == 1 {
			panic("a bug in the publish")
		}
		return nil
	}
	_, err := h.submit(publishReq(id, "node-1"))
	wantCode(t, err, codes.Internal)
	if !strings.Contains(err.Error(), "a bug in the publish") {
		t.Errorf("the answer does not name the panic: %v", err)
	}
	if v := h.volume(id); v.State != fsm.Created || v.ActiveOp != 0 {
		t.Fatalf("after the panic the op must be over and the volume where it was: %+v", v)
	}
	if n := h.ex.compensations(fsm.ControllerPublish); n != 1 {
		t.Errorf("the failed publish was compensated %d times, want 1", n)
	}
	if !h.eng.Ready() {
		t.Error("a panicking executor made csid not ready")
	}
	// The only worker slot was given back: another volume's op runs.
	other := h.must(createReq("pvc-b", gib)).Volume.ID
	h.must(publishReq(other, "node-1"))
	// The CO's retry runs the publish again, and it succeeds.
	if out := h.must(publishReq(id, "node-1")); out.Volume.State != fsm.NodeReady {
		t.Fatalf("the retried publish: %+v", out.Volume)
	}
	checkInvariants(t, h)
}
