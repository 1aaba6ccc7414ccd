package app_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/testutil"
	"google.golang.org/grpc/codes"
)

// TestControllerConfirmsWithTheCloud: with the controller and the node as
// separate csids on one state directory (the single-node overlay's shape),
// the cloud is changed behind the controller's back, and the controller's
// repeated answers follow the cloud, not its record: a disk detached out of
// band is attached again by the next ControllerPublishVolume (and the node
// then stages it); a disk attached out of band is detached by the next
// ControllerUnpublishVolume; a volume whose disk was deleted out of band is
// not "created already".
func TestControllerConfirmsWithTheCloud(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	s := startSplit(t, dir)
	h := newHostView(t, dir)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	create := &csi.CreateVolumeRequest{Name: "pvc-a", CapacityRange: capRange(64 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}}
	id := apptest.R(s.c.CreateVolume(ctx, create)).Must(t).Volume.VolumeId
	publish := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc}
	pub := apptest.R(s.c.ControllerPublishVolume(ctx, publish)).Must(t)
	disk := pub.PublishContext[effects.PublishContextDiskID]
	attachedTo := func() string {
		t.Helper()
		d, err := h.cloud.GetDisk(ctx, disk)
		if err != nil {
			t.Fatal(err)
		}
		return d.AttachedTo
	}
	do := func(op cloud.Operation, err error) {
		t.Helper()
		if err == nil {
			_, err = h.cloud.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	// Detached out of band: the repeated publish attaches it again.
	do(h.cloud.DetachDisk(ctx, disk, "node-1"))
	apptest.R(s.c.ControllerPublishVolume(ctx, publish)).Must(t)
	if got := attachedTo(); got != "node-1" {
		t.Fatalf("after a repeated publish of a disk detached out of band, it is attached to %q, want node-1", got)
	}
	stage := filepath.Join(dir, "kubelet", "stage-a")
	if err := os.MkdirAll(filepath.Dir(stage), 0o750); err != nil {
		t.Fatal(err)
	}
	apptest.R(s.n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc,
		PublishContext: pub.PublishContext})).Must(t)
	apptest.R(s.n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)

	// Attached out of band: the repeated unpublish detaches it.
	unpublish := &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"}
	apptest.R(s.c.ControllerUnpublishVolume(ctx, unpublish)).Must(t)
	do(h.cloud.AttachDisk(ctx, disk, "node-1"))
	apptest.R(s.c.ControllerUnpublishVolume(ctx, unpublish)).Must(t)
	if got := attachedTo(); got != "" {
		t.Fatalf("after a repeated unpublish of a disk attached out of band, it is attached to %q", got)
	}

	// Deleted out of band: the create by name is not answered from the record.
	do(h.cloud.DeleteDisk(ctx, disk))
	_, err := s.c.CreateVolume(ctx, create)
	wantCode(t, err, codes.FailedPrecondition, "no longer exists in the cloud")
	apptest.R(s.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	s.controller.Stop(t)
	s.node.Stop(t)
	checkNothingLeft(t, "confirm", dir)
}
