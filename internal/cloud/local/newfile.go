package local

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// New files are made whole under a temporary name in their directory
// (.tmp-<final name>-<random>), fsynced when they must survive a crash of
// the machine, and only then linked or renamed into place: a crash never
// leaves a half-written file under a real name, and a temporary name a
// kill leaves behind is removed by Open, under the key lock of the file's
// owner (gc.go).
//
// Not O_TMPFILE on the hot path: an unnamed file has no links when it is
// fsynced, and the link that names it later changes its inode again. On a
// file system without a journal nothing writes that change before the
// kernel's writeback, so a crash of the machine in between leaves a name pointing
// to an inode with no links on the device, which e2fsck deletes at the
// next boot, the name with it (TestMachineCrashKeepsWhatReturned). A file
// made under a name has its one link when it is fsynced; later links only
// add to it, and e2fsck counts them right. (linkFile, for the copies that
// are made unnamed, fsyncs such a file again once it is named.)

// tempPath is a fresh temporary name in dir for a file to be named name.
func tempPath(dir, name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return dirPath(dir, tmpPrefix+name+"-"+hex.EncodeToString(b[:]))
}

// createTemp makes a new file at path (which must not exist), open for
// reading and writing.
func createTemp(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
}

// createFile makes dir/name, which must not exist yet (os.ErrExist), with
// the content fill writes, fsynced when durable, whole or not at all.
// Making its directory entry durable (an fsync of dir) is the caller's.
func createFile(dir, name string, fill func(*os.File) error, durable bool) error {
	return placeTemp(dir, name, fill, durable, renameNoReplace)
}

// replaceFile replaces dir/name (or makes it) with data, fsynced, such that
// a crash leaves either the old file or the new one, never a mix. Making
// the rename durable (an fsync of dir) is the caller's.
func replaceFile(dir, name string, data []byte) error {
	return placeTemp(dir, name, writeBytes(data), true, os.Rename)
}

// placeTemp makes dir/name with writeTemp and place (renameNoReplace or
// os.Rename). On failure it leaves no temporary name.
func placeTemp(dir, name string, fill func(*os.File) error, durable bool, place func(from, to string) error) error {
	tmp, err := writeTemp(dir, name, fill, durable)
	if err != nil {
		return err
	}
	if err := place(tmp, dirPath(dir, name)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// writeTemp makes a file under a fresh temporary name in dir for the file
// to be named name (tempPath), with the content fill writes, fsynced when
// durable, and returns that temporary name, for the caller to link or
// rename into place. On failure it leaves nothing.
func writeTemp(dir, name string, fill func(*os.File) error, durable bool) (string, error) {
	tmp := tempPath(dir, name)
	f, err := createTemp(tmp)
	if err != nil {
		return "", err
	}
	err = fill(f)
	if err == nil && durable {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// writeBytes is a fill for writeTemp that writes b.
func writeBytes(b []byte) func(*os.File) error {
	return func(f *os.File) error { _, err := f.Write(b); return err }
}

// renameNoReplace renames from to to, both on one file system, unless to
// exists: then it fails with an error wrapping os.ErrExist, and nothing
// changed.
func renameNoReplace(from, to string) error {
	for {
		err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EEXIST):
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: os.ErrExist}
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS):
			return fmt.Errorf("rename %s to %s: the file system cannot rename without replacing (RENAME_NOREPLACE), which the local backend needs: use ext4, xfs, btrfs or tmpfs: %w", from, to, err)
		default:
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
		}
	}
}

// openUnnamed opens a new unnamed file in dir (O_TMPFILE), for linkFile:
// copies of images (snapshots and clones, copy.go) are made so. The state directory's file system must support O_TMPFILE
// (ext4, xfs, btrfs, tmpfs do); Open says so when it does not.
func openUnnamed(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) {
		return nil, fmt.Errorf("%s: the file system does not support unnamed files (O_TMPFILE), which the local backend needs: use ext4, xfs, btrfs or tmpfs: %w", dir, err)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open O_TMPFILE", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir+"/(unnamed)"), nil
}

// linkFile gives the open file f the name path (on the same file system).
// An existing path is an error wrapping os.ErrExist. A file that had no
// link (made by openUnnamed) is fsynced once named, so that its link count
// reaches the device before its caller makes the name durable (see above:
// e2fsck deletes a name whose inode has no links).
func linkFile(f *os.File, path string) error {
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.ENOENT) {
		// No /proc: link by descriptor (needs CAP_DAC_READ_SEARCH).
		err = unix.Linkat(fd, "", unix.AT_FDCWD, path, unix.AT_EMPTY_PATH)
	}
	switch {
	case errors.Is(err, unix.EEXIST):
		return &os.PathError{Op: "link", Path: path, Err: os.ErrExist}
	case err != nil:
		return fmt.Errorf("link %s: %w", path, err)
	case st.Nlink == 0:
		if err := f.Sync(); err != nil {
			_ = os.Remove(path)
			return fmt.Errorf("fsync %s once named: %w", path, err)
		}
	}
	return nil
}

func dirPath(dir, name string) string { return dir + string(os.PathSeparator) + name }
