package app_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/bench"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// mkfsFloorConfig is a run of the lifecycle alone, whose floors are made
// in floorDir.
func mkfsFloorConfig(t *testing.T, socket, floorDir string) bench.Config {
	return bench.Config{Endpoint: socket, Phases: []bench.Phase{bench.PhaseLifecycle}, Concurrency: []int{1, 2}, Count: 4,
		Rounds: 2, FloorSamples: 5, MkfsFloorSamples: 3, FloorDir: floorDir, JournalDir: t.TempDir(), SizeBytes: 64 << 20}
}

// TestBenchMkfsFloor: as root, with the lifecycle phase and mount volumes,
// each round measures the mkfs+mount floor (every sample formats and
// mounts a real image on a real loop device in --floor-dir) between the
// units of the lifecycle's lane of concurrency 1, and reports it after the
// lifecycle, in the floor, in the summary and as the lifecycle's
// NodeStageVolume p50 over it, round by round. Afterwards nothing of it
// is left: no file in the floor directory, no loop device bound to a file
// under it, no mount under it.
func TestBenchMkfsFloor(t *testing.T) {
	testutil.RequireRoot(t)
	in, _ := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	floorDir := t.TempDir()
	cfg := mkfsFloorConfig(t, in.Socket, floorDir)
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("run not clean: %+v", rep.Errors)
	}
	fl := rep.Floor.MkfsMount
	if fl == nil || rep.Floor.MkfsMountAbsent != "" {
		t.Fatalf("no mkfs+mount floor (absent: %q)", rep.Floor.MkfsMountAbsent)
	}
	if fl.Count != cfg.Rounds*cfg.MkfsFloorSamples || fl.Errors != 0 || fl.P50 <= 0 || fl.P50 > fl.P99 {
		t.Errorf("mkfs+mount floor %+v", fl)
	}
	var order []string // the results' units, in the order they were made
	for _, r := range rep.Results {
		order = append(order, r.Phase+" "+r.Unit)
		if r.Unit != "mkfs+mount" {
			continue
		}
		mkfs, mount := rpc(t, r, "mkfs"), rpc(t, r, "mount")
		if whole := rpc(t, r, "mkfs+mount"); mkfs.P50 <= 0 || mount.P50 <= 0 || whole.Max < max(mkfs.Max, mount.Max) {
			t.Errorf("round %d: mkfs %+v, mount %+v, both %+v", r.Round, mkfs, mount, whole)
		}
	}
	round := []string{"floor Probe+bbolt.Update", "lifecycle lifecycle", "lifecycle lifecycle", "floor mkfs+mount"}
	if want := append(slices.Clone(round), round...); !slices.Equal(order, want) {
		t.Errorf("results %v, want %v", order, want)
	}
	var floors []bench.Ratio
	for _, q := range rep.Ratios {
		if q.Kind == "floor" {
			floors = append(floors, q)
		}
	}
	if len(floors) != len(cfg.Concurrency) {
		t.Fatalf("floor ratios %+v, want one per concurrency", floors)
	}
	for i, q := range floors {
		if q.Phase != "lifecycle" || q.Method != "NodeStageVolume" || q.Numerator.Concurrency != cfg.Concurrency[i] ||
			len(q.PerRound) != cfg.Rounds || q.Value <= 0 {
			t.Errorf("floor ratio %+v", q)
		}
	}
	checkFloorLeftNothing(t, floorDir)
}

// rpc returns a method's figures in a result.
func rpc(t *testing.T, r bench.Result, method string) bench.RPCStats {
	t.Helper()
	for _, st := range r.RPCs {
		if st.Method == method {
			return st
		}
	}
	t.Fatalf("round %d %s: no %s in %+v", r.Round, r.Unit, method, r.RPCs)
	return bench.RPCStats{}
}

// TestBenchMkfsFloorFailsCleanly: the floor directory is a file system too
// small for the image's metadata (a real ENOSPC under the loop device), so
// every mkfs fails: the run reports the failures (and is not clean), and
// each sample still unbinds its loop device and removes its image.
func TestBenchMkfsFloorFailsCleanly(t *testing.T) {
	testutil.RequireRoot(t)
	in, _ := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	floorDir := testutil.SmallFS(t, 4<<20)
	// mkfs.ext4 of 64 MiB on a loop device writes about 380 KiB to the
	// image (the kernel discards instead of zeroing); the bbolt floor's
	// file needs less than 100 KiB.
	testutil.Fill(t, floorDir, "filler")
	filler := filepath.Join(floorDir, "filler")
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-192<<10); err != nil {
		t.Fatal(err)
	}
	cfg := mkfsFloorConfig(t, in.Socket, floorDir)
	cfg.Rounds, cfg.Concurrency = 1, []int{1}
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.Errors.Count != cfg.MkfsFloorSamples {
		t.Fatalf("errors %+v, want the %d samples of the floor", rep.Errors, cfg.MkfsFloorSamples)
	}
	for _, e := range rep.Errors.First {
		t.Log(e)
		if !strings.Contains(e, "floor mkfs+mount") || !strings.Contains(e, "mkfs.ext4") {
			t.Errorf("error %q: want the floor's mkfs", e)
		}
	}
	if fl := rep.Floor.MkfsMount; fl == nil || fl.Errors != cfg.MkfsFloorSamples {
		t.Errorf("mkfs+mount floor %+v: want its failed samples", fl)
	}
	checkFloorLeftNothing(t, floorDir)
}

