package local

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// New files are made whole before they have a name: filled unnamed
// (O_TMPFILE), fsynced when they must survive a crash of the machine, and
// only then linked into their directory. A process killed at any point
// leaves no name and no half-written file, and nothing for Open to collect.
// The state directory's file system must support O_TMPFILE (ext4, xfs,
// btrfs, tmpfs do); Open says so when it does not.

// createFile makes dir/name, which must not exist yet (os.ErrExist), with
// the content fill writes, fsynced when durable. Making its directory
// entry durable (an fsync of dir) is the caller's.
func createFile(dir, name string, fill func(*os.File) error, durable bool) error {
	f, err := openUnnamed(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fill(f); err != nil {
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return linkFile(f, dirPath(dir, name))
}

// openUnnamed opens a new unnamed file in dir (O_TMPFILE), for linkFile.
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
// An existing path is an error wrapping os.ErrExist.
func linkFile(f *os.File, path string) error {
	fd := int(f.Fd())
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
	}
	return nil
}

func dirPath(dir, name string) string { return dir + string(os.PathSeparator) + name }
