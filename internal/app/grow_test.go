package app_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/testutil"
)

// The tests here run resize2fs for real, slowed down or killed part-way by
// writeshim (testdata/writeshim.c, built with gcc and preloaded into
// resize2fs alone by a wrapper first on csid's PATH), in a csid that leads
// its own process group, as in a container, and that lacks
// CAP_SYS_RESOURCE (setpriv), so that it grows ext4 offline.

// growRig is a state dir with the shim and the wrapper built.
type growRig struct {
	dir  string
	bin  string // the directory of the resize2fs wrapper
	co   childOptions
	vc   *csi.VolumeCapability
	ctx  context.Context
	vols []*growVol
}

// growVol is a volume of the rig, with the files written into it.
type growVol struct {
	name, id, diskID string
	sums             map[string][32]byte
	stage, target    string
}

const growFrom, growTo = 64 << 20, 128 << 20

func newGrowRig(t *testing.T) *growRig {
	t.Helper()
	testutil.RequireRoot(t)
	for _, tool := range []string{"gcc", "setpriv", "resize2fs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (.ci/run installs it): %v", tool, err)
		}
	}
	dir := apptest.ShortTempDir(t)
	_, file, _, _ := runtime.Caller(0)
	shim := filepath.Join(dir, "writeshim.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-o", shim,
		filepath.Join(filepath.Dir(file), "testdata", "writeshim.c"), "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build the shim: %v\n%s", err, out)
	}
	real, err := exec.LookPath("resize2fs")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	wrapper := fmt.Sprintf("#!/bin/sh\nLD_PRELOAD=%s exec %s \"$@\"\n", shim, real)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "resize2fs"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	return &growRig{dir: dir, bin: bin, vc: apptest.MountCap("ext4"), ctx: context.Background(),
		co: childOptions{Mode: driver.ModeAll, Endpoint: "unix://" + dir + "/csi.sock", StateDir: dir, Cloud: "local", NodeID: "node-1"}}
}

// start runs csid as its own process group's leader, without
// CAP_SYS_RESOURCE, with the wrapper first on its PATH and shim settings
// in env.
func (r *growRig) start(t *testing.T, env ...string) (*child, apptest.Client) {
	t.Helper()
	cmd := exec.Command("setpriv", "--bounding-set", "-sys_resource", "--", os.Args[0], "-test.run=^$")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	env = append([]string{"PATH=" + r.bin + ":" + os.Getenv("PATH")}, env...)
	c := runChild(t, r.co, cmd, env...)
	t.Cleanup(func() { _ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) }) // the group, if a test failed mid-way
	return c, apptest.Dial(t, c.socket)
}

// prepare makes n volumes of growFrom bytes, writes files into each, and
// expands each, detached, to growTo: every one is then a filesystem whose
// next NodeStage grows it offline.
func (r *growRig) prepare(t *testing.T, n int) {
	t.Helper()
	proc, c := r.start(t)
	for i := range n {
		v := &growVol{name: fmt.Sprintf("grow-%d", i), sums: map[string][32]byte{}}
		v.stage, v.target = filepath.Join(r.dir, v.name, "stage"), filepath.Join(r.dir, v.name, "pod")
		if err := os.Mkdir(filepath.Join(r.dir, v.name), 0o750); err != nil { // kubelet makes the parents
			t.Fatal(err)
		}
		v.id = apptest.R(c.CreateVolume(r.ctx, &csi.CreateVolumeRequest{Name: v.name, CapacityRange: capRange(growFrom),
			VolumeCapabilities: []*csi.VolumeCapability{r.vc}})).Must(t).Volume.VolumeId
		r.up(t, c, v)
		for j := range 6 { // the same sizes in every volume: resize2fs then writes the same
			data := make([]byte, (j+1)<<20)
			rand.Read(data)
			name := fmt.Sprintf("file-%d", j)
			if err := os.WriteFile(filepath.Join(v.target, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
			v.sums[name] = sha256.Sum256(data)
		}
		r.down(t, c, v)
		apptest.R(c.ControllerExpandVolume(r.ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
			CapacityRange: capRange(growTo), VolumeCapability: r.vc})).Must(t)
		r.vols = append(r.vols, v)
	}
	proc.stop(t)
}

// attach publishes v to the node and returns the NodeStage request.
func (r *growRig) attach(t *testing.T, c apptest.Client, v *growVol) *csi.NodeStageVolumeRequest {
	t.Helper()
	pub := apptest.R(c.ControllerPublishVolume(r.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: "node-1",
		VolumeCapability: r.vc})).Must(t)
	v.diskID = pub.PublishContext[effects.PublishContextDiskID]
	return &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.stage, VolumeCapability: r.vc, PublishContext: pub.PublishContext}
}

// up attaches, stages and publishes v.
func (r *growRig) up(t *testing.T, c apptest.Client, v *growVol) {
	t.Helper()
	apptest.R(c.NodeStageVolume(r.ctx, r.attach(t, c, v))).Must(t)
	apptest.R(c.NodePublishVolume(r.ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, TargetPath: v.target,
		StagingTargetPath: v.stage, VolumeCapability: r.vc})).Must(t)
}

