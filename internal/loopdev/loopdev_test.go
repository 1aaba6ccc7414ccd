package loopdev

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/testutil"
)

const mib = 1 << 20

// sparseFile creates a sparse file of size bytes and returns it open
// read-write, with its identity.
func sparseFile(t *testing.T, size int64) (*os.File, FileID) {
	t.Helper()
	return sparseFileIn(t, t.TempDir(), size)
}

// sparseFileIn is sparseFile in the directory dir.
func sparseFileIn(t *testing.T, dir string, size int64) (*os.File, FileID) {
	t.Helper()
	path := filepath.Join(dir, "disk.img")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f, idOf(t, f)
}

// attach binds f and releases the device when the test ends, whatever
// happened.
func attach(t *testing.T, f *os.File, id FileID, opts Options) Device {
	t.Helper()
	d, err := Attach(context.Background(), f, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Release(context.Background(), d.Path, id); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return d
}

func find(t *testing.T, id FileID) []Device {
	t.Helper()
	ds, err := Find(id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func TestAttachFindRelease(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 16*mib)
	d := attach(t, f, id, Options{SizeLimit: 8 * mib})

	if d.SizeBytes != 8*mib {
		t.Errorf("size = %d, want the size limit %d", d.SizeBytes, 8*mib)
	}
	if d.BackingFile != f.Name() || d.Deleted || d.AutoClear || d.ReadOnly {
		t.Errorf("device = %+v, want bound read-write to %s", d, f.Name())
	}
	// The binding outlives the file descriptor it was made with.
	f.Close()
	got := find(t, id)
	if len(got) != 1 || got[0].Path != d.Path {
		t.Fatalf("Find = %+v, want exactly %s", got, d.Path)
	}
	if err := Release(context.Background(), d.Path, id); err != nil {
		t.Fatal(err)
	}
	if got := find(t, id); len(got) != 0 {
		t.Fatalf("after Release, Find = %+v, want none", got)
	}
	// Releasing again is success.
	if err := Release(context.Background(), d.Path, id); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

func TestAttachReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{ReadOnly: true})
	if !d.ReadOnly || d.SizeBytes != 4*mib {
		t.Fatalf("device = %+v, want read-only, 4 MiB", d)
	}
	w, err := os.OpenFile(d.Path, os.O_WRONLY, 0)
	if err == nil {
		// Recent kernels let the open succeed and refuse the write.
		_, err = w.Write(make([]byte, 4096))
		w.Close()
	}
	if !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) {
		t.Fatalf("writing to a read-only device: %v, want a read-only refusal", err)
	}
}

func TestReleaseRefusesBusyDevice(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{})

	// An exclusive opener is what a mounted filesystem looks like.
	holder, err := os.OpenFile(d.Path, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = Release(context.Background(), d.Path, id)
	holder.Close()
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Release of a busy device = %v, want ErrBusy", err)
	}
	if got := find(t, id); len(got) != 1 {
		t.Fatalf("busy device was released: Find = %+v", got)
	}
}

// A device whose node is bind-mounted on a file (a raw block volume's
// target) is in use although nothing holds it open: released, the device
// would be bound to the next file under that target.
func TestReleaseRefusesADeviceBoundOnAFile(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{})
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(d.Path, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) }) // should the test fail before its unmount
	err := Release(context.Background(), d.Path, id)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), target) {
		t.Fatalf("Release of a device bound at %s = %v, want ErrBusy naming it", target, err)
	}
	if got := find(t, id); len(got) != 1 || got[0].AutoClear {
		t.Fatalf("the bound device was touched: Find = %+v", got)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := Release(context.Background(), d.Path, id); err != nil {
		t.Fatalf("Release once unbound: %v", err)
	}
}