// TestBenchMkfsFloorInterrupted: a run stopped (Ctrl-C) while it measures
// the mkfs+mount floor stops between samples, lets a running mkfs or mount
// finish, and leaves nothing of the floor behind. With no lifecycle lane
// of concurrency 1, the floor's samples are taken back to back, before the
// lifecycle.
func TestBenchMkfsFloorInterrupted(t *testing.T) {
	testutil.RequireRoot(t)
	in, _ := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	floorDir := t.TempDir()
	cfg := mkfsFloorConfig(t, in.Socket, floorDir)
	cfg.Concurrency = []int{2}
	// Minutes of samples (at most -n of them): the interruption comes first.
	cfg.Count, cfg.MkfsFloorSamples = 10000, 10000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Ctrl-C once the progress line shows the floor (its first redraw,
	// 200 ms into it: some samples done, one running).
	cfg.Progress = &cancelOn{what: []byte("floor mkfs+mount"), cancel: cancel}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Interrupted || rep.Errors.Count != 0 {
		t.Fatalf("interrupted %v, errors %+v", rep.Interrupted, rep.Errors)
	}
	if fl := rep.Floor.MkfsMount; fl == nil || fl.Count == 0 || fl.Count >= cfg.MkfsFloorSamples {
		t.Errorf("mkfs+mount floor %+v: want the samples made before the interruption", fl)
	}
	checkFloorLeftNothing(t, floorDir)
}

// cancelOn is a progress writer that cancels when a line shows what.
type cancelOn struct {
	what   []byte
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	if bytes.Contains(p, w.what) {
		w.cancel()
	}
	return len(p), nil
}

// checkFloorLeftNothing checks that a run left nothing in its floor
// directory: no file or directory of the bench, no loop device bound to a
// file under it, no mount under it.
func checkFloorLeftNothing(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "lost+found" && e.Name() != "filler" { // a SmallFS's, a test's
			t.Errorf("left in the floor directory: %s", e.Name())
		}
	}
	devs, err := loopdev.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if strings.HasPrefix(d.BackingFile, dir+string(filepath.Separator)) {
			t.Errorf("loop device left: %s bound to %s (deleted: %v)", d.Path, d.BackingFile, d.Deleted)
		}
	}
	for _, m := range mountsUnder(t, dir) {
		t.Errorf("mount left at %s", m)
	}
}

// TestBenchRecoversKilledFloor: a run killed in the middle of a sample of
// the mkfs+mount floor leaves its scratch directory in the floor directory
// with the image bound to a loop device, formatted and mounted, and its
// journal naming the directory. The next run against the same endpoint
// (here --cleanup-only) unmounts it, releases the device, removes the
// directory and the journal.
func TestBenchRecoversKilledFloor(t *testing.T) {
	testutil.RequireRoot(t)
	in, _ := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	floorDir, journals := t.TempDir(), t.TempDir()
	scratch := filepath.Join(floorDir, "csid-bench-0badf00d")
	leaveMountedImage(t, scratch)
	header := fmt.Sprintf(`{"endpoint":%q,"size_bytes":%d,"access_type":"mount","fs_type":"ext4","pid":1}`, in.Socket, 64<<20)
	journal := filepath.Join(journals, "0badf00d.journal")
	if err := os.WriteFile(journal, []byte(header+"\n"+fmt.Sprintf(`{"scratch":%q}`, scratch)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(mountsUnder(t, floorDir)) != 1 {
		t.Fatal("the killed run's mount is not there to recover")
	}
	cfg := mkfsFloorConfig(t, in.Socket, floorDir)
	cfg.JournalDir, cfg.CleanupOnly = journals, true
	if _, err := bench.Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	checkFloorLeftNothing(t, floorDir)
	if _, err := os.Stat(journal); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed run's journal is still there: %v", err)
	}
}

// leaveMountedImage leaves in dir what a run killed right after a sample's
// mount leaves: the floor's bbolt file, and its image on a loop device,
// formatted and mounted on dir/mnt.
func leaveMountedImage(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{dir, filepath.Join(dir, "mnt")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "floor.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := os.OpenFile(filepath.Join(dir, "image"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	dev, err := loopdev.Attach(context.Background(), img, loopdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostscrub.Scrub(context.Background(), dir) }) // if the test fails
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", dev.Path}, {"mount", "-t", "ext4", dev.Path, filepath.Join(dir, "mnt")}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
}