// down unpublishes, unstages and detaches v.
func (r *growRig) down(t *testing.T, c apptest.Client, v *growVol) {
	t.Helper()
	apptest.R(c.NodeUnpublishVolume(r.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})).Must(t)
	r.unstage(t, c, v)
}

// unstage unstages and detaches v, staged but not published.
func (r *growRig) unstage(t *testing.T, c apptest.Client, v *growVol) {
	t.Helper()
	apptest.R(c.NodeUnstageVolume(r.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.stage})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(r.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: "node-1"})).Must(t)
}

// check stages v (in a csid that may have to repair it first), and checks
// that its files are intact and that its filesystem fills the grown disk;
// then brings it down and checks the filesystem with e2fsck -fn.
func (r *growRig) check(t *testing.T, c apptest.Client, v *growVol) error {
	t.Helper()
	if _, err := c.NodeStageVolume(r.ctx, r.attach(t, c, v)); err != nil {
		return fmt.Errorf("NodeStage: %w", err)
	}
	apptest.R(c.NodePublishVolume(r.ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, TargetPath: v.target,
		StagingTargetPath: v.stage, VolumeCapability: r.vc})).Must(t)
	var problems []string
	for name, sum := range v.sums {
		if got, err := os.ReadFile(filepath.Join(v.target, name)); err != nil || sha256.Sum256(got) != sum {
			problems = append(problems, fmt.Sprintf("%s: not what was written (%v)", name, err))
		}
	}
	total := apptest.R(c.NodeGetVolumeStats(r.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: v.target})).Must(t).Usage[0].Total
	if total < growTo*8/10 {
		problems = append(problems, fmt.Sprintf("a filesystem of %d bytes on a %d-byte disk: not grown", total, growTo))
	}
	r.down(t, c, v)
	if clean, out := r.fsck(t, v); !clean {
		problems = append(problems, "e2fsck -fn: "+out)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// fsck runs e2fsck -fn on v's disk image: clean means it found nothing to
// fix (exit status 0, and no question it answered no to).
func (r *growRig) fsck(t *testing.T, v *growVol) (clean bool, out string) {
	t.Helper()
	in, err := local.OpenInspector(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := exec.Command("e2fsck", "-fn", in.ImagePath(v.diskID)).CombinedOutput()
	out = strings.TrimSpace(string(raw))
	return err == nil && !strings.Contains(out, "? no"), out
}

// noGrowRecords checks that no growth record is left.
func (r *growRig) noGrowRecords(t *testing.T) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(r.dir, app.GrowDir, "*"))
	if len(left) > 0 {
		t.Errorf("growth records left: %v", left)
	}
}

// TestShutdownLetsResize2fsFinish is SIGTERM while resize2fs grows a
// filesystem offline at NodeStage: csid stops serving and starts no new
// step, but lets resize2fs finish, and exits within its bound; the
// filesystem is clean, and stages afterwards with its data, grown.
func TestShutdownLetsResize2fsFinish(t *testing.T) {
	r := newGrowRig(t)
	r.prepare(t, 1)
	v := r.vols[0]
	const drain, grace = time.Second, 2 * time.Minute
	r.co.ShutdownTimeout, r.co.HostToolGrace = drain, grace
	started, done := filepath.Join(r.dir, "resize-started"), filepath.Join(r.dir, "resize-done")
	// About 300 writes, 20 ms each: resize2fs runs for seconds, well past
	// the drain's second, after which csid's contexts are cancelled.
	proc, c := r.start(t, "SHIM_DELAY_US=20000", "SHIM_STARTED="+started, "SHIM_DONE="+done)
	stage := r.attach(t, c, v)
	go c.NodeStageVolume(r.ctx, stage) //nolint:errcheck // answered Unavailable or Aborted: csid stops

	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("resize2fs did not start writing within 30s")
		}
		time.Sleep(10 * time.Millisecond) // polling another process's file
	}
	sent := time.Now()
	_ = proc.cmd.Process.Signal(syscall.SIGTERM)
	var exitErr error
	select {
	case exitErr = <-proc.exited:
	case <-time.After(2*drain + grace + 30*time.Second):
		t.Fatal("csid did not exit within its shutdown bound")
	}
	took := time.Since(sent)
	if exitErr != nil {
		t.Errorf("csid exited with %v after SIGTERM, want a clean exit", exitErr)
	}
	writes, err := readWrites(done)
	if err != nil {
		t.Fatalf("after the shutdown: %v", err)
	}
	t.Logf("SIGTERM to exit: %v; resize2fs made %d writes and finished", took.Round(time.Millisecond), writes)
	if !strings.Contains(proc.log.String(), "waiting for host tools to finish") || !strings.Contains(proc.log.String(), "resize2fs") {
		t.Errorf("csid did not say it waited for resize2fs; its log:\n%s", proc.log.String())
	}
	if clean, out := r.fsck(t, v); !clean {
		t.Fatalf("the filesystem after the shutdown needs repair:\n%s", out)
	}

	_, c = r.start(t)
	if err := r.check(t, c, v); err != nil {
		t.Fatal(err)
	}
	r.noGrowRecords(t)
}

