package app_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// snapshotBackends are the backends the snapshot stories run on: the fake
// (no root) and the local one (loop devices, real filesystems; root).
var snapshotBackends = []string{"fake", "local"}

// startBackend starts an all-in-one csid on backend, skipping (failing
// with CSID_REQUIRE_ROOT=1) the local backend without root.
func startBackend(t *testing.T, backend string) (*apptest.Instance, apptest.Client) {
	t.Helper()
	if backend == "local" {
		testutil.RequireRoot(t)
	}
	in := apptest.Start(t, app.Options{Cloud: backend, Log: zerolog.Nop()})
	return in, apptest.Dial(t, in.Socket)
}

// volumeChain publishes, stages and publishes volume id on node-1 at
// paths under dir, and returns the target path and a func that brings it
// all down again.
func volumeChain(t *testing.T, c apptest.Client, dir, id string, vc *csi.VolumeCapability) (string, func()) {
	t.Helper()
	ctx := context.Background()
	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	stage, target := filepath.Join(dir, "stage-"+id), filepath.Join(dir, "target-"+id)
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc,
		PublishContext: pub.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, StagingTargetPath: stage,
		VolumeCapability: vc})).Must(t)
	return target, func() {
		t.Helper()
		apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})).Must(t)
		apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
		apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	}
}

func createVolume(t *testing.T, c apptest.Client, name string, size int64, vc *csi.VolumeCapability, src *csi.VolumeContentSource) *csi.Volume {
	t.Helper()
	req := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{vc}, VolumeContentSource: src}
	if size > 0 {
		req.CapacityRange = capRange(size)
	}
	return apptest.R(c.CreateVolume(context.Background(), req)).Must(t).Volume
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// TestSnapshotOfAVolumeWithAQueuedResize: a snapshot taken while a resize
// waits in the offline resize queue (the volume is attached) has the size
// before the resize, and keeps it after the detach has grown the volume;
// a volume restored from it without a size has that size, one restored
// at the grown size has the grown size.
func TestSnapshotOfAVolumeWithAQueuedResize(t *testing.T) {
	for _, backend := range snapshotBackends {
		t.Run(backend, func(t *testing.T) {
			in, c := startBackend(t, backend)
			ctx := context.Background()
			const size, grown = 64 << 20, 128 << 20
			vc := apptest.MountCap("ext4")
			id := createVolume(t, c, "queued", size, vc, nil).VolumeId
			_, down := volumeChain(t, c, in.Dir, id, vc)
			expand := &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(grown), VolumeCapability: vc}
			_, err := c.ControllerExpandVolume(ctx, expand)
			wantCode(t, err, codes.FailedPrecondition, "queued")

			snap := apptest.R(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "before-the-resize", SourceVolumeId: id})).Must(t).Snapshot
			if snap.SizeBytes != size || !snap.ReadyToUse || snap.SourceVolumeId != id {
				t.Fatalf("snapshot of a volume with a queued resize: %+v, want %d bytes, ready", snap, size)
			}
			down() // the detach runs the resize
			if got := apptest.R(c.ControllerExpandVolume(ctx, expand)).Must(t); got.CapacityBytes != grown {
				t.Fatalf("after the detach the volume has %d bytes, want %d", got.CapacityBytes, grown)
			}
			list := apptest.R(c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snap.SnapshotId})).Must(t)
			if len(list.Entries) != 1 || list.Entries[0].Snapshot.SizeBytes != size {
				t.Errorf("the snapshot after the resize: %+v, want %d bytes", list.Entries, size)
			}
			restored := createVolume(t, c, "restored", 0, vc, fromSnapshot(snap.SnapshotId))
			if restored.CapacityBytes != size || restored.ContentSource.GetSnapshot().GetSnapshotId() != snap.SnapshotId {
				t.Errorf("restored without a size: %+v, want %d bytes from %s", restored, size, snap.SnapshotId)
			}
			if big := createVolume(t, c, "restored-big", grown, vc, fromSnapshot(snap.SnapshotId)); big.CapacityBytes != grown {
				t.Errorf("restored at %d bytes: %d", grown, big.CapacityBytes)
			}
			_, err = c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "too-small", CapacityRange: &csi.CapacityRange{LimitBytes: size / 2},
				VolumeCapabilities: []*csi.VolumeCapability{vc}, VolumeContentSource: fromSnapshot(snap.SnapshotId)})
			wantCode(t, err, codes.OutOfRange)
		})
	}
}

