package ops

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"google.golang.org/grpc/codes"
)

func TestExpandOfADetachedVolumeRunsAtOnce(t *testing.T) {
	h := newHarness(t)
	id := h.must(createReq("pvc-a", gib)).Volume.ID
	out := h.must(expandReq(id, 2*gib))
	if out.Volume.CapacityBytes != 2*gib || h.resize(id) != nil {
		t.Fatalf("capacity %d, resize entry %+v", out.Volume.CapacityBytes, h.resize(id))
	}
	// The publish that follows at once (sanity's node expansion test) just works.
	h.must(publishReq(id, "node-1"))
	checkInvariants(t, h)
}

func TestExpandSizeRules(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a") // 1 GiB, published

	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	for _, want := range []string{"2147483648 bytes is queued", "unpublished"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if r := h.resize(id); r == nil || r.TargetBytes != 2*gib || r.Status != store.ResizeQueued {
		t.Fatalf("queue entry: %+v", r)
	}
	// Larger replaces the queued one.
	_, err = h.submit(expandReq(id, 3*gib))
	wantCode(t, err, codes.FailedPrecondition)
	if r := h.resize(id); r.TargetBytes != 3*gib {
		t.Fatalf("larger request did not replace: %+v", r)
	}
	// Smaller than queued: joins it, answered with the queued size.
	_, err = h.submit(expandReq(id, 2*gib+1))
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "3221225472 bytes is queued") || h.resize(id).TargetBytes != 3*gib {
		t.Fatalf("smaller request: %v, entry %+v", err, h.resize(id))
	}
	// Equal to (or below) the current size: success at once.
	out := h.must(expandReq(id, gib))
	if out.Volume.CapacityBytes != gib {
		t.Fatalf("equal size answered %d", out.Volume.CapacityBytes)
	}
	// A shrink (limit below the current size) is refused.
	_, err = h.submit(Request{VolumeID: id, Event: fsm.Expand, Args: &ExpandArgs{RequiredBytes: gib / 2, LimitBytes: gib / 2}})
	wantCode(t, err, codes.OutOfRange)
	// Repeats of a queued request do not flood the history: each raise is
	// one note, and one op that records the target on the disk.
	notes, recorded := 0, 0
	for _, e := range h.history(id) {
		switch {
		case e.Guard == fsm.Deferred && e.OpSeq == 0:
			notes++
		case e.Guard == fsm.Deferred:
			recorded++
		}
	}
	if notes != 2 || recorded != 2 {
		t.Fatalf("%d deferred notes and %d ops recording them, want 2 each (2 GiB, then 3 GiB)", notes, recorded)
	}
	if n := h.ex.count(fsm.Expand); n != 0 {
		t.Fatalf("expand ran %d times on an attached volume", n)
	}
}

// unwind takes a published volume down to NODE_READY.
func unwind(t *testing.T, h *harness, id string) {
	t.Helper()
	h.must(nodeUnpublishReq(id, "/target/"+id))
	h.must(unstageReq(id, "/stage/"+id))
}

