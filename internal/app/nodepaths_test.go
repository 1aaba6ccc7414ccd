package app_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/moby/sys/mountinfo"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The node's path rules (issue 13), on real mounts: a node op never
// unmounts or removes what it did not make, follows no symbolic link,
// mounts on no content, and stays under kubelet's root when it has one.
// Each table entry snapshots the host under the test's directory before
// the call and compares after it: a refused call changes nothing there.

// nodeEnv is an all-in-one csid on the local backend, and a kubelet
// directory beside its state.
type nodeEnv struct {
	t       *testing.T
	dir     string // the state directory, without symbolic links
	kubelet string
	c       apptest.Client
	n       int
}

func newNodeEnv(t *testing.T, o app.Options) *nodeEnv {
	t.Helper()
	dir, err := filepath.EvalSymlinks(apptest.ShortTempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.Mkdir(kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	if o.KubeletRoot == "kubelet" {
		o.KubeletRoot = kubelet
	}
	o.Cloud, o.StateDir, o.Log = "local", dir, zerolog.Nop()
	in := apptest.Start(t, o)
	return &nodeEnv{t: t, dir: dir, kubelet: kubelet, c: apptest.Dial(t, in.Socket)}
}

// path is a path under the kubelet directory; mkdirs its parent.
func (e *nodeEnv) path(elem ...string) string {
	e.t.Helper()
	p := filepath.Join(append([]string{e.kubelet}, elem...)...)
	mkdir(e.t, filepath.Dir(p))
	return p
}

// volume creates a volume of capability vc and attaches it to node-1.
func (e *nodeEnv) volume(vc *csi.VolumeCapability) (string, map[string]string) {
	e.t.Helper()
	ctx := context.Background()
	e.n++
	id := apptest.R(e.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("pvc-%d", e.n), CapacityRange: capRange(16 << 20),
		VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(e.t).Volume.VolumeId
	pub := apptest.R(e.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(e.t)
	return id, pub.PublishContext
}

// staged creates, attaches and stages a volume at a staging directory of
// its own (kubelet creates it); it returns the id and the staging path.
func (e *nodeEnv) staged(vc *csi.VolumeCapability) (string, string) {
	e.t.Helper()
	id, pub := e.volume(vc)
	staging := e.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", id, "globalmount")
	mkdir(e.t, staging)
	apptest.R(e.c.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: vc, PublishContext: pub})).Must(e.t)
	return id, staging
}

// published stages a volume and publishes it at a target of its own; it
// returns the id, the staging path and the target.
func (e *nodeEnv) published(vc *csi.VolumeCapability) (string, string, string) {
	e.t.Helper()
	id, staging := e.staged(vc)
	target := e.path("pods", "uid-"+id, "volumes", "kubernetes.io~csi", "pv-"+id, "mount")
	apptest.R(e.c.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
		StagingTargetPath: staging, VolumeCapability: vc})).Must(e.t)
	return id, staging, target
}

func (e *nodeEnv) publish(id, staging, target string, vc *csi.VolumeCapability) error {
	_, err := e.c.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
		StagingTargetPath: staging, VolumeCapability: vc})
	return err
}

func (e *nodeEnv) unpublish(id, target string) error {
	_, err := e.c.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	return err
}

func (e *nodeEnv) stage(id, staging string, vc *csi.VolumeCapability, pub map[string]string) error {
	_, err := e.c.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: vc, PublishContext: pub})
	return err
}

func (e *nodeEnv) unstage(id, staging string) error {
	_, err := e.c.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	return err
}

func mkdir(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, to, link string) {
	t.Helper()
	mkdir(t, filepath.Dir(link))
	if err := os.Symlink(to, link); err != nil {
		t.Fatal(err)
	}
}

