package app_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/drill"
	"github.com/csid-dev/csid/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// storm drives the overlay like an orchestrator through SIGKILLs: each
// call is retried with the same arguments until it gives the answer
// wanted; a process that died (a crash point it was armed with, or the
// test's own SIGKILL) is started again, unarmed, first.
type storm struct {
	*overlay
	t        *testing.T
	restarts int
}

// role is one of the two processes.
type role int

const (
	ctrl role = iota
	node
)

func (s *storm) child(r role) *child {
	if r == ctrl {
		return s.controller
	}
	return s.node
}

// start (re)starts a process, armed at point ("" for none).
func (s *storm) start(r role, point string) {
	s.t.Helper()
	if r == node {
		s.startNode(s.t, point)
		return
	}
	s.startController(s.t, point)
}

// arm SIGKILLs a process between two calls and starts it again armed at
// point: its next hit of the point kills it.
func (s *storm) arm(r role, point string) {
	s.t.Helper()
	s.child(r).kill(s.t)
	s.start(r, point)
}

// call makes a CSI call on process r until its code is want, starting the
// process again when it died under the call.
func (s *storm) call(r role, what string, want codes.Code, fn func() error) {
	s.t.Helper()
	for range 20 {
		err := fn()
		code := status.Code(err)
		switch {
		case code == want:
			return
		case code == codes.Unavailable:
			s.child(r).waitKilled(s.t)
			s.restarts++
			s.start(r, "")
		default:
			s.t.Fatalf("%s: %v, want %s", what, err, want)
		}
	}
	s.t.Fatalf("%s: still failing after 20 restarts", what)
}

// up creates a raw block volume, attaches, stages and publishes it, and
// writes its marker through its target.
func (s *storm) up(name string, vc *csi.VolumeCapability) (id, staging, target string) {
	s.t.Helper()
	ctx := context.Background()
	var pc map[string]string
	s.call(ctrl, "CreateVolume "+name, codes.OK, func() error {
		resp, err := s.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(16 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}})
		if err == nil {
			id = resp.Volume.VolumeId
		}
		return err
	})
	s.call(ctrl, "ControllerPublishVolume "+name, codes.OK, func() error {
		resp, err := s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})
		if err == nil {
			pc = resp.PublishContext
		}
		return err
	})
	staging = s.blockStaging(s.t, "pv-"+name)
	s.call(node, "NodeStageVolume "+name, codes.OK, func() error { return s.stage(id, staging, vc, pc) })
	target = s.blockTarget(s.t, "pv-"+name, "pod-"+name)
	s.call(node, "NodePublishVolume "+name, codes.OK, func() error { return s.publish(id, staging, target, vc) })
	writeMarker(s.t, target, id, 16*drill.MarkerBlock)
	return id, staging, target
}

// TestDeviceReuseCrashStorm: raw block volumes come and go on the overlay
// while both processes are SIGKILLed between calls and at crash points
// inside them. In each round a new volume is attached and published, the
// previous one is force-detached while the node still records it staged,
// and the next volume takes the loop device it let go (on purpose: the
// test stages volumes until one does). Each volume's pod writes a marker
// unique to the volume into the first blocks of its device. Through it
// all, a read through any target returns its own volume's marker, never
// another's, and no publish of a force-detached volume succeeds; once the
// attacher attaches those again, they are published from their own disks.
func TestDeviceReuseCrashStorm(t *testing.T) {
	testutil.RequireRoot(t)
	s := &storm{overlay: startOverlay(t), t: t}
	ctx := context.Background()
	vc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	nodePoints := []string{crash.NodeAfterLosetup, crash.OpsBeforeCommit, crash.OpsBeforeEffect, crash.OpsQueued}
	ctrlPoints := []string{crash.UnpublishAfterDetach, crash.CloudAfterAttach, crash.OpsBeforeCommit, crash.OpsQueued}

	type vol struct{ id, staging, target string }
	var live, stale []vol
	readAll := func(when string) {
		t.Helper()
		for _, v := range live {
			expectMarker(t, fmt.Sprintf("%s: the target of %s", when, v.id), v.target, v.id)
		}
	}
	var prev *vol       // the last round's volume
	var released string // the device its force detach let go
	reused := 0
	for round := range len(nodePoints) {
		s.arm(node, nodePoints[round])
		s.arm(ctrl, ctrlPoints[round])
		if prev != nil {
			// The last round's volume goes stale: its pod goes, and the
			// controller detaches it while the node still has it staged.
			released = s.stagedDevice(t, prev.id)
			s.call(node, "NodeUnpublishVolume "+prev.id, codes.OK, func() error {
				_, err := s.n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: prev.id, TargetPath: prev.target})
				return err
			})
			s.call(ctrl, "ControllerUnpublishVolume "+prev.id, codes.OK, func() error {
				_, err := s.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: prev.id, NodeId: "node-1"})
				return err
			})
			live = slices.DeleteFunc(live, func(v vol) bool { return v.id == prev.id })
			stale = append(stale, *prev)
		}
		// Volumes are attached until one takes the released device (another
		// test may take it first); each stays published.
		var v vol
		for try := range 5 {
			v.id, v.staging, v.target = s.up(fmt.Sprintf("r%d-%d", round, try), vc)
			live = append(live, v)
			if released == "" {
				break
			}
			if s.stagedDevice(t, v.id) == released {
				reused++
				break
			}
		}
		prev = &v
		readAll(fmt.Sprintf("round %d", round))
		for _, o := range stale {
			again := s.blockTarget(t, "pv-again", "pod-"+o.id)
			s.call(node, "NodePublishVolume of force-detached "+o.id, codes.FailedPrecondition, func() error {
				return s.publish(o.id, o.staging, again, vc)
			})
			notThere(t, "the refused publish of "+o.id, again)
		}
		readAll(fmt.Sprintf("round %d, after the refused publishes", round))
	}
	if reused == 0 {
		t.Fatal("no volume took a device another volume let go: the storm tested nothing")
	}
	t.Logf("%d rounds, %d device reuses, %d restarts after a crash", len(nodePoints), reused, s.restarts)

	// The attacher attaches the force-detached volumes again: each is
	// published from its own disk, whatever its record remembered.
	s.arm(node, "")
	s.arm(ctrl, "")
	for _, o := range stale {
		var pc map[string]string
		s.call(ctrl, "ControllerPublishVolume again "+o.id, codes.OK, func() error {
			resp, err := s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: o.id, NodeId: "node-1", VolumeCapability: vc})
			if err == nil {
				pc = resp.PublishContext
			}
			return err
		})
		s.call(node, "NodeStageVolume again "+o.id, codes.OK, func() error { return s.stage(o.id, o.staging, vc, pc) })
		o.target = s.blockTarget(t, "pv-again", "pod-"+o.id)
		s.call(node, "NodePublishVolume again "+o.id, codes.OK, func() error { return s.publish(o.id, o.staging, o.target, vc) })
		live = append(live, o)
	}
	readAll("all attached again")
	for _, v := range live {
		s.unpublish(t, v.id, v.target)
		s.unstage(t, v.id, v.staging)
		s.detach(t, v.id)
	}
	s.clean(t)
}
