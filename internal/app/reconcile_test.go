package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
)

// split runs a controller and a node csid on one state dir, as the
// Kubernetes deploy does on a single-node cluster with the local backend.
type split struct {
	dir              string
	controller, node *apptest.Instance
	c, n             apptest.Client
}

func startSplit(t *testing.T, dir string) *split {
	t.Helper()
	s := &split{dir: dir}
	s.startController(t)
	s.startNode(t)
	return s
}

func (s *split) controllerOptions() app.Options {
	return app.Options{Cloud: "local", StateDir: s.dir, Mode: driver.ModeController, Endpoint: "unix://" + s.dir + "/controller.sock", Log: zerolog.Nop()}
}

// nodeOptions are the node plugin's, confined to the kubelet directory in
// the state dir as the manifests confine it to /var/lib/kubelet.
func (s *split) nodeOptions() app.Options {
	return app.Options{Cloud: "local", StateDir: s.dir, Mode: driver.ModeNode, NodeID: "node-1",
		Endpoint: "unix://" + s.dir + "/node.sock", KubeletRoot: filepath.Join(s.dir, "kubelet"), Log: zerolog.Nop()}
}

func (s *split) startController(t *testing.T) { s.startControllerWith(t, s.controllerOptions()) }

func (s *split) startControllerWith(t *testing.T, o app.Options) {
	t.Helper()
	s.controller = apptest.Start(t, o)
	s.c = apptest.Dial(t, s.controller.Socket)
}

func (s *split) startNode(t *testing.T) { s.startNodeWith(t, s.nodeOptions()) }

func (s *split) startNodeWith(t *testing.T, o app.Options) {
	t.Helper()
	s.node = apptest.Start(t, o)
	s.n = apptest.Dial(t, s.node.Socket)
}

// refused runs csid with o and returns the error it stops with; the test
// fails if it starts instead.
func refused(t *testing.T, o app.Options) error {
	t.Helper()
	ready := make(chan struct{})
	o.Ready = ready
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("csid stopped without an error")
		}
		return err
	case <-ready:
		cancel()
		<-done
		t.Fatal("csid started")
	}
	return nil
}

// wantRefusedNewFile checks that csid refuses to start on a new state
// file, naming it, the disk that shows it held volumes, and the way out.
func wantRefusedNewFile(t *testing.T, err error, file, disk string) {
	t.Helper()
	for _, want := range []string{"the state file " + file + " is new", disk, "--rebuild-from-cloud", "Restore it from a backup"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

// useKubeletVolume creates a volume and uses it as kubelet would: staged
// at kubelet's staging path for it (named by the sha256 of its id),
// published at a target for each pod, with kubelet's vol_data.json beside
// each target. It returns the id and the paths.
func useKubeletVolume(t *testing.T, c, n apptest.Client, root, name string, pods ...string) (id, stage string, targets []string) {
	t.Helper()
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	id = apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(64 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	stage = apptest.KubeletStaging(root, id)
	for _, pod := range pods {
		tp := filepath.Join(root, "pods", pod, "volumes/kubernetes.io~csi", name, "mount")
		apptest.WriteVolData(t, filepath.Dir(tp), id)
		targets = append(targets, tp)
	}
	if err := os.MkdirAll(stage, 0o750); err != nil {
		t.Fatal(err)
	}
	apptest.WriteVolData(t, filepath.Dir(stage), id)
	pc := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc, PublishContext: pc.PublishContext})).Must(t)
	for _, tp := range targets {
		apptest.R(n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: tp, StagingTargetPath: stage, VolumeCapability: vc})).Must(t)
	}
	return id, stage, targets
}

// kubeletPaths are where kubelet stages and publishes a filesystem volume.
func kubeletPaths(root, volumeID string, pods ...string) (stage string, targets []string) {
	stage = filepath.Join(root, "plugins/kubernetes.io/csi", driver.DefaultName, volumeID[4:14], "globalmount")
	for _, pod := range pods {
		targets = append(targets, filepath.Join(root, "pods", pod, "volumes/kubernetes.io~csi/pv-"+volumeID[4:10], "mount"))
	}
	return stage, targets
}

