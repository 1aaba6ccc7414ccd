package ops

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/testutil"
	"google.golang.org/grpc/codes"
)

// lifecycle drives a volume to PUBLISHED and returns its id.
func lifecycle(t testing.TB, h *harness, name string) string {
	t.Helper()
	id := h.must(createReq(name, gib)).Volume.ID
	h.must(publishReq(id, "node-1"))
	h.must(stageReq(id, "/stage/"+id))
	h.must(nodePublishReq(id, "/target/"+id))
	return id
}

func TestConcurrentIdenticalSubmissionsRunOnce(t *testing.T) {
	h := newHarness(t)
	release := h.ex.gate(fsm.Create)
	type res struct {
		out Outcome
		err error
	}
	results := make(chan res, 2)
	for i := 0; i < 2; i++ {
		go func() {
			out, err := h.submit(createReq("pvc-a", gib))
			results <- res{out, err}
		}()
	}
	waitEntered(t, h.ex, "create ") // the create's volume has no id yet in the log line
	// One caller started the op (its executor is held, so it waits); the
	// other joined it.
	joined := <-h.waits
	release()
	a, b := <-results, <-results
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	if a.out.Volume.ID != b.out.Volume.ID || a.out.OpSeq != b.out.OpSeq || a.out.OpSeq != joined || a.out.Volume.DiskID == "" {
		t.Fatalf("different outcomes: %+v / %+v (joined op %d)", a.out, b.out, joined)
	}
	if n := h.ex.count(fsm.Create); n != 1 {
		t.Fatalf("executor ran %d times", n)
	}
	checkInvariants(t, h)
}

func TestDifferentTransitionInFlightIsAborted(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	release := h.ex.gate(fsm.ControllerPublish)
	done := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); done <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)

	_, err := h.submit(deleteReq(id))
	wantCode(t, err, codes.Aborted)
	_, err = h.submit(publishReq(id, "node-2"))
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "controller_publish") {
		t.Errorf("the message should name the op in progress: %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := h.ex.count(fsm.Delete); n != 0 {
		t.Fatalf("the aborted delete ran %d times", n)
	}
	checkInvariants(t, h)
}

func TestCompletedTransitionReplaysAfterRestart(t *testing.T) {
	h := newHarness(t)
	first := h.must(createReq("pvc-a", gib)).Volume
	pub := h.must(publishReq(first.ID, "node-1")).Volume
	h.stop()
	h.ex = newFakeExec() // count afresh; the engine of the new "process" uses it
	h.start()

	again := h.must(createReq("pvc-a", gib))
	if again.Volume.ID != first.ID || again.OpSeq != 0 {
		t.Fatalf("create replay: %+v (want id %s, no op)", again, first.ID)
	}
	pub2 := h.must(publishReq(first.ID, "node-1"))
	if pub2.OpSeq != 0 || pub2.Volume.Attachment.PublishContext["op"] != pub.Attachment.PublishContext["op"] {
		t.Fatalf("publish replay: %+v, want stored context %v", pub2.Volume.Attachment, pub.Attachment.PublishContext)
	}
	for _, e := range fsm.Events {
		if n := h.ex.count(e); n != 0 {
			t.Fatalf("a replay ran the %s executor %d times", e, n)
		}
	}
	// Same name, incompatible request: AlreadyExists, not a second volume.
	_, err := h.submit(createReq("pvc-a", 2*gib))
	wantCode(t, err, codes.AlreadyExists)
	checkInvariants(t, h)
}

