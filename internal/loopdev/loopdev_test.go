package loopdev

import (
	"context"
	"errors"
	"os"
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
	path := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	id, err := IDOf(fi)
	if err != nil {
		t.Fatal(err)
	}
	return f, id
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
		{Path: "/dev/loop10", Number: 10, BackingFile: "/state/disks/disk-b.img", Deleted: true, AutoClear: true, SizeBytes: mib},
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