// useVolume creates a volume, attaches it to node-1, stages it and
// publishes it at the targets; it returns the volume id.
func useVolume(t *testing.T, c, n apptest.Client, name, stage string, targets []string) string {
	t.Helper()
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(64 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	if stage == "" {
		return id
	}
	if err := os.MkdirAll(stage, 0o750); err != nil {
		t.Fatal(err)
	}
	apptest.R(n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc, PublishContext: pub.PublishContext})).Must(t)
	for _, tp := range targets {
		if err := os.MkdirAll(filepath.Dir(tp), 0o750); err != nil {
			t.Fatal(err)
		}
		apptest.R(n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: tp, StagingTargetPath: stage, VolumeCapability: vc})).Must(t)
	}
	return id
}

// inspectVolumes reads the controller's volumes through its admin socket,
// as `csid inspect volumes` does: id, name, state, disk, capacity and node.
func inspectVolumes(t *testing.T, dir string) []string {
	t.Helper()
	c := admin.NewClient(app.AdminSocketPath(dir, driver.ModeController), 5*time.Second)
	defer c.Close()
	list, err := c.Volumes(context.Background(), view.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range list.Volumes {
		out = append(out, fmt.Sprintf("%s %s %s %s %d node=%s", v.ID, v.Name, v.State, v.DiskID, v.CapacityBytes, v.Node))
	}
	slices.Sort(out)
	return out
}

func listVolumes(t *testing.T, c apptest.Client) []*csi.ListVolumesResponse_Entry {
	t.Helper()
	entries := apptest.R(c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})).Must(t).Entries
	slices.SortFunc(entries, func(a, b *csi.ListVolumesResponse_Entry) int {
		if a.Volume.VolumeId < b.Volume.VolumeId {
			return -1
		}
		return 1
	})
	return entries
}

