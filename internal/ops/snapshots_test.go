package ops

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
)

// TestSnapshotCreateIsIdempotentByName: CreateSnapshot runs as an op of the
// snapshot once; the same name of the same volume answers the same
// snapshot without another effect; the name with another volume, or other
// parameters, is AlreadyExists; an unknown volume is NotFound. The
// snapshot's op is in the snapshot's history, not the volume's.
func TestSnapshotCreateIsIdempotentByName(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	other := h.must(createReq("pvc-2", gib)).Volume.ID
	out := h.must(snapshotReq("vs-1", vol))
	s := out.Snapshot
	if !strings.HasPrefix(s.ID, "snap-") || s.State != fsm.Ready || s.SourceVolumeID != vol || s.SizeBytes != snapBytes ||
		!s.ReadyToUse || s.CloudID != "cloud-"+s.ID || s.CutAt.IsZero() || out.OpSeq == 0 {
		t.Fatalf("snapshot: %+v (op %d)", s, out.OpSeq)
	}
	again := h.must(snapshotReq("vs-1", vol))
	if again.Snapshot.ID != s.ID || again.OpSeq != 0 || h.ex.count(fsm.SnapshotCreate) != 1 {
		t.Errorf("repeat: %+v (op %d), %d executions", again.Snapshot, again.OpSeq, h.ex.count(fsm.SnapshotCreate))
	}
	_, err := h.submit(snapshotReq("vs-1", other))
	wantCode(t, err, codes.AlreadyExists)
	_, err = h.submit(Request{Event: fsm.SnapshotCreate, Args: &SnapshotCreateArgs{Name: "vs-1", SourceVolumeID: vol,
		Parameters: map[string]string{"k": "v"}}})
	wantCode(t, err, codes.AlreadyExists)
	_, err = h.submit(snapshotReq("vs-2", "vol-nosuch"))
	wantCode(t, err, codes.NotFound)
	if h.snapshot(s.ID).State != fsm.Ready || h.ex.count(fsm.SnapshotCreate) != 1 {
		t.Errorf("after the refusals: %+v, %d executions", h.snapshot(s.ID), h.ex.count(fsm.SnapshotCreate))
	}
	for _, l := range h.history(vol) {
		if l.Event.OfSnapshot() {
			t.Errorf("the volume's history holds a snapshot's line: %+v", l)
		}
	}
	checkInvariants(t, h)
}

// TestRepeatedSnapshotCreateJoinsTheOpInFlight: CreateSnapshot repeated
// while the first is being cut waits for the same op: one effect, one
// snapshot, both answered with it; a DeleteSnapshot of it meanwhile is
// Aborted (it does not cancel the cut).
func TestRepeatedSnapshotCreateJoinsTheOpInFlight(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	release := h.ex.gate(fsm.SnapshotCreate)
	outs := make([]Outcome, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); outs[0], errs[0] = h.submit(snapshotReq("vs-1", vol)) }()
	waitEntered(t, h.ex, string(fsm.SnapshotCreate))
	h.drainWaits()
	for i := 1; i < 3; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); outs[i], errs[i] = h.submit(snapshotReq("vs-1", vol)) }()
	}
	for range 2 {
		<-h.waits // both joined the op in flight
	}
	id := read(h, func(tx *store.Tx) (string, error) { return tx.SnapshotIDByName("vs-1") })
	_, err := h.submit(deleteSnapshotReq(id))
	wantCode(t, err, codes.Aborted)
	if n, _, _ := h.eng.ListSnapshots("", 0, ""); len(n) != 0 {
		t.Errorf("a snapshot being cut is listed: %+v", n)
	}
	release()
	wg.Wait()
	for i := range outs {
		if errs[i] != nil || outs[i].Snapshot.ID != id || outs[i].Snapshot.State != fsm.Ready {
			t.Errorf("request %d: %+v, %v", i, outs[i].Snapshot, errs[i])
		}
	}
	if n := h.ex.count(fsm.SnapshotCreate); n != 1 {
		t.Errorf("%d executions of one snapshot", n)
	}
	checkInvariants(t, h)
}