// TestSnapshotRequestsAreCheckedFirst: malformed snapshot requests get
// InvalidArgument, ids csid never handed out name nothing (NotFound, or
// success for a delete, an empty list), and a foreign page token is
// Aborted; nothing reaches the engine.
func TestSnapshotRequestsAreCheckedFirst(t *testing.T) {
	in, c := startBackend(t, "fake")
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	vol := createVolume(t, c, "source", 64<<20, vc, nil).VolumeId
	before := allOps(t, in.Dir)
	for _, w := range []struct {
		what string
		err  error
		code codes.Code
	}{
		{"a snapshot without a name", second(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: vol})), codes.InvalidArgument},
		{"a snapshot without a source", second(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s"})), codes.InvalidArgument},
		{"a snapshot with a parameter csid does not know", second(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s",
			SourceVolumeId: vol, Parameters: map[string]string{"tier": "gold"}})), codes.InvalidArgument},
		{"a snapshot of a volume id csid never gave", second(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "pvc-1"})), codes.NotFound},
		{"a delete without an id", second(c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{})), codes.InvalidArgument},
		{"a delete of an id csid never gave", second(c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "../../etc"})), codes.OK},
		{"a list of a negative size", second(c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: -1})), codes.InvalidArgument},
		{"a list from a foreign token", second(c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "page-2"})), codes.Aborted},
		{"a get without an id", second(c.GetSnapshot(ctx, &csi.GetSnapshotRequest{})), codes.InvalidArgument},
		{"a get of an unknown snapshot", second(c.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "snap-00000000000000000000"})), codes.NotFound},
		{"a restore of an id csid never gave", second(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{vc},
			VolumeContentSource: fromSnapshot("backup-1")})), codes.NotFound},
		{"a clone of an unknown volume", second(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{vc},
			VolumeContentSource: fromVolume("vol-00000000000000000000")})), codes.NotFound},
		{"an empty content source", second(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{vc},
			VolumeContentSource: &csi.VolumeContentSource{}})), codes.InvalidArgument},
	} {
		if got := status.Code(w.err); got != w.code {
			t.Errorf("%s: %v, want %s", w.what, w.err, w.code)
		}
	}
	for _, req := range []*csi.ListSnapshotsRequest{{SnapshotId: "nosuch"}, {SourceVolumeId: "nosuch"}, {SnapshotId: "snap-00000000000000000000"}} {
		if list := apptest.R(c.ListSnapshots(ctx, req)).Must(t); len(list.Entries) != 0 || list.NextToken != "" {
			t.Errorf("list %v: %+v, want an empty list", req, list)
		}
	}
	if after := allOps(t, in.Dir); len(after) != len(before) {
		t.Errorf("the engine took ops for requests it should never have seen: %d ops before them, %d after: %+v", len(before), len(after), after)
	}
	caps := apptest.R(c.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})).Must(t)
	want := map[csi.ControllerServiceCapability_RPC_Type]bool{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT: true,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS: true, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT: true,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME: true}
	for _, cp := range caps.Capabilities {
		delete(want, cp.GetRpc().GetType())
	}
	if len(want) != 0 {
		t.Errorf("capabilities not advertised on a backend that takes snapshots: %v", want)
	}
}

func second[T any](_ T, err error) error { return err }

// allOps lists every op of the all-in-one csid in dir, whatever its
// status, through its admin socket.
func allOps(t *testing.T, dir string) []view.Op {
	t.Helper()
	c := admin.NewClient(app.AdminSocketPath(dir, driver.ModeAll), 5*time.Second)
	defer c.Close()
	list, err := c.Ops(context.Background(), view.OpFilter{Status: view.OpsAll})
	if err != nil {
		t.Fatal(err)
	}
	return list.Ops
}