// TestControllerRebuildsItsRecordsFromTheCloud: the controller's state file
// is deleted (its pod moved to a node without it), or emptied, and the
// controller restarted: it refuses to start on the new file, naming a disk
// it made and the way out. Started with --rebuild-from-cloud, before it
// answers ready it has rebuilt every volume and every attachment from the
// cloud, and the CO's calls go on as before.
func TestControllerRebuildsItsRecordsFromTheCloud(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	s := startSplit(t, dir)
	ctx := context.Background()
	kubelet := filepath.Join(dir, "kubelet")
	stage, targets := "", []string(nil)
	id1 := useVolume(t, s.c, s.n, "pvc-detached", "", nil)
	apptest.R(s.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id1, NodeId: "node-1"})).Must(t)
	id2 := useVolume(t, s.c, s.n, "pvc-attached", "", nil)
	stage, targets = kubeletPaths(kubelet, "vol-in-use-00000000", "pod-a")
	id3 := useVolume(t, s.c, s.n, "pvc-in-use", stage, targets)
	before := listVolumes(t, s.c)
	if len(before) != 3 {
		t.Fatalf("%d volumes before", len(before))
	}
	inspectBefore := inspectVolumes(t, dir)

	s.controller.Stop(t)
	file := app.StateFile(dir, driver.ModeController)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	wantRefusedNewFile(t, refused(t, s.controllerOptions()), file, "of volume vol-")
	// The refused start leaves the file it made new: refused again.
	wantRefusedNewFile(t, refused(t, s.controllerOptions()), file, "of volume vol-")
	if err := os.Truncate(file, 0); err != nil { // an empty file, as a botched copy leaves
		t.Fatal(err)
	}
	wantRefusedNewFile(t, refused(t, s.controllerOptions()), file, "of volume vol-")
	o := s.controllerOptions()
	o.RebuildFromCloud = true
	s.startControllerWith(t, o)

	after := listVolumes(t, s.c)
	if len(after) != len(before) {
		t.Fatalf("after the rebuild: %d volumes, before %d", len(after), len(before))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Errorf("volume %d before %v, after the rebuild %v", i, before[i], after[i])
		}
	}
	// What `csid inspect volumes` shows (the admin socket) is the same too.
	if got := inspectVolumes(t, dir); !slices.Equal(got, inspectBefore) {
		t.Errorf("csid inspect volumes before the rebuild:\n%s\nafter:\n%s", strings.Join(inspectBefore, "\n"), strings.Join(got, "\n"))
	}
	// The CO's repeats are answered as before: create by name, publish.
	vc := apptest.MountCap("ext4")
	cv := apptest.R(s.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-in-use", CapacityRange: capRange(64 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t)
	if cv.Volume.VolumeId != id3 {
		t.Fatalf("create by name after the rebuild gave %s, want %s", cv.Volume.VolumeId, id3)
	}
	apptest.R(s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id2, NodeId: "node-1", VolumeCapability: vc})).Must(t)

	// And everything comes down cleanly.
	for _, tp := range targets {
		apptest.R(s.n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id3, TargetPath: tp})).Must(t)
	}
	apptest.R(s.n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id3, StagingTargetPath: stage})).Must(t)
	for _, id := range []string{id1, id2, id3} {
		apptest.R(s.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
		apptest.R(s.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	}
	s.controller.Stop(t)
	s.node.Stop(t)
	checkNothingLeft(t, "rebuild", dir)
}

// TestNodeReconcilesAfterLosingItsStateFile: with a volume staged and
// published at two targets (kubelet's paths), the node's state file is
// deleted and the node restarted: it refuses the new file (the cloud has a
// disk of csid attached to it). With --rebuild-from-cloud it adopts the
// mounts it finds, so stats work, and NodeUnpublish/NodeUnstage still
// clean up.
func TestNodeReconcilesAfterLosingItsStateFile(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	s := startSplit(t, dir)
	ctx := context.Background()
	id, stage, targets := useKubeletVolume(t, s.c, s.n, filepath.Join(dir, "kubelet"), "pvc-a", "pod-a", "pod-b")
	if err := os.WriteFile(filepath.Join(targets[0], "data"), []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}

	s.node.Stop(t)
	file := app.StateFile(dir, driver.ModeNode)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	wantRefusedNewFile(t, refused(t, s.nodeOptions()), file, "attached to node node-1")
	o := s.nodeOptions()
	o.RebuildFromCloud = true
	s.startNodeWith(t, o)

	for _, p := range append([]string{stage}, targets...) {
		st := apptest.R(s.n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})).Must(t)
		if len(st.Usage) == 0 || st.Usage[0].Total == 0 {
			t.Fatalf("stats at %s after the node lost its state: %v", p, st)
		}
	}
	for _, tp := range targets {
		apptest.R(s.n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tp})).Must(t)
		if _, err := os.Lstat(tp); !os.IsNotExist(err) {
			t.Fatalf("target %s still there after NodeUnpublish: %v", tp, err)
		}
	}
	apptest.R(s.n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	if ok, _ := mounter.New().IsMounted(ctx, stage); ok {
		t.Fatal("the staging path is still mounted after NodeUnstage")
	}
	apptest.R(s.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	apptest.R(s.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	s.controller.Stop(t)
	s.node.Stop(t)
	checkNothingLeft(t, "node reconcile", dir)
}

// TestNodeRollsBackRecordsWhoseMountsVanished: the node's mounts disappear
// while csid is down (a reboot); at start csid rolls its records back, so
// kubelet's repeated NodeStage/NodePublish really mount again (instead of
// being told they are done) and the data is there.
func TestNodeRollsBackRecordsWhoseMountsVanished(t *testing.T) {
	testutil.RequireRoot(t)
	p := startPodVolume(t, "before the reboot")
	p.in.Stop(t)
	p.unmount(t) // the reboot
	p.in = apptest.Start(t, app.Options{Cloud: "local", StateDir: p.dir, Log: zerolog.Nop()})
	p.c = apptest.Dial(t, p.in.Socket)
	pub := apptest.R(p.c.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: p.id, NodeId: "node-1",
		VolumeCapability: apptest.MountCap("ext4")})).Must(t)
	p.remount(t, pub.PublishContext, "after the reboot", "reboot")
}

