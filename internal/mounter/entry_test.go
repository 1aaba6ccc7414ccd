package mounter

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/csid-dev/csid/internal/testutil"
	"golang.org/x/sys/unix"
)

// sameDir reports whether two descriptors are of one directory.
func sameDir(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// TestWalkNoFollow: the walk that stands in for openat2 on kernels without
// it opens what openat2 opens, and refuses a link in any element (ELOOP)
// and a file on the way (ENOTDIR), as openat2 with RESOLVE_NO_SYMLINKS does.
func TestWalkNoFollow(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "a", "b", "c")
	if err := os.MkdirAll(real, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS}
	cases := []struct {
		path string
		want error // nil: opens real
	}{
		{real, nil},
		{real + "/", nil},
		{filepath.Join(dir, "link", "b", "c"), unix.ELOOP},
		{filepath.Join(dir, "link"), unix.ELOOP},
		{filepath.Join(dir, "file", "x"), unix.ENOTDIR},
		{filepath.Join(dir, "missing", "x"), unix.ENOENT},
	}
	for _, c := range cases {
		walked, werr := walkNoFollow(c.path)
		opened, oerr := unix.Openat2(unix.AT_FDCWD, c.path, how)
		if !errors.Is(werr, oerr) && !(werr == nil && oerr == nil) {
			t.Errorf("%s: the walk says %v, openat2 %v", c.path, werr, oerr)
		}
		if c.want != nil {
			if !errors.Is(werr, c.want) {
				t.Errorf("%s: the walk says %v, want %v", c.path, werr, c.want)
			}
			continue
		}
		if werr != nil || oerr != nil {
			t.Fatalf("%s: %v, %v", c.path, werr, oerr)
		}
		if !sameDir(t, walked, opened) {
			t.Errorf("%s: the walk and openat2 opened different directories", c.path)
		}
		unix.Close(walked)
		unix.Close(opened)
	}
}

// TestMountPointWithoutStatx: the mount-id comparison that stands in for
// statx's STATX_ATTR_MOUNT_ROOT before Linux 5.8 agrees with it, on a
// mount point, a directory and a file bind-mounted on.
func TestMountPointWithoutStatx(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	mounted, plain, file := sb.path("mounted"), sb.path("plain"), sb.path("file")
	mkdirs(t, mounted, plain)
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mounted, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(sb.device(mib), file, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{mounted: true, plain: false, file: true} {
		e, err := openEntry(p)
		if err != nil {
			t.Fatal(err)
		}
		l, err := e.stat()
		if err != nil {
			t.Fatal(err)
		}
		other, err := e.onOtherMount()
		if err != nil {
			t.Fatal(err)
		}
		if l.mountPoint != want || other != want {
			t.Errorf("%s: statx says mount point %v, the mount ids %v; want %v", p, l.mountPoint, other, want)
		}
		e.Close()
	}
}