func TestIllegalTransitionsGetTheSpecCodes(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	cases := []struct {
		req  Request
		code codes.Code
	}{
		{deleteReq(id), codes.FailedPrecondition},                // published
		{unpublishReq(id), codes.FailedPrecondition},             // still staged
		{unstageReq(id, "/stage/"+id), codes.FailedPrecondition}, // still published
		{publishReq(id, "node-2"), codes.FailedPrecondition},     // attached elsewhere
		{publishReq("vol-unknown", "node-1"), codes.NotFound},    // no such volume
		{stageReq("vol-unknown", "/s"), codes.NotFound},          // no such volume
		{nodePublishReq("vol-unknown", "/t"), codes.NotFound},    // no such volume
		{stageReq(id, "/elsewhere"), codes.FailedPrecondition},   // staged at another path
		{Request{VolumeID: id, Event: fsm.ControllerPublish, Args: &ControllerPublishArgs{Node: "node-1", ReadOnly: true, Capability: mountCap}}, codes.AlreadyExists},
	}
	for _, c := range cases {
		_, err := h.submit(c.req)
		wantCode(t, err, c.code)
	}
	// Negations of what never happened succeed: nothing to undo.
	for _, req := range []Request{deleteReq("vol-unknown"), unpublishReq("vol-unknown"),
		unstageReq("vol-unknown", "/s"), nodeUnpublishReq(id, "/never")} {
		if _, err := h.submit(req); err != nil {
			t.Errorf("%s: %v", req.Event, err)
		}
	}
	checkInvariants(t, h)
}

func TestFullLifecycleWithTwoTargets(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	h.must(nodePublishReq(id, "/target2/"+id))
	if v := h.volume(id); v.State != fsm.Published || len(v.Targets) != 2 {
		t.Fatalf("after the second target: %+v", v)
	}
	h.must(nodeUnpublishReq(id, "/target/"+id))
	if v := h.volume(id); v.State != fsm.Published {
		t.Fatalf("one target left, want PUBLISHED, got %s", v.State)
	}
	h.must(nodeUnpublishReq(id, "/target2/"+id))
	h.must(unstageReq(id, "/stage/"+id))
	h.must(unpublishReq(id))
	h.must(deleteReq(id))
	if v := h.volume(id); v != nil {
		t.Fatalf("deleted volume still stored: %+v", v)
	}
	checkInvariants(t, h)
}

func TestFailedForwardOpIsCompensatedAndLeavesStateUnchanged(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.ControllerPublish {
			return Errorf(Exhausted, "node node-1 cannot take another disk")
		}
		return nil
	}
	_, err := h.submit(publishReq(id, "node-1"))
	wantCode(t, err, codes.ResourceExhausted)
	if n := h.ex.compensations(fsm.ControllerPublish); n != 1 {
		t.Fatalf("compensated %d times", n)
	}
	v := h.volume(id)
	if v.State != fsm.Created || v.Attachment != nil || v.ActiveOp != 0 {
		t.Fatalf("after a failed publish: %+v", v)
	}
	hist := h.history(id)
	if last := hist[len(hist)-1]; !strings.HasPrefix(last.Outcome, "failed:") || last.Event != fsm.ControllerPublish {
		t.Fatalf("history does not record the failure: %+v", last)
	}
	// A failed create leaves no record at all.
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.Create {
			return errors.New("quota exceeded")
		}
		return nil
	}
	_, err = h.submit(createReq("pvc-b", gib))
	wantCode(t, err, codes.Internal)
	_ = h.st.View(func(tx *store.Tx) error {
		if id, _ := tx.VolumeIDByName("pvc-b"); id != "" {
			t.Errorf("failed create left a name record for %s", id)
		}
		return nil
	})
	if n := h.ex.compensations(fsm.Create); n != 1 {
		t.Fatalf("create compensated %d times", n)
	}
	h.ex.fail = nil
	checkInvariants(t, h)
}

func TestNegationCancelsTheForwardOp(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	h.ex.gate(fsm.ControllerPublish) // never released: only cancellation ends it
	pubErr := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); pubErr <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)

	h.must(unpublishReq(id))
	err := <-pubErr
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "cancelled by controller_unpublish") {
		t.Errorf("publish error should say why: %v", err)
	}
	if n := h.ex.compensations(fsm.ControllerPublish); n != 1 {
		t.Fatalf("cancelled publish compensated %d times", n)
	}
	if v := h.volume(id); v.State != fsm.Created || v.Attachment != nil {
		t.Fatalf("after cancel: %+v", v)
	}
	checkInvariants(t, h)
}

