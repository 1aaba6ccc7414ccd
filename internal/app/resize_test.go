package app_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func wantCode(t testing.TB, err error, code codes.Code, contains ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("want %s, got %v", code, err)
	}
	for _, s := range contains {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Fatalf("message %q does not say %q", status.Convert(err).Message(), s)
		}
	}
}

// TestOfflineResizeStory is issue 5's whole story on real loop devices: a
// pod on node-1 uses a filesystem volume and writes a file; the volume is
// expanded while attached (queued, FailedPrecondition); the pod's
// replacement on node-2 cannot have the volume while node-1 holds it; the
// pod on node-1 goes away and the volume is unpublished, which runs the
// resize; the publish to node-2 succeeds after the resize, the stage there
// shows the larger filesystem, and the file is intact.
func TestOfflineResizeStory(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	all := apptest.Start(t, app.Options{Cloud: "local", StateDir: dir, NodeID: "node-1", Endpoint: "unix://" + dir + "/all.sock", Log: zerolog.Nop()})
	node2 := apptest.Start(t, app.Options{Cloud: "local", StateDir: dir, NodeID: "node-2", Mode: driver.ModeNode,
		Endpoint: "unix://" + dir + "/node2.sock", Log: zerolog.Nop()})
	id := offlineResizeStory(t, story{dir: dir, all: apptest.Dial(t, all.Socket), node2: apptest.Dial(t, node2.Socket),
		size: 64 << 20, grown: 128 << 20})
	all.Stop(t)
	node2.Stop(t)
	checkResizeBeforeAttach(t, app.StateFile(dir, driver.ModeAll), id, "node-2")
	checkNothingLeft(t, "story", dir)
}

// story is where the offline-resize story runs: csid all-in-one on node-1
// and a node csid on node-2, on one backend.
type story struct {
	dir        string
	all, node2 apptest.Client
	// size and grown are the volume's sizes before and after the expansion.
	size, grown int64
	// published2, if set, checks the backend once the volume is published
	// to node-2 (after the resize), given the publish context.
	published2 func(t *testing.T, publishContext map[string]string)
}

// offlineResizeStory runs issue 5's story (TestOfflineResizeStory) and
// returns the volume's id; the volume is deleted at the end.
func offlineResizeStory(t *testing.T, s story) string {
	t.Helper()
	c, n2, dir, size, grown := s.all, s.node2, s.dir, s.size, s.grown
	ctx := context.Background()
	vc := apptest.MountCap("ext4")

	vol := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "story", CapacityRange: capRange(size), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume
	id := vol.VolumeId
	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	stage1, target1 := filepath.Join(dir, "stage1"), filepath.Join(dir, "pod-a")
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage1, VolumeCapability: vc, PublishContext: pub.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target1, StagingTargetPath: stage1, VolumeCapability: vc})).Must(t)
	data := []byte("written by pod A before the expansion\n")
	if err := os.WriteFile(filepath.Join(target1, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	before := apptest.R(c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target1})).Must(t).Usage[0].Total

	// Expand while attached: queued, and said so.
	expand := &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(grown), VolumeCapability: vc}
	_, err := c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprint(grown), "queued", "unpublished")

	// The replacement pod on node-2 is held: node-1 has the disk.
	publish2 := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-2", VolumeCapability: vc}
	_, err = c.ControllerPublishVolume(ctx, publish2)
	wantCode(t, err, codes.FailedPrecondition, "node-1")

	// Pod A goes away. Until the detach, expand keeps answering FailedPrecondition.
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target1})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage1})).Must(t)
	_, err = c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, "queued")
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)

	// The publish to node-2 attaches after the resize.
	pub2 := apptest.R(c.ControllerPublishVolume(ctx, publish2)).Must(t)
	exp := apptest.R(c.ControllerExpandVolume(ctx, expand)).Must(t) // the resizer's retry: done
	if exp.CapacityBytes != grown || !exp.NodeExpansionRequired {
		t.Fatalf("after the resize, expand answers %+v", exp)
	}
	if s.published2 != nil {
		s.published2(t, pub2.PublishContext)
	}
	stage2, target2 := filepath.Join(dir, "stage2"), filepath.Join(dir, "pod-b")
	apptest.R(n2.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage2, VolumeCapability: vc, PublishContext: pub2.PublishContext})).Must(t)
	apptest.R(n2.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target2, StagingTargetPath: stage2, VolumeCapability: vc})).Must(t)
	after := apptest.R(n2.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target2})).Must(t).Usage[0].Total
	if after < before+(grown-size)*9/10 {
		t.Fatalf("filesystem %d bytes before, %d after: not grown to the %d-byte disk", before, after, grown)
	}
	if got, err := os.ReadFile(filepath.Join(target2, "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file after the resize: %q, %v", got, err)
	}
	apptest.R(n2.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target2, StagingTargetPath: stage2})).Must(t)

	// Down again.
	apptest.R(n2.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target2})).Must(t)
	apptest.R(n2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage2})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-2"})).Must(t)
	apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	return id
}