// TestSnapshotsAreRebuiltFromTheCloud: a controller whose state file was
// lost, started with --rebuild-from-cloud, rebuilds its snapshots from the
// provider's snapshots and their tags (as its volumes from their disks'):
// ListSnapshots answers as before, a volume restored from a snapshot still
// names it as its content source, and CreateSnapshot by name answers the
// same snapshot.
func TestSnapshotsAreRebuiltFromTheCloud(t *testing.T) {
	dir := apptest.ShortTempDir(t)
	o := app.Options{Cloud: "fake", Fake: fake.New(fake.Options{Zones: []string{"fake"}}), StateDir: dir, Log: zerolog.Nop()}
	in := apptest.Start(t, o)
	c := apptest.Dial(t, in.Socket)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	vol := createVolume(t, c, "pvc-1", 64<<20, vc, nil).VolumeId
	snap := apptest.R(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "vs-1", SourceVolumeId: vol})).Must(t).Snapshot
	restored := createVolume(t, c, "pvc-r", 0, vc, fromSnapshot(snap.SnapshotId))
	before := apptest.R(c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})).Must(t)
	in.Stop(t)
	if err := os.Remove(app.StateFile(dir, driver.ModeAll)); err != nil {
		t.Fatal(err)
	}
	o.RebuildFromCloud = true
	in = apptest.Start(t, o)
	c = apptest.Dial(t, in.Socket)
	after := apptest.R(c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})).Must(t)
	if !proto.Equal(before, after) {
		t.Errorf("snapshots before the rebuild:\n%v\nafter:\n%v", before, after)
	}
	got := apptest.R(c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: restored.VolumeId})).Must(t).Volume
	if got.ContentSource.GetSnapshot().GetSnapshotId() != snap.SnapshotId {
		t.Errorf("the restored volume after the rebuild: %v", got)
	}
	again := apptest.R(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "vs-1", SourceVolumeId: vol})).Must(t).Snapshot
	if again.SnapshotId != snap.SnapshotId {
		t.Errorf("CreateSnapshot by name after the rebuild: %s, want %s", again.SnapshotId, snap.SnapshotId)
	}
}

// fsckImage checks the filesystem of a detached disk's image, read-only:
// it must need no repair.
func fsckImage(t *testing.T, fsType, image string) {
	t.Helper()
	cmd := exec.Command("e2fsck", "-fn", image)
	if fsType == "xfs" {
		cmd = exec.Command("xfs_repair", "-n", "-f", image)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s of %s: %v\n%s", cmd.Args[0], image, err, out)
	}
}

// TestRestoreAndCloneOnLoopDevices is point 4 of issue 17 on the local
// backend, with real loop devices and real filesystems (ext4 and xfs): a
// file written to a volume is in a snapshot of it; the source volume is
// deleted and the snapshot restored at twice its size: the file is intact,
// the filesystem was grown to the larger device when the node staged it,
// and it needs no repair; a clone of the restored volume at a larger size
// again holds the file on a grown filesystem.
func TestRestoreAndCloneOnLoopDevices(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			in, c := startBackend(t, "local")
			ctx := context.Background()
			vc := apptest.MountCap(fsType)
			size := int64(64 << 20)
			if fsType == "xfs" {
				size = driver.MinXFSBytes
			}
			src := createVolume(t, c, "source", size, vc, nil).VolumeId
			target, down := volumeChain(t, c, in.Dir, src, vc)
			data := []byte("written to the source before its snapshot\n")
			if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			down()
			snap := apptest.R(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "backup", SourceVolumeId: src})).Must(t).Snapshot
			apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src})).Must(t)

			restored := createVolume(t, c, "restored", 2*size, vc, fromSnapshot(snap.SnapshotId))
			clone := ""
			for _, w := range []struct {
				id   string
				size int64
			}{{restored.VolumeId, 2 * size}, {"", 3 * size}} {
				if w.id == "" { // the clone, of the restored volume, once that is down again
					w.id = createVolume(t, c, "clone", w.size, vc, fromVolume(restored.VolumeId)).VolumeId
					clone = w.id
				}
				target, down := volumeChain(t, c, in.Dir, w.id, vc)
				if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || !bytes.Equal(got, data) {
					t.Errorf("volume %s: the file reads %q, %v; want %q", w.id, got, err, data)
				}
				stats := apptest.R(c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: w.id, VolumePath: target})).Must(t)
				if total := stats.Usage[0].Total; total < w.size*8/10 {
					t.Errorf("volume %s: a filesystem of %d bytes on a %d-byte device: not grown at stage", w.id, total, w.size)
				}
				down()
			}
			insp, err := local.OpenInspector(in.Dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range newHostView(t, in.Dir).disks(t) {
				fsckImage(t, fsType, insp.ImagePath(d.ID))
			}
			for _, id := range []string{clone, restored.VolumeId} {
				apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
			}
			apptest.R(c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})).Must(t)
			in.Stop(t)
			checkNothingLeft(t, "restore and clone", in.Dir)
		})
	}
}
