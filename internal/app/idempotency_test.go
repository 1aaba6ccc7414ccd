package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestIdempotency drives a volume through its whole lifecycle against a
// real csid (local backend: sparse files, loop devices, mkfs, mounts) twice:
// first sending every RPC 3 times in a row, then sending every RPC from 8
// goroutines released at once. Each time all answers must be equal (the
// same response, or the same code and message), and after each step the
// host must show exactly one of each resource: one disk, one loop device
// for it, one mount at the staging path and one per target.
//
// A duplicate may join the op in flight or be answered from the stored
// result; either way its answer is the same. Different ops are never sent
// at once on one volume here (csid answers those Aborted, by design).
func TestIdempotency(t *testing.T) {
	testutil.RequireRoot(t)
	// A private tmpfs: GetCapacity reports the free space of the state
	// dir's file system, which must change only with what this test does.
	dir := tmpfsDir(t)
	in := apptest.Start(t, app.Options{Cloud: "local", StateDir: dir, Log: zerolog.Nop()})
	h := newHostView(t, dir)
	c := apptest.Dial(t, in.Socket)

	t.Run("sequential x3", func(t *testing.T) {
		lifecycle(t, c, h, repeat{n: 3}, filepath.Join(dir, "seq"))
	})
	t.Run("concurrent x8", func(t *testing.T) {
		lifecycle(t, c, h, repeat{n: 8, concurrent: true}, filepath.Join(dir, "conc"))
	})
}

// repeat says how to send each RPC: n times in a row, or n at once.
type repeat struct {
	n          int
	concurrent bool
}

// answer is one RPC's outcome.
type answer[R proto.Message] struct {
	resp R
	err  error
}

// same sends call r.n times (in a row, or from r.n goroutines released
// together) and fails the test unless every answer equals the first: equal
// responses (proto.Equal), or errors with the same code and message. It
// returns the first answer.
func same[R proto.Message](t *testing.T, r repeat, rpc string, call func(ctx context.Context) (R, error)) (R, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answers := make([]answer[R], r.n)
	if r.concurrent {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				answers[i].resp, answers[i].err = call(ctx)
			}()
		}
		close(start)
		wg.Wait()
	} else {
		for i := range answers {
			answers[i].resp, answers[i].err = call(ctx)
		}
	}
	first := answers[0]
	for i, a := range answers[1:] {
		switch {
		case (first.err == nil) != (a.err == nil):
			t.Errorf("%s: answer %d is (%v, %v), answer 1 is (%v, %v)", rpc, i+2, a.resp, a.err, first.resp, first.err)
		case first.err != nil:
			s0, s := status.Convert(first.err), status.Convert(a.err)
			if s0.Code() != s.Code() || s0.Message() != s.Message() {
				t.Errorf("%s: answer %d is %v, answer 1 is %v", rpc, i+2, a.err, first.err)
			}
		case !proto.Equal(first.resp, a.resp):
			t.Errorf("%s: answer %d is %v, answer 1 is %v", rpc, i+2, a.resp, first.resp)
		}
	}
	return first.resp, first.err
}

// mustOK fails the test now if err is not nil.
func mustOK(t *testing.T, rpc string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", rpc, err)
	}
}

const mib = int64(1) << 20