// hostState describes the host as far as a test may look: every entry
// under roots (testutil.Tree), and every mount under dir (its filesystem,
// source and root, in stacking order).
func hostState(t *testing.T, dir string, roots ...string) map[string]string {
	t.Helper()
	out := testutil.Tree(t, roots...)
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		out["mount "+m.Mountpoint] += fmt.Sprintf("[%s %s %s]", m.FSType, m.Source, m.Root)
	}
	return out
}

// wantStatus fails the test unless err has code and a message holding
// every one of words.
func wantStatus(t *testing.T, what string, err error, code codes.Code, words ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Errorf("%s: %v; want %s", what, err, code)
		return
	}
	for _, w := range words {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("%s: the message %q does not name %q", what, st.Message(), w)
		}
	}
}

// TestNodeOpsUndoOnlyWhatTheyMade: the cases of issue 13 where a failed
// NodeStageVolume or NodePublishVolume "compensated" by unmounting and
// removing whatever was at the path it was given. Each is refused with
// FailedPrecondition naming what is there, and nothing under the test's
// directory changes; the negation (NodeUnpublish, NodeUnstage) of the same
// path answers OK and changes nothing either. A stage that fails after it
// made its directory removes that directory, and only a directory it made.
func TestNodeOpsUndoOnlyWhatTheyMade(t *testing.T) {
	testutil.RequireRoot(t)
	e := newNodeEnv(t, app.Options{})
	fsCap, blkCap := apptest.MountCap("ext4"), blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	idA, _, targetA := e.published(fsCap)
	writeFile(t, filepath.Join(targetA, "a-data"), "A's")
	idC, stagingC := e.staged(fsCap)
	writeFile(t, filepath.Join(stagingC, "c-data"), "C's")
	withTmpfs := e.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", "tmpfs", "globalmount")
	mkdir(t, withTmpfs)
	if err := unix.Mount("tmpfs", withTmpfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(withTmpfs, "t-data"), "the tmpfs's")
	file := e.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", "file", "globalmount")
	writeFile(t, file, "a file's")
	emptyDir := e.path("plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv-dir", "uid-1")
	mkdir(t, emptyDir)
	fileTarget := e.path("plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv-file", "uid-1")
	writeFile(t, fileTarget, "content")

	// stagedFS and stagedBlock make a fresh volume B for a case.
	stagedFS := func() (string, string) { return e.staged(fsCap) }
	stagedBlock := func() (string, string) { return e.staged(blkCap) }
	cases := []struct {
		name string
		// call makes B and returns the refused call and its negation.
		call   func() (do, undo func() error)
		code   codes.Code
		naming string
	}{
		{"NodePublish onto another volume's published target", func() (func() error, func() error) {
			id, st := stagedFS()
			return func() error { return e.publish(id, st, targetA, fsCap) }, func() error { return e.unpublish(id, targetA) }
		}, codes.FailedPrecondition, "ext4 from /dev/loop"},
		{"NodePublish onto another volume's staging path", func() (func() error, func() error) {
			id, st := stagedFS()
			return func() error { return e.publish(id, st, stagingC, fsCap) }, func() error { return e.unpublish(id, stagingC) }
		}, codes.FailedPrecondition, "ext4 from /dev/loop"},
		{"NodeStage onto another volume's staging path", func() (func() error, func() error) {
			id, pub := e.volume(fsCap)
			return func() error { return e.stage(id, stagingC, fsCap, pub) }, func() error { return e.unstage(id, stagingC) }
		}, codes.FailedPrecondition, "ext4 from /dev/loop"},
		{"NodeStage onto a directory holding a tmpfs", func() (func() error, func() error) {
			id, pub := e.volume(fsCap)
			return func() error { return e.stage(id, withTmpfs, fsCap, pub) }, func() error { return e.unstage(id, withTmpfs) }
		}, codes.FailedPrecondition, "tmpfs"},
		{"NodeStage onto a regular file", func() (func() error, func() error) {
			id, pub := e.volume(fsCap)
			return func() error { return e.stage(id, file, fsCap, pub) }, func() error { return e.unstage(id, file) }
		}, codes.FailedPrecondition, "not one"},
		{"NodePublish onto a regular file", func() (func() error, func() error) {
			id, st := stagedFS()
			return func() error { return e.publish(id, st, file, fsCap) }, func() error { return e.unpublish(id, file) }
		}, codes.FailedPrecondition, "not one"},
		{"block NodePublish onto an existing empty directory", func() (func() error, func() error) {
			id, st := stagedBlock()
			return func() error { return e.publish(id, st, emptyDir, blkCap) }, func() error { return e.unpublish(id, emptyDir) }
		}, codes.FailedPrecondition, "not one"},
		{"block NodePublish onto a file with content", func() (func() error, func() error) {
			id, st := stagedBlock()
			return func() error { return e.publish(id, st, fileTarget, blkCap) }, func() error { return e.unpublish(id, fileTarget) }
		}, codes.FailedPrecondition, "content"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			do, undo := c.call()
			before := hostState(t, e.dir, e.kubelet)
			wantStatus(t, c.name, do(), c.code, c.naming)
			if d := testutil.Changes(before, hostState(t, e.dir, e.kubelet)); len(d) > 0 {
				t.Errorf("the refused call changed the host:\n%s", strings.Join(d, "\n"))
			}
			if err := undo(); err != nil {
				t.Errorf("the negation of the refused call: %v", err)
			}
			if d := testutil.Changes(before, hostState(t, e.dir, e.kubelet)); len(d) > 0 {
				t.Errorf("the negation of the refused call changed the host:\n%s", strings.Join(d, "\n"))
			}
		})
	}

	// A stage that fails after it made its staging directory (mount(8)
	// refuses an option) removes that directory; one that found the
	// directory there leaves it.
	badOption := mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	badOption.GetMount().MountFlags = []string{"csid-no-such-option"}
	for _, existed := range []bool{false, true} {
		id, pub := e.volume(badOption)
		staging := e.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", fmt.Sprintf("bad-%v", existed), "globalmount")
		if existed {
			mkdir(t, staging)
		}
		before := hostState(t, e.dir, e.kubelet)
		if err := e.stage(id, staging, badOption, pub); status.Code(err) == codes.OK {
			t.Fatalf("a stage with an option mount(8) refuses succeeded")
		}
		if d := testutil.Changes(before, hostState(t, e.dir, e.kubelet)); len(d) > 0 {
			t.Errorf("a failed stage (directory existed: %v) left the host changed:\n%s", existed, strings.Join(d, "\n"))
		}
	}

	// A and C are as they were, and go as kubelet would make them go.
	if got, err := os.ReadFile(filepath.Join(targetA, "a-data")); err != nil || string(got) != "A's" {
		t.Errorf("A's target after the cases: %q, %v", got, err)
	}
	if err := e.unpublish(idA, targetA); err != nil {
		t.Errorf("NodeUnpublish of A: %v", err)
	}
	if err := e.unstage(idC, stagingC); err != nil {
		t.Errorf("NodeUnstage of C: %v", err)
	}
	if err := unix.Unmount(withTmpfs, 0); err != nil {
		t.Errorf("the tmpfs was not mounted any more: %v", err)
	}
}

