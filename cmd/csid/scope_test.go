package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
)

// TestCheckComparesOnlyWhatItRead: csid check on real csids (the local
// backend: loop devices, ext4, real mounts) is clean for a staged and
// published raw block volume (its staging path is kubelet's directory,
// never a mount), and compares only the mounts of the csids it read: those
// in another csid's kubelet directory are not reported, even when
// --kubelet-root (the stand-in for state files) names that directory.
func TestCheckComparesOnlyWhatItRead(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	type csid struct {
		dir, kubelet string
		c            apptest.Client
	}
	start := func() csid {
		dir := apptest.ShortTempDir(t)
		kubelet := filepath.Join(dir, "kubelet")
		in := apptest.Start(t, app.Options{Cloud: "local", StateDir: dir, NodeID: "node-1", KubeletRoot: kubelet, Log: zerolog.Nop()})
		t.Cleanup(func() { hostscrub.Scrub(context.Background(), dir) })
		return csid{dir, kubelet, apptest.Dial(t, in.Socket)}
	}
	// use stages and publishes a volume where kubelet would, and writes
	// kubelet's vol_data.json beside a filesystem volume's mount points.
	use := func(s csid, name string, vc *csi.VolumeCapability) {
		id := apptest.R(s.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
		staging := filepath.Join(s.kubelet, "plugins/kubernetes.io/csi", driver.DefaultName, "0f1e2d", "globalmount")
		target := filepath.Join(s.kubelet, "pods/uid-1/volumes/kubernetes.io~csi", name, "mount")
		if vc.GetBlock() != nil {
			staging = filepath.Join(s.kubelet, "plugins/kubernetes.io/csi/volumeDevices/staging", name)
			target = filepath.Join(s.kubelet, "plugins/kubernetes.io/csi/volumeDevices/publish", name, "uid-1")
		}
		for _, d := range []string{staging, filepath.Dir(target)} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
		if vc.GetMount() != nil {
			apptest.WriteVolData(t, filepath.Dir(staging), id)
			apptest.WriteVolData(t, filepath.Dir(target), id)
		}
		pc := apptest.R(s.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
		apptest.R(s.c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pc.PublishContext})).Must(t)
		apptest.R(s.c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc})).Must(t)
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

	a, b := start(), start()
	cases := []struct {
		name  string
		setup func()
		args  []string
		mount int // the mounts of csid compared
	}{
		{"a staged and published raw block volume", func() { use(a, "pvc-block", block) },
			[]string{"--state-dir", a.dir, "--kubelet-root", a.kubelet}, 1},
		{"another csid's volume in its own kubelet directory", func() { use(b, "pvc-other", apptest.MountCap("ext4")) },
			[]string{"--state-dir", a.dir, "--kubelet-root", b.kubelet}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.setup()
			code, doc := checkRun(t, c.args...)
			if code != 0 || !doc.Clean() || doc.Checked.Mounts != c.mount {
				_, table, _ := cli(t, append([]string{"check"}, c.args...)...)
				t.Fatalf("exit %d, %d mounts compared (want %d):\n%s", code, doc.Checked.Mounts, c.mount, table)
			}
			if want := []check.Kubelet{{DriverName: driver.DefaultName, Root: a.kubelet}}; !slices.Equal(doc.Kubelets, want) {
				t.Errorf("compared the kubelet directories %+v, want %+v (the csid read says its own)", doc.Kubelets, want)
			}
		})
	}
	// The other csid's own check sees its volume, and only that.
	if code, doc := checkRun(t, "--state-dir", b.dir, "--kubelet-root", a.kubelet); code != 0 || !doc.Clean() || doc.Checked.Mounts != 2 {
		t.Errorf("the other csid's check: exit %d, checked %+v, findings %+v", code, doc.Checked, doc.Findings)
	}
}