func TestTransientErrorsAreRetriedWithBackoffOnAnInjectedClock(t *testing.T) {
	clk := testutil.NewFakeClock()
	h := newHarness(t, func(c *Config) {
		c.Clock = clk
		c.Retry = &Backoff{Base: time.Second, Cap: 4 * time.Second, MaxAttempts: 5}
		c.Retry.Seed(1)
	})
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	var mu sync.Mutex
	failures := 3
	h.ex.fail = func(x *Exec) error {
		mu.Lock()
		defer mu.Unlock()
		if x.Op.Event == fsm.ControllerPublish && failures > 0 {
			failures--
			return errTransient
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); done <- err }()
	stop := make(chan struct{})
	defer close(stop)
	var delays []time.Duration
	for i := 0; i < 3; i++ {
		// The worker (and the idle sweeper) wait on timers; advance to the
		// worker's retry, which is the earliest.
		if !clk.WaitForTimers(2, stop) {
			t.Fatal("no retry timer")
		}
		d, _ := clk.NextTimer()
		delays = append(delays, d)
		clk.Advance(d)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Exponential, capped, jittered into [d/2, d].
	for i, d := range delays {
		full := time.Second << i
		if full > 4*time.Second {
			full = 4 * time.Second
		}
		if d < full/2 || d > full {
			t.Errorf("retry %d waited %v, want within [%v, %v]", i+1, d, full/2, full)
		}
	}
	var op *store.Op
	_ = h.st.View(func(tx *store.Tx) error {
		return tx.ForEachOp(func(o *store.Op) bool {
			if o.Event == fsm.ControllerPublish {
				op = o
				return false
			}
			return true
		})
	})
	if op.Attempts != 3 || op.Status != store.OpSucceeded || !strings.Contains(op.LastError, "transient") {
		t.Fatalf("op record: %+v", op)
	}
	checkInvariants(t, h)
}

func TestRetriesGiveUpAfterMaxAttempts(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.ControllerPublish {
			return Mark(errors.New("api throttled"), Transient)
		}
		return nil
	}
	_, err := h.submit(publishReq(id, "node-1"))
	wantCode(t, err, codes.Unavailable)
	if n := h.ex.count(fsm.ControllerPublish); n != 4 {
		t.Fatalf("executed %d times, want MaxAttempts=4", n)
	}
	if !strings.Contains(err.Error(), "gave up after 4 attempts") {
		t.Errorf("message: %v", err)
	}
	checkInvariants(t, h)
}

func TestDeadlineReturnsAbortedAndTheRetryJoins(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	release := h.ex.gate(fsm.ControllerPublish)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := h.eng.Submit(ctx, publishReq(id, "node-1")); errc <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)
	cancel() // the CO's deadline
	err := <-errc
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "still running") {
		t.Errorf("message: %v", err)
	}
	// The op went on; the CO's retry with the same arguments joins it.
	outc := make(chan Outcome, 1)
	h.drainWaits()
	go func() { outc <- h.must(publishReq(id, "node-1")) }()
	<-h.waits
	release()
	out := <-outc
	if out.Volume.State != fsm.NodeReady || h.ex.count(fsm.ControllerPublish) != 1 {
		t.Fatalf("retry outcome %+v, executions %d", out.Volume, h.ex.count(fsm.ControllerPublish))
	}
	checkInvariants(t, h)
}

func TestCloseLeavesRunningOpsForTheNextStart(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DrainTimeout = time.Millisecond })
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	release := h.ex.gate(fsm.ControllerPublish) // blocks until the shutdown cancels it
	errc := make(chan error, 1)
	go func() { _, err := h.submit(publishReq(id, "node-1")); errc <- err }()
	waitEntered(t, h.ex, "controller_publish "+id)
	h.stop()
	release()
	wantCode(t, <-errc, codes.Unavailable)
	if n := h.ex.compensations(fsm.ControllerPublish); n != 0 {
		t.Fatalf("a shutdown must not compensate (it is not a failure); compensated %d", n)
	}
	h.start() // resumes the op; this time it is not gated
	out := h.must(publishReq(id, "node-1"))
	if out.Volume.State != fsm.NodeReady || h.ex.count(fsm.ControllerPublish) != 2 {
		t.Fatalf("after restart: %+v, executions %d", out.Volume, h.ex.count(fsm.ControllerPublish))
	}
	checkInvariants(t, h)
}