// TestNodeFollowsNoSymlink: a symbolic link as, or in, a staging or target
// path is refused with InvalidArgument, and nothing changes where it
// points. A volume recorded at a path whose parent was since replaced by a
// link is not reported unpublished or unstaged while its mount stays. With
// a kubelet root, paths outside it are refused.
func TestNodeFollowsNoSymlink(t *testing.T) {
	testutil.RequireRoot(t)
	e := newNodeEnv(t, app.Options{})
	fsCap, blkCap := apptest.MountCap("ext4"), blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	elsewhere := filepath.Join(e.dir, "elsewhere")
	mkdir(t, filepath.Join(elsewhere, "empty"), filepath.Join(elsewhere, "parent"))
	writeFile(t, filepath.Join(elsewhere, "file"), "")
	writeFile(t, filepath.Join(elsewhere, "keep"), "elsewhere's")
	toEmpty := e.path("pods", "uid-link", "volumes", "kubernetes.io~csi", "pv", "mount")
	symlink(t, filepath.Join(elsewhere, "empty"), toEmpty)
	toFile := e.path("plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv", "uid-link")
	symlink(t, filepath.Join(elsewhere, "file"), toFile)
	viaParent := e.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", "linked")
	symlink(t, filepath.Join(elsewhere, "parent"), viaParent)

	// Recorded at a path whose parent is then replaced by a link to where
	// it was moved: the mount moved with it.
	idA, _, targetA := e.published(fsCap)
	idC, stagingC := e.staged(fsCap)
	for _, p := range []string{filepath.Dir(targetA), filepath.Dir(stagingC)} {
		if err := os.Rename(p, p+"-moved"); err != nil {
			t.Fatal(err)
		}
		symlink(t, filepath.Base(p)+"-moved", p)
	}

	cases := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"NodeStage at a link to an empty directory", func() error {
			id, pub := e.volume(fsCap)
			return e.stage(id, toEmpty, fsCap, pub)
		}, codes.InvalidArgument},
		{"NodeStage below a linked directory", func() error {
			id, pub := e.volume(fsCap)
			return e.stage(id, filepath.Join(viaParent, "globalmount"), fsCap, pub)
		}, codes.InvalidArgument},
		{"NodePublish at a link to an empty directory", func() error {
			id, st := e.staged(fsCap)
			return e.publish(id, st, toEmpty, fsCap)
		}, codes.InvalidArgument},
		{"NodePublish below a linked directory", func() error {
			id, st := e.staged(fsCap)
			return e.publish(id, st, filepath.Join(viaParent, "mount"), fsCap)
		}, codes.InvalidArgument},
		{"block NodePublish at a link to an empty file", func() error {
			id, st := e.staged(blkCap)
			return e.publish(id, st, toFile, blkCap)
		}, codes.InvalidArgument},
		{"NodeUnpublish of a target whose parent is now a link", func() error { return e.unpublish(idA, targetA) }, codes.InvalidArgument},
		{"NodeUnstage of a staging path whose parent is now a link", func() error { return e.unstage(idC, stagingC) }, codes.InvalidArgument},
		{"NodeUnpublish at a link it never published", func() error {
			id, _ := e.staged(fsCap)
			return e.unpublish(id, toEmpty)
		}, codes.OK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := hostState(t, e.dir, e.kubelet, elsewhere)
			wantStatus(t, c.name, c.call(), c.code)
			// The volumes the cases make are staged before the snapshot's
			// comparison could see them: compare only what was there.
			after := hostState(t, e.dir, e.kubelet, elsewhere)
			for p := range after {
				if _, ok := before[p]; !ok && !strings.Contains(p, "/csid.csi.dev/vol-") {
					t.Errorf("%s appeared", p)
				}
			}
			for p, b := range before {
				if after[p] != b {
					t.Errorf("%s is %q, was %q", p, after[p], b)
				}
			}
		})
	}
	for _, p := range []string{filepath.Dir(targetA) + "-moved/mount", filepath.Dir(stagingC) + "-moved/globalmount"} {
		if ok, err := mountinfo.Mounted(p); err != nil || !ok {
			t.Errorf("%s: mounted %v, %v; want still mounted", p, ok, err)
		}
	}

	// With a kubelet root, only paths under it.
	k := newNodeEnv(t, app.Options{KubeletRoot: "kubelet"})
	outside := filepath.Join(k.dir, "kubelet-other", "globalmount")
	mkdir(t, outside)
	id, pub := k.volume(fsCap)
	wantStatus(t, "NodeStage outside the kubelet root", k.stage(id, outside, fsCap, pub), codes.InvalidArgument, "outside kubelet's directory")
	wantStatus(t, "NodeUnstage outside the kubelet root", k.unstage(id, outside), codes.InvalidArgument, "outside kubelet's directory")
	staging := k.path("plugins", "kubernetes.io", "csi", "csid.csi.dev", "sha", "globalmount")
	mkdir(t, staging)
	if err := k.stage(id, staging, fsCap, pub); err != nil {
		t.Fatalf("NodeStage under the kubelet root: %v", err)
	}
	wantStatus(t, "NodePublish outside the kubelet root", k.publish(id, staging, filepath.Join(k.dir, "mount"), fsCap), codes.InvalidArgument, "outside kubelet's directory")
	wantStatus(t, "NodeUnpublish outside the kubelet root", k.unpublish(id, filepath.Join(k.dir, "mount")), codes.InvalidArgument, "outside kubelet's directory")
	target := k.path("pods", "uid", "volumes", "kubernetes.io~csi", "pv", "mount")
	if err := k.publish(id, staging, target, fsCap); err != nil {
		t.Fatalf("NodePublish under the kubelet root: %v", err)
	}
	if err := k.unpublish(id, target); err != nil {
		t.Fatal(err)
	}
	if err := k.unstage(id, staging); err != nil {
		t.Fatal(err)
	}
}

