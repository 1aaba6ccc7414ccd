package app_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

// diskOf reads a disk of the local backend in dir, as the cloud has it.
func diskOf(t *testing.T, dir, id string) cloud.Disk {
	t.Helper()
	insp, err := local.OpenInspector(dir)
	if err != nil {
		t.Fatal(err)
	}
	disks, err := insp.Disks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("no disk %s in %s", id, dir)
	return cloud.Disk{}
}

// TestQueuedResizeSurvivesALostStateFile is issue 15's story on the local
// backend with real loop devices: an expansion of a volume in use is
// queued, and recorded on its disk (the resize-to tag) before csid answers
// FailedPrecondition; the state file is lost; csid, started with
// --rebuild-from-cloud, rebuilds the volume with its queued resize; the
// pod goes, the volume is detached, and the disk is grown exactly once,
// its tag cleared; the next stage shows the grown filesystem and the data.
func TestQueuedResizeSurvivesALostStateFile(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	root := filepath.Join(dir, "kubelet")
	opts := app.Options{Cloud: "local", StateDir: dir, NodeID: "node-1", KubeletRoot: root, Log: zerolog.Nop()}
	in := apptest.Start(t, opts)
	c := apptest.Dial(t, in.Socket)
	ctx := context.Background()
	const size, grown = 64 << 20, 128 << 20
	vc := apptest.MountCap("ext4")
	id, stage, targets := useKubeletVolume(t, c, c, root, "pvc-grow", "pod-a")
	data := []byte("written before the expansion\n")
	if err := os.WriteFile(filepath.Join(targets[0], "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	before := apptest.R(c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: targets[0]})).Must(t).Usage[0].Total
	expand := &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(grown), VolumeCapability: vc}
	_, err := c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, "queued")
	diskID := inspectVolume(t, dir, driver.ModeAll, id).DiskID
	if d := diskOf(t, dir, diskID); d.Tags[effects.TagResizeTo] != "134217728" || d.SizeBytes != size {
		t.Fatalf("after the expansion was queued, the disk is %d bytes with tags %v; want its resize-to tag", d.SizeBytes, d.Tags)
	}

	// The state file is lost.
	in.Stop(t)
	if err := os.Remove(app.StateFile(dir, driver.ModeAll)); err != nil {
		t.Fatal(err)
	}
	opts.RebuildFromCloud = true
	in = apptest.Start(t, opts)
	c = apptest.Dial(t, in.Socket)
	src := admin.NewClient(app.AdminSocketPath(dir, driver.ModeAll), 5*time.Second)
	defer src.Close()
	v, err := src.Volume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Resize == nil || v.Resize.TargetBytes != grown || v.State != fsm.Published {
		t.Fatalf("after the rebuild: %s with resize %+v; want PUBLISHED with the resize to %d queued", v.State, v.Resize, grown)
	}
	_, err = c.ControllerExpandVolume(ctx, expand) // the resizer's retry joins the rebuilt queue
	wantCode(t, err, codes.FailedPrecondition, "queued")

	// The pod goes; the detach runs the resize.
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targets[0]})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	if exp := apptest.R(c.ControllerExpandVolume(ctx, expand)).Must(t); exp.CapacityBytes != grown {
		t.Fatalf("after the detach, expand answers %+v", exp)
	}
	if d := diskOf(t, dir, diskID); d.SizeBytes != grown || d.Tags[effects.TagResizeTo] != "" {
		t.Fatalf("after the resize the disk is %d bytes with tags %v; want %d and no resize-to tag", d.SizeBytes, d.Tags, grown)
	}
	v, err = src.Volume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	resizes := 0
	for _, h := range v.History {
		if h.Event == fsm.Expand && h.Guard == "" && h.Op != 0 {
			resizes++
		}
	}
	if resizes != 1 || v.Resize != nil {
		t.Fatalf("history after the rebuild shows %d resizes (want exactly 1), queue %+v:\n%+v", resizes, v.Resize, v.History)
	}

	// The next pod sees the grown filesystem and its data.
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc, PublishContext: pub.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: targets[0], StagingTargetPath: stage, VolumeCapability: vc})).Must(t)
	if got, err := os.ReadFile(filepath.Join(targets[0], "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file after the resize: %q, %v", got, err)
	}
	total := apptest.R(c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: targets[0]})).Must(t).Usage[0].Total
	if total < before+(grown-size)*9/10 {
		t.Fatalf("the filesystem is %d bytes, %d before: not grown to the %d-byte disk", total, before, grown)
	}
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targets[0]})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	in.Stop(t)
	checkNothingLeft(t, "resize tag", dir)
}
