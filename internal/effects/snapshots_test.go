package effects_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// controller is a controller's engine on a real state file and the fake
// cloud, restartable on the same file and cloud.
type controller struct {
	t    *testing.T
	c    *fake.Cloud
	path string
	st   *store.Store
	eng  *ops.Engine
}

func newController(t *testing.T, c *fake.Cloud) *controller {
	k := &controller{t: t, c: c, path: filepath.Join(t.TempDir(), "csid.db")}
	k.start()
	t.Cleanup(k.stop)
	return k
}

func (k *controller) start() {
	st, err := store.Open(k.path, store.Options{NoSync: true})
	if err != nil {
		k.t.Fatal(err)
	}
	ctrl := &effects.Controller{Cloud: k.c, DriverName: "csid.test"}
	k.st = st
	k.eng = ops.New(ops.Config{Store: st, Executors: ctrl.Executors(), ConfirmSnapshot: ctrl.ConfirmSnapshot(), Log: zerolog.Nop(),
		Retry: &ops.Backoff{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 2}, DrainTimeout: time.Millisecond})
	if err := k.eng.Start(context.Background()); err != nil {
		k.t.Fatal(err)
	}
}

func (k *controller) stop() {
	if k.eng == nil {
		return
	}
	_ = k.eng.Close(context.Background())
	k.st.Close()
	k.eng = nil
}

func (k *controller) submit(ctx context.Context, req ops.Request) (ops.Outcome, error) {
	return k.eng.Submit(ctx, req)
}

func (k *controller) must(req ops.Request) ops.Outcome {
	k.t.Helper()
	out, err := k.eng.Submit(context.Background(), req)
	if err != nil {
		k.t.Fatalf("%s: %v", req.Event, err)
	}
	return out
}

var mountCap = store.Capability{AccessType: "mount", FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER"}

func createReq(name string, size int64, src *ops.ContentSource) ops.Request {
	return ops.Request{Event: fsm.Create, Args: &ops.CreateArgs{Name: name, SizeBytes: size, RequiredBytes: size, Capability: mountCap, Source: src}}
}

func snapshotReq(name, vol string) ops.Request {
	return ops.Request{Event: fsm.SnapshotCreate, Args: &ops.SnapshotCreateArgs{Name: name, SourceVolumeID: vol}}
}

// calls counts the fake's calls of a method.
func calls(c *fake.Cloud, method string) int {
	n := 0
	for _, call := range c.Calls() {
		if call.Method == method {
			n++
		}
	}
	return n
}

// TestSnapshotWaitsOnItsRecordedOperationAfterARestart: a snapshot_create
// records the provider's operation and snapshot ids before it waits; a
// csid restarted meanwhile resumes the wait on that operation (no second
// CreateSnapshot call), and the snapshot is the one the first run started.
func TestSnapshotWaitsOnItsRecordedOperationAfterARestart(t *testing.T) {
	c := fake.New(fake.Options{})
	k := newController(t, c)
	vol := k.must(createReq("pvc-1", 1<<30, nil)).Volume
	release := c.Hold(cloud.OpSnapshot)
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := k.submit(ctx, snapshotReq("vs-1", vol.ID))
	cancel()
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a snapshot held by the provider: %v, want Aborted (still running)", err)
	}
	var cp map[string]string
	_ = k.st.View(func(tx *store.Tx) error {
		ops, _ := tx.ActiveOps()
		if len(ops) == 1 {
			cp = ops[0].Checkpoints
		}
		return nil
	})
	if cp["cloud-op"] == "" || cp["cloud-snapshot"] == "" {
		t.Fatalf("the op waits without having recorded the provider's operation and snapshot: %v", cp)
	}
	k.stop()
	k.start()
	release()
	out := k.must(snapshotReq("vs-1", vol.ID))
	if out.Snapshot.CloudID != cp["cloud-snapshot"] || !out.Snapshot.ReadyToUse || out.Snapshot.SizeBytes != 1<<30 {
		t.Errorf("resumed snapshot: %+v, want the provider's %s", out.Snapshot, cp["cloud-snapshot"])
	}
	if n := calls(c, "CreateSnapshot"); n != 1 {
		t.Errorf("%d CreateSnapshot calls, want the one the first run made", n)
	}
}

