package main

import (
	"context"
	"encoding/json"
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
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view/viewtest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkRun runs `csid check args... -o json` and returns its exit code and
// report.
func checkRun(t *testing.T, args ...string) (int, checkDoc) {
	t.Helper()
	code, stdout, stderr := cli(t, append(append([]string{"check"}, args...), "-o", "json")...)
	var doc checkDoc
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("csid check: exit %d, %v\nstdout: %s\nstderr: %s", code, err, stdout, stderr)
	}
	return code, doc
}

func findingKinds(d checkDoc) []check.Kind {
	var out []check.Kind
	for _, f := range d.Findings {
		out = append(out, f.Kind)
	}
	return out
}

// TestCheckFindsEachConditionForReal is acceptance 3: on a real csid (the
// local backend: sparse files, loop devices, ext4, real mounts) csid check
// reports nothing on a clean system and exits 0, and reports each
// condition, made for real behind csid's back, with exit 1: a disk with no
// record, a record whose disk is gone, a loop device no volume accounts
// for, a mount no volume accounts for, an attachment the records do not
// know, a published volume whose mount is gone, and a target that is a
// mount of another volume's disk (and a second loop device of a disk in
// use).
func TestCheckFindsEachConditionForReal(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	dir := apptest.ShortTempDir(t)
	kubelet := filepath.Join(dir, "kubelet")
	in := apptest.Start(t, app.Options{Cloud: "local", StateDir: dir, NodeID: "node-1", KubeletRoot: kubelet})
	t.Cleanup(func() { hostscrub.Scrub(context.Background(), dir) }) // runs before csid stops: leave the machine clean
	c := apptest.Dial(t, in.Socket)
	vc := apptest.MountCap("ext4")
	create := func(name string) string {
		return apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	}
	adm := admin.NewClient(app.AdminSocketPath(dir, driver.ModeAll), 5*time.Second)
	defer adm.Close()
	diskOf := func(id string) string { return apptest.R(adm.Volume(ctx, id)).Must(t).DiskID }

	// A volume published where kubelet would: staged in csid's plugin
	// directory, published in a pod's volume directory beside the
	// vol_data.json kubelet writes; and two detached volumes.
	pub := create("pvc-pub")
	staging := filepath.Join(kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, "9b1e5c/globalmount")
	target := filepath.Join(kubelet, "pods/0b7d4e36/volumes/kubernetes.io~csi/pvc-pub/mount")
	apptest.WriteVolData(t, filepath.Dir(staging), pub)
	apptest.WriteVolData(t, filepath.Dir(target), pub)
	pc := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: pub, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: pub, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pc.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: pub, TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc})).Must(t)
	spare, doomed := create("pvc-spare"), create("pvc-doomed")
	// The spare was attached once (which made its image), and is detached.
	apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: spare, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: spare, NodeId: "node-1"})).Must(t)

	args := []string{"--state-dir", dir, "--kubelet-root", kubelet}
	expectClean := func(when string) {
		t.Helper()
		code, doc := checkRun(t, args...)
		if code != 0 || !doc.Clean() || len(doc.Notes) != 0 {
			t.Fatalf("%s: exit %d, findings %+v, notes %q", when, code, doc.Findings, doc.Notes)
		}
		if !slices.Equal(doc.HostNodes, []string{"node-1"}) || len(doc.Records) != 1 || doc.Records[0].Mode != "all" {
			t.Fatalf("%s: read %+v for nodes %q", when, doc.Records, doc.HostNodes)
		}
		if doc.Checked.Mounts < 2 || doc.Checked.Devices != 1 {
			t.Fatalf("%s: checked %+v, want the published volume's device and its two mounts", when, doc.Checked)
		}
		if code, table, _ := cli(t, append([]string{"check"}, args...)...); code != 0 {
			t.Fatalf("%s: csid check exits %d:\n%s", when, code, table)
		} else if when == "a clean system" {
			t.Logf("%s: csid check says\n%s", when, table)
		}
	}
	expect := func(what string, kind check.Kind, about string) check.Finding {
		t.Helper()
		code, doc := checkRun(t, args...)
		if code != 1 || !slices.Equal(findingKinds(doc), []check.Kind{kind}) {
			t.Fatalf("%s: exit %d, findings %v, want exit 1 and [%s]: %+v", what, code, findingKinds(doc), kind, doc.Findings)
		}
		f := doc.Findings[0]
		if !strings.Contains(f.Problem, about) || f.Cause == "" || f.Action == "" {
			t.Errorf("%s: the finding does not name %s, or lacks a cause or an action: %+v", what, about, f)
		}
		_, table, _ := cli(t, append([]string{"check"}, args...)...)
		t.Logf("%s: csid check says\n%s", what, table)
		return f
	}
	expectClean("a clean system")

	// Another client of the state directory, as another process would be.
	cl, err := local.Open(ctx, dir, local.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	do := func(op cloud.Operation, err error) {
		t.Helper()
		if err == nil {
			_, err = cl.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	// 1. A disk csid does not know.
	op, err := cl.CreateDisk(ctx, cloud.DiskSpec{Name: "made-by-hand", SizeBytes: 8 << 20})
	do(op, err)
	expect("a disk with no volume record", check.DiskWithoutVolume, op.DiskID)
	do(cl.DeleteDisk(ctx, op.DiskID))
	expectClean("the stray disk deleted")

	// 2. A record whose disk was deleted behind csid's back.
	do(cl.DeleteDisk(ctx, diskOf(doomed)))
	expect("a record whose disk is gone", check.VolumeWithoutDisk, doomed)
	apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: doomed})).Must(t)
	expectClean("the volume of the lost disk deleted")

	// 3. A loop device bound by hand to a detached disk's image.
	insp, err := local.OpenInspector(dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := os.OpenFile(insp.ImagePath(diskOf(spare)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := loopdev.Attach(ctx, img, loopdev.Options{})
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	expect("a loop device no volume accounts for", check.LoopDeviceUnaccounted, dev.Path)
	id, err := loopdev.Backing(dev.Path)
	if err == nil {
		err = loopdev.Release(ctx, dev.Path, id)
	}
	if err != nil {
		t.Fatal(err)
	}
	expectClean("the loop device released")
	// ... and a second device bound to the image of the published volume.
	img, err = os.OpenFile(insp.ImagePath(diskOf(pub)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev, err = loopdev.Attach(ctx, img, loopdev.Options{})
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	expect("a second loop device of a volume in use", check.LoopDeviceUnaccounted, "second loop device")
	if id, err = loopdev.Backing(dev.Path); err == nil {
		err = loopdev.Release(ctx, dev.Path, id)
	}
	if err != nil {
		t.Fatal(err)
	}
	expectClean("the second device released")

	// 4. A tmpfs mounted in csid's staging directory under the kubelet root.
	stray := filepath.Join(kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, "77aa01/globalmount")
	if err := os.MkdirAll(stray, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", stray, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	expect("a mount no volume accounts for", check.MountUnaccounted, stray)
	if err := unix.Unmount(stray, 0); err != nil {
		t.Fatal(err)
	}
	expectClean("the tmpfs unmounted")

	// 5. An attachment made in the cloud directly.
	do(cl.AttachDisk(ctx, diskOf(spare), "node-1"))
	expect("an attachment the store does not know", check.AttachmentUnknown, "attached to node-1")
	do(cl.DetachDisk(ctx, diskOf(spare), "node-1"))
	expectClean("the disk detached")

	// 7. The published volume's target swapped for a mount of another
	// volume's disk (staged, and accounted for, itself).
	pcSpare := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: spare, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	stagingSpare := filepath.Join(kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, "5d2a77/globalmount")
	if err := os.MkdirAll(stagingSpare, 0o750); err != nil {
		t.Fatal(err)
	}
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: spare, StagingTargetPath: stagingSpare, VolumeCapability: vc, PublishContext: pcSpare.PublishContext})).Must(t)
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(stagingSpare, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	f := expect("a target that is a mount of another volume's disk", check.DeviceMismatch, "bound to disk "+diskOf(spare)+" (volume "+spare+")")
	if f.Volume != pub || f.Path != target {
		t.Errorf("the finding is about %s at %s, want %s at %s", f.Volume, f.Path, pub, target)
	}
	// ... and kubelet's repeated NodePublishVolume is not told it is done.
	_, err = c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: pub, TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a repeated NodePublishVolume at a target of another disk: %v, want FailedPrecondition", err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(staging, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: spare, StagingTargetPath: stagingSpare})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: spare, NodeId: "node-1"})).Must(t)
	expectClean("the target bound to its own disk again")

	// 6. The published volume's mount gone behind csid's back.
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	expect("a published volume whose mount is gone", check.MountMissing, target)
	// The remedy the finding gives: the pod goes, kubelet unpublishes.
	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: pub, TargetPath: target})).Must(t)
	code, doc := checkRun(t, args...)
	if code != 0 || !doc.Clean() {
		t.Fatalf("after the unpublish: exit %d, %+v", code, doc.Findings)
	}

	// Tear down through CSI: nothing is left, and check agrees.
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: pub, StagingTargetPath: staging})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: pub, NodeId: "node-1"})).Must(t)
	for _, id := range []string{pub, spare} {
		apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	}
	code, doc = checkRun(t, args...)
	if code != 0 || !doc.Clean() || doc.Checked != (check.Counts{}) {
		t.Fatalf("after deleting everything: exit %d, checked %+v, findings %+v", code, doc.Checked, doc.Findings)
	}
}

// TestCheckStateFileElsewhere: csid check of a state file read where its
// node's directories are not (no local backend, no kubelet) compares what
// it can, says what it could not, and finds nothing (exit 0).
func TestCheckStateFileElsewhere(t *testing.T) {
	db := filepath.Join(t.TempDir(), "csid.db")
	if err := viewtest.Build(db); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	code, doc := checkRun(t, "--db", db, "--state-dir", dir, "--kubelet-root", filepath.Join(dir, "no-kubelet"), "--node-id", "node-1")
	if code != 0 || !doc.Clean() {
		t.Fatalf("exit %d, findings %+v", code, doc.Findings)
	}
	notes := strings.Join(doc.Notes, "\n")
	for _, want := range []string{"no local backend in " + dir, "kubelet's root", viewtest.TargetA, viewtest.Retrying + " (op #10 controller_publish in flight)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes do not say %q:\n%s", want, notes)
		}
	}
	if doc.Checked.Volumes != 6 || doc.Records[0].Mode != "all" {
		t.Errorf("checked %+v from %+v", doc.Checked, doc.Records)
	}
}