// lifecycle is one pass of TestIdempotency. base is a fresh directory for
// the pass's staging and target paths.
func lifecycle(t *testing.T, c apptest.Client, h *hostView, r repeat, base string) {
	staging := filepath.Join(base, "staging")
	target1, target2 := filepath.Join(base, "pods", "a", "mount"), filepath.Join(base, "pods", "b", "mount")
	// The CO creates the staging directory and the targets' parents.
	for _, d := range []string{staging, filepath.Dir(target1), filepath.Dir(target2)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	vc := mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	name := "idempotency-" + filepath.Base(base)

	// CreateVolume.
	created, err := same(t, r, "CreateVolume", func(ctx context.Context) (*csi.CreateVolumeResponse, error) {
		return c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{vc},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}})
	})
	mustOK(t, "CreateVolume", err)
	vol := created.GetVolume()
	if vol.GetVolumeId() == "" || vol.GetCapacityBytes() != 64*mib {
		t.Fatalf("CreateVolume answered %v, want a volume of %d bytes", vol, 64*mib)
	}
	id := vol.GetVolumeId()
	disks := h.disks(t)
	if len(disks) != 1 || disks[0].Tags[effects.TagVolumeID] != id {
		t.Fatalf("after CreateVolume the cloud has disks %+v, want exactly one, of volume %s", disks, id)
	}
	disk := disks[0].ID
	h.expectHost(t, "CreateVolume", want{disk: disk, sizeBytes: 64 * mib})

	// ControllerExpandVolume of the detached volume: it grows now.
	expanded, err := same(t, r, "ControllerExpandVolume (detached)", func(ctx context.Context) (*csi.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 80 * mib}, VolumeCapability: vc})
	})
	mustOK(t, "ControllerExpandVolume (detached)", err)
	if expanded.GetCapacityBytes() != 80*mib || !expanded.GetNodeExpansionRequired() {
		t.Errorf("ControllerExpandVolume (detached) answered %v, want %d bytes and node expansion", expanded, 80*mib)
	}
	h.expectHost(t, "ControllerExpandVolume (detached)", want{disk: disk, sizeBytes: 80 * mib})

	// The controller's read-only RPCs.
	reads(t, c, r, id, vc, "")
	if cp, err := same(t, r, "GetCapacity", func(ctx context.Context) (*csi.GetCapacityResponse, error) {
		return c.GetCapacity(ctx, &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{vc}})
	}); err != nil || cp.GetAvailableCapacity() <= 0 {
		t.Errorf("GetCapacity answered (%v, %v), want some free capacity", cp, err)
	}
	info, err := same(t, r, "NodeGetInfo", func(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
		return c.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	})
	mustOK(t, "NodeGetInfo", err)
	if info.GetNodeId() != "node-1" {
		t.Fatalf("NodeGetInfo answered node %q, want node-1", info.GetNodeId())
	}

	// ControllerPublishVolume.
	published, err := same(t, r, "ControllerPublishVolume", func(ctx context.Context) (*csi.ControllerPublishVolumeResponse, error) {
		return c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})
	})
	mustOK(t, "ControllerPublishVolume", err)
	if got := published.GetPublishContext()[effects.PublishContextDiskID]; got != disk {
		t.Errorf("ControllerPublishVolume's publish context names disk %q, want %s", got, disk)
	}
	h.expectHost(t, "ControllerPublishVolume", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1"})

	// NodeStageVolume.
	_, err = same(t, r, "NodeStageVolume", func(ctx context.Context) (*csi.NodeStageVolumeResponse, error) {
		return c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: vc, PublishContext: published.GetPublishContext()})
	})
	mustOK(t, "NodeStageVolume", err)
	h.expectHost(t, "NodeStageVolume", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1", loops: 1,
		mounted: []string{staging}})

	// NodePublishVolume at two targets (two pods on the node).
	for i, target := range []string{target1, target2} {
		rpc := fmt.Sprintf("NodePublishVolume (target %d)", i+1)
		_, err := same(t, r, rpc, func(ctx context.Context) (*csi.NodePublishVolumeResponse, error) {
			return c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				TargetPath: target, VolumeCapability: vc, PublishContext: published.GetPublishContext()})
		})
		mustOK(t, rpc, err)
	}
	h.expectHost(t, "NodePublishVolume", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1", loops: 1,
		mounted: []string{staging, target1, target2}})

	// NodeGetVolumeStats at a target and at the staging path.
	for _, p := range []string{target1, staging} {
		st, err := same(t, r, "NodeGetVolumeStats "+p, func(ctx context.Context) (*csi.NodeGetVolumeStatsResponse, error) {
			return c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p, StagingTargetPath: staging})
		})
		mustOK(t, "NodeGetVolumeStats", err)
		if len(st.GetUsage()) == 0 || st.GetUsage()[0].GetTotal() <= 0 {
			t.Errorf("NodeGetVolumeStats at %s answered %v, want the usage of a filesystem", p, st)
		}
	}
	reads(t, c, r, id, vc, "node-1")

	// ControllerExpandVolume of the attached volume: FailedPrecondition,
	// the resize queued until the volume is unpublished.
	_, err = same(t, r, "ControllerExpandVolume (attached)", func(ctx context.Context) (*csi.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 96 * mib}, VolumeCapability: vc})
	})
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || !strings.Contains(s.Message(), "queued") {
		t.Errorf("ControllerExpandVolume (attached) answered %v, want FailedPrecondition saying the resize is queued", err)
	}
	h.expectHost(t, "ControllerExpandVolume (attached)", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1", loops: 1,
		mounted: []string{staging, target1, target2}})

	// NodeExpandVolume.
	nodeExpanded, err := same(t, r, "NodeExpandVolume", func(ctx context.Context) (*csi.NodeExpandVolumeResponse, error) {
		return c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target1,
			StagingTargetPath: staging, VolumeCapability: vc})
	})
	mustOK(t, "NodeExpandVolume", err)
	if nodeExpanded.GetCapacityBytes() != 80*mib {
		t.Errorf("NodeExpandVolume answered %d bytes, want %d", nodeExpanded.GetCapacityBytes(), 80*mib)
	}

	// Back down: NodeUnpublishVolume of each target.
	for i, target := range []string{target2, target1} {
		rpc := fmt.Sprintf("NodeUnpublishVolume (target %d)", 2-i)
		_, err := same(t, r, rpc, func(ctx context.Context) (*csi.NodeUnpublishVolumeResponse, error) {
			return c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		})
		mustOK(t, rpc, err)
		if _, err := os.Lstat(target); !os.IsNotExist(err) {
			t.Errorf("%s left %s behind (%v); the plugin must remove the target it created", rpc, target, err)
		}
	}
	h.expectHost(t, "NodeUnpublishVolume", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1", loops: 1,
		mounted: []string{staging}})

	// NodeUnstageVolume.
	_, err = same(t, r, "NodeUnstageVolume", func(ctx context.Context) (*csi.NodeUnstageVolumeResponse, error) {
		return c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	mustOK(t, "NodeUnstageVolume", err)
	h.expectHost(t, "NodeUnstageVolume", want{disk: disk, sizeBytes: 80 * mib, attachedTo: "node-1", loops: 1})

	// ControllerUnpublishVolume: detached, and the queued resize starts.
	_, err = same(t, r, "ControllerUnpublishVolume", func(ctx context.Context) (*csi.ControllerUnpublishVolumeResponse, error) {
		return c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})
	})
	mustOK(t, "ControllerUnpublishVolume", err)

	// The resizer's retry of the queued expansion waits for the resize the
	// unpublish started, and reports the new size.
	expanded, err = same(t, r, "ControllerExpandVolume (after unpublish)", func(ctx context.Context) (*csi.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 96 * mib}, VolumeCapability: vc})
	})
	mustOK(t, "ControllerExpandVolume (after unpublish)", err)
	if expanded.GetCapacityBytes() != 96*mib || !expanded.GetNodeExpansionRequired() {
		t.Errorf("ControllerExpandVolume (after unpublish) answered %v, want %d bytes and node expansion", expanded, 96*mib)
	}
	h.expectHost(t, "ControllerUnpublishVolume and the queued resize", want{disk: disk, sizeBytes: 96 * mib})

	// DeleteVolume.
	_, err = same(t, r, "DeleteVolume", func(ctx context.Context) (*csi.DeleteVolumeResponse, error) {
		return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	})
	mustOK(t, "DeleteVolume", err)
	h.expectHost(t, "DeleteVolume", want{})
	list, err := c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	mustOK(t, "ListVolumes", err)
	if len(list.GetEntries()) != 0 {
		t.Errorf("after DeleteVolume ListVolumes still lists %v", list.GetEntries())
	}
}

