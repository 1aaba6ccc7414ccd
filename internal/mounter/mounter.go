// Package mounter formats, mounts, bind-mounts, unmounts and grows the
// filesystems of block devices on the node csid runs on, and reports their
// usage. It is built on k8s.io/mount-utils.
//
// Every operation is idempotent: a second call after a crash at any point
// converges to the same result and never repeats a destructive step. A device
// is formatted only when a probe that succeeded says it is blank; a probe
// that fails is an error, never "blank".
package mounter

import (
	"context"
	"errors"
)

// Typed errors, wrapped by implementations; decide with errors.Is.
var (
	// ErrInvalidPath: a path is empty, relative, contains a ".." element
	// or a NUL byte, or is longer than MaxPathBytes (see ValidatePath).
	ErrInvalidPath = errors.New("invalid path")
	// ErrProbeFailed: the device could not be read or probed, so csid
	// does not know whether it holds data; it is not formatted.
	ErrProbeFailed = errors.New("device probe failed")
	// ErrFormatMismatch: the device holds a filesystem other than the one
	// requested; it is neither reformatted nor mounted.
	ErrFormatMismatch = errors.New("device holds another filesystem")
	// ErrNotMounted: the path is not a mount point where one is required.
	ErrNotMounted = errors.New("not mounted")
	// ErrBusy: the target is mounted from another source.
	ErrBusy = errors.New("target is mounted from another source")
	// ErrInUse: the target cannot be unmounted now because something has a
	// file open inside it (or its current directory there). Transient:
	// retry later.
	ErrInUse = errors.New("target is in use")
	// ErrSymlink: an element of a path is a symbolic link. csid follows
	// none in the paths it is handed: the caller must name the real path.
	ErrSymlink = errors.New("symbolic link in path")
	// ErrPathConflict: what is at a path is in the way of what csid was
	// asked to do there, and csid did not put it there: a directory with
	// content where a mount would hide it, a file where a directory is
	// needed (or the reverse), a missing parent directory. Nothing was
	// changed.
	ErrPathConflict = errors.New("path is in the way")
)

// MountKind is what a mount at a target is made from.
type MountKind string

// The kinds of mount csid makes.
const (
	// FilesystemMount is a device's filesystem mounted on a directory
	// (FormatAndMount).
	FilesystemMount MountKind = "filesystem"
	// DirBind is a directory bind-mounted on a directory (BindMount).
	DirBind MountKind = "bind"
	// DeviceBind is a block device bind-mounted on a file
	// (BindMountDevice).
	DeviceBind MountKind = "device"
)

// Made is what one mount call makes at its target. A caller records it
// durably before the call (Plan says what it will be; FormatAndMount hands
// it to the caller's record), so that a failed operation undoes exactly
// that with Undo, and never anything that was there before.
type Made struct {
	Kind MountKind `json:"kind"`
	// Source is the device (FilesystemMount, DeviceBind) or directory
	// (DirBind) mounted.
	Source string `json:"source"`
	// Created: the call creates the target itself (the directory, or the
	// file of a DeviceBind).
	Created bool `json:"created,omitempty"`
	// Mounted: the call mounts Source at the target.
	Mounted bool `json:"mounted,omitempty"`
}

// Nothing reports whether the call makes nothing (its mount is there).
func (m Made) Nothing() bool { return !m.Created && !m.Mounted }

// Stats is the usage of a mounted filesystem (or, for a block device, only
// its size in TotalBytes).
type Stats struct {
	TotalBytes     int64
	AvailableBytes int64
	UsedBytes      int64
	TotalInodes    int64
	FreeInodes     int64
	UsedInodes     int64
	// Block is true when the path is a block device (or a file bind-mounted
	// from one): only TotalBytes is meaningful.
	Block bool
}

// MountPoint is one entry of the host's mount table.
type MountPoint struct {
	// Device is the source as the kernel reports it (e.g. /dev/loop3); for a
	// bind mount of a directory it is the device of the filesystem.
	Device string
	// Path is the mount point.
	Path string
	// Type is the filesystem type.
	Type string
	// Root is the path inside the source filesystem that is mounted (a bind
	// mount of a sub-directory shows it here).
	Root string
	// Options are the mount options.
	Options []string
}