func TestUnpublishCommitStartsTheResizeAndPublishWaitsForIt(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	unwind(t, h, id)
	// Until the detach has committed, expand keeps answering FailedPrecondition.
	releaseDetach := h.ex.gate(fsm.ControllerUnpublish)
	unpubDone := make(chan error, 1)
	go func() { _, err := h.submit(unpublishReq(id)); unpubDone <- err }()
	waitEntered(t, h.ex, "controller_unpublish "+id)
	_, err = h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)

	releaseResize := h.ex.gate(fsm.Expand)
	releaseDetach()
	if err := <-unpubDone; err != nil {
		t.Fatal(err)
	}
	// The unpublish's own commit made the resize run: no sweep, no retry.
	if r := h.resize(id); r == nil || r.Status != store.ResizeRunning {
		t.Fatalf("after unpublish the resize should be running: %+v", r)
	}
	waitEntered(t, h.ex, "expand "+id)
	// What inspect shows names the op growing the disk: the volume's
	// active op, an expand still in flight.
	var running view.ResizeList
	var growing *store.Op
	if err := h.st.View(func(tx *store.Tx) (err error) {
		if running, err = view.ListResizes(tx); err != nil || len(running.Resizes) != 1 {
			return err
		}
		growing, err = tx.Op(running.Resizes[0].OpSeq)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(running.Resizes) != 1 || growing == nil || growing.Event != fsm.Expand || growing.Status != store.OpQueued {
		t.Fatalf("the running resize should name its expand op: %+v, op %+v", running.Resizes, growing)
	}

	// A publish with a deadline is held, and says why.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = h.eng.Submit(ctx, publishReq(id, "node-1"))
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "being resized") {
		t.Fatalf("held publish should name the resize: %v", err)
	}
	// A publish without deadline waits, then attaches.
	pub := make(chan Outcome, 1)
	h.drainWaits()
	go func() { pub <- h.must(publishReq(id, "node-1")) }()
	<-h.waits
	releaseResize()
	out := <-pub
	if out.Volume.State != fsm.NodeReady || out.Volume.CapacityBytes != 2*gib || h.resize(id) != nil {
		t.Fatalf("after the resize the publish gave %+v (resize %+v)", out.Volume, h.resize(id))
	}
	order := strings.Join(h.ex.order, ",")
	if !strings.Contains(order, "expand "+id+",controller_publish "+id) {
		t.Fatalf("the attach did not follow the resize: %s", order)
	}
	checkInvariants(t, h)
}

func TestQueuedResizeSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	h.restart()
	unwind(t, h, id)
	h.must(unpublishReq(id))
	out := h.must(publishReq(id, "node-1"))
	if out.Volume.CapacityBytes != 2*gib {
		t.Fatalf("the queued resize was lost over the restart: %+v", out.Volume)
	}
	checkInvariants(t, h)
}

func TestFailedResizeStaysVisibleAndBlocksUntilItSucceeds(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	unwind(t, h, id)
	broken := true
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.Expand && broken {
			return errTransient
		}
		return nil
	}
	h.must(unpublishReq(id))
	// The publish waits for the resize op the unpublish started to give up.
	_, err = h.submit(publishReq(id, "node-1"))
	wantCode(t, err, codes.Aborted)
	r := h.resize(id)
	if r == nil || r.Status != store.ResizeQueued || r.Attempts < 3 || !strings.Contains(r.LastError, "transient") {
		t.Fatalf("failed resize must stay queued with its attempts and error: %+v", r)
	}
	if v := h.volume(id); v.State != fsm.Created {
		t.Fatalf("a volume with a failing resize was attached: %s", v.State)
	}
	// Once the cloud recovers, the next publish runs the resize first.
	broken = false
	out := h.must(publishReq(id, "node-1"))
	if out.Volume.CapacityBytes != 2*gib || out.Volume.State != fsm.NodeReady {
		t.Fatalf("after recovery: %+v", out.Volume)
	}
	checkInvariants(t, h)
}

func TestPermanentResizeFailureIsDroppedAndReported(t *testing.T) {
	h := newHarness(t)
	id := lifecycle(t, h, "pvc-a")
	_, err := h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	unwind(t, h, id)
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.Expand {
			return Mark(errors.New("size exceeds the disk type's maximum"), Invalid)
		}
		return nil
	}
	h.must(unpublishReq(id))
	// The publish waits for the failing resize (it was started by the
	// unpublish commit), is told about it, and the retry attaches.
	_, err = h.submit(publishReq(id, "node-1"))
	if err != nil {
		wantCode(t, err, codes.Aborted)
		h.must(publishReq(id, "node-1"))
	}
	if h.resize(id) != nil {
		t.Fatal("a permanently failed resize stayed queued")
	}
	found := false
	for _, e := range h.history(id) {
		found = found || strings.Contains(e.Outcome, "dropped")
	}
	if !found {
		t.Fatal("history does not say the resize was dropped")
	}
	// The CO's next expand gets the error itself.
	h.must(unpublishReq(id))
	_, err = h.submit(expandReq(id, 2*gib))
	wantCode(t, err, codes.InvalidArgument)
	checkInvariants(t, h)
}
