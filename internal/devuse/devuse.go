// Package devuse finds where a block device is in use in this host's mount
// table, by device number: mounted as a filesystem, or its device node
// bind-mounted on a file (how a raw block volume is published). The node
// uses it to refuse a raw block publish of a device mounted as a
// filesystem (and the reverse), and the local backend to refuse releasing
// a loop device a target still binds: a bind mount of a device node does
// not hold the device open, so nothing in the kernel stops the device from
// being released and bound to another disk under it.
//
// A device node can be bound from any filesystem; only those on devtmpfs
// (the host's /dev) and tmpfs (a container's /dev) are looked at, where
// looking never waits on a network or a FUSE daemon. csid binds the nodes
// of /dev.
package devuse

import (
	"errors"
	"fmt"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Kind says how a device is in use.
type Kind string

// Kinds of use.
const (
	// Filesystem: a filesystem on the device is mounted at Path (its
	// first mount or a bind mount of it: the mount table does not tell
	// them apart).
	Filesystem Kind = "filesystem"
	// Node: the device node is bind-mounted at Path.
	Node Kind = "node"
)

// Use is one place a device is in use.
type Use struct {
	Kind Kind
	// Path is the mount point.
	Path string
	// FSType is the filesystem type of a Filesystem use.
	FSType string
}

// String says what the use is: "mounted (ext4) at /x", "bound at /y".
func (u Use) String() string {
	if u.Kind == Node {
		return "its node bound at " + u.Path
	}
	return fmt.Sprintf("mounted (%s) at %s", u.FSType, u.Path)
}

// Of lists where the block device with number dev is in use in this
// process's mount table, in the table's order.
func Of(dev uint64) ([]Use, error) {
	major, minor := int(unix.Major(dev)), int(unix.Minor(dev))
	infos, err := mountinfo.GetMounts(func(in *mountinfo.Info) (skip, stop bool) {
		mine := in.Major == major && in.Minor == minor
		node := (in.FSType == "devtmpfs" || in.FSType == "tmpfs") && in.Root != "/"
		return !mine && !node, false
	})
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	var out []Use
	for _, in := range infos {
		if in.Major == major && in.Minor == minor {
			out = append(out, Use{Kind: Filesystem, Path: in.Mountpoint, FSType: in.FSType})
			continue
		}
		ok, err := nodeOf(in.Mountpoint, dev)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, Use{Kind: Node, Path: in.Mountpoint})
		}
	}
	return out, nil
}

// nodeOf reports whether the mount at path is a bind mount of a node of
// the block device dev. The mount point is looked at without following a
// link and without waiting on a filesystem; one gone since the table was
// read is not.
func nodeOf(path string, dev uint64) (bool, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT|unix.AT_STATX_DONT_SYNC,
		unix.STATX_TYPE, &st)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EACCES) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("statx %s: %w", path, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFBLK && unix.Mkdev(st.Rdev_major, st.Rdev_minor) == dev, nil
}
