package app_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/mounter"
	"golang.org/x/sys/unix"
)

// hostView reads, independently of the csid under test, what exists on
// the host for one state directory: the local cloud's disks (through a
// second client of the same directory), the loop devices bound to its
// images, and the mounts.
type hostView struct {
	cloud *local.Cloud
	// dir is the state directory with symlinks resolved, as the kernel
	// reports loop backing files and mount points.
	dir string
}

func newHostView(t *testing.T, stateDir string) *hostView {
	t.Helper()
	c, err := local.Open(context.Background(), stateDir, local.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &hostView{cloud: c, dir: c.Dir()}
}

// disks lists every disk of the local cloud.
func (h *hostView) disks(t *testing.T) []cloud.Disk {
	t.Helper()
	var all []cloud.Disk
	token := ""
	for {
		page, err := h.cloud.ListDisks(context.Background(), cloud.ListOptions{PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Disks...)
		if token = page.NextToken; token == "" {
			return all
		}
	}
}

// loops lists the loop devices bound to a file under the state directory.
// Unlike Host.Devices, which is keyed by disk, it shows a disk bound twice.
func (h *hostView) loops(t *testing.T) []loopdev.Device {
	t.Helper()
	all, err := loopdev.List()
	if err != nil {
		t.Fatal(err)
	}
	var ours []loopdev.Device
	for _, d := range all {
		if strings.HasPrefix(d.BackingFile, h.dir+string(os.PathSeparator)) {
			ours = append(ours, d)
		}
	}
	return ours
}

// hostDevices is what the node's host reports: device by disk.
func (h *hostView) hostDevices(t *testing.T) map[string]string {
	t.Helper()
	devs, err := h.cloud.Host("node-1").Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// mountsUnder lists the mount points strictly below root, one entry per
// mount (a path mounted twice appears twice).
func mountsUnder(t *testing.T, root string) []string {
	t.Helper()
	mounts, err := mounter.New().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		if strings.HasPrefix(m.Path, root+string(os.PathSeparator)) {
			out = append(out, m.Path)
		}
	}
	sort.Strings(out)
	return out
}

// want is the host state expected after a step of a volume's lifecycle.
type want struct {
	// disk is the volume's disk id; "" means the cloud has no disk at all.
	disk       string
	sizeBytes  int64
	attachedTo string
	// loops is the number of loop devices bound to the disk's image.
	loops int
	// mounted are the paths mounted exactly once each; no other mount
	// may exist under the state directory.
	mounted []string
}

// expectHost fails the test unless the host shows exactly w: at most one
// disk, one loop device per attached disk, one mount per path.
func (h *hostView) expectHost(t *testing.T, step string, w want) {
	t.Helper()
	disks := h.disks(t)
	switch {
	case w.disk == "" && len(disks) != 0:
		t.Errorf("%s: the cloud has %d disk(s), want none: %+v", step, len(disks), disks)
	case w.disk != "" && len(disks) != 1:
		t.Errorf("%s: the cloud has %d disk(s), want exactly one (%s): %+v", step, len(disks), w.disk, disks)
	case w.disk != "":
		d := disks[0]
		if d.ID != w.disk || d.SizeBytes != w.sizeBytes || d.AttachedTo != w.attachedTo {
			t.Errorf("%s: disk %s of %d bytes attached to %q, want %s of %d bytes attached to %q",
				step, d.ID, d.SizeBytes, d.AttachedTo, w.disk, w.sizeBytes, w.attachedTo)
		}
	}
	loops := h.loops(t)
	if len(loops) != w.loops {
		t.Errorf("%s: %d loop device(s) bound to the state dir's images, want %d: %+v", step, len(loops), w.loops, loops)
	}
	devs := h.hostDevices(t)
	if w.loops > 0 {
		if _, ok := devs[w.disk]; !ok || len(devs) != 1 {
			t.Errorf("%s: the host reports devices %v, want one for disk %s", step, devs, w.disk)
		}
	} else if len(devs) != 0 {
		t.Errorf("%s: the host reports devices %v, want none", step, devs)
	}
	wantMounts := slices.Clone(w.mounted)
	sort.Strings(wantMounts)
	if got := mountsUnder(t, h.dir); !slices.Equal(got, wantMounts) {
		t.Errorf("%s: mounts under the state dir are %q, want exactly %q", step, got, wantMounts)
	}
}

// tmpfsDir is a short temporary directory with a private tmpfs mounted on
// it, so that the free space a test reads changes only with what the test
// itself writes (the machine's disk is shared with concurrent tests).
func tmpfsDir(t *testing.T) string {
	t.Helper()
	dir := apptest.ShortTempDir(t)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1g,mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the tmpfs on %s: %v", dir, err)
		}
	})
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return resolved
}

// mountCapMode is a filesystem capability with an access mode.
func mountCapMode(fsType string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// blockCap is a raw block capability.
func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func capRange(bytes int64) *csi.CapacityRange { return &csi.CapacityRange{RequiredBytes: bytes} }