// TestRestoreAndCloneCopyTheSourceContent: a volume restored from a
// snapshot holds the content the source had when it was cut, also after
// the source volume is deleted; a clone holds the source's content now;
// a restore at a larger size is a larger disk with the content.
func TestRestoreAndCloneCopyTheSourceContent(t *testing.T) {
	c := fake.New(fake.Options{})
	k := newController(t, c)
	vol := k.must(createReq("pvc-1", 1<<30, nil)).Volume
	if err := c.WriteDisk(vol.DiskID, 4096, []byte("before the snapshot")); err != nil {
		t.Fatal(err)
	}
	snap := k.must(snapshotReq("vs-1", vol.ID)).Snapshot
	if err := c.WriteDisk(vol.DiskID, 4096, []byte("after the snapshot!")); err != nil {
		t.Fatal(err)
	}
	clone := k.must(createReq("pvc-clone", 0, &ops.ContentSource{VolumeID: vol.ID})).Volume
	k.must(ops.Request{VolumeID: vol.ID, Event: fsm.Delete})
	restored := k.must(createReq("pvc-r", 0, &ops.ContentSource{SnapshotID: snap.ID})).Volume
	bigger := k.must(createReq("pvc-big", 2<<30, &ops.ContentSource{SnapshotID: snap.ID})).Volume
	for _, w := range []struct {
		v    store.Volume
		want string
		size int64
	}{{restored, "before the snapshot", 1 << 30}, {bigger, "before the snapshot", 2 << 30}, {clone, "after the snapshot!", 1 << 30}} {
		got, err := c.ReadDisk(w.v.DiskID, 4096, len(w.want))
		if err != nil || !bytes.Equal(got, []byte(w.want)) || w.v.CapacityBytes != w.size {
			t.Errorf("volume %s from %s: %q (%v), %d bytes; want %q, %d bytes", w.v.ID, w.v.Source, got, err, w.v.CapacityBytes, w.want, w.size)
		}
		d, err := c.GetDisk(context.Background(), w.v.DiskID)
		if err != nil || d.Tags[effects.TagSource] != effects.SourceTag(w.v.Source) || d.Source == nil {
			t.Errorf("disk of %s: tags %v, source %+v, %v", w.v.ID, d.Tags, d.Source, err)
		}
	}
}

// TestFailedSnapshotLeavesNoProviderSnapshot: a snapshot_create that fails
// after the provider has cut the snapshot (reading it back fails for
// good) deletes the provider's snapshot before it answers.
func TestFailedSnapshotLeavesNoProviderSnapshot(t *testing.T) {
	c := fake.New(fake.Options{})
	k := newController(t, c)
	vol := k.must(createReq("pvc-1", 1<<30, nil)).Volume
	c.FailCalls(fake.KindGetSnapshot, 1, errors.Join(errors.New("the provider lost its index"), cloud.ErrInvalid))
	_, err := k.submit(context.Background(), snapshotReq("vs-1", vol.ID))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("snapshot whose read-back fails: %v", err)
	}
	page, err := c.ListSnapshots(context.Background(), cloud.SnapshotListOptions{})
	if err != nil || len(page.Snapshots) != 0 {
		t.Errorf("the failed snapshot left provider snapshots: %+v, %v", page.Snapshots, err)
	}
}

// TestSnapshotRefusalsGetTheirCodes: the provider's refusals reach the
// caller with the CSI table's codes: a snapshot it cannot take
// consistently (ErrNotSupported) is FailedPrecondition, no room is
// ResourceExhausted.
func TestSnapshotRefusalsGetTheirCodes(t *testing.T) {
	c := fake.New(fake.Options{})
	k := newController(t, c)
	vol := k.must(createReq("pvc-1", 1<<30, nil)).Volume
	for _, w := range []struct {
		err  error
		code codes.Code
	}{{cloud.ErrNotSupported, codes.FailedPrecondition}, {cloud.ErrLimitReached, codes.ResourceExhausted}} {
		c.FailCalls(cloud.OpSnapshot, 1, w.err)
		_, err := k.submit(context.Background(), snapshotReq("vs-1", vol.ID))
		if status.Code(err) != w.code {
			t.Errorf("provider refusal %v: %v, want %s", w.err, err, w.code)
		}
	}
	if out := k.must(snapshotReq("vs-1", vol.ID)); !out.Snapshot.ReadyToUse {
		t.Errorf("after the refusals: %+v", out.Snapshot)
	}
}

// TestSnapshotDeletedBehindCsidsBackIsTakenAgain: a repeated CreateSnapshot
// of a snapshot the provider no longer has forgets the record and takes a
// new one.
func TestSnapshotDeletedBehindCsidsBackIsTakenAgain(t *testing.T) {
	c := fake.New(fake.Options{})
	k := newController(t, c)
	vol := k.must(createReq("pvc-1", 1<<30, nil)).Volume
	first := k.must(snapshotReq("vs-1", vol.ID)).Snapshot
	op, err := c.DeleteSnapshot(context.Background(), first.CloudID)
	if err == nil {
		_, err = c.WaitOperation(context.Background(), op.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	again := k.must(snapshotReq("vs-1", vol.ID)).Snapshot
	if again.ID == first.ID || again.CloudID == first.CloudID {
		t.Errorf("the lost snapshot was answered again: %+v", again)
	}
	if _, err := c.GetSnapshot(context.Background(), again.CloudID); err != nil {
		t.Errorf("the new snapshot: %v", err)
	}
}
