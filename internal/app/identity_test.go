package app_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/drill"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/testutil"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// Device identity (issue 14), with the controller and the node as separate
// csid processes on one state directory, as the single-node overlay runs
// them: the device a node op binds, formats or mounts is proven to be the
// volume's disk when it is used; a remembered device path is never trusted,
// and a disk is staged only under the volume id it carries.

// overlay is the single-node overlay's shape: a controller and a node
// plugin, each its own csid process, on one state directory, the node
// confined to a kubelet directory beside it.
type overlay struct {
	dir, kubelet     string
	controller, node *child
	c, n             apptest.Client
}

func startOverlay(t *testing.T) *overlay {
	t.Helper()
	dir, err := filepath.EvalSymlinks(apptest.ShortTempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	o := &overlay{dir: dir, kubelet: filepath.Join(dir, "kubelet")}
	mkdir(t, o.kubelet)
	o.startController(t, "")
	o.startNode(t, "")
	return o
}

// startController and startNode start the controller and the node
// plugin, with a crash point armed if crashAt is set (their log of fired
// points is fired in the state dir).
func (o *overlay) startController(t *testing.T, crashAt string) {
	t.Helper()
	o.controller = startChild(t, childOptions{Mode: driver.ModeController, Cloud: "local", StateDir: o.dir,
		Endpoint: "unix://" + filepath.Join(o.dir, "controller.sock")}, crashAt, filepath.Join(o.dir, "fired"))
	o.c = apptest.Dial(t, o.controller.socket)
}

func (o *overlay) startNode(t *testing.T, crashAt string) {
	t.Helper()
	o.node = startChild(t, childOptions{Mode: driver.ModeNode, Cloud: "local", StateDir: o.dir, NodeID: "node-1",
		Endpoint: "unix://" + filepath.Join(o.dir, "node.sock"), KubeletRoot: o.kubelet}, crashAt, filepath.Join(o.dir, "fired"))
	o.n = apptest.Dial(t, o.node.socket)
}

// create makes a volume of capability vc; attach attaches it to node-1 and
// returns the publish context.
func (o *overlay) create(t *testing.T, name string, vc *csi.VolumeCapability) string {
	t.Helper()
	return apptest.R(o.c.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(16 << 20),
		VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
}

func (o *overlay) attach(t *testing.T, id string, vc *csi.VolumeCapability) map[string]string {
	t.Helper()
	return apptest.R(o.c.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1",
		VolumeCapability: vc})).Must(t).PublishContext
}

func (o *overlay) detach(t *testing.T, id string) {
	t.Helper()
	apptest.R(o.c.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
}

// Kubelet's paths of a raw block volume: its staging directory and a
// pod's target file (whose directory kubelet creates).
func (o *overlay) blockStaging(t *testing.T, pv string) string {
	t.Helper()
	p := filepath.Join(o.kubelet, "plugins/kubernetes.io/csi/volumeDevices/staging", pv)
	mkdir(t, p)
	return p
}

func (o *overlay) blockTarget(t *testing.T, pv, pod string) string {
	t.Helper()
	p := filepath.Join(o.kubelet, "plugins/kubernetes.io/csi/volumeDevices/publish", pv, pod)
	mkdir(t, filepath.Dir(p))
	return p
}

// Kubelet's paths of a filesystem volume.
func (o *overlay) fsStaging(t *testing.T, id string) string {
	t.Helper()
	p := filepath.Join(o.kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, id, "globalmount")
	mkdir(t, p)
	return p
}

func (o *overlay) fsTarget(t *testing.T, pv, pod string) string {
	t.Helper()
	p := filepath.Join(o.kubelet, "pods", pod, "volumes/kubernetes.io~csi", pv, "mount")
	mkdir(t, filepath.Dir(p))
	return p
}

func (o *overlay) stage(id, staging string, vc *csi.VolumeCapability, pc map[string]string) error {
	_, err := o.n.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: vc, PublishContext: pc})
	return err
}

func (o *overlay) publish(id, staging, target string, vc *csi.VolumeCapability) error {
	_, err := o.n.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
		StagingTargetPath: staging, VolumeCapability: vc})
	return err
}

