package testutil

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallFS mounts a fresh ext4 file system of sizeBytes (an image under the
// test's temporary directory, on a loop device that mount(8) sets up and
// releases) and returns its path; it is unmounted when the test ends. It
// is a real file system for fault tests: fill it to make writes fail with
// ENOSPC (Fill), or make a file in it immutable (SetImmutable; ext4, unlike
// tmpfs, also refuses writes through descriptors opened before). Needs
// root.
func SmallFS(t testing.TB, sizeBytes int64) string {
	t.Helper()
	return MountFS(t, "ext4", sizeBytes)
}

// MountFS mounts a fresh file system of type fsType (ext2, ext3, ext4, xfs:
// an image of sizeBytes under the test's temporary directory on a loop
// device, made with mkfs's extra options mkfsOpts; tmpfs: of that size)
// and returns its path; it is unmounted when the test ends. Needs root.
func MountFS(t testing.TB, fsType string, sizeBytes int64, mkfsOpts ...string) string {
	t.Helper()
	RequireRoot(t)
	tmp := t.TempDir()
	img, dir := filepath.Join(tmp, fsType+".img"), filepath.Join(tmp, fsType)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmds := [][]string{{"mount", "-t", "tmpfs", "-o", "size=" + strconv.FormatInt(sizeBytes, 10), "tmpfs", dir}}
	if fsType != "tmpfs" {
		f, err := os.Create(img)
		if err == nil {
			err = f.Truncate(sizeBytes)
			f.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		mkfs := append([]string{"mkfs." + fsType, "-q", "-F", "-m", "0"}, mkfsOpts...)
		if fsType == "xfs" {
			mkfs = append([]string{"mkfs.xfs", "-q", "-f"}, mkfsOpts...)
		}
		mkfs = append(mkfs, img)
		cmds = [][]string{mkfs, {"mount", "-t", fsType, "-o", "loop,nosuid,nodev", img, dir}}
	}
	for _, cmd := range cmds {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	t.Cleanup(func() {
		// The loop device mount(8) made is released with the last unmount.
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file named name in dir until the file system is full, and
// returns a function that removes it again.
func Fill(t testing.TB, dir, name string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("fill %s: %v", dir, err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				f.Close()
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	// Also the bytes of a partial block.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	f.Close()
	return func() {
		t.Helper()
		if err := os.Remove(path); err != nil {
			t.Fatalf("free %s: %v", dir, err)
		}
	}
}

// SetImmutable sets or clears the immutable attribute of path (chattr +i /
// -i): while set, nobody, root included, can write, rename or remove it.
// The attribute is cleared when the test ends.
func SetImmutable(t testing.TB, path string, on bool) {
	t.Helper()
	flag := "-i"
	if on {
		flag = "+i"
		t.Cleanup(func() { _ = exec.Command("chattr", "-i", path).Run() })
	}
	if out, err := exec.Command("chattr", flag, path).CombinedOutput(); err != nil {
		t.Fatalf("chattr %s %s: %v: %s", flag, path, err, out)
	}
}
