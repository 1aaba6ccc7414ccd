package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/kubelet"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/store"
)

// TestKubeletMounts: of a device's mounts, only kubelet's staging and
// target paths for the driver and the volume (or paths the record names)
// are the volume's; an operator's bind mount, a sub-path kubelet binds for
// a container, a path kubelet keeps for another volume, are not.
func TestKubeletMounts(t *testing.T) {
	root := t.TempDir()
	const id, drv = "vol-0123456789abcdef0123", "csid.csi.dev"
	sum := sha256.Sum256([]byte(id))
	for dir, vd := range map[string]string{
		"pods/a/volumes/kubernetes.io~csi/pv":             id,
		"pods/b/volumes/kubernetes.io~csi/pv":             id,
		"pods/c/volumes/kubernetes.io~csi/pv":             "vol-other",
		"plugins/kubernetes.io/csi/volumeDevices/pv/data": id,
	} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o750); err != nil {
			t.Fatal(err)
		}
		raw := fmt.Sprintf(`{"driverName":%q,"volumeHandle":%q}`, drv, vd)
		if err := os.WriteFile(filepath.Join(root, dir, "vol_data.json"), []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k := func(p string) string { return filepath.Join(root, p) }
	staging := k("plugins/kubernetes.io/csi/" + drv + "/" + hex.EncodeToString(sum[:]) + "/globalmount")
	table := []mounter.MountPoint{
		{Device: "/dev/loop1", Path: k("pods/a/volumes/kubernetes.io~csi/pv/mount"), Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: staging, Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: k("pods/b/volumes/kubernetes.io~csi/pv/mount"), Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: k("pods/c/volumes/kubernetes.io~csi/pv/mount"), Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: k("pods/a/volume-subpaths/pv/app/0"), Type: "ext4", Root: "/data"},
		{Device: "/dev/loop1", Path: "/mnt/by-hand", Type: "ext4", Root: "/"},
		{Device: "devtmpfs", Path: k("plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid"), Type: "devtmpfs", Root: "/loop2"},
		{Device: "devtmpfs", Path: k("pods/uid/volumeDevices/kubernetes.io~csi/pv"), Type: "devtmpfs", Root: "/loop2"},
		{Device: "/dev/loop12", Path: "/other", Type: "ext4", Root: "/"},
	}
	r := &Reconciler{Kubelet: kubelet.Layout{Root: root, Driver: drv}}
	disk := cloud.Disk{ID: "disk-1", Tags: map[string]string{effects.TagVolumeID: id}}
	fs := &store.Volume{ID: id, Capability: store.Capability{AccessType: "mount"}}
	stage, targets, others := r.kubeletMounts(table, "/dev/loop1", disk, fs)
	if stage != staging || !slices.Equal(targets, []string{table[0].Path, table[2].Path}) || len(others) != 3 {
		t.Fatalf("filesystem: stage %q targets %v others %v", stage, targets, others)
	}
	// Without a kubelet root, only the paths the record names.
	fs.Stage, fs.Targets = &store.Stage{Path: "/mnt/by-hand"}, map[string]store.Target{table[0].Path: {}}
	stage, targets, _ = (&Reconciler{}).kubeletMounts(table, "/dev/loop1", disk, fs)
	if stage != "/mnt/by-hand" || !slices.Equal(targets, []string{table[0].Path}) {
		t.Fatalf("recorded paths: stage %q targets %v", stage, targets)
	}
	blk := &store.Volume{ID: id, Capability: store.Capability{AccessType: "block"}}
	stage, targets, others = r.kubeletMounts(table, "/dev/loop2", disk, blk)
	if stage != "" || !slices.Equal(targets, []string{table[6].Path}) || !slices.Equal(others, []string{table[7].Path}) {
		t.Fatalf("raw block: stage %q targets %v others %v", stage, targets, others)
	}
}

func TestDropVanished(t *testing.T) {
	v := &store.Volume{ID: "v", State: fsm.Published, Capability: store.Capability{AccessType: "mount"},
		Stage: &store.Stage{Path: "/s"}, Targets: map[string]store.Target{"/t1": {}, "/t2": {}}}
	mounted := func(paths ...string) []mounter.MountPoint {
		var m []mounter.MountPoint
		for _, p := range paths {
			m = append(m, mounter.MountPoint{Path: p})
		}
		return m
	}
	if nv, _, _ := dropVanished(v, mounted("/s", "/t1", "/t2")); nv != nil {
		t.Fatalf("nothing vanished, yet: %+v", nv)
	}
	if nv, g, why := dropVanished(v, mounted("/s", "/t1")); nv == nil || nv.State != fsm.Published || len(nv.Targets) != 1 || why == "" || g != fsm.OtherTargets {
		t.Fatalf("one target gone: %+v", nv)
	}
	if nv, g, _ := dropVanished(v, mounted("/s")); nv == nil || nv.State != fsm.VolReady || nv.Targets != nil || g != fsm.Unpublished {
		t.Fatalf("all targets gone: %+v", nv)
	}
	if nv, g, _ := dropVanished(v, nil); nv == nil || nv.State != fsm.NodeReady || nv.Stage != nil || g != fsm.Unstaged {
		t.Fatalf("everything gone (a reboot): %+v", nv)
	}
	block := &store.Volume{ID: "b", State: fsm.VolReady, Capability: store.Capability{AccessType: "block"}, Stage: &store.Stage{Path: "/s"}}
	if nv, _, _ := dropVanished(block, nil); nv != nil {
		t.Fatalf("a block volume's stage is no mount; nothing vanished: %+v", nv)
	}
}
