package mounter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// source is what a mount is made from, and how to tell a mount of it from
// any other.
type source struct {
	kind MountKind
	path string
	// dev and ino identify a directory (DirBind); rdev a block device.
	dev, ino, rdev uint64
	// dir is the directory of a DirBind, opened without following a link:
	// the bind is made from this descriptor.
	dir *os.File
}

// openSource looks at what a mount of kind is made from: a block device
// (FilesystemMount, DeviceBind), opened as the backend names it, or a
// directory (DirBind), a path csid was handed and opened without following
// a link.
func openSource(kind MountKind, path string) (*source, error) {
	s := &source{kind: kind, path: path}
	if kind != DirBind {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !isBlock(fi) {
			return nil, fmt.Errorf("%s is not a block device", path)
		}
		s.rdev = rdev(fi)
		return s, nil
	}
	e, err := openEntry(path)
	if err != nil {
		return nil, fmt.Errorf("bind mount source: %w", err)
	}
	defer e.Close()
	l, err := e.stat()
	switch {
	case err != nil:
		return nil, err
	case !l.exists:
		return nil, fmt.Errorf("bind mount source %s: %w", path, fs.ErrNotExist)
	case !l.isDir():
		return nil, fmt.Errorf("bind mount source %s is not a directory", path)
	}
	if s.dir, err = e.open(unix.O_PATH | unix.O_DIRECTORY); err != nil {
		return nil, err
	}
	s.dev, s.ino = l.dev, l.ino
	return s, nil
}

// Close releases the source's descriptor, if it has one.
func (s *source) Close() {
	if s.dir != nil {
		s.dir.Close()
	}
}

// from is what mount(2) binds: the directory's descriptor, or the device.
func (s *source) from() string {
	if s.dir != nil {
		return fdPath(s.dir)
	}
	return s.path
}

// holds reports whether the mount at a target (l is a mount point) is of s.
func (s *source) holds(l leaf) bool {
	switch s.kind {
	case FilesystemMount:
		return l.dev == s.rdev
	case DeviceBind:
		return l.isBlock() && l.rdev == s.rdev
	default:
		return l.dev == s.dev && l.ino == s.ino
	}
}

func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// plan checks target (e, seen as l) for a mount of src and says what the
// mount will make there; see Mounter.Plan.
func plan(e *entry, l leaf, src *source) (Made, error) {
	made := Made{Kind: src.kind, Source: src.path}
	switch {
	case !l.exists:
		made.Created, made.Mounted = true, true
		return made, nil
	case l.mountPoint && src.holds(l):
		return made, nil
	case l.mountPoint:
		return Made{}, fmt.Errorf("%s is a mount point of %s, not of %s; csid leaves it alone: %w", e.path, e.mounted(l), src.path, ErrBusy)
	}
	info, err := e.info(l)
	if err != nil {
		return Made{}, err
	}
	if err := info.Conflict(e.path, src.kind); err != nil {
		return Made{}, err
	}
	made.Mounted = true
	return made, nil
}

// planAt opens target and plans a mount of src there. A missing parent
// directory is ErrPathConflict: csid creates a target, never its parents.
func planAt(src *source, target string) (*entry, Made, error) {
	e, l, err := openLeaf(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Made{}, fmt.Errorf("the parent directory of %s does not exist (the CO creates it; csid creates only the target itself): %w", target, ErrPathConflict)
	}
	if err != nil {
		return nil, Made{}, err
	}
	made, err := plan(e, l, src)
	if err != nil {
		e.Close()
		return nil, Made{}, err
	}
	return e, made, nil
}

// mountAt creates the target if made says so and mounts on it: mount gets
// the target's descriptor.
func mountAt(e *entry, made Made, mount func(target *os.File) error) error {
	flags := unix.O_PATH | unix.O_DIRECTORY
	if made.Kind == DeviceBind {
		flags = unix.O_PATH
	}
	if made.Created {
		create := e.mkdir
		if made.Kind == DeviceBind {
			create = e.createFile
		}
		if err := create(); err != nil {
			return err
		}
	}
	t, err := e.open(flags)
	if err != nil {
		return err
	}
	defer t.Close()
	return mount(t)
}

// Plan says what a mount of source at target would make there; see
// Mounter.
func (m *Linux) Plan(ctx context.Context, kind MountKind, source, target string) (Made, error) {
	if err := ValidatePaths(source, target); err != nil {
		return Made{}, err
	}
	if err := ctx.Err(); err != nil {
		return Made{}, err
	}
	src, err := openSource(kind, source)
	if err != nil {
		return Made{}, err
	}
	defer src.Close()
	e, made, err := planAt(src, target)
	if err != nil {
		return Made{}, err
	}
	e.Close()
	return made, nil
}

// Undo removes what a mount call made at target, and only that; see
// Mounter.
func (m *Linux) Undo(ctx context.Context, target string, made Made) error {
	if made.Nothing() {
		return nil
	}
	if err := ValidatePath(target); err != nil {
		return err
	}
	e, l, err := look(target)
	if err != nil || e == nil {
		return err
	}
	defer e.Close()
	if !l.exists {
		return nil
	}
	if l.mountPoint {
		if !made.Mounted {
			return nil
		}
		src, err := openSource(made.Kind, made.Source)
		if err != nil {
			return fmt.Errorf("undo at %s: cannot tell whether its mount (%s) is csid's: %w", target, e.mounted(l), err)
		}
		ours := src.holds(l)
		src.Close()
		if !ours {
			return nil
		}
		if err := unmountRetrying(ctx, e.at()); err != nil {
			return unmountError(target, err)
		}
		if l, err = e.stat(); err != nil || !l.exists || l.mountPoint {
			return err // something csid did not mount is left under it
		}
	}
	if !made.Created {
		return nil
	}
	return e.remove(l)
}