// Mounter is the host side of volume staging and publishing.
//
// The paths a CO hands csid (targets, staging paths, volume paths) are
// used without following a symbolic link anywhere in them: one is
// ErrSymlink, and nothing is done. A mount call creates its target, never
// the target's parent directories (the CO creates those), and mounts only
// on an empty directory (or, for a raw block device, an empty file): a
// target with content, of the wrong kind, or mounted from anything else is
// refused before anything is done (ErrPathConflict, ErrBusy).
type Mounter interface {
	// Plan says what mounting source at target as kind would make there
	// (see Made), without making anything, and refuses what the mount call
	// would refuse: target mounted from anything else, ErrBusy naming
	// what is mounted; target in the way, ErrPathConflict; a link in
	// target (or, for DirBind, in source), ErrSymlink. Already mounted
	// from source: a Made that makes nothing.
	Plan(ctx context.Context, kind MountKind, source, target string) (Made, error)
	// Undo removes what made says a mount call made at target, and only
	// that: the mount, if the top mount at target is still one of
	// made.Source (anything else mounted there stays, and so does what is
	// under it); then target itself, if made.Created and it is an empty
	// directory or an empty file. A target that holds content csid did
	// not write stays, and that is ErrPathConflict. Nothing at target:
	// success.
	Undo(ctx context.Context, target string, made Made) error
	// FormatAndMount mounts device at target (a directory, created if
	// missing) with filesystem fsType ("ext4" when empty) and options. The
	// device is formatted first only if a successful probe finds it blank.
	// A device already formatted with fsType is mounted without being
	// formatted (an ext3/ext4 smaller than its device is grown first,
	// offline, unless the mount is read-only or the caller's GrowFilesystem
	// can grow it online; an interrupted offline growth is repaired first);
	// with another filesystem, ErrFormatMismatch. Already mounted there:
	// success; target mounted from anything else: ErrBusy; target in the
	// way: ErrPathConflict. A ctx that ends while a host tool (mkfs,
	// e2fsck, resize2fs, mount) runs lets the tool finish; FormatAndMount
	// then returns ctx's error before its next step.
	//
	// record, unless nil, records durably what the mount will make at
	// target: FormatAndMount calls it once, after the target is checked
	// and before anything is made there, with what Plan says, and makes
	// nothing there unless it returns nil. It runs while the device is
	// probed and formatted, so that its write is not on a stage's way; a
	// format it fails after is not undone (the device was blank). Already
	// mounted there: record is not called.
	//
	// formatted reports that this call formatted the device (with a nil
	// error only): its fresh filesystem fills the device, so a caller
	// need not ask GrowFilesystem.
	FormatAndMount(ctx context.Context, device, target, fsType string, options []string, record func(Made) error) (formatted bool, err error)
	// BindMount bind-mounts the directory source onto target (created if
	// missing), read-only if readOnly. Already bind-mounted: success.
	BindMount(ctx context.Context, source, target string, readOnly bool) error
	// BindMountDevice bind-mounts the block device onto target, a file it
	// creates if missing (raw block volumes). Already mounted: success.
	BindMountDevice(ctx context.Context, device, target string, readOnly bool) error
	// Unmount unmounts every mount stacked at target and removes target
	// (an empty directory or a file). A target that does not exist is
	// success; one that is no mount point and holds content stays, and
	// that is an error.
	Unmount(ctx context.Context, target string) error
	// IsMounted reports whether path is a mount point. A path that does not
	// exist is not mounted (no error).
	IsMounted(ctx context.Context, path string) (bool, error)
	// DeviceOf returns the device mounted at path, or ErrNotMounted.
	DeviceOf(ctx context.Context, path string) (string, error)
	// Filesystem probes device and returns its filesystem type, "" when
	// blank. A failing probe returns ErrProbeFailed.
	Filesystem(ctx context.Context, device string) (string, error)
	// DeviceSize returns the size of a block device in bytes.
	DeviceSize(ctx context.Context, device string) (int64, error)
	// GrowFilesystem grows the filesystem of device, mounted at path, to
	// fill the device, when the device is larger. It reports whether it
	// grew anything. The growth is online, journalled by the kernel.
	GrowFilesystem(ctx context.Context, device, path string) (bool, error)
	// Stats reports the usage of the filesystem mounted at path, or the
	// size of the block device at path.
	Stats(ctx context.Context, path string) (Stats, error)
	// List returns the host's mount table.
	List(ctx context.Context) ([]MountPoint, error)
	// DeviceUses lists where the block device is in use in the host's
	// mount table, by device number: its filesystem mounted (a
	// FilesystemMount; bind mounts of a directory of it look the same),
	// or its node bound on a file (a DeviceBind).
	DeviceUses(ctx context.Context, device string) ([]DeviceUse, error)
}

// DeviceUse is one place a block device is in use (Mounter.DeviceUses).
type DeviceUse struct {
	// Kind is FilesystemMount or DeviceBind.
	Kind MountKind
	// Path is the mount point.
	Path string
}

// Paths returns the paths of the uses of kind k.
func Paths(uses []DeviceUse, k MountKind) []string {
	var out []string
	for _, u := range uses {
		if u.Kind == k {
			out = append(out, u.Path)
		}
	}
	return out
}