// TestSnapshotCreateResumesAfterRestart: a snapshot_create cut short by a
// shutdown stays queued in the store and is resumed by the next start,
// before the engine says ready; the CO's retry joins it or gets its result.
func TestSnapshotCreateResumesAfterRestart(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DrainTimeout = time.Millisecond })
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	h.ex.hang = func(x *Exec) bool { return x.Op.Event == fsm.SnapshotCreate }
	done := make(chan error, 1)
	go func() { _, err := h.submit(snapshotReq("vs-1", vol)); done <- err }()
	waitEntered(t, h.ex, string(fsm.SnapshotCreate))
	h.stop()
	if err := <-done; KindOf(err) != Transient {
		t.Fatalf("the request cut short by shutdown: %v", err)
	}
	h.ex.hang = nil
	h.start()
	out := h.must(snapshotReq("vs-1", vol))
	if out.Snapshot.State != fsm.Ready || h.ex.count(fsm.SnapshotCreate) != 2 {
		t.Errorf("after the restart: %+v, %d executions (want the resumed one)", out.Snapshot, h.ex.count(fsm.SnapshotCreate))
	}
	ops := read(h, func(tx *store.Tx) (int, error) {
		n := 0
		err := tx.ForEachOp(func(op *store.Op) bool {
			if op.Event == fsm.SnapshotCreate {
				n++
			}
			return true
		})
		return n, err
	})
	if ops != 1 {
		t.Errorf("%d snapshot_create ops, want the one resumed", ops)
	}
	checkInvariants(t, h)
}

// TestFailedSnapshotCreateIsCompensatedAndLeavesNothing: a snapshot_create
// that fails is compensated (its effect undone) before its failure is
// committed, leaves no record and frees its name; the CO's retry takes a
// new snapshot.
func TestFailedSnapshotCreateIsCompensatedAndLeavesNothing(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	h.ex.fail = func(x *Exec) error {
		if x.Op.Event == fsm.SnapshotCreate {
			return Errorf(Exhausted, "no room for the snapshot")
		}
		return nil
	}
	_, err := h.submit(snapshotReq("vs-1", vol))
	wantCode(t, err, codes.ResourceExhausted)
	if n := h.ex.compensations(fsm.SnapshotCreate); n != 1 {
		t.Errorf("%d compensations, want 1", n)
	}
	if id := read(h, func(tx *store.Tx) (string, error) { return tx.SnapshotIDByName("vs-1") }); id != "" {
		t.Errorf("a failed snapshot left its name: %s", id)
	}
	if counts, _ := h.eng.Counts(); len(counts.Snapshots) != 0 {
		t.Errorf("a failed snapshot left a record: %v", counts.Snapshots)
	}
	h.ex.fail = nil
	if out := h.must(snapshotReq("vs-1", vol)); out.Snapshot.State != fsm.Ready {
		t.Errorf("retry: %+v", out.Snapshot)
	}
	checkInvariants(t, h)
}

// TestSnapshotDelete: an unknown snapshot is deleted at once; a READY one
// by an op, after which it is neither listed nor restorable; a repeated
// delete is done.
func TestSnapshotDelete(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	h.must(deleteSnapshotReq("snap-nosuch"))
	if n := h.ex.count(fsm.SnapshotDelete); n != 0 {
		t.Errorf("an unknown snapshot's delete ran %d times", n)
	}
	s := h.must(snapshotReq("vs-1", vol)).Snapshot
	if out := h.must(deleteSnapshotReq(s.ID)); out.Snapshot.State != fsm.Absent || out.OpSeq == 0 {
		t.Errorf("delete: %+v (op %d)", out.Snapshot, out.OpSeq)
	}
	h.must(deleteSnapshotReq(s.ID))
	if n := h.ex.count(fsm.SnapshotDelete); n != 1 {
		t.Errorf("%d deletes ran, want 1", n)
	}
	if got, err := h.eng.Snapshot(s.ID); got != nil || err != nil {
		t.Errorf("a deleted snapshot reads %+v, %v", got, err)
	}
	_, err := h.submit(restoreReq("pvc-r", ContentSource{SnapshotID: s.ID}, 0))
	wantCode(t, err, codes.NotFound)
	checkInvariants(t, h)
}

