package yandex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

// DefaultByIDDir is where udev links each disk by its serial: a disk
// attached with device name N is <DefaultByIDDir>/virtio-N.
const DefaultByIDDir = "/dev/disk/by-id"

// DefaultDeviceWait bounds how long OpenDevice waits for the device of a
// disk the cloud says is attached here to appear (udev links it some time
// after the attach operation finished).
const DefaultDeviceWait = 2 * time.Minute

// HostOptions configure NewHost.
type HostOptions struct {
	// InstanceID is the instance this host is (its node id).
	InstanceID string
	// Cloud is asked whether a disk is attached to the instance, and for
	// the disk as it reports it (size, tags). A node needs read access to
	// the folder's disks only.
	Cloud cloud.Cloud
	// ByIDDir is the directory of udev's by-id links (default
	// DefaultByIDDir). It is opened without following a symbolic link.
	ByIDDir string
	// Serial reads the serial of the open block device f, the identity
	// Yandex guarantees: the device name the disk was attached with, which
	// csid sets to the disk id (default VirtioSerial). Tests with loop
	// devices standing in for disks pass LoopSerial.
	Serial func(f *os.File) (string, error)
	// DeviceWait bounds the wait for an attached disk's device to appear
	// (default DefaultDeviceWait).
	DeviceWait time.Duration
}

// Host is the node side of Yandex Compute Cloud: it finds the block device
// of a disk attached to its instance by the disk's stable name,
// <by-id dir>/virtio-<disk id>, and proves on the open descriptor that its
// virtio serial is the disk id.
type Host struct {
	instance string
	cloud    cloud.Cloud
	byID     string
	serial   func(f *os.File) (string, error)
	wait     time.Duration
	// missed, if set, is called each time waitLink finds no link (tests
	// make the device appear only once OpenDevice is waiting for it).
	missed func()
}

var _ cloud.Host = (*Host)(nil)

// NewHost returns the node side of instance o.InstanceID.
func NewHost(o HostOptions) cloud.Host {
	h := &Host{instance: o.InstanceID, cloud: o.Cloud, byID: o.ByIDDir, serial: o.Serial, wait: o.DeviceWait}
	if h.byID == "" {
		h.byID = DefaultByIDDir
	}
	h.byID = filepath.Clean(h.byID)
	if h.serial == nil {
		h.serial = VirtioSerial
	}
	if h.wait <= 0 {
		h.wait = DefaultDeviceWait
	}
	return h
}

// NodeID is the instance this host is.
func (h *Host) NodeID() string { return h.instance }

// maxHostLookups bounds how often OpenDevice looks a disk's link up again
// after the device it named failed to prove to be the disk.
const maxHostLookups = 3

// lookupPause is the pause before the second lookup of a disk's link
// after its device failed the proof (twice it before the third).
const lookupPause = 100 * time.Millisecond

// errNotProven: a device is not (or no longer) the disk's.
var errNotProven = errors.New("not the disk's device")

// OpenDevice opens the block device of a disk attached to this instance
// and proves it is the disk; see cloud.Host. A disk the cloud does not
// report attached here (or an id that is not Yandex's) is ErrNotFound, at
// once: the device of a disk not attached is not waited for.
//
// The proof, on the open descriptor: it is a block device, and its serial
// (HostOptions.Serial: for virtio, /sys/dev/block/MAJ:MIN/serial of the
// descriptor's device number) is the disk id. While the descriptor is
// open, the device number cannot be given to another disk, even if the
// disk is detached meanwhile. opts.Hint is tried first; then the by-id
// link is read (waiting for udev to make it, at most
// HostOptions.DeviceWait, then ErrTransient) and the device it names
// opened; a device that fails the proof (a link naming another disk's
// device, a link to a link, a hint reused by another disk) is dropped and
// the link read again after a short pause (udev may be replacing a stale
// link), at most maxHostLookups times, then ErrIdentity.
func (h *Host) OpenDevice(ctx context.Context, diskID string, opts cloud.OpenOptions) (*cloud.Device, error) {
	if err := checkDiskID(diskID, true); err != nil {
		return nil, err
	}
	d, err := h.cloud.GetDisk(ctx, diskID)
	if err != nil {
		return nil, err
	}
	if d.AttachedTo != h.instance {
		return nil, fmt.Errorf("disk %s is not attached to instance %s: %w", diskID, h.instance, cloud.ErrNotFound)
	}
	var why error
	if opts.Hint != "" {
		dev, err := h.openDisk(d, opts.Hint, opts.Exclusive)
		if !errors.Is(err, errNotProven) {
			return dev, err
		}
		why = err
	}
	for i := range maxHostLookups {
		if i > 0 {
			// udev may be replacing a stale link (a device gone with
			// an earlier attach): give it a moment.
			if err := sleepCtx(ctx, time.Duration(i)*lookupPause); err != nil {
				return nil, err
			}
		}
		path, err := h.waitLink(ctx, diskID)
		if err != nil {
			return nil, err
		}
		dev, err := h.openDisk(d, path, opts.Exclusive)
		if !errors.Is(err, errNotProven) {
			return dev, err
		}
		why = err
	}
	return nil, fmt.Errorf("disk %s: no device proved to be it in %d lookups of %s (last: %v): %w",
		diskID, maxHostLookups, h.linkPath(diskID), why, cloud.ErrIdentity)
}

