package mounter

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// entry is a path csid was handed, opened for use without following any
// symbolic link: its parent directory, held open as an O_PATH descriptor,
// and the name of its last element in it. Every later step (stat, mkdir,
// create, mount, unmount, remove) goes through the parent's descriptor and
// refuses a link as the last element, so a directory renamed, or replaced
// by a link, after the walk cannot redirect it elsewhere.
//
// The descriptor of the last element itself is opened only for the moment
// a step needs it: an open descriptor pins a mount, and unmounting it would
// fail with EBUSY.
type entry struct {
	path   string
	parent *os.File
	name   string
}

// openEntry opens path's parent directory without following links (see
// entry). A link in any element of the parent is ErrSymlink; a missing
// parent is an error wrapping fs.ErrNotExist; an element that is no
// directory, ErrPathConflict.
func openEntry(path string) (*entry, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	clean := filepath.Clean(path)
	if clean == "/" {
		return nil, fmt.Errorf("path %q is the root directory: %w", path, ErrInvalidPath)
	}
	dir, name := filepath.Split(clean)
	fd, err := openDirNoFollow(dir)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%s: %s is a symbolic link, and csid follows none in the paths it is handed: %w", path, firstLink(dir), ErrSymlink)
	case errors.Is(err, unix.ENOTDIR):
		return nil, fmt.Errorf("%s: an element of %s is not a directory: %w", path, dir, ErrPathConflict)
	case err != nil:
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &entry{path: clean, parent: os.NewFile(uintptr(fd), dir), name: name}, nil
}

// openDirNoFollow opens directory dir as an O_PATH descriptor with openat2
// and RESOLVE_NO_SYMLINKS, or, on a kernel without openat2 (before Linux
// 5.6), by a walk that opens each element with O_NOFOLLOW. A link on the
// way is ELOOP either way.
func openDirNoFollow(dir string) (int, error) {
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, how)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) { // EPERM: a seccomp filter that predates openat2
		return walkNoFollow(dir)
	}
	return fd, err
}