// TestNodePublishTargetRules: a target that is the staging path (or inside
// it, or holding it) is InvalidArgument, and NodeUnpublish of it then
// leaves the staging mounted; a target that is a directory with content is
// FailedPrecondition, and nothing is mounted over the content. An empty
// directory (older kubelets create it) is a good target, and goes on
// NodeUnpublish.
func TestNodePublishTargetRules(t *testing.T) {
	testutil.RequireRoot(t)
	e := newNodeEnv(t, app.Options{})
	fsCap := apptest.MountCap("ext4")
	id, staging := e.staged(fsCap)
	writeFile(t, filepath.Join(staging, "data"), "the volume's")
	full := e.path("pods", "uid-full", "volumes", "kubernetes.io~csi", "pv", "mount")
	writeFile(t, filepath.Join(full, "theirs"), "not the volume's")
	cases := []struct {
		name   string
		target string
		code   codes.Code
		words  []string
	}{
		{"the staging path", staging, codes.InvalidArgument, []string{"staging_target_path"}},
		{"inside the staging path", filepath.Join(staging, "sub"), codes.InvalidArgument, []string{"inside"}},
		{"holding the staging path", filepath.Dir(staging), codes.InvalidArgument, []string{"inside"}},
		{"a directory with content", full, codes.FailedPrecondition, []string{"content"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := hostState(t, e.dir, e.kubelet)
			wantStatus(t, "NodePublish at "+c.name, e.publish(id, staging, c.target, fsCap), c.code, c.words...)
			if err := e.unpublish(id, c.target); err != nil {
				t.Errorf("NodeUnpublish at %s: %v", c.name, err)
			}
			if d := testutil.Changes(before, hostState(t, e.dir, e.kubelet)); len(d) > 0 {
				t.Errorf("publish and unpublish at %s changed the host:\n%s", c.name, strings.Join(d, "\n"))
			}
		})
	}
	if got, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(got) != "the volume's" {
		t.Fatalf("the staging after the refused publishes: %q, %v", got, err)
	}
	empty := e.path("pods", "uid-empty", "volumes", "kubernetes.io~csi", "pv", "mount")
	mkdir(t, empty)
	if err := e.publish(id, staging, empty, fsCap); err != nil {
		t.Fatalf("NodePublish at an empty directory: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(empty, "data")); err != nil || string(got) != "the volume's" {
		t.Fatalf("the published volume: %q, %v", got, err)
	}
	if err := e.unpublish(id, empty); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("NodeUnpublish left the target: %v", err)
	}
	if err := e.unstage(id, staging); err != nil {
		t.Fatal(err)
	}
}