// BindingOf reads the binding on the descriptor: the file, and the mark
// of a release waiting for its openers.
func TestBindingOf(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{ReadOnly: true})
	dev, err := os.Open(d.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if b, err := BindingOf(dev); err != nil || b != (Binding{File: id, ReadOnly: true}) {
		t.Fatalf("BindingOf = %+v, %v; want %+v, read-only", b, err, id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Release(ctx, d.Path, id); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if b, err := BindingOf(dev); err != nil || !b.AutoClear || b.File != id {
		t.Fatalf("BindingOf while released = %+v, %v; want the same file, AutoClear", b, err)
	}
	if n, ok := Number(d.Path); !ok || "/dev/loop"+strconv.Itoa(n) != d.Path {
		t.Fatalf("Number(%s) = %d, %v", d.Path, n, ok)
	}
	for _, p := range []string{"/dev/loop", "/dev/loop-control", "/dev/sda", "/tmp/dev/loop0", "/dev/x/loop0"} {
		if _, ok := Number(p); ok {
			t.Errorf("Number(%s) is ok", p)
		}
	}
}

func TestReleaseLeavesOtherFilesDevice(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{})
	other := FileID{Dev: id.Dev, Ino: id.Ino + 1}
	if err := Release(context.Background(), d.Path, other); err != nil {
		t.Fatalf("Release for another file = %v, want success (not ours)", err)
	}
	if got := find(t, id); len(got) != 1 {
		t.Fatalf("device of another file was released: Find = %+v", got)
	}
}

func TestReleaseWaitsForOpeners(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	d := attach(t, f, id, Options{})

	reader, err := os.Open(d.Path) // a non-exclusive opener, like udev probing
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // do not wait: observe the state the reader holds the device in
	if err := Release(ctx, d.Path, id); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with an opener = %v, want it to wait (and give up with the context)", err)
	}
	got := find(t, id)
	if len(got) != 1 || !got[0].AutoClear {
		t.Fatalf("Find = %+v, want the device still bound and marked for release", got)
	}
	reader.Close()
	if got := find(t, id); len(got) != 0 {
		t.Fatalf("after the last opener closed, Find = %+v, want none", got)
	}
	if err := Release(context.Background(), d.Path, id); err != nil {
		t.Fatal(err)
	}
}

func TestListIgnoresOtherEntries(t *testing.T) {
	root := t.TempDir()
	mk := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("loop10/loop/backing_file", "/state/disks/disk-b.img (deleted)\n")
	mk("loop10/size", "2048\n")
	mk("loop10/loop/autoclear", "1\n")
	mk("loop10/loop/dio", "1\n")
	mk("loop2/loop/backing_file", "/state/disks/disk-a.img\n")
	mk("loop2/ro", "1\n")
	mk("loop3/size", "0\n") // unbound
	mk("sda/size", "100\n")
	mk("loopx/loop/backing_file", "/nope\n")

	got, err := listIn(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Path: "/dev/loop2", Number: 2, BackingFile: "/state/disks/disk-a.img", ReadOnly: true},
		{Path: "/dev/loop10", Number: 10, BackingFile: "/state/disks/disk-b.img", Deleted: true, AutoClear: true, SizeBytes: mib, DirectIO: true},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listIn = %+v, want %+v", got, want)
	}
	// A filter on the backing file keeps only what it accepts, with every
	// attribute read for it.
	got, err = listIn(root, func(backing string) bool { return filepath.Base(backing) == "disk-b.img" })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want[1:]) {
		t.Fatalf("listIn filtered = %+v, want %+v", got, want[1:])
	}
}

// dioAlign is the alignment direct I/O on the file needs (statx's
// STATX_DIOALIGN), 0 when the file system does no direct I/O.
func dioAlign(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_DIOALIGN, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mask&unix.STATX_DIOALIGN == 0 {
		t.Skipf("the kernel does not say the direct I/O alignment of %s (STATX_DIOALIGN: Linux 6.1)", path)
	}
	return st.Dio_offset_align
}

// sectorBytes is the logical block size of the loop device d.
func sectorBytes(t *testing.T, d Device) int64 {
	t.Helper()
	n := readSysInt(filepath.Join(sysBlock, "loop"+strconv.Itoa(d.Number), "queue", "logical_block_size"))
	if n == 0 {
		t.Fatalf("%s: no logical block size in sysfs", d.Path)
	}
	return n
}

// roundTrip writes a block through the device at an offset that is not
// 4 KiB aligned and reads it back from the backing file.
func roundTrip(t *testing.T, d Device, f *os.File) {
	t.Helper()
	dev, err := os.OpenFile(d.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	want := []byte(strings.Repeat("csid", 128)) // 512 bytes
	if _, err := dev.WriteAt(want, 3*512); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 3*512); err != nil || string(got) != string(want) {
		t.Fatalf("the image reads %q, %v at 1536; want what was written through %s", got[:8], err, d.Path)
	}
}

// A device bound with DirectIO reads and writes its file with direct I/O
// where the file's file system does it at 512 bytes, and keeps 512-byte
// sectors; bound without, it is buffered.
func TestAttachDirectIO(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFile(t, 4*mib)
	align := dioAlign(t, f.Name())
	d := attach(t, f, id, Options{DirectIO: true})
	if want := align != 0 && align <= 512; d.DirectIO != want {
		t.Fatalf("DirectIO = %v on a file whose direct I/O aligns to %d bytes, want %v", d.DirectIO, align, want)
	}
	if got := sectorBytes(t, d); got != 512 {
		t.Fatalf("a device bound with direct I/O has %d-byte sectors, want 512", got)
	}
	if got := find(t, id); len(got) != 1 || got[0].DirectIO != d.DirectIO {
		t.Fatalf("Find = %+v, want the device as Attach reported it", got)
	}
	roundTrip(t, d, f)

	g, gid := sparseFile(t, 4*mib)
	if b := attach(t, g, gid, Options{}); b.DirectIO || sectorBytes(t, b) != 512 {
		t.Fatalf("bound without DirectIO: %+v, %d-byte sectors; want buffered, 512", b, sectorBytes(t, b))
	}
}