// checkResizeBeforeAttach reads a stopped csid's state file: the volume's
// resize op finished before the op that attached it to node was accepted.
func checkResizeBeforeAttach(t *testing.T, stateFile, id, node string) {
	t.Helper()
	st, err := store.OpenReadOnly(stateFile, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var resize, attach *store.Op
	_ = st.View(func(tx *store.Tx) error {
		return tx.ForEachOp(func(op *store.Op) bool {
			if op.VolumeID != id || op.Status != store.OpSucceeded {
				return true
			}
			switch {
			case op.Event == fsm.Expand && resize == nil:
				resize = op
			case op.Event == fsm.ControllerPublish && attach == nil && strings.Contains(string(op.Args), `"`+node+`"`):
				attach = op
			}
			return true
		})
	})
	if resize == nil || attach == nil {
		t.Fatalf("ops of %s: resize %+v, attach to %s %+v", id, resize, node, attach)
	}
	if attach.Seq < resize.Seq || attach.CreatedAt.Before(resize.FinishedAt) {
		t.Fatalf("attach op %d (accepted %v) did not wait for resize op %d (finished %v)", attach.Seq, attach.CreatedAt, resize.Seq, resize.FinishedAt)
	}
}

// startFake runs an all-in-one csid on the fake backend (no root needed).
func startFake(t testing.TB, f *fake.Cloud, latency map[cloud.OpKind]time.Duration) (*apptest.Instance, apptest.Client) {
	t.Helper()
	in := apptest.Start(t, app.Options{Cloud: "fake", Fake: f, FakeLatency: latency, Log: zerolog.Nop()})
	return in, apptest.Dial(t, in.Socket)
}

// TestResizeSizeRulesOverCSI: a shrink is refused, an equal size succeeds at
// once, a larger request replaces the queued one and a smaller one joins it.
func TestResizeSizeRulesOverCSI(t *testing.T) {
	_, c := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	const mib = 1 << 20
	id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "rules", CapacityRange: capRange(100 * mib), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	expand := func(required, limit int64) (*csi.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}})
	}
	_, err := expand(50*mib, 50*mib)
	wantCode(t, err, codes.OutOfRange, "shrink")
	if r, err := expand(100*mib, 0); err != nil || r.CapacityBytes != 100*mib {
		t.Fatalf("equal size: %+v, %v", r, err)
	}
	// Beyond what the backend holds: OutOfRange at once, nothing queued
	// (the next expand names its own size, not this one).
	_, err = expand(fake.MaxDiskBytes+mib, 0)
	wantCode(t, err, codes.OutOfRange, "largest volume this backend holds")
	_, err = expand(200*mib, 0)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprint(200*mib))
	_, err = expand(300*mib, 0)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprint(300*mib)) // replaces the queued 200 MiB
	_, err = expand(250*mib, 0)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprint(300*mib)) // joins the queued 300 MiB
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	if r := apptest.R(expand(250*mib, 0)).Must(t); r.CapacityBytes != 300*mib {
		t.Fatalf("after the detach the volume is %d bytes, want the queued 300 MiB", r.CapacityBytes)
	}
}