func (o *overlay) unpublish(t *testing.T, id, target string) {
	t.Helper()
	apptest.R(o.n.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})).Must(t)
}

func (o *overlay) unstage(t *testing.T, id, staging string) {
	t.Helper()
	apptest.R(o.n.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})).Must(t)
}

// stagedDevice is the device the node's record of a volume says it was
// staged from (read through the node's admin socket, as csid inspect does).
func (o *overlay) stagedDevice(t *testing.T, id string) string {
	t.Helper()
	return inspectVolume(t, o.dir, driver.ModeNode, id).Device
}

// writeMarker writes size bytes of volume id's marker through path (a
// raw block target, or a device).
func writeMarker(t *testing.T, path, id string, size int) {
	t.Helper()
	if err := drill.WriteMarker(path, id, size/drill.MarkerBlock); err != nil {
		t.Fatal(err)
	}
}

// expectMarker fails unless path reads the marker of volume want.
func expectMarker(t *testing.T, what, path, want string) {
	t.Helper()
	if got, err := drill.ReadMarker(path); err != nil || got != want {
		t.Fatalf("%s (%s) reads the marker of %q (%v), want %q's", what, path, got, err, want)
	}
}

// notThere fails if anything exists at path.
func notThere(t *testing.T, what, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err == nil {
		t.Fatalf("%s: %s exists", what, path)
	}
}