// openDisk opens the device at path, proves it is disk d, and opens it
// exclusively too when asked (while the first descriptor keeps the proof).
func (h *Host) openDisk(d cloud.Disk, path string, exclusive bool) (*cloud.Device, error) {
	f, number, err := h.openProven(path, d.ID)
	if err != nil {
		return nil, err
	}
	if !exclusive {
		return cloud.NewDevice(d, path, number, f.Close), nil
	}
	x, err := openNoFollow(path, unix.O_EXCL)
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("%s, disk %s's device, is held exclusively (a filesystem on it is mounted): %w", path, d.ID, cloud.ErrInUse)
		}
		return nil, fmt.Errorf("%s: %v: %w", path, err, errNotProven)
	}
	if n, err := deviceNumber(x); err != nil || n != number {
		x.Close()
		f.Close()
		return nil, fmt.Errorf("%s is another device than the one proven a moment ago: %w", path, errNotProven)
	}
	return cloud.NewDevice(d, path, number, func() error { return errors.Join(x.Close(), f.Close()) }), nil
}

// openProven opens the block device at path, following no symbolic link
// anywhere in it, and proves on the descriptor that its serial is id. It
// returns the open device and its number, or an error wrapping
// errNotProven for a device that is not (or no longer) the disk's.
func (h *Host) openProven(path, id string) (*os.File, uint64, error) {
	f, err := openNoFollow(path, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ELOOP) ||
		errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENODEV) {
		return nil, 0, fmt.Errorf("%s: %v: %w", path, err, errNotProven)
	}
	if err != nil {
		return nil, 0, err
	}
	number, err := deviceNumber(f)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	serial, err := h.serial(f)
	switch {
	case err != nil:
		err = fmt.Errorf("%s: no serial: %v: %w", path, err, errNotProven)
	case serial != id:
		err = fmt.Errorf("%s has serial %q, not disk %s's: %w", path, serial, id, errNotProven)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, number, nil
}

// openNoFollow opens path read-only (with extra flags), following no
// symbolic link in any of its elements (openat2 RESOLVE_NO_SYMLINKS).
func openNoFollow(path string, flags int) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   uint64(unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | flags),
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// deviceNumber is the device number of the open block device f; anything
// else is errNotProven.
func deviceNumber(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device: %w", f.Name(), errNotProven)
	}
	return uint64(st.Rdev), nil
}

// linkPath is the by-id link of a disk.
func (h *Host) linkPath(diskID string) string {
	return filepath.Join(h.byID, linkPrefix+diskID)
}

// linkPrefix starts the by-id name udev gives a virtio disk.
const linkPrefix = "virtio-"