// TestNoAttachBeforeResizeFinishes: on the fake backend with a 500 ms
// resize, 100 volumes each go through publish, expand (queued), unpublish,
// publish, concurrently; the fake's call log shows every disk resized once,
// and no attach of a disk starting before its resize finished.
func TestNoAttachBeforeResizeFinishes(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	_, c := startFake(t, f, map[cloud.OpKind]time.Duration{cloud.OpResize: 500 * time.Millisecond})
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	const volumes, mib = 100, int64(1) << 20
	var wg sync.WaitGroup
	errs := make(chan error, volumes)
	for i := 0; i < volumes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := func() error {
				v, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("v%d", i), CapacityRange: capRange(64 * mib), VolumeCapabilities: []*csi.VolumeCapability{vc}})
				if err != nil {
					return err
				}
				id := v.Volume.VolumeId
				pub := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc}
				if _, err := c.ControllerPublishVolume(ctx, pub); err != nil {
					return err
				}
				_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(128 * mib)})
				if status.Code(err) != codes.FailedPrecondition {
					return fmt.Errorf("expand while attached: %v", err)
				}
				if _, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"}); err != nil {
					return err
				}
				if _, err := c.ControllerPublishVolume(ctx, pub); err != nil {
					return err
				}
				return nil
			}()
			if err != nil {
				errs <- fmt.Errorf("volume %d: %w", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	resized := map[string]fake.Call{}
	for _, call := range f.Calls() {
		if call.Kind == cloud.OpResize && call.Err == nil {
			if _, dup := resized[call.DiskID]; dup {
				t.Errorf("disk %s resized twice", call.DiskID)
			}
			resized[call.DiskID] = call
		}
	}
	if len(resized) != volumes {
		t.Fatalf("%d disks resized, want %d", len(resized), volumes)
	}
	attaches := 0
	for _, call := range f.Calls() {
		r, ok := resized[call.DiskID]
		if call.Kind != cloud.OpAttach || !ok || call.Seq < r.Seq {
			continue
		}
		attaches++
		if call.Start.Before(r.End) {
			t.Errorf("disk %s: attach started at %v, before its resize finished at %v", call.DiskID, call.Start, r.End)
		}
	}
	if attaches < volumes {
		t.Fatalf("%d attaches after a resize, want %d", attaches, volumes)
	}
}

// TestQueuedResizeSurvivesSIGKILL is issue 5's crash story with real
// processes: csid is SIGKILLed between queueing a resize and the unpublish,
// and again between the unpublish and the end of the resize (after the
// cloud grew the disk, before csid recorded it). After each restart the
// resize still happens, the publish waits for it, and the data is intact.
func TestQueuedResizeSurvivesSIGKILL(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	co := childOptions{Mode: driver.ModeAll, Endpoint: "unix://" + dir + "/csi.sock", StateDir: dir, Cloud: "local", NodeID: "node-1"}
	fired := filepath.Join(dir, "fired")
	ctx := context.Background()
	const size, grown = 64 << 20, 128 << 20
	vc := apptest.MountCap("ext4")

	proc := startChild(t, co, "", fired)
	c := apptest.Dial(t, proc.socket)
	id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "crashy", CapacityRange: capRange(size), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	publish := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc}
	pub := apptest.R(c.ControllerPublishVolume(ctx, publish)).Must(t)
	stage, target := filepath.Join(dir, "stage"), filepath.Join(dir, "pod")
	stageReq := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc, PublishContext: pub.PublishContext}
	publishReq := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, StagingTargetPath: stage, VolumeCapability: vc}
	apptest.R(c.NodeStageVolume(ctx, stageReq)).Must(t)
	apptest.R(c.NodePublishVolume(ctx, publishReq)).Must(t)
	data := []byte("written before two crashes\n")
	if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	expand := &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(grown), VolumeCapability: vc}
	_, err := c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, "queued")

	// Crash 1: between queueing and unpublish.
	proc.kill(t)
	proc = startChild(t, co, crash.ResizeAfterCloudResize, fired)
	c = apptest.Dial(t, proc.socket)
	_, err = c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprint(grown), "queued") // the queue survived
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)

	// Crash 2: the unpublish's commit starts the resize; csid dies after the
	// cloud grew the disk and before it recorded it. The unpublish's answer
	// may be lost with it; the CO then retries.
	unpublish := &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"}
	_, _ = c.ControllerUnpublishVolume(ctx, unpublish)
	proc.waitKilled(t)
	if got, _ := os.ReadFile(fired); strings.TrimSpace(string(got)) != crash.ResizeAfterCloudResize {
		t.Fatalf("crash points fired: %q", got)
	}
	proc = startChild(t, co, "", fired)
	c = apptest.Dial(t, proc.socket)
	apptest.R(c.ControllerUnpublishVolume(ctx, unpublish)).Must(t)
	pub = apptest.R(c.ControllerPublishVolume(ctx, publish)).Must(t)
	if e := apptest.R(c.ControllerExpandVolume(ctx, expand)).Must(t); e.CapacityBytes != grown {
		t.Fatalf("after the crashes the volume is %d bytes, want %d", e.CapacityBytes, grown)
	}
	stageReq.PublishContext = pub.PublishContext
	apptest.R(c.NodeStageVolume(ctx, stageReq)).Must(t)
	apptest.R(c.NodePublishVolume(ctx, publishReq)).Must(t)
	usage := apptest.R(c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})).Must(t).Usage[0].Total
	if usage < grown*8/10 {
		t.Fatalf("filesystem of %d bytes on a %d-byte disk: not grown", usage, grown)
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file after the crashes: %q, %v", got, err)
	}
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, unpublish)).Must(t)
	apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	proc.stop(t)
	checkResizeBeforeAttach(t, app.StateFile(dir, driver.ModeAll), id, "node-1")
	checkNothingLeft(t, "crashes", dir)
}
