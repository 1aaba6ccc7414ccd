package ops

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"google.golang.org/grpc/codes"
)

// TestPanicInASnapshotExecutorFailsOnlyItsOp: a snapshot op runs on the
// same workers as volume ops; a panic in its executor fails that op alone
// (Internal, compensated, no record or name left), csid stays ready, the
// only worker slot is given back, and the CO's retry cuts the snapshot.
func TestPanicInASnapshotExecutorFailsOnlyItsOp(t *testing.T) {
	var panics atomic.Int32
	h := newHarness(t, func(c *Config) { c.Workers = 1 })
	vol := h.must(createReq("pvc-a", gib)).Volume.ID
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.SnapshotCreate && panics.Add(1) == 1 {
			panic("a bug in the snapshot")
		}
		return nil
	}
	_, err := h.submit(snapshotReq("vs-1", vol))
	wantCode(t, err, codes.Internal)
	if !strings.Contains(err.Error(), "a bug in the snapshot") {
		t.Errorf("the answer does not name the panic: %v", err)
	}
	if n := h.ex.compensations(fsm.SnapshotCreate); n != 1 {
		t.Errorf("the failed snapshot was compensated %d times, want 1", n)
	}
	if counts, _ := h.eng.Counts(); len(counts.Snapshots) != 0 {
		t.Errorf("a panicked snapshot left a record: %v", counts.Snapshots)
	}
	if !h.eng.Ready() {
		t.Error("a panicking snapshot executor made csid not ready")
	}
	h.must(publishReq(vol, "node-1")) // the slot is free: a volume op runs
	if out := h.must(snapshotReq("vs-1", vol)); out.Snapshot.State != fsm.Ready {
		t.Fatalf("the retried snapshot: %+v", out.Snapshot)
	}
	checkInvariants(t, h)
}

// TestSnapshotAttemptDeadlineReleasesTheSlot: a snapshot whose cloud
// operation never finishes is cut off at its event's deadline; the only
// worker slot serves a volume op meanwhile, the caller hears Unavailable,
// nothing is left, and a later snapshot of the same name succeeds.
func TestSnapshotAttemptDeadlineReleasesTheSlot(t *testing.T) {
	var hung atomic.Bool
	h := newHarness(t, func(c *Config) {
		c.Workers = 1
		c.Deadlines = Deadlines{fsm.SnapshotCreate: 20 * time.Millisecond}
		c.Retry = &Backoff{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 2}
	})
	a := h.must(createReq("pvc-a", gib)).Volume.ID
	b := h.must(createReq("pvc-b", gib)).Volume.ID
	hung.Store(true)
	h.ex.hang = func(x *Exec) bool { return x.Op.Event == fsm.SnapshotCreate && hung.Load() }
	errc := make(chan error, 1)
	go func() { _, err := h.submit(snapshotReq("vs-1", a)); errc <- err }()
	waitEntered(t, h.ex, string(fsm.SnapshotCreate))
	h.must(expandReq(b, 2*gib))
	err := waitFor(t, "the hung snapshot's answer", errc)
	wantCode(t, err, codes.Unavailable)
	if !strings.Contains(err.Error(), "deadline of 20ms") {
		t.Errorf("the answer does not name the deadline: %v", err)
	}
	if counts, _ := h.eng.Counts(); len(counts.Snapshots) != 0 {
		t.Errorf("a snapshot cut off at its deadline left a record: %v", counts.Snapshots)
	}
	hung.Store(false)
	if out := h.must(snapshotReq("vs-1", a)); out.Snapshot.State != fsm.Ready {
		t.Fatalf("the later snapshot: %+v", out.Snapshot)
	}
	checkInvariants(t, h)
}