// reads sends the controller's read-only RPCs about volume id and checks
// that they agree with each other: the volume, published to node ("" for
// none).
func reads(t *testing.T, c apptest.Client, r repeat, id string, vc *csi.VolumeCapability, node string) {
	t.Helper()
	var wantNodes []string
	if node != "" {
		wantNodes = []string{node}
	}
	list, err := same(t, r, "ListVolumes", func(ctx context.Context) (*csi.ListVolumesResponse, error) {
		return c.ListVolumes(ctx, &csi.ListVolumesRequest{})
	})
	mustOK(t, "ListVolumes", err)
	if e := list.GetEntries(); len(e) != 1 || e[0].GetVolume().GetVolumeId() != id ||
		!slices.Equal(e[0].GetStatus().GetPublishedNodeIds(), wantNodes) {
		t.Errorf("ListVolumes answered %v, want volume %s published to %v", list, id, wantNodes)
	}
	got, err := same(t, r, "ControllerGetVolume", func(ctx context.Context) (*csi.ControllerGetVolumeResponse, error) {
		return c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
	})
	mustOK(t, "ControllerGetVolume", err)
	if got.GetVolume().GetVolumeId() != id || !slices.Equal(got.GetStatus().GetPublishedNodeIds(), wantNodes) {
		t.Errorf("ControllerGetVolume answered %v, want volume %s published to %v", got, id, wantNodes)
	}
	valid, err := same(t, r, "ValidateVolumeCapabilities", func(ctx context.Context) (*csi.ValidateVolumeCapabilitiesResponse, error) {
		return c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id,
			VolumeCapabilities: []*csi.VolumeCapability{vc}})
	})
	mustOK(t, "ValidateVolumeCapabilities", err)
	if valid.GetConfirmed() == nil {
		t.Errorf("ValidateVolumeCapabilities did not confirm the volume's own capability: %v", valid)
	}
}
