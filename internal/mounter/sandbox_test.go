package mounter

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/loopdev"
)

const mib = int64(1) << 20

// sandbox is a test's corner of the machine: a directory for targets and
// images, and the loop devices made for it. When the test ends, however it
// ends, every mount under the directory is unmounted and every loop device
// released, before the directory is removed.
type sandbox struct {
	t   testing.TB
	dir string
	// bind is how its loop devices are bound (buffered unless a test says).
	bind loopdev.Options

	mu    sync.Mutex
	loops []loop
}

type loop struct {
	path string
	img  string
	id   loopdev.FileID
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	dir := t.TempDir() // removed after the cleanup below has run
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	sb := &sandbox{t: t, dir: dir}
	t.Cleanup(sb.cleanup)
	return sb
}

// path returns a path inside the sandbox.
func (sb *sandbox) path(elem ...string) string {
	return filepath.Join(append([]string{sb.dir}, elem...)...)
}

// device makes a blank loop device of size bytes, backed by a sparse file.
func (sb *sandbox) device(size int64) string {
	sb.t.Helper()
	img, err := os.CreateTemp(sb.dir, "disk-*.img")
	if err != nil {
		sb.t.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(size); err != nil {
		sb.t.Fatal(err)
	}
	return sb.attach(img)
}

// attach binds an image file to a loop device.
func (sb *sandbox) attach(img *os.File) string {
	sb.t.Helper()
	fi, err := img.Stat()
	if err != nil {
		sb.t.Fatal(err)
	}
	id, err := loopdev.IDOf(fi)
	if err != nil {
		sb.t.Fatal(err)
	}
	d, err := loopdev.Attach(context.Background(), img, sb.bind)
	if err != nil {
		sb.t.Fatal(err)
	}
	sb.mu.Lock()
	sb.loops = append(sb.loops, loop{path: d.Path, img: img.Name(), id: id})
	sb.mu.Unlock()
	return d.Path
}

// regrow releases a loop device of the sandbox, grows its image to size
// and binds it again, as a detach, resize and attach do; it returns the new
// device.
func (sb *sandbox) regrow(device string, size int64) string {
	sb.t.Helper()
	img := sb.detach(device)
	if err := os.Truncate(img, size); err != nil {
		sb.t.Fatal(err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		sb.t.Fatal(err)
	}
	defer f.Close()
	return sb.attach(f)
}

// growInPlace grows the image of a bound loop device and has the device
// pick up the new size (LOOP_SET_CAPACITY), as a disk grown while attached.
func (sb *sandbox) growInPlace(device string, size int64) {
	sb.t.Helper()
	sb.mu.Lock()
	i := slices.IndexFunc(sb.loops, func(l loop) bool { return l.path == device })
	sb.mu.Unlock()
	if i < 0 {
		sb.t.Fatalf("%s is not a device of this sandbox", device)
	}
	if err := os.Truncate(sb.loops[i].img, size); err != nil {
		sb.t.Fatal(err)
	}
	f, err := os.Open(device)
	if err != nil {
		sb.t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		sb.t.Fatal(err)
	}
}

// detach releases a loop device made by the sandbox and returns its image.
func (sb *sandbox) detach(device string) string {
	sb.t.Helper()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for i, l := range sb.loops {
		if l.path == device {
			if err := loopdev.Release(context.Background(), l.path, l.id); err != nil {
				sb.t.Fatal(err)
			}
			sb.loops = slices.Delete(sb.loops, i, i+1)
			return l.img
		}
	}
	sb.t.Fatalf("%s is not a device of this sandbox", device)
	return ""
}

func (sb *sandbox) cleanup() {
	t := sb.t
	// Unmount the deepest mount points first, and each as often as mounts
	// are stacked on it.
	for range 16 {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(sb.dir))
		if err != nil {
			t.Errorf("cleanup: %v", err)
			break
		}
		if len(mounts) == 0 {
			break
		}
		slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
		for _, m := range mounts {
			if err := unix.Unmount(m.Mountpoint, 0); err != nil {
				t.Errorf("cleanup: unmount %s: %v; detaching it lazily", m.Mountpoint, err)
				_ = unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
			}
		}
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, l := range sb.loops {
		if err := loopdev.Release(context.Background(), l.path, l.id); err != nil {
			t.Errorf("cleanup: leaked %s: %v", l.path, err)
		}
	}
}

// mountEntry returns the mount table's top entry for path.
func mountEntry(t testing.TB, path string) *mountinfo.Info {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) == 0 {
		t.Fatalf("%s is not in the mount table", path)
	}
	return mounts[len(mounts)-1]
}

func hasOption(opts, want string) bool {
	return slices.Contains(strings.Split(opts, ","), want)
}

// errOf is FormatAndMount's error, for a test that asks nothing else of it.
func errOf(_ bool, err error) error { return err }