// walkNoFollow is openDirNoFollow without openat2: from the root, each
// element is opened below the last with O_NOFOLLOW, so a link is never
// followed, even one swapped in during the walk.
func walkNoFollow(dir string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, elem := range strings.Split(dir, "/") {
		if elem == "" || elem == "." {
			continue
		}
		next, err := unix.Openat(fd, elem, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) {
			var st unix.Stat_t
			if unix.Fstatat(fd, elem, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// firstLink names the first element of dir that is a symbolic link, for
// an error message (the walk that refused it does not say which).
func firstLink(dir string) string {
	p := "/"
	for _, elem := range strings.Split(dir, "/") {
		if elem == "" {
			continue
		}
		p = filepath.Join(p, elem)
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if to, err := os.Readlink(p); err == nil {
				return fmt.Sprintf("%s (-> %s)", p, to)
			}
			return p
		}
	}
	return "an element of " + dir
}

func (e *entry) Close() error { return e.parent.Close() }

// openLeaf opens path's entry (see openEntry for its errors) and looks at
// its last element; the caller closes the entry.
func openLeaf(path string) (*entry, leaf, error) {
	e, err := openEntry(path)
	if err != nil {
		return nil, leaf{}, err
	}
	l, err := e.stat()
	if err != nil {
		e.Close()
		return nil, leaf{}, err
	}
	return e, l, nil
}

// leaf is what is at an entry, seen without following a link.
type leaf struct {
	exists     bool
	mode       uint32 // type (S_IFMT) and permission bits
	size       int64
	dev, rdev  uint64
	ino        uint64
	mountPoint bool
	mntID      uint64 // 0 when the kernel does not say
}

func (l leaf) isDir() bool   { return l.mode&unix.S_IFMT == unix.S_IFDIR }
func (l leaf) isReg() bool   { return l.mode&unix.S_IFMT == unix.S_IFREG }
func (l leaf) isBlock() bool { return l.mode&unix.S_IFMT == unix.S_IFBLK }

// stat looks at the entry's last element without following it. A link
// there is ErrSymlink; nothing there is a leaf that does not exist.
func (e *entry) stat() (leaf, error) {
	var st unix.Statx_t
	err := unix.Statx(int(e.parent.Fd()), e.name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_INO|unix.STATX_SIZE|unix.STATX_MNT_ID, &st)
	if errors.Is(err, unix.ENOENT) {
		return leaf{}, nil
	}
	if err != nil {
		return leaf{}, &fs.PathError{Op: "statx", Path: e.path, Err: err}
	}
	l := leaf{exists: true, mode: uint32(st.Mode), size: int64(st.Size), ino: st.Ino,
		dev: unix.Mkdev(st.Dev_major, st.Dev_minor), rdev: unix.Mkdev(st.Rdev_major, st.Rdev_minor)}
	if l.mode&unix.S_IFMT == unix.S_IFLNK {
		return leaf{}, fmt.Errorf("%s is a symbolic link, and csid follows none in the paths it is handed: %w", e.path, ErrSymlink)
	}
	if st.Mask&unix.STATX_MNT_ID != 0 {
		l.mntID = st.Mnt_id
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		l.mountPoint = st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
		return l, nil
	}
	// Before Linux 5.8 statx does not say: a mount point is on another
	// mount than its parent directory.
	if l.mountPoint, err = e.onOtherMount(); err != nil {
		return leaf{}, fmt.Errorf("is %s mounted: %w", e.path, err)
	}
	return l, nil
}

// onOtherMount reports whether the last element is on another mount than
// its parent: a mount point. It reads the mount ids from
// /proc/self/fdinfo, which kernels have had since 3.15.
func (e *entry) onOtherMount() (bool, error) {
	f, err := e.open(unix.O_PATH)
	if err != nil {
		return false, err
	}
	defer f.Close()
	mine, err := fdMountID(f.Fd())
	if err != nil {
		return false, err
	}
	parent, err := fdMountID(e.parent.Fd())
	return mine != parent, err
}

// fdMountID reads the id of the mount a descriptor is on.
func fdMountID(fd uintptr) (string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if id, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			return strings.TrimSpace(id), nil
		}
	}
	return "", fmt.Errorf("/proc/self/fdinfo/%d names no mount", fd)
}

// at is a path to the entry through its parent's descriptor: the kernel
// resolves the descriptor, and only the last element by name. Give it only
// to calls that do not follow a link in the last element (UMOUNT_NOFOLLOW,
// or after the element was checked not to be one).
func (e *entry) at() string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", e.parent.Fd(), e.name)
}

// open opens the last element with flags and O_NOFOLLOW; a link there is
// ErrSymlink (O_PATH opens a link itself rather than failing, so the
// descriptor is checked).
func (e *entry) open(flags int) (*os.File, error) {
	fd, err := unix.Openat(int(e.parent.Fd()), e.name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link: %w", e.path, ErrSymlink)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: e.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), e.path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "fstat", Path: e.path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		f.Close()
		return nil, fmt.Errorf("%s is a symbolic link: %w", e.path, ErrSymlink)
	}
	return f, nil
}

// empty reports whether the last element is an empty directory or a file
// of no bytes.
func (e *entry) empty(l leaf) (bool, error) {
	if !l.isDir() {
		return l.size == 0, nil
	}
	d, err := e.open(unix.O_RDONLY | unix.O_DIRECTORY)
	if err != nil {
		return false, err
	}
	defer d.Close()
	_, err = d.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// mkdir creates the last element as a directory. One that appeared since
// it was looked at is ErrPathConflict: it is not csid's.
func (e *entry) mkdir() error {
	err := unix.Mkdirat(int(e.parent.Fd()), e.name, 0o750)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s appeared while csid was about to create it: %w", e.path, ErrPathConflict)
	}
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: e.path, Err: err}
	}
	return nil
}

// createFile creates the last element as an empty file (a raw block
// target); one that appeared meanwhile is ErrPathConflict.
func (e *entry) createFile() error {
	fd, err := unix.Openat(int(e.parent.Fd()), e.name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0o640)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s appeared while csid was about to create it: %w", e.path, ErrPathConflict)
	}
	if err != nil {
		return &fs.PathError{Op: "create", Path: e.path, Err: err}
	}
	return unix.Close(fd)
}

