package bench

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
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/mounter"
)

// The methods of the mkfs+mount floor: the timed unit, and its two parts.
const (
	methodMkfsMount = "mkfs+mount"
	methodMkfs      = "mkfs"
	methodMount     = "mount"
)

// releaseTimeout bounds the wait for the kernel to let a floor's loop
// device go (udev may hold it open for a moment after the unmount).
const releaseTimeout = 30 * time.Second

// mkfsFloor is where the mkfs+mount floor works, in the run's scratch
// directory (on the driver's state file system): the image each sample
// makes and removes, and the directory it is mounted on. Nothing else is
// ever touched: the image is created exclusively, and the mount point is
// unmounted only where a sample mounted it.
type mkfsFloor struct {
	image, mnt string
	size       int64
	fsType     string
}

// openMkfsFloor makes the mkfs+mount floor's mount point in the scratch
// directory when the run measures that floor; otherwise it records why not
// (when the lifecycle runs: the floor belongs to it) and returns nil.
func (r *runner) openMkfsFloor(scratch string) (*mkfsFloor, error) {
	if why := r.mkfsFloorAbsent(); why != "" {
		if slices.Contains(r.cfg.Phases, PhaseLifecycle) {
			r.report.Floor.MkfsMountAbsent = why
		}
		return nil, nil
	}
	f := &mkfsFloor{image: filepath.Join(scratch, scratchImage), mnt: filepath.Join(scratch, scratchMount),
		size: r.cfg.SizeBytes, fsType: r.cfg.FsType}
	if err := os.Mkdir(f.mnt, 0o700); err != nil {
		return nil, fmt.Errorf("mkfs+mount floor: %w", err)
	}
	return f, nil
}

// mkfsFloorAbsent says why the run does not measure the mkfs+mount floor,
// or "" when it does.
func (r *runner) mkfsFloorAbsent() string {
	switch {
	case r.cfg.MkfsFloorSamples < 0:
		return "not asked for (no samples: --mkfs-floor-samples 0)"
	case !slices.Contains(r.cfg.Phases, PhaseLifecycle):
		return "the lifecycle phase does not run"
	case r.cfg.AccessType != "mount":
		return "block volumes are neither formatted nor mounted"
	case os.Geteuid() != 0:
		return "not root: binding a loop device and mounting need root"
	}
	name, _, ok := mounter.FormatCommand(r.cfg.FsType, "")
	if !ok {
		return fmt.Sprintf("csid does not format %s (ext4, ext3 and xfs only)", r.cfg.FsType)
	}
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Sprintf("%s is not installed: %v", name, err)
	}
	return ""
}

// mkfsFloor measures the mkfs+mount floor of a round back to back:
// MkfsFloorSamples samples at concurrency 1, right before the round's
// lifecycle phase. It is the floor of a lifecycle phase with no lane of
// concurrency 1 (see floorBetween).
func (r *runner) mkfsFloor(ctx context.Context, round int, f *mkfsFloor) Result {
	res := mkfsFloorResult(round)
	res.Count = r.cfg.MkfsFloorSamples
	return r.floorSamples(ctx, res, mkfsFloorLabel(round), func(s *samples) error {
		_, err := f.sampleInto(ctx, s)
		return err
	})
}

// mkfsFloorResult is the Result of round's mkfs+mount floor, before its
// figures.
func mkfsFloorResult(round int) Result {
	return Result{Phase: string(PhaseFloor), Round: round, Concurrency: 1, Unit: methodMkfsMount}
}

// mkfsFloorLabel names round's mkfs+mount floor in the progress line and
// in errors.
func mkfsFloorLabel(round int) string { return fmt.Sprintf("round %d floor mkfs+mount", round) }

// sampleInto takes one sample and adds it to s: the timed unit and its two
// parts, or a failure. It returns how long the whole sample took, its
// set-up and undoing included.
func (f *mkfsFloor) sampleInto(ctx context.Context, s *samples) (time.Duration, error) {
	start := time.Now()
	mkfs, mount, err := f.sample(ctx)
	took := time.Since(start)
	switch {
	case err != nil && ctx.Err() == nil:
		s.add(methodMkfsMount, 0, true)
	case err == nil:
		s.add(methodMkfsMount, mkfs+mount, false)
		s.add(methodMkfs, mkfs, false)
		s.add(methodMount, mount, false)
	}
	return took, err
}

// floorBetween takes a round's mkfs+mount floor between the units of its
// lifecycle phase: on the lane of concurrency 1 of the endpoint under
// test, one sample after each of MkfsFloorSamples units spread evenly over
// the phase, and the lifecycle's measurement leaves the samples' time out.
// Each sample then meets the machine as that lane's NodeStageVolume calls
// do, between the other calls of a lifecycle, not right after another
// mkfs and mount: on a shared machine that matters. mkfs.ext4 of 64 MiB
// took 1 to 1.5 ms longer after 20 ms asleep than back to back, and 3 ms
// longer after 20 ms of a busy core, and a floor sampled back to back
// before the lifecycle came out 0.6 to 1.1 ms under the same floor
// sampled between its units, in the same runs (docs/benchmarks.md). With
// no lane of concurrency 1 the floor is sampled back to back (mkfsFloor).
type floorBetween struct {
	r     *runner
	f     *mkfsFloor
	round int

	mu sync.Mutex
	s  *samples
	t  tally
}