// TestInspectShowsThePodsOwnCsid: a controller and a node csid answer in
// one state directory, as on a single-node cluster where the two pods
// share the node's /var/lib/csid. The controller runs in a pid namespace of
// its own (another pod); csid inspect, run beside the node csid (kubectl
// exec into the node pod), shows the node's records by default and says
// so. When both run beside it, it shows the first (controller) and says
// which others answer.
func TestInspectShowsThePodsOwnCsid(t *testing.T) {
	testutil.RequireRoot(t) // a pid namespace
	ctx := context.Background()
	for _, elsewhere := range []bool{true, false} {
		t.Run(fmt.Sprintf("controller in another pid namespace: %v", elsewhere), func(t *testing.T) {
			dir := apptest.ShortTempDir(t)
			var attr *syscall.SysProcAttr
			if elsewhere {
				attr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			}
			ctrlSock := filepath.Join(dir, "controller.sock")
			p := startCSIDProcessWith(t, attr, "", "serve", "--mode", "controller", "--cloud", "fake", "--state-dir", dir,
				"--endpoint", "unix://"+ctrlSock, "--log-level", "error")
			waitReady(t, p, ctrlSock)
			apptest.Start(t, app.Options{Mode: driver.ModeNode, Cloud: "fake", StateDir: dir, Endpoint: "unix://" + filepath.Join(dir, "node.sock"), Log: zerolog.Nop()})
			vc := apptest.MountCap("ext4")
			id := apptest.R(apptest.Dial(t, ctrlSock).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1",
				VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId

			wantMode, other := "node", app.AdminSocketPath(dir, driver.ModeController)
			if !elsewhere {
				wantMode, other = "controller", app.AdminSocketPath(dir, driver.ModeNode)
			}
			code, stdout, stderr := cli(t, "inspect", "volumes", "--state-dir", dir)
			if code != 0 {
				t.Fatalf("csid inspect volumes: exit %d\n%s", code, stderr)
			}
			note := fmt.Sprintf("Note: showing csid (%s, pid ", wantMode)
			if !strings.HasPrefix(stdout, note) || !strings.Contains(stdout, other) {
				t.Errorf("the table does not start by saying it shows the %s csid and that %s answers too:\n%s", wantMode, other, stdout)
			}
			if elsewhere != strings.Contains(stdout, "the csid of this container") {
				t.Errorf("the note does not say why it shows this csid:\n%s", stdout)
			}
			if (wantMode == "controller") != strings.Contains(stdout, id) {
				t.Errorf("the table is not the %s's records:\n%s", wantMode, stdout)
			}
			code, stdout, stderr = cli(t, "inspect", "volumes", "--state-dir", dir, "-o", "json")
			var l view.VolumeList
			if err := json.Unmarshal([]byte(stdout), &l); code != 0 || err != nil {
				t.Fatalf("-o json: exit %d, %v:\n%s%s", code, err, stdout, stderr)
			}
			if (wantMode == "controller") != (len(l.Volumes) == 1) || !strings.Contains(stderr, "showing csid ("+wantMode) {
				t.Errorf("-o json: %d volumes, stderr %q; want the %s's records and a note", len(l.Volumes), stderr, wantMode)
			}
		})
	}
}

// TestNodeAdoptsOnlyKubeletsMounts: a staged and published volume's device
// is also mounted by hand at other paths, and the node plugin restarts
// (with its state file, and without: it adopts what it finds). Of those
// mounts only kubelet's target for the volume (its path, and the
// vol_data.json kubelet writes beside it) is adopted; an operator's bind
// mount outside kubelet's directory, a sub-path kubelet binds for a
// container, a bind at another volume's target, are not, and csid check
// reports those that are nobody's. Once they are gone, kubelet's
// NodeUnpublish and NodeUnstage go through.
func TestNodeAdoptsOnlyKubeletsMounts(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("state file lost %v", lost), func(t *testing.T) {
			dir := apptest.ShortTempDir(t)
			t.Cleanup(func() { hostscrub.Scrub(context.Background(), dir) })
			k := filepath.Join(dir, "kubelet")
			ctrl := apptest.Start(t, app.Options{Mode: driver.ModeController, Cloud: "local", StateDir: dir,
				Endpoint: "unix://" + filepath.Join(dir, "controller.sock"), Log: zerolog.Nop()})
			nodeOpts := app.Options{Mode: driver.ModeNode, Cloud: "local", StateDir: dir, NodeID: "node-1",
				Endpoint: "unix://" + filepath.Join(dir, "node.sock"), KubeletRoot: k, Log: zerolog.Nop()}
			node := apptest.Start(t, nodeOpts)
			c, n := apptest.Dial(t, ctrl.Socket), apptest.Dial(t, node.Socket)
			vc := apptest.MountCap("ext4")
			id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-a", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
			staging := apptest.KubeletStaging(k, id)
			target := func(pod string) string { return filepath.Join(k, "pods", pod, "volumes/kubernetes.io~csi/pvc-a/mount") }
			apptest.WriteVolData(t, filepath.Dir(staging), id)
			apptest.WriteVolData(t, filepath.Dir(target("pod-a")), id)
			mkdirT(t, staging)
			pc := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
			apptest.R(n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pc.PublishContext})).Must(t)
			apptest.R(n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target("pod-a"), StagingTargetPath: staging, VolumeCapability: vc})).Must(t)

			cases := []struct {
				name              string
				path              string
				volData           string // the volume kubelet's vol_data.json beside it names
				adopted, reported bool
			}{
				{"an operator's bind mount outside kubelet's directory", filepath.Join(dir, "backup", "mnt"), "", false, true},
				{"a sub-path kubelet binds for a container", filepath.Join(k, "pods/pod-a/volume-subpaths/pvc-a/app/0"), "", false, false},
				{"a bind at another volume's target", filepath.Join(k, "pods/pod-x/volumes/kubernetes.io~csi/pvc-x/mount"), "vol-other", false, true},
				{"kubelet's target for the volume in another pod", target("pod-b"), id, true, false},
			}
			for _, c := range cases {
				mkdirT(t, c.path)
				if c.volData != "" {
					apptest.WriteVolData(t, filepath.Dir(c.path), c.volData)
				}
				if err := syscall.Mount(staging, c.path, "", syscall.MS_BIND, ""); err != nil {
					t.Fatal(err)
				}
			}
			node.Stop(t)
			if lost {
				if err := os.Remove(app.StateFile(dir, driver.ModeNode)); err != nil {
					t.Fatal(err)
				}
				nodeOpts.RebuildFromCloud = true // a lost node file is rebuilt only when asked
			}
			node = apptest.Start(t, nodeOpts)
			n = apptest.Dial(t, node.Socket)

			adm := admin.NewClient(app.AdminSocketPath(dir, driver.ModeNode), 5*time.Second)
			defer adm.Close()
			rec := apptest.R(adm.Volume(ctx, id)).Must(t)
			_, doc := checkRun(t, "--state-dir", dir)
			for _, c := range cases {
				adopted := slices.ContainsFunc(rec.Targets, func(tg view.Target) bool { return tg.Path == c.path })
				reported := slices.ContainsFunc(doc.Findings, func(f check.Finding) bool { return f.Kind == check.MountUnaccounted && f.Path == c.path })
				if adopted != c.adopted || reported != c.reported {
					t.Errorf("%s: adopted %v, reported by csid check %v; want %v, %v", c.name, adopted, reported, c.adopted, c.reported)
				}
			}
			if len(doc.Findings) != 2 {
				t.Errorf("csid check found %d problems, want the 2 mounts that are nobody's: %+v", len(doc.Findings), doc.Findings)
			}

			// The operator removes what they mounted; kubelet unpublishes
			// and unstages.
			for _, c := range cases {
				if !c.adopted {
					if err := syscall.Unmount(c.path, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, tg := range rec.Targets {
				apptest.R(n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg.Path})).Must(t)
			}
			apptest.R(n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})).Must(t)
			apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
			if code, doc := checkRun(t, "--state-dir", dir); code != 0 {
				t.Errorf("csid check after the clean-up: exit %d, %+v", code, doc.Findings)
			}
		})
	}
}

func mkdirT(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}
