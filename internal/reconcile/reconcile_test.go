package reconcile

import (
	"slices"
	"testing"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/store"
)

func TestMountsOf(t *testing.T) {
	table := []mounter.MountPoint{
		{Device: "/dev/loop1", Path: "/k/pods/a/mount", Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: "/k/plugins/x/globalmount", Type: "ext4", Root: "/"},
		{Device: "/dev/loop1", Path: "/k/pods/b/mount", Type: "ext4", Root: "/"},
		{Device: "devtmpfs", Path: "/k/volumeDevices/publish/pv/uid", Type: "devtmpfs", Root: "/loop2"},
		{Device: "/dev/loop12", Path: "/other", Type: "ext4", Root: "/"},
	}
	stage, targets := mountsOf(table, "/dev/loop1")
	if stage != "/k/plugins/x/globalmount" || !slices.Equal(targets, []string{"/k/pods/a/mount", "/k/pods/b/mount"}) {
		t.Fatalf("filesystem: stage %q targets %v", stage, targets)
	}
	stage, targets = mountsOf(table, "/dev/loop2")
	if stage != "" || !slices.Equal(targets, []string{"/k/volumeDevices/publish/pv/uid"}) {
		t.Fatalf("raw block: stage %q targets %v", stage, targets)
	}
	// Without kubelet's globalmount, the first mounted is the staging mount.
	stage, targets = mountsOf(table[2:3], "/dev/loop1")
	if stage != "/k/pods/b/mount" || len(targets) != 0 {
		t.Fatalf("no globalmount: stage %q targets %v", stage, targets)
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