// newFloorBetween prepares the floor of round's lifecycle phase, to be
// sampled between the units of its floor lane (isFloorLane): the caller
// sees that it has one.
func (r *runner) newFloorBetween(round int, f *mkfsFloor) *floorBetween {
	return &floorBetween{r: r, f: f, round: round, s: newSamples()}
}

// isFloorLane: the floor is sampled between the units of this lane.
func isFloorLane(ln lane) bool { return ln.conc == 1 && !ln.ep.baseline }

// after takes a sample after lifecycle unit i of lane ln when one is due
// there, and has ln's measurement (s) leave its time out.
func (b *floorBetween) after(ctx context.Context, s *samples, ln lane, i int) {
	if !isFloorLane(ln) || !b.due(i) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	took, err := b.f.sampleInto(ctx, b.s)
	s.leaveOut(took)
	if b.t.count(ctx, b.r, mkfsFloorLabel(b.round), err) {
		b.t.elapsed += took
	}
}

// due reports whether a sample follows unit i: MkfsFloorSamples of the
// Count units, one in every Count/MkfsFloorSamples, the last unit among
// them.
func (b *floorBetween) due(i int) bool {
	n, count := b.r.cfg.MkfsFloorSamples, b.r.cfg.Count
	return (i+1)*n/count != i*n/count
}

// result is the floor's Result, once the lifecycle phase is over.
func (b *floorBetween) result() Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.t.result(mkfsFloorResult(b.round), b.s)
}

// sample makes a sparse image of the run's size, binds it to a loop
// device, formats it and mounts it as csid's NodeStageVolume does (the
// timed part: mkfs, then mount), and undoes all of it: unmount, release,
// remove. What it made is undone also when a step fails; ctx ending stops
// it between steps, never a tool that runs.
func (f *mkfsFloor) sample(ctx context.Context) (mkfs, mount time.Duration, err error) {
	img, err := os.OpenFile(f.image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, 0, fmt.Errorf("image: %w", err)
	}
	defer func() {
		img.Close()
		if rerr := os.Remove(f.image); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the image: %w", rerr))
		}
	}()
	id, err := sparse(img, f.size)
	if err != nil {
		return 0, 0, err
	}
	dev, err := loopdev.Attach(ctx, img, local.BindOptions(f.size))
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if rerr := loopdev.Release(rctx, dev.Path, id); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	held, err := holdDevice(dev.Path, id)
	if err != nil {
		return 0, 0, err
	}
	defer held.Close() // before the release: an opener delays it
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	name, args, _ := mounter.FormatCommand(f.fsType, dev.Path) // mkfsFloorAbsent checked fsType
	t := time.Now()
	if err := runTool(name, args...); err != nil {
		return 0, 0, err
	}
	mkfs = time.Since(t)
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	t = time.Now()
	merr := runTool("mount", mounter.MountCommand(dev.Path, f.mnt, f.fsType, nil)...)
	mount = time.Since(t)
	// Unmount whatever mount(8) did, also when it failed: only this
	// sample mounts on its private directory.
	if uerr := unix.Unmount(f.mnt, unix.UMOUNT_NOFOLLOW); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
		merr = errors.Join(merr, fmt.Errorf("unmount %s: %w", f.mnt, uerr))
	}
	return mkfs, mount, merr
}

// sparse makes img a sparse file of size bytes and returns its identity.
func sparse(img *os.File, size int64) (loopdev.FileID, error) {
	if err := img.Truncate(size); err != nil {
		return loopdev.FileID{}, fmt.Errorf("image: %w", err)
	}
	fi, err := img.Stat()
	if err != nil {
		return loopdev.FileID{}, fmt.Errorf("image: %w", err)
	}
	return loopdev.IDOf(fi)
}

// holdDevice opens the loop device at path and proves it is bound to the
// image id. While it stays open its binding cannot change (see
// loopdev.BindingOf): the device path given to mkfs and mount is the
// image's device for as long as they use it.
func holdDevice(path string, id loopdev.FileID) (*os.File, error) {
	held, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	b, err := loopdev.BindingOf(held)
	if err == nil && b.File != id {
		err = fmt.Errorf("%s is bound to another file than the floor's image", path)
	}
	if err != nil {
		held.Close()
		return nil, err
	}
	return held, nil
}

// runTool runs a host program to completion with an argument list (no
// shell). It runs in a process group of its own, so a Ctrl-C at the
// terminal reaches the bench (which then stops between samples), not the
// tool: a host tool is never killed midway.
func runTool(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