func TestNodeAdoptsAVolumeItHasNotSeen(t *testing.T) {
	var asked []string
	h := newHarness(t, func(c *Config) {
		c.Adopt = func(ctx context.Context, id string, a *NodeStageArgs) (*store.Volume, error) {
			asked = append(asked, id)
			if id != "vol-attached" {
				return nil, Errorf(NotFound, "volume %s is not attached to this node", id)
			}
			return &store.Volume{DiskID: "disk-1", CapacityBytes: gib, Capability: mountCap,
				Attachment: &store.Attachment{Node: "node-1", PublishContext: a.PublishContext}}, nil
		}
	})
	_, err := h.submit(stageReq("vol-unknown", "/stage/x"))
	wantCode(t, err, codes.NotFound)
	if h.volume("vol-unknown") != nil {
		t.Fatal("an unknown volume left a record")
	}
	h.must(stageReq("vol-attached", "/stage/vol-attached"))
	v := h.volume("vol-attached")
	if v.State != fsm.VolReady || v.DiskID != "disk-1" {
		t.Fatalf("adopted volume: %+v", v)
	}
	hist := h.history("vol-attached")
	if len(hist) != 2 || hist[0].Event != fsm.Adopt || hist[0].From != fsm.Absent || hist[0].To != fsm.NodeReady || hist[1].Event != fsm.NodeStage {
		t.Fatalf("history: %+v", hist)
	}
	h.must(stageReq("vol-attached", "/stage/vol-attached")) // replay: no second adoption
	if len(asked) != 2 {
		t.Fatalf("adopter asked %d times", len(asked))
	}
	checkInvariants(t, h)
}

// TestDeleteDuringCreateIsAborted: a delete of a volume whose create is
// still running is answered Aborted ("retry"), never "already gone": the
// create may still make the disk, and the CO would lose track of it.
func TestDeleteDuringCreateIsAborted(t *testing.T) {
	h := newHarness(t)
	release := h.ex.gate(fsm.Create)
	done := make(chan Outcome, 1)
	go func() { done <- h.must(createReq("pvc-a", gib)) }()
	waitEntered(t, h.ex, "create ")
	var id string
	_ = h.st.View(func(tx *store.Tx) error { id, _ = tx.VolumeIDByName("pvc-a"); return nil })
	_, err := h.submit(deleteReq(id))
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "being created") {
		t.Errorf("message: %v", err)
	}
	release()
	if out := <-done; out.Volume.ID != id || out.Volume.State != fsm.Created {
		t.Fatalf("create after the refused delete: %+v", out.Volume)
	}
	h.must(deleteReq(id))
	checkInvariants(t, h)
}

// TestPublishRecordsTheProvenDevice: the device a publish proved to be the
// volume's disk replaces the record's device, which is only a hint for the
// next op (a device number the backend gave to another disk meanwhile).
func TestPublishRecordsTheProvenDevice(t *testing.T) {
	raw, _ := encodeArgs(&NodePublishArgs{TargetPath: "/t", StagingPath: "/s"})
	op := &store.Op{Event: fsm.NodePublish, From: fsm.VolReady, To: fsm.Published, Args: raw}
	v := &store.Volume{ID: "v", State: fsm.VolReady, Stage: &store.Stage{Path: "/s", Device: "/dev/loop0"}}
	if err := apply(v, op, Result{Device: "/dev/loop3"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if v.Stage.Device != "/dev/loop3" || v.State != fsm.Published {
		t.Fatalf("after a publish that proved /dev/loop3: %+v", v.Stage)
	}
}