// TestStaleDeviceOfAForceDetachedVolumeIsNeverBound is the first
// scenario: raw block volume A is staged, and its record names its loop
// device; the controller detaches A behind the node's back (a force
// detach: kubelet never unstaged it), which releases the device; volume B
// is attached and gets that very device, and its pod writes 1 MiB. A's
// NodePublishVolume must not bind the device A's record remembers: it is
// B's disk now. Once the controller attaches A again (on another device),
// the publish binds A's disk, found by its identity, not by the record.
func TestStaleDeviceOfAForceDetachedVolumeIsNeverBound(t *testing.T) {
	testutil.RequireRoot(t)
	o := startOverlay(t)
	vc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	// A staged, published, written and force-detached; B attached and
	// staged on the device A's record names. Loop devices are the
	// machine's: another test may take A's released device first, and
	// keep it, so a lost race starts again with a new A.
	a, stagingA, pcA, devA, b, stagingB := staleDevice(t, o, vc)
	podB := o.blockTarget(t, "pv-b", "pod-b")
	if err := o.publish(b, stagingB, podB, vc); err != nil {
		t.Fatal(err)
	}
	writeMarker(t, podB, b, 1<<20)

	// A's next pod: the record says A is staged from devA, which is B's.
	podA2 := o.blockTarget(t, "pv-a", "pod-a2")
	// (NodePublishVolume of A, detached, whose record names B's device.)
	wantCode(t, o.publish(a, stagingA, podA2, vc), codes.FailedPrecondition, "not attached")
	notThere(t, "the refused publish of A", podA2)
	expectMarker(t, "B's target", podB, b)
	// A repeated NodeStageVolume of A is not answered "staged" either.
	wantCode(t, o.stage(a, stagingA, vc, pcA), codes.FailedPrecondition, "not attached")
	// And csid check says A's record names B's device.
	if f := o.check(t); len(f) != 1 || f[0].Kind != check.DeviceMismatch || f[0].Volume != a ||
		!strings.Contains(f[0].Problem, "staged from "+devA+" as its record says, and "+devA+" is bound to disk") {
		t.Fatalf("csid check found %+v, want A's device mismatch", f)
	}

	// The attacher attaches A again: A gets another device; the publish
	// finds it by its identity and binds A's disk.
	o.attach(t, a, vc)
	if err := o.stage(a, stagingA, vc, pcA); err != nil {
		t.Fatal(err)
	}
	if err := o.publish(a, stagingA, podA2, vc); err != nil {
		t.Fatal(err)
	}
	expectMarker(t, "A's target after A was attached again", podA2, a)
	expectMarker(t, "B's target", podB, b)

	// A's target swapped, by hand, for a bind of B's device: the repeated
	// NodePublishVolume of A is not answered "published"; once the bind is
	// gone, it binds A's disk again.
	if err := unix.Unmount(podA2, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(o.stagedDevice(t, b), podA2, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	wantCode(t, o.publish(a, stagingA, podA2, vc), codes.FailedPrecondition, "is not a mount of its disk")
	if err := unix.Unmount(podA2, 0); err != nil {
		t.Fatal(err)
	}
	if err := o.publish(a, stagingA, podA2, vc); err != nil {
		t.Fatal(err)
	}
	expectMarker(t, "A's target, published again", podA2, a)

	o.unpublish(t, a, podA2)
	o.unpublish(t, b, podB)
	o.unstage(t, a, stagingA)
	o.unstage(t, b, stagingB)
	o.detach(t, a)
	o.detach(t, b)
	o.clean(t)
}

// staleDevice makes the first scenario's world: raw block volume A is
// staged, published, written and unpublished, and then detached behind
// the node's back (the force detach releases its loop device); volume B is
// attached and staged, and gets A's released device. Loop device numbers
// are the machine's, and another test may take A's device as it is
// released (and keep it for a while): then B and A are undone and the
// scenario starts again with a new A, on whatever device it gets, up to
// ten times.
func staleDevice(t *testing.T, o *overlay, vc *csi.VolumeCapability) (a, stagingA string, pcA map[string]string, devA, b, stagingB string) {
	t.Helper()
	for i := range 10 {
		a = o.create(t, fmt.Sprintf("pvc-a%d", i), vc)
		stagingA = o.blockStaging(t, fmt.Sprintf("pv-a%d", i))
		pcA = o.attach(t, a, vc)
		if err := o.stage(a, stagingA, vc, pcA); err != nil {
			t.Fatal(err)
		}
		podA := o.blockTarget(t, fmt.Sprintf("pv-a%d", i), "pod-a1")
		if err := o.publish(a, stagingA, podA, vc); err != nil {
			t.Fatal(err)
		}
		writeMarker(t, podA, a, drill.MarkerBlock)
		o.unpublish(t, a, podA)
		devA = o.stagedDevice(t, a)
		o.detach(t, a)

		b = o.create(t, fmt.Sprintf("pvc-b%d", i), vc)
		stagingB = o.blockStaging(t, fmt.Sprintf("pv-b%d", i))
		if err := o.stage(b, stagingB, vc, o.attach(t, b, vc)); err != nil {
			t.Fatal(err)
		}
		got := o.stagedDevice(t, b)
		if got == devA {
			return a, stagingA, pcA, devA, b, stagingB
		}
		t.Logf("volume %s got %s, not %s (taken meanwhile): again with a new A", b, got, devA)
		o.unstage(t, b, stagingB)
		o.detach(t, b)
		o.unstage(t, a, stagingA)
	}
	t.Fatalf("in 10 tries no volume B got the device its volume A released")
	return
}

// TestPhantomVolumeIdNeverStagesAnotherVolumesDisk is the second
// scenario: the node is asked to stage a volume id no controller issued,
// with the publish context of volume A (its disk id), while A is staged
// and published. It must refuse, as filesystem and as raw block, and mount
// nothing: A's disk carries A's id.
func TestPhantomVolumeIdNeverStagesAnotherVolumesDisk(t *testing.T) {
	testutil.RequireRoot(t)
	o := startOverlay(t)
	vc := apptest.MountCap("ext4")
	a := o.create(t, "pvc-a", vc)
	pc := o.attach(t, a, vc)
	stagingA := o.fsStaging(t, a)
	if err := o.stage(a, stagingA, vc, pc); err != nil {
		t.Fatal(err)
	}
	podA := o.fsTarget(t, "pv-a", "pod-a")
	if err := o.publish(a, stagingA, podA, vc); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(podA, "data"), "A's file")

	for _, c := range []struct {
		name, phantom string
		vc            *csi.VolumeCapability
	}{
		{"filesystem", "vol-0000000000000000bee1", vc},
		{"raw block", "vol-0000000000000000bee2", blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	} {
		t.Run(c.name, func(t *testing.T) {
			staging, target := o.fsStaging(t, c.phantom), o.fsTarget(t, "pv-phantom", "pod-p")
			if c.vc.GetBlock() != nil {
				staging, target = o.blockStaging(t, "pv-phantom"), o.blockTarget(t, "pv-phantom", "pod-p")
			}
			before := mountsUnder(t, o.dir)
			// The refusal names the volume the disk carries.
			wantCode(t, o.stage(c.phantom, staging, c.vc, pc), codes.FailedPrecondition, "volume "+a+"'s")
			if after := mountsUnder(t, o.dir); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("mounts changed: before %q, after %q", before, after)
			}
			// Nothing was staged: the node has no such volume.
			wantCode(t, o.publish(c.phantom, staging, target, c.vc), codes.NotFound)
			notThere(t, "the phantom's publish", target)
		})
	}
	if got, err := os.ReadFile(filepath.Join(podA, "data")); err != nil || string(got) != "A's file" {
		t.Fatalf("A's file reads %q, %v", got, err)
	}
	o.unpublish(t, a, podA)
	o.unstage(t, a, stagingA)
	o.detach(t, a)
	o.clean(t)
}

// check compares the controller's and the node's records with the cloud
// and the host, as csid check does in the node plugin's pod.
func (o *overlay) check(t *testing.T) []check.Finding {
	t.Helper()
	ctx := context.Background()
	insp, err := local.OpenInspector(o.dir)
	if err != nil {
		t.Fatal(err)
	}
	var recs []check.RecordSource
	for _, m := range []driver.Mode{driver.ModeController, driver.ModeNode} {
		c := admin.NewClient(app.AdminSocketPath(o.dir, m), 5*time.Second)
		defer c.Close()
		recs = append(recs, check.RecordSource{Name: string(m), Mode: string(m), Source: c})
	}
	in, err := check.Gather(ctx, check.Sources{Records: recs, Cloud: insp, Mounts: mounter.New(), HostNodes: []string{"node-1"},
		DriverName: driver.DefaultName, KubeletRoot: o.kubelet})
	if err != nil {
		t.Fatal(err)
	}
	return check.Compare(in).Findings
}

// clean fails unless csid check finds nothing.
func (o *overlay) clean(t *testing.T) {
	t.Helper()
	if f := o.check(t); len(f) != 0 {
		t.Fatalf("csid check found %+v", f)
	}
}

// TestRawBlockNeverWhileMountedAsFilesystem: a disk is never bound as a
// raw block device while a filesystem of it is mounted, nor its
// filesystem mounted while it is bound raw, whoever made the other use
// (here, an operator by hand); the node says where, from the mount table,
// and does nothing. Once the other use is gone, the same call succeeds.
func TestRawBlockNeverWhileMountedAsFilesystem(t *testing.T) {
	testutil.RequireRoot(t)
	o := startOverlay(t)
	ctx := context.Background()

	// A raw block volume, published; its device formatted and mounted by
	// hand outside kubelet's directory.
	vb := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	b := o.create(t, "pvc-raw", vb)
	stagingB := o.blockStaging(t, "pv-raw")
	if err := o.stage(b, stagingB, vb, o.attach(t, b, vb)); err != nil {
		t.Fatal(err)
	}
	devB := o.stagedDevice(t, b)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", devB).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", devB, err, out)
	}
	byHand := filepath.Join(o.dir, "by-hand")
	mkdir(t, byHand)
	if err := unix.Mount(devB, byHand, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	podB := o.blockTarget(t, "pv-raw", "pod-b")
	wantCode(t, o.publish(b, stagingB, podB, vb), codes.FailedPrecondition, "mounted as a filesystem at "+byHand)
	notThere(t, "the refused raw publish", podB)
	if err := unix.Unmount(byHand, 0); err != nil {
		t.Fatal(err)
	}
	if err := o.publish(b, stagingB, podB, vb); err != nil {
		t.Fatalf("the raw publish once the filesystem is unmounted: %v", err)
	}

	// A filesystem volume, staged and unstaged (its device stays bound to
	// the disk while attached); its device node bound by hand.
	vc := apptest.MountCap("ext4")
	a := o.create(t, "pvc-fs", vc)
	pc := o.attach(t, a, vc)
	stagingA := o.fsStaging(t, a)
	if err := o.stage(a, stagingA, vc, pc); err != nil {
		t.Fatal(err)
	}
	devA := o.stagedDevice(t, a)
	o.unstage(t, a, stagingA)
	raw := filepath.Join(o.dir, "raw-by-hand")
	writeFile(t, raw, "")
	if err := unix.Mount(devA, raw, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	stagingA = o.fsStaging(t, a)
	wantCode(t, o.stage(a, stagingA, vc, pc), codes.FailedPrecondition, "bound as a raw block device at "+raw)
	mounted, err := mounter.New().IsMounted(ctx, stagingA)
	if err != nil || mounted {
		t.Fatalf("the refused stage mounted %s: %v, %v", stagingA, mounted, err)
	}
	if err := unix.Unmount(raw, 0); err != nil {
		t.Fatal(err)
	}
	if err := o.stage(a, stagingA, vc, pc); err != nil {
		t.Fatalf("the stage once the raw bind is gone: %v", err)
	}

	o.unpublish(t, b, podB)
	o.unstage(t, b, stagingB)
	o.unstage(t, a, stagingA)
	o.detach(t, a)
	o.detach(t, b)
	o.clean(t)
}

// TestFilesystemPublishBindsOnlyItsDisksStagingMount: a filesystem
// volume's publish binds its staging mount only while that is a mount of
// the volume's disk (proven, by device number). With another volume's
// filesystem bound there by hand, the publish is refused and nothing is
// made; once the volume is staged again, it publishes its own data.
func TestFilesystemPublishBindsOnlyItsDisksStagingMount(t *testing.T) {
	testutil.RequireRoot(t)
	o := startOverlay(t)
	vc := apptest.MountCap("ext4")
	staged := func(name string) (id, staging string, pc map[string]string) {
		id = o.create(t, name, vc)
		pc = o.attach(t, id, vc)
		staging = o.fsStaging(t, id)
		if err := o.stage(id, staging, vc, pc); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(staging, "data"), name)
		return id, staging, pc
	}
	a, stagingA, pcA := staged("pvc-a")
	b, stagingB, _ := staged("pvc-b")

	if err := unix.Unmount(stagingA, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(stagingB, stagingA, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	target := o.fsTarget(t, "pv-a", "pod-a")
	wantCode(t, o.publish(a, stagingA, target, vc), codes.FailedPrecondition, "is not a mount of its disk")
	notThere(t, "the refused publish", target)

	if err := unix.Unmount(stagingA, 0); err != nil {
		t.Fatal(err)
	}
	if err := o.stage(a, stagingA, vc, pcA); err != nil { // the mount is gone: staged again
		t.Fatal(err)
	}
	if err := o.publish(a, stagingA, target, vc); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "pvc-a" {
		t.Fatalf("A's target reads %q, %v; want A's data", got, err)
	}
	o.unpublish(t, a, target)
	for _, v := range []struct{ id, staging string }{{a, stagingA}, {b, stagingB}} {
		o.unstage(t, v.id, v.staging)
		o.detach(t, v.id)
	}
	o.clean(t)
}

// TestStageRefusesAnotherVolumesPublishContext: all-in-one, the volume's
// record names its disk; a NodeStageVolume whose publish context names
// another volume's disk is refused and mounts nothing (it is not this
// volume's publish context), and the right one stages.
func TestStageRefusesAnotherVolumesPublishContext(t *testing.T) {
	testutil.RequireRoot(t)
	e := newNodeEnv(t, app.Options{})
	vc := apptest.MountCap("ext4")
	a, pcA := e.volume(vc)
	_, pcB := e.volume(vc)
	staging := e.path("plugins", "kubernetes.io", "csi", driver.DefaultName, a, "globalmount")
	mkdir(t, staging)
	wantCode(t, e.stage(a, staging, vc, pcB), codes.FailedPrecondition, "the publish context names disk "+pcB[effects.PublishContextDiskID])
	if ok, err := mounter.New().IsMounted(context.Background(), staging); err != nil || ok {
		t.Fatalf("the refused stage mounted %s: %v, %v", staging, ok, err)
	}
	if err := e.stage(a, staging, vc, pcA); err != nil {
		t.Fatal(err)
	}
}
