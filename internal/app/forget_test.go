package app_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// nodeVolumes lists the volume records of the node plugin in dir through
// its admin socket.
func nodeVolumes(t *testing.T, dir string) []view.Volume {
	t.Helper()
	c := admin.NewClient(app.AdminSocketPath(dir, driver.ModeNode), 5*time.Second)
	defer c.Close()
	l, err := c.Volumes(context.Background(), view.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Volumes
}

// TestNodeForgetsWhatIsGone: a node plugin keeps a volume's record only
// while the volume has a staging or a target on its node. After 1,000
// volumes went through stage, publish, unpublish and unstage, its state
// holds no volume record and csid_volumes is 0 in every state; a record
// whose mounts vanished while the node was down (a reboot) is forgotten at
// start, and so is one a failed stage left; kubelet's next NodeStage
// brings each back.
func TestNodeForgetsWhatIsGone(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"1000 volumes through stage, publish, unpublish and unstage", forgetsThousand},
		{"mounts gone while the node was down", forgetsVanished},
		{"a failed stage", forgetsFailedStage},
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

func forgetsThousand(t *testing.T) {
	const volumes, workers = 1000, 16
	dir := apptest.ShortTempDir(t)
	kubelet := filepath.Join(dir, "kubelet")
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	ctrl := apptest.Start(t, app.Options{Mode: driver.ModeController, Cloud: "fake", Fake: f, StateDir: dir,
		Endpoint: "unix://" + filepath.Join(dir, "controller.sock"), Log: zerolog.Nop()})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	node := apptest.Start(t, app.Options{Mode: driver.ModeNode, Cloud: "fake", Fake: f, StateDir: dir, KubeletRoot: kubelet,
		Endpoint: "unix://" + filepath.Join(dir, "node.sock"), MetricsListener: lis, Log: zerolog.Nop()})
	c, n := apptest.Dial(t, ctrl.Socket), apptest.Dial(t, node.Socket)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	lifecycle := func(i int) error {
		name := fmt.Sprintf("pvc-%04d", i)
		staging := filepath.Join(kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, name, "globalmount")
		target := filepath.Join(kubelet, "pods", name, "volumes/kubernetes.io~csi", name, "mount")
		for _, d := range []string{staging, filepath.Dir(target)} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				return err
			}
		}
		v, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{vc}})
		if err != nil {
			return err
		}
		id := v.Volume.VolumeId
		pc, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})
		if err != nil {
			return err
		}
		for _, call := range []func() error{
			func() error {
				_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pc.PublishContext})
				return err
			},
			func() error {
				_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc})
				return err
			},
			func() error {
				_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
				return err
			},
			func() error {
				_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
				return err
			},
			func() error {
				_, err := c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})
				return err
			},
			func() error { _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); return err },
		} {
			if err := call(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, volumes)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := lifecycle(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range volumes {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if vols := nodeVolumes(t, dir); len(vols) != 0 {
		t.Errorf("the node holds %d volume records after every volume left it, want 0: first %+v", len(vols), vols[0])
	}
	m := scrape(t, "http://"+lis.Addr().String())
	for _, st := range fsm.States {
		if got := m.value(t, "csid_volumes", "state="+string(st)); got != 0 {
			t.Errorf("csid_volumes{state=%s} = %v on the node, want 0", st, got)
		}
	}
}

func forgetsVanished(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	s := startSplit(t, dir)
	ctx := context.Background()
	id, stage, targets := useKubeletVolume(t, s.c, s.n, filepath.Join(dir, "kubelet"), "pvc-a", "pod-a")
	s.node.Stop(t)
	for _, p := range append(targets, stage) { // the reboot
		if err := unix.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.startNode(t)
	if vols := nodeVolumes(t, dir); len(vols) != 0 {
		t.Fatalf("after a reboot the node still holds %+v, want nothing", vols)
	}
	// Kubelet stages and publishes again: the node meets the volume anew.
	pc := apptest.R(s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1",
		VolumeCapability: apptest.MountCap("ext4")})).Must(t)
	apptest.R(s.n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage,
		VolumeCapability: apptest.MountCap("ext4"), PublishContext: pc.PublishContext})).Must(t)
	if vols := nodeVolumes(t, dir); len(vols) != 1 || vols[0].State != fsm.VolReady {
		t.Fatalf("after the new stage the node holds %+v, want the volume VOL_READY", vols)
	}
	apptest.R(s.n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	if vols := nodeVolumes(t, dir); len(vols) != 0 {
		t.Fatalf("after the unstage the node holds %+v, want nothing", vols)
	}
}

func forgetsFailedStage(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	s := startSplit(t, dir)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	id := useVolume(t, s.c, s.n, "pvc-a", "", nil)
	pc := apptest.R(s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	file := filepath.Join(dir, "kubelet", "plugins/kubernetes.io/csi", driver.DefaultName, "x", "globalmount")
	writeFile(t, file, "in the way")
	_, err := s.n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: file, VolumeCapability: vc, PublishContext: pc.PublishContext})
	if err == nil {
		t.Fatal("a stage onto a regular file succeeded")
	}
	if vols := nodeVolumes(t, dir); len(vols) != 1 || vols[0].State != fsm.NodeReady {
		t.Fatalf("after the failed stage the node holds %+v, want the volume NODE_READY", vols)
	}
	s.node.Stop(t)
	s.startNode(t)
	if vols := nodeVolumes(t, dir); len(vols) != 0 {
		t.Fatalf("after a restart the node still holds %+v, want nothing", vols)
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