// TestGrowthSurvivesAKill SIGKILLs csid's process group (csid and
// resize2fs, as a container dies) while resize2fs grows a filesystem
// offline at NodeStage, at points spread over resize2fs's whole run (its
// N-th write to the device, for N from the first to the last), one volume
// per point. After a restart, NodeStage of every volume succeeds: none needs
// a manual fsck, the files written before the growth are intact, and the
// filesystem is grown.
//
// resize2fs's count of writes is not the same for every volume: under load
// one may make a write more or less than the census volume (289 against 290
// was seen). A volume that finishes before its kill point is grown with no
// kill, and checked as the others (clean for e2fsck -fn, and staged with
// its files, grown); its point then moves to that volume's last write, on
// a spare volume.
func TestGrowthSurvivesAKill(t *testing.T) {
	const points, spares = 12, 3
	r := newGrowRig(t)
	r.prepare(t, 1+points+spares)

	// Census: how many writes resize2fs makes growing one of them.
	census := filepath.Join(r.dir, "census")
	proc, c := r.start(t, "SHIM_DONE="+census)
	if err := r.check(t, c, r.vols[0]); err != nil {
		t.Fatal(err)
	}
	proc.stop(t)
	total, err := readWrites(census)
	if err != nil || total < points {
		t.Fatalf("resize2fs made %d writes (%v): too few to spread %d kills over", total, err, points)
	}
	kills := []int{1, 2, 3}
	for i := 1; len(kills) < points; i++ {
		kills = append(kills, 3+i*(total-3)/(points-3))
	}

	// One volume per point, each repaired before the next kill: the
	// restarted csid resumes the interrupted NodeStage at once.
	vols := r.vols[1:]
	needed, failed := 0, 0
	for _, k := range kills {
		var v *growVol
		for {
			if len(vols) == 0 {
				t.Fatalf("kill at write %d: every spare volume finished before its kill point", k)
			}
			v, vols = vols[0], vols[1:]
			finished := filepath.Join(r.dir, "finished-"+v.name)
			proc, c := r.start(t, "SHIM_KILL_AT="+strconv.Itoa(k), "SHIM_DONE="+finished)
			_, err := c.NodeStageVolume(r.ctx, r.attach(t, c, v))
			if err != nil {
				t.Logf("kill at write %d: NodeStage of %s: %v", k, v.name, err)
				proc.waitKilled(t)
				break
			}
			// Staged: resize2fs exited on its own, before write k.
			proc.stop(t)
			n, rerr := readWrites(finished)
			if rerr != nil || n >= k {
				t.Fatalf("kill at write %d of %d: NodeStage succeeded, yet resize2fs made %d writes (%v)", k, total, n, rerr)
			}
			t.Logf("%s: resize2fs made %d writes, finished before write %d; the point moves to write %d of the next volume", v.name, n, k, n)
			// Grown with no kill, and left staged and attached: brought
			// down, by a csid without the shim's kill, it is checked as
			// the others are.
			proc, c = r.start(t)
			r.unstage(t, c, v)
			if clean, out := r.fsck(t, v); !clean {
				t.Errorf("%s, grown with no kill: e2fsck -fn: %s", v.name, out)
			}
			if err := r.check(t, c, v); err != nil {
				t.Errorf("%s, grown with no kill: %v", v.name, err)
			}
			proc.stop(t)
			k = n
		}
		clean, out := r.fsck(t, v)
		if !clean {
			needed++
		}
		proc, c := r.start(t)
		err := r.check(t, c, v)
		proc.stop(t)
		if err != nil {
			failed++
			t.Errorf("killed at write %d of %d: after the restart: %v", k, total, err)
		}
		t.Logf("killed at write %3d of %d: before the restart e2fsck -fn says %s; after it: %v", k, total, firstLines(out, clean), errOrOK(err))
	}
	t.Logf("%d kills: %d left a filesystem e2fsck -fn finds damaged; after the restart, %d need a manual fsck or lost data",
		len(kills), needed, failed)
	if needed == 0 {
		// Then nothing above needed the repair: the kills no longer
		// strike where a filesystem is left damaged, and the test would
		// pass without it.
		t.Errorf("none of the %d kills left a damaged filesystem: the repair was never exercised", len(kills))
	}
	r.noGrowRecords(t)
}

// readWrites reads the count of writes the shim wrote to path when
// resize2fs exited on its own.
func readWrites(path string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("resize2fs did not exit on its own: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(raw)))
}

func errOrOK(err error) string {
	if err != nil {
		return err.Error()
	}
	return "staged, data intact, grown, e2fsck -fn clean"
}

// firstLines sums up e2fsck's output for a log line.
func firstLines(out string, clean bool) string {
	if clean {
		return "clean"
	}
	var found []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "?") || strings.Contains(l, "e2fsck:") || strings.Contains(l, "invalid") {
			found = append(found, strings.TrimSpace(l))
		}
	}
	if len(found) > 3 {
		found = append(found[:3], "...")
	}
	return "needs repair: " + strings.Join(found, " | ")
}