// waitLink reads the by-id link of disk id, waiting for udev to make it:
// polls with a growing interval, at most h.wait (then ErrTransient) or
// until ctx ends. The path returned is only a candidate: it is proven
// once opened.
func (h *Host) waitLink(ctx context.Context, id string) (string, error) {
	deadline := time.Now().Add(h.wait)
	interval := 10 * time.Millisecond
	for {
		path, err := h.readLink(id)
		if !errors.Is(err, unix.ENOENT) {
			return path, err
		}
		if h.missed != nil {
			h.missed()
		}
		left := time.Until(deadline)
		if left <= 0 {
			return "", fmt.Errorf("disk %s is attached to instance %s, and %s did not appear within %v: %w",
				id, h.instance, h.linkPath(id), h.wait, cloud.ErrTransient)
		}
		if err := sleepCtx(ctx, min(interval, left)); err != nil {
			return "", err
		}
		interval = min(2*interval, 500*time.Millisecond)
	}
}

// readLink returns the path the by-id entry of disk id names: the link's
// target (relative to the by-id directory, as udev writes it), or the
// entry itself when it is no link. The directory is opened without
// following a symbolic link, and only the entry's own link is read: a
// target that is a link again is refused when it is opened. A missing
// entry (or directory) is unix.ENOENT.
func (h *Host) readLink(id string) (string, error) {
	dir, err := h.openByID(unix.O_PATH)
	if err != nil {
		return "", err
	}
	defer dir.Close()
	return readLinkAt(dir, h.byID, linkPrefix+id)
}

// openByID opens the by-id directory (with extra flags), following no
// symbolic link. A directory udev has not made yet (no disk by id so far)
// is unix.ENOENT.
func (h *Host) openByID(flags int) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, h.byID, &unix.OpenHow{
		Flags:   uint64(unix.O_DIRECTORY | unix.O_CLOEXEC | flags),
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s (following no link): %w", h.byID, err)
	}
	return os.NewFile(uintptr(fd), h.byID), nil
}

// readLinkAt is readLink's read of entry name in the open directory dir,
// which is dirPath.
func readLinkAt(dir *os.File, dirPath, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
	switch {
	case errors.Is(err, unix.EINVAL): // not a link: the entry itself is the candidate
		return filepath.Join(dirPath, name), nil
	case err != nil:
		return "", err
	}
	target := string(buf[:n])
	if !filepath.IsAbs(target) {
		target = filepath.Join(dirPath, target)
	}
	return filepath.Clean(target), nil
}

// Devices lists the by-id entries of this instance that prove to be disks
// (each opened, its serial read and compared with the id its name
// carries), keyed by disk id. The cloud is not asked: these are the disks
// attached here as the kernel sees them. The directory is opened once,
// following no link, and each entry's link read in it.
func (h *Host) Devices(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	dir, err := h.openByID(unix.O_RDONLY)
	if errors.Is(err, unix.ENOENT) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		id, ok := strings.CutPrefix(name, linkPrefix)
		if !ok || !idPattern.MatchString(id) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		path, err := readLinkAt(dir, h.byID, name)
		if errors.Is(err, unix.ENOENT) {
			continue // detached meanwhile
		}
		if err != nil {
			return nil, err
		}
		f, _, err := h.openProven(path, id)
		if errors.Is(err, errNotProven) {
			continue
		}
		if err != nil {
			return nil, err
		}
		f.Close()
		out[id] = path
	}
	return out, nil
}

// VirtioSerial is the serial of the open virtio block device f, as the
// kernel reports it for the descriptor's device number
// (/sys/dev/block/MAJ:MIN/serial). A device without one (a partition, a
// loop device) is an error.
func VirtioSerial(f *os.File) (string, error) {
	number, err := deviceNumber(f)
	if err != nil {
		return "", err
	}
	return sysfsAttr(number, "serial")
}

// LoopSerial is the serial of an open loop device standing in for a disk
// (a test's node simulator, such as the fake API's LoopNode): the base
// name of its backing file, which the simulator names after the disk id,
// read for the descriptor's device number as VirtioSerial reads a virtio
// disk's. It proves nothing on a real instance.
func LoopSerial(f *os.File) (string, error) {
	number, err := deviceNumber(f)
	if err != nil {
		return "", err
	}
	backing, err := sysfsAttr(number, "loop/backing_file")
	if err != nil {
		return "", err
	}
	return filepath.Base(strings.TrimSuffix(backing, " (deleted)")), nil
}

// sysfsAttr reads attribute name of the block device number from sysfs.
func sysfsAttr(number uint64, name string) (string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/%s", unix.Major(number), unix.Minor(number), name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(raw)), nil
}