// Where the file's file system does direct I/O only in 4 KiB blocks (on a
// disk of 4 KiB sectors), a device bound with DirectIO is buffered rather
// than of 4 KiB sectors: a filesystem made on it with 512-byte sectors
// before (xfs) would not mount on a device of larger ones.
func TestDirectIOFallsBackKeepingSectors(t *testing.T) {
	testutil.RequireRoot(t)
	f, id := sparseFileIn(t, fsOn4KSectors(t), 4*mib)
	if align := dioAlign(t, f.Name()); align != 4096 {
		t.Fatalf("direct I/O on the 4 KiB-sector file system aligns to %d bytes, want 4096", align)
	}
	d := attach(t, f, id, Options{DirectIO: true})
	if d.DirectIO || sectorBytes(t, d) != 512 {
		t.Fatalf("device = %+v with %d-byte sectors, want buffered with 512", d, sectorBytes(t, d))
	}
	roundTrip(t, d, f)
}

// fsOn4KSectors mounts an ext4 file system made on a loop device of 4 KiB
// sectors, and returns where; all of it goes when the test ends.
func fsOn4KSectors(t *testing.T) string {
	t.Helper()
	backing, id := sparseFile(t, 64*mib)
	d := attachSectors(t, backing, id, 4096)
	if out, err := exec.Command("mkfs.ext4", "-q", d.Path).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(d.Path, dir, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	// Registered after attachSectors' release: runs before it.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// attachSectors binds f to a free loop device of sectors-byte sectors
// (buffered) and releases it when the test ends.
func attachSectors(t *testing.T, f *os.File, id FileID, sectors uint32) Device {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for range maxAttachRaces {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatal(err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &unix.LoopConfig{Fd: uint32(f.Fd()), Size: sectors})
		dev.Close()
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			t.Fatalf("LOOP_CONFIGURE with %d-byte sectors: %v", sectors, err)
		}
		d, bound, err := readSys(sysBlock, n, nil)
		if err != nil || !bound {
			t.Fatalf("loop%d: %+v, %v, %v", n, d, bound, err)
		}
		t.Cleanup(func() {
			if err := Release(context.Background(), d.Path, id); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		return d
	}
	t.Fatal("no free loop device")
	return Device{}
}

// Find looks at the loop devices /proc/partitions lists with a size (the
// bound ones), not at every loop device in sysfs; without the list, at
// every one.
func TestListSizedReadsOnlyListedLoops(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"loop0", "loop1", "loop7", "loop12"} {
		p := filepath.Join(root, n, "loop", "backing_file")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("/state/disks/"+n+".img\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	partitions := filepath.Join(t.TempDir(), "partitions")
	list := "major minor  #blocks  name\n\n" +
		"   7        0          0 loop0\n" + // bound to a file of no size
		"   7       12      65536 loop12\n" +
		" 253        0  264212084 vda\n" +
		"   7        7      16384 loop7\n" +
		"   8        1      16384 loop1\n" // not the loop major
	if err := os.WriteFile(partitions, []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	numbers := func(ds []Device) []int {
		var out []int
		for _, d := range ds {
			out = append(out, d.Number)
		}
		return out
	}
	got, err := listSized(partitions, root, nil)
	if err != nil || !slices.Equal(numbers(got), []int{7, 12}) {
		t.Fatalf("listSized = %v, %v; want loop7 and loop12, the listed loops with a size", numbers(got), err)
	}
	got, err = listSized(filepath.Join(t.TempDir(), "none"), root, nil)
	if err != nil || !slices.Equal(numbers(got), []int{0, 1, 7, 12}) {
		t.Fatalf("listSized without a partitions list = %v, %v; want every loop in sysfs", numbers(got), err)
	}
}

// TestZeroedReadsTheBackingFilesMap binds sparse files on each file system
// Zeroed relies on, with and without direct I/O, and checks that it says
// zero exactly while the file has no data in the range the device maps:
// a byte written to the file in the range, or through the device's page
// cache and not yet written back, is data; a byte beyond the size limit is
// not the device's. Where it cannot tell it says false: a file system not
// in its list (ext4 once the list is emptied), one that maps no holes
// (ramfs), a backing file whose path now names another file (one of holes
// bind-mounted over it, or put there after the bound file was deleted), no
// loop device.
func TestZeroedReadsTheBackingFilesMap(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs", "tmpfs"} {
		dir := testutil.MountFS(t, fsType, 512*mib)
		for _, dio := range []bool{true, false} {
			t.Run(fsType+map[bool]string{true: "/direct", false: "/buffered"}[dio], func(t *testing.T) {
				sub, err := os.MkdirTemp(dir, "zeroed-")
				if err != nil {
					t.Fatal(err)
				}
				zeroed := func(t *testing.T, f *os.File) *os.File {
					t.Helper()
					d := attach(t, f, idOf(t, f), Options{SizeLimit: 8 * mib, DirectIO: dio})
					dev, err := os.OpenFile(d.Path, os.O_RDWR, 0)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { dev.Close() })
					if zero, err := Zeroed(dev, 8*mib); err != nil || !zero {
						t.Fatalf("a sparse file: Zeroed = %v, %v; want true", zero, err)
					}
					return dev
				}

				f, _ := sparseFileIn(t, sub, 16*mib)
				dev := zeroed(t, f)
				if _, err := f.WriteAt([]byte{1}, 12*mib); err != nil {
					t.Fatal(err)
				}
				if zero, err := Zeroed(dev, 8*mib); err != nil || !zero {
					t.Errorf("data beyond the size limit: Zeroed = %v, %v; want true", zero, err)
				}
				if _, err := f.WriteAt([]byte{1}, 5*mib); err != nil {
					t.Fatal(err)
				}
				if zero, err := Zeroed(dev, 8*mib); err != nil || zero {
					t.Errorf("a byte written to the file at 5 MiB: Zeroed = %v, %v; want false", zero, err)
				}

				// Through the device's page cache, never synced.
				g, err := os.OpenFile(filepath.Join(sub, "cached.img"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
				if err == nil {
					err = g.Truncate(16 * mib)
				}
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				dev = zeroed(t, g)
				if _, err := dev.WriteAt([]byte{1}, 3*mib); err != nil {
					t.Fatal(err)
				}
				if zero, err := Zeroed(dev, 8*mib); err != nil || zero {
					t.Errorf("a byte written through the device, not synced: Zeroed = %v, %v; want false", zero, err)
				}
			})
		}
	}

	t.Run("cannot tell", func(t *testing.T) {
		zeroed := func(t *testing.T, f *os.File, size int64, before func()) bool {
			t.Helper()
			d := attach(t, f, idOf(t, f), Options{})
			if before != nil {
				before()
			}
			dev, err := os.Open(d.Path)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			zero, err := Zeroed(dev, size)
			if err != nil {
				t.Fatal(err)
			}
			return zero
		}

		// ramfs maps no holes: its SEEK_DATA finds data everywhere.
		ramfs := t.TempDir()
		if err := unix.Mount("ramfs", ramfs, "ramfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(ramfs, 0) })
		onRamfs, _ := sparseFileIn(t, ramfs, 16*mib)
		if zeroed(t, onRamfs, 16*mib, nil) {
			t.Error("a file on ramfs: Zeroed = true")
		}

		// A file system whose map Zeroed does not believe: the same
		// sparse file on ext4 once the list no longer names ext4.
		sparse, _ := sparseFile(t, 16*mib)
		kept := maps.Clone(mapsDirtyPages)
		clear(mapsDirtyPages)
		got := zeroed(t, sparse, 16*mib, nil)
		maps.Copy(mapsDirtyPages, kept)
		if got {
			t.Error("a file system not in the list: Zeroed = true")
		}

		// The backing file's path now names another file (all holes,
		// bind-mounted over it), while the bound file has data: the path
		// is not followed to the other file.
		bound, _ := sparseFile(t, 16*mib)
		if _, err := bound.WriteAt([]byte{1}, 5*mib); err != nil {
			t.Fatal(err)
		}
		other, _ := sparseFile(t, 16*mib)
		if zeroed(t, bound, 16*mib, func() {
			if err := unix.Mount(other.Name(), bound.Name(), "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(bound.Name(), 0) })
		}) {
			t.Error("another file mounted over the backing file's path: Zeroed = true")
		}

		// A deleted backing file (another file, all holes, at its path).
		gone, _ := sparseFile(t, 16*mib)
		if _, err := gone.WriteAt([]byte{1}, 5*mib); err != nil {
			t.Fatal(err)
		}
		if zeroed(t, gone, 16*mib, func() {
			if err := os.Remove(gone.Name()); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(gone.Name(), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(gone.Name(), 16*mib); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Error("a deleted backing file: Zeroed = true")
		}

		null, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		defer null.Close()
		plain, _ := sparseFile(t, mib)
		for _, f := range []*os.File{null, plain} {
			if zero, err := Zeroed(f, mib); err != nil || zero {
				t.Errorf("%s, no loop device: Zeroed = %v, %v; want false", f.Name(), zero, err)
			}
		}
	})
}

// idOf is the identity of the open file f.
func idOf(t *testing.T, f *os.File) FileID {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	id, err := IDOf(fi)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