// TestCreateFromASource: CreateVolume with a content source is the create
// op with a source. A snapshot or volume that does not exist is NotFound;
// without a size the volume is the source's size; a size above it is kept
// (the volume is grown); a limit below it is OutOfRange. The name's
// idempotency includes the source: the same name and source answer the
// same volume; another source, or none, is AlreadyExists.
func TestCreateFromASource(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", 2*gib)).Volume.ID
	snap := h.must(snapshotReq("vs-1", vol)).Snapshot.ID
	fromSnap := ContentSource{SnapshotID: snap}

	for _, src := range []ContentSource{{SnapshotID: "snap-nosuch"}, {VolumeID: "vol-nosuch"}} {
		_, err := h.submit(restoreReq("pvc-x", src, 0))
		wantCode(t, err, codes.NotFound)
	}
	_, err := h.submit(restoreReq("pvc-x", ContentSource{SnapshotID: snap, VolumeID: vol}, 0))
	wantCode(t, err, codes.InvalidArgument)
	limited := restoreReq("pvc-x", fromSnap, 0)
	limited.Args.(*CreateArgs).LimitBytes = snapBytes - 1
	_, err = h.submit(limited)
	wantCode(t, err, codes.OutOfRange)

	r := h.must(restoreReq("pvc-r", fromSnap, 0)).Volume
	if r.CapacityBytes != snapBytes || r.Source == nil || r.Source.SnapshotID != snap || r.Source.CloudSnapshotID != "cloud-"+snap {
		t.Errorf("restored without a size: %d bytes, source %+v", r.CapacityBytes, r.Source)
	}
	big := h.must(restoreReq("pvc-big", fromSnap, 5*gib)).Volume
	if big.CapacityBytes != 5*gib {
		t.Errorf("restored at 5 GiB: %d bytes", big.CapacityBytes)
	}
	small := h.must(restoreReq("pvc-small", fromSnap, gib)).Volume
	if small.CapacityBytes != snapBytes {
		t.Errorf("restored asking 1 GiB of a %d-byte snapshot: %d bytes", snapBytes, small.CapacityBytes)
	}
	clone := h.must(restoreReq("pvc-c", ContentSource{VolumeID: vol}, 0)).Volume
	if clone.CapacityBytes != 2*gib || clone.Source == nil || clone.Source.VolumeID != vol || clone.Source.DiskID != "disk-"+vol {
		t.Errorf("clone: %d bytes, source %+v", clone.CapacityBytes, clone.Source)
	}

	creates := h.ex.count(fsm.Create)
	if again := h.must(restoreReq("pvc-r", fromSnap, 0)).Volume; again.ID != r.ID {
		t.Errorf("the same name and source made another volume: %s, %s", again.ID, r.ID)
	}
	for _, req := range []Request{restoreReq("pvc-r", ContentSource{VolumeID: vol}, 0), createReq("pvc-r", snapBytes),
		restoreReq("pvc-1", fromSnap, 0)} {
		_, err := h.submit(req)
		wantCode(t, err, codes.AlreadyExists)
	}
	if h.ex.count(fsm.Create) != creates {
		t.Errorf("idempotent answers created %d volumes", h.ex.count(fsm.Create)-creates)
	}
	checkInvariants(t, h)
}

// TestDeleteVolumeKeepsItsSnapshots: deleting a volume that has snapshots
// succeeds (csid's documented choice); its snapshots stay READY, listed
// by their source volume's id, and restorable.
func TestDeleteVolumeKeepsItsSnapshots(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	snap := h.must(snapshotReq("vs-1", vol)).Snapshot.ID
	h.must(deleteReq(vol))
	if v := h.volume(vol); v != nil {
		t.Fatalf("the volume is still there: %+v", v)
	}
	list, _, err := h.eng.ListSnapshots("", 0, vol)
	if err != nil || len(list) != 1 || list[0].ID != snap || list[0].State != fsm.Ready {
		t.Errorf("snapshots of the deleted volume: %+v, %v", list, err)
	}
	if r := h.must(restoreReq("pvc-r", ContentSource{SnapshotID: snap}, 0)).Volume; r.Source == nil || r.Source.SnapshotID != snap {
		t.Errorf("restored: %+v", r)
	}
	// A new snapshot of the deleted volume is NotFound.
	_, err = h.submit(snapshotReq("vs-2", vol))
	wantCode(t, err, codes.NotFound)
	checkInvariants(t, h)
}