// TestRepeatedStageRemountsWhatVanishedWhileRunning: csid is running when
// the staging mount and the target are unmounted behind its back. Kubelet's
// repeated NodeStage and NodePublish are not answered from the record ("done"):
// csid sees the mounts are gone, rolls the record back with a note, and
// mounts again; the pod sees its data.
func TestRepeatedStageRemountsWhatVanishedWhileRunning(t *testing.T) {
	testutil.RequireRoot(t)
	p := startPodVolume(t, "still here")
	p.unmount(t)
	p.remount(t, map[string]string{effects.PublishContextDiskID: inspectVolume(t, p.dir, driver.ModeAll, p.id).DiskID}, "after the repeated stage and publish", "remount")
}

// podVolume is a volume of an all-in-one csid on the local backend,
// staged and published at kubelet's paths for pod-a, holding a file.
type podVolume struct {
	dir, id, stage, target, data string
	in                           *apptest.Instance
	c                            apptest.Client
}

// startPodVolume starts csid, and creates, attaches, stages and publishes
// the volume; the pod writes data to its file.
func startPodVolume(t *testing.T, data string) *podVolume {
	t.Helper()
	p := &podVolume{dir: apptest.ShortTempDir(t), data: data}
	p.in = apptest.Start(t, app.Options{Cloud: "local", StateDir: p.dir, Log: zerolog.Nop()})
	p.c = apptest.Dial(t, p.in.Socket)
	stage, targets := kubeletPaths(filepath.Join(p.dir, "kubelet"), "vol-0123456789abcdef0123", "pod-a")
	p.stage, p.target = stage, targets[0]
	p.id = useVolume(t, p.c, p.c, "pvc-a", stage, targets)
	if err := os.WriteFile(filepath.Join(p.target, "data"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// unmount unmounts the target and the staging path behind csid's back.
func (p *podVolume) unmount(t *testing.T) {
	t.Helper()
	m := mounter.New()
	for _, path := range []string{p.target, p.stage} {
		if err := m.Unmount(context.Background(), path); err != nil {
			t.Fatal(err)
		}
	}
}

// remount is kubelet's repeated NodeStage (with publish context pc) and
// NodePublish: the pod must see its file (when says after what). Then
// the volume comes down and goes, csid stops, and nothing may be left.
func (p *podVolume) remount(t *testing.T, pc map[string]string, when, what string) {
	t.Helper()
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	if err := os.MkdirAll(p.stage, 0o750); err != nil {
		t.Fatal(err)
	}
	apptest.R(p.c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: p.id, StagingTargetPath: p.stage, VolumeCapability: vc, PublishContext: pc})).Must(t)
	apptest.R(p.c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: p.id, TargetPath: p.target, StagingTargetPath: p.stage, VolumeCapability: vc})).Must(t)
	if got, err := os.ReadFile(filepath.Join(p.target, "data")); err != nil || string(got) != p.data {
		t.Fatalf("%s the pod sees %q, %v", when, got, err)
	}
	apptest.R(p.c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: p.id, TargetPath: p.target})).Must(t)
	apptest.R(p.c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: p.id, StagingTargetPath: p.stage})).Must(t)
	apptest.R(p.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: p.id, NodeId: "node-1"})).Must(t)
	apptest.R(p.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: p.id})).Must(t)
	p.in.Stop(t)
	checkNothingLeft(t, what, p.dir)
}

// inspectVolume reads the record of a volume of the csid of mode in dir
// through its admin socket, as `csid inspect volume` does.
func inspectVolume(t *testing.T, dir string, mode driver.Mode, id string) view.Volume {
	t.Helper()
	c := admin.NewClient(app.AdminSocketPath(dir, mode), 5*time.Second)
	defer c.Close()
	v, err := c.Volume(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