// BindMount bind-mounts the directory source at target; see Mounter. A
// target already bound to source is brought to the asked read-only state
// (a crash between the bind and the read-only step leaves it read-write).
func (m *Linux) BindMount(ctx context.Context, source, target string, readOnly bool) error {
	return bindFrom(DirBind, source, target, readOnly)
}

// BindMountDevice bind-mounts the block device at target, a file it
// creates; see Mounter.
//
// A read-only bind mount keeps the mount from being written through, but
// not the device: Linux lets a device node on a read-only mount be opened
// for writing. Read-only raw block volumes need the device itself read-only.
func (m *Linux) BindMountDevice(ctx context.Context, device, target string, readOnly bool) error {
	return bindFrom(DeviceBind, device, target, readOnly)
}

// bindFrom validates the paths, looks at the source and binds it.
func bindFrom(kind MountKind, source, target string, readOnly bool) error {
	if err := ValidatePaths(source, target); err != nil {
		return err
	}
	src, err := openSource(kind, source)
	if err != nil {
		return err
	}
	defer src.Close()
	return bind(src, target, readOnly)
}

// bind makes target a bind mount of src, or finds it one already, and sets
// its read-only flag.
func bind(src *source, target string, readOnly bool) error {
	e, made, err := planAt(src, target)
	if err != nil {
		return err
	}
	defer e.Close()
	if made.Mounted {
		err := mountAt(e, made, func(t *os.File) error {
			if err := unix.Mount(src.from(), fdPath(t), "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind mount %s at %s: %w", src.path, target, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := setReadOnly(e, readOnly); err != nil {
		if made.Mounted {
			// Never leave a writable mount where a read-only one was asked.
			_ = unix.Unmount(e.at(), unix.UMOUNT_NOFOLLOW)
		}
		return err
	}
	return nil
}

// setReadOnly sets or clears the read-only flag of the mount at e and
// nothing else.
func setReadOnly(e *entry, readOnly bool) error {
	root, err := e.open(unix.O_PATH)
	if err != nil {
		return err
	}
	defer root.Close()
	fd := int(root.Fd())
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", e.path, err)
	}
	if (st.Flags&unix.ST_RDONLY != 0) == readOnly {
		return nil
	}
	attr := unix.MountAttr{}
	if readOnly {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	} else {
		attr.Attr_clr = unix.MOUNT_ATTR_RDONLY
	}
	err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
	if errors.Is(err, unix.ENOSYS) {
		err = remountReadOnly(fdPath(root), &st, readOnly)
	}
	if err != nil {
		return fmt.Errorf("make %s read-only=%v: %w", e.path, readOnly, err)
	}
	return nil
}

// remountReadOnly is setReadOnly before Linux 5.12 (no mount_setattr): a
// bind remount sets every per-mount flag, so it restates those the mount
// has (st is its statfs), as mount(8) does.
func remountReadOnly(target string, st *unix.Statfs_t, readOnly bool) error {
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND)
	for stFlag, msFlag := range map[int64]uintptr{
		unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
		unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if int64(st.Flags)&stFlag != 0 {
			flags |= msFlag
		}
	}
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	return unix.Mount("", target, "", flags, "")
}

// Unmount unmounts target (every mount stacked on it) and removes it; see
// Mounter. A directory left with content after the unmount is not removed:
// that is an error, never a recursive delete; so is a file with content.
func (m *Linux) Unmount(ctx context.Context, target string) error {
	if err := ValidatePath(target); err != nil {
		return err
	}
	e, l, err := look(target)
	if err != nil || e == nil {
		return err
	}
	defer e.Close()
	// Unmount until target is no mount point: mounts may be stacked on it.
	const maxStacked = 16
	for i := 0; l.exists && l.mountPoint; i++ {
		if i == maxStacked {
			return fmt.Errorf("unmount %s: still mounted after %d unmounts", target, maxStacked)
		}
		if err := unmountRetrying(ctx, e.at()); err != nil && !errors.Is(err, unix.EINVAL) {
			return unmountError(target, err)
		}
		if l, err = e.stat(); err != nil {
			return err
		}
	}
	if !l.exists {
		return nil
	}
	if err := e.remove(l); err != nil {
		return fmt.Errorf("remove %s after unmounting it: %w", target, err)
	}
	return nil
}

func unmountError(target string, err error) error {
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("unmount %s: %w (%v)", target, ErrInUse, err)
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// unmountRetrying unmounts the mount at path (an entry's at(): the last
// element is not followed), retrying EBUSY for up to about a second: a
// mount is busy for an instant while anything holds a file in it, and such
// holders come and go on their own — a forked child holds a copy of its
// parent's open files until it execs, udev probes devices, a process is
// exiting. A holder that stays makes it return EBUSY.
func unmountRetrying(ctx context.Context, path string) error {
	wait := 5 * time.Millisecond
	for i := 0; ; i++ {
		err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		if !errors.Is(err, unix.EBUSY) || i == 8 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}