// TestListSnapshotsPages: the list pages in id order by the last id
// given, filters by source volume, and leaves out snapshots being cut.
func TestListSnapshotsPages(t *testing.T) {
	h := newHarness(t)
	a := h.must(createReq("pvc-a", gib)).Volume.ID
	b := h.must(createReq("pvc-b", gib)).Volume.ID
	var want []string
	for i, src := range []string{a, b, a, b, a} {
		want = append(want, h.must(snapshotReq(string(rune('p'+i)), src)).Snapshot.ID)
	}
	slices.Sort(want) // ids drawn in one millisecond need not be in order
	var got []string
	after := ""
	for range 10 {
		page, next, err := h.eng.ListSnapshots(after, 2, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			got = append(got, s.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("pages: %v, want %v", got, want)
	}
	ofA, next, err := h.eng.ListSnapshots("", 0, a)
	if err != nil || len(ofA) != 3 || next != "" {
		t.Errorf("of volume a: %d snapshots, next %q, %v", len(ofA), next, err)
	}
	if none, _, err := h.eng.ListSnapshots("", 0, "vol-nosuch"); len(none) != 0 || err != nil {
		t.Errorf("of an unknown volume: %+v, %v", none, err)
	}
}

// TestSnapshotConfirmForgetsWhatTheProviderLost: a repeated CreateSnapshot
// whose record says READY asks the provider; a snapshot it no longer has
// (deleted behind csid's back) is forgotten (a forget line in the
// history) and taken again under the same name.
func TestSnapshotConfirmForgetsWhatTheProviderLost(t *testing.T) {
	var lost sync.Map
	h := newHarness(t, func(c *Config) {
		c.ConfirmSnapshot = func(_ context.Context, s *store.Snapshot) (string, error) {
			if _, ok := lost.Load(s.CloudID); ok {
				return "the provider has no snapshot " + s.CloudID, nil
			}
			return "", nil
		}
	})
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	first := h.must(snapshotReq("vs-1", vol)).Snapshot
	h.must(snapshotReq("vs-1", vol))
	if n := h.ex.count(fsm.SnapshotCreate); n != 1 {
		t.Fatalf("a confirmed snapshot was taken again: %d", n)
	}
	lost.Store(first.CloudID, true)
	second := h.must(snapshotReq("vs-1", vol)).Snapshot
	if second.ID == first.ID || h.ex.count(fsm.SnapshotCreate) != 2 {
		t.Errorf("after the provider lost it: %+v, %d executions", second, h.ex.count(fsm.SnapshotCreate))
	}
	hist := h.history(first.ID)
	if len(hist) == 0 || hist[len(hist)-1].Event != fsm.SnapshotCreate {
		t.Errorf("the forgotten snapshot's history: %+v", hist)
	}
	if h.snapshot(first.ID) != nil {
		t.Errorf("the forgotten record is still there")
	}
	checkInvariants(t, h)
}

// TestSnapshotAndVolumeOpsDoNotWaitForEachOther: a snapshot being cut
// holds no op of its source volume back (an expand runs meanwhile), and a
// volume's op in flight holds no snapshot of it back.
func TestSnapshotAndVolumeOpsDoNotWaitForEachOther(t *testing.T) {
	h := newHarness(t)
	vol := h.must(createReq("pvc-1", gib)).Volume.ID
	release := h.ex.gate(fsm.SnapshotCreate)
	done := make(chan error, 1)
	go func() { _, err := h.submit(snapshotReq("vs-1", vol)); done <- err }()
	waitEntered(t, h.ex, string(fsm.SnapshotCreate))
	if out := h.must(expandReq(vol, 2*gib)); out.Volume.CapacityBytes != 2*gib {
		t.Errorf("expand while a snapshot is cut: %+v", out.Volume)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h.ex.overlaps.Load() != 0 {
		t.Errorf("overlapping executions of one subject")
	}
	checkInvariants(t, h)
}