// remove removes the last element (seen as l): an empty directory, or an
// empty file (the target of a raw block device). Anything else stays, and
// that is ErrPathConflict: csid made no such thing.
func (e *entry) remove(l leaf) error {
	flags := 0
	switch {
	case l.isDir():
		flags = unix.AT_REMOVEDIR
	case !l.isReg() || l.size > 0:
		return fmt.Errorf("%s is not an empty directory or file; it is left in place: %w", e.path, ErrPathConflict)
	}
	err := unix.Unlinkat(int(e.parent.Fd()), e.name, flags)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%s holds files csid did not put there; it is left in place: %w", e.path, ErrPathConflict)
	}
	return &fs.PathError{Op: "remove", Path: e.path, Err: err}
}

// mountInfo returns the mount table's entry of the mount at e (l is a
// mount point), or nil when the table has none.
func (e *entry) mountInfo(l leaf) *mountinfo.Info {
	filter := func(in *mountinfo.Info) (skip, stop bool) { return in.ID != int(l.mntID), false }
	if l.mntID == 0 {
		dir, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", e.parent.Fd()))
		if err != nil {
			return nil
		}
		filter = mountinfo.SingleEntryFilter(filepath.Join(dir, e.name))
	}
	mounts, err := mountinfo.GetMounts(filter)
	if err != nil || len(mounts) == 0 {
		return nil
	}
	return mounts[len(mounts)-1] // the top of a stack
}

// mounted names what is mounted at e (l is a mount point), for messages:
// "ext4 from /dev/loop3", "tmpfs from tmpfs".
func (e *entry) mounted(l leaf) string {
	m := e.mountInfo(l)
	if m == nil {
		return "a mount the mount table does not show"
	}
	what := fmt.Sprintf("%s from %s", m.FSType, m.Source)
	if m.Root != "/" {
		what += ", directory " + m.Root + " of it"
	}
	return what
}

// PathInfo is what is at a path, seen without following a symbolic link.
type PathInfo struct {
	// Exists is false when nothing is there (its parent directory exists).
	Exists bool
	// Dir and Regular say what it is (neither: a device, socket, ...).
	Dir, Regular bool
	// Empty: a directory without entries, or a file of no bytes.
	Empty bool
	// MountPoint: something is mounted there; Mounted names it ("tmpfs
	// from tmpfs").
	MountPoint bool
	Mounted    string
}

// Lookup returns what is at path without following any symbolic link: a
// link anywhere in it is ErrSymlink, a missing parent directory an error
// wrapping fs.ErrNotExist.
func Lookup(path string) (PathInfo, error) {
	e, l, err := openLeaf(path)
	if err != nil {
		return PathInfo{}, err
	}
	defer e.Close()
	if !l.exists {
		return PathInfo{}, nil
	}
	return e.info(l)
}

func (e *entry) info(l leaf) (PathInfo, error) {
	p := PathInfo{Exists: true, Dir: l.isDir(), Regular: l.isReg(), MountPoint: l.mountPoint}
	if p.MountPoint {
		p.Mounted = e.mounted(l)
		return p, nil
	}
	var err error
	p.Empty, err = e.empty(l)
	return p, err
}

// Conflict says why kind cannot be mounted at a path that is not a mount
// point, with ErrPathConflict, or returns nil: a filesystem or a directory
// is mounted on an empty directory, a block device on an empty file (or on
// nothing yet: the mount creates it). Mounting over content would hide it,
// and the unmount that follows would find content it cannot remove.
func (p PathInfo) Conflict(path string, kind MountKind) error {
	if !p.Exists {
		return nil
	}
	var want string
	switch kind {
	case DeviceBind:
		if !p.Regular {
			want = "a raw block volume is bound on a file, and this is not one"
		} else if !p.Empty {
			want = "it is a file with content, which the device would hide"
		}
	default:
		if !p.Dir {
			want = "a filesystem is mounted on a directory, and this is not one"
		} else if !p.Empty {
			want = "it is a directory with content, which the mount would hide"
		}
	}
	if want == "" {
		return nil
	}
	return fmt.Errorf("%s: %s: %w", path, want, ErrPathConflict)
}
