package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/loopdev"
)

// Host is the node side of the local provider: it binds the image of a disk
// attached to its node to a loop device, and finds that device again after
// a restart. Binding needs root.
type Host struct {
	c    *Cloud
	node string
}

var _ cloud.Host = (*Host)(nil)

// Host returns the node side of nodeID on this machine. The node registers
// itself separately (RegisterNode).
func (c *Cloud) Host(nodeID string) *Host {
	return &Host{c: c, node: nodeID}
}

// NodeID is the node this host is.
func (h *Host) NodeID() string { return h.node }

// OpenDevice opens the loop device of a disk attached to this node,
// binding the disk's image to one the first time, and proves it is the
// disk; see cloud.Host. A disk that is not attached to this node (or
// malformed, or unknown) is ErrNotFound.
//
// The proof, on the open descriptor: the kernel's loop status
// (LOOP_GET_STATUS64) names the image's device and inode number, the
// device is not being released, and it has the disk's size; then the
// disk's record still says it is attached here. A device that fails it (a
// hint bound to another image since, a device released and bound to
// another disk between its lookup and its open) is dropped and the disk's
// device looked up again, up to maxLookups times.
func (h *Host) OpenDevice(ctx context.Context, diskIDStr string, opts cloud.OpenOptions) (*cloud.Device, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return nil, fmt.Errorf("disk %q: %w", diskIDStr, cloud.ErrNotFound)
	}
	path := opts.Hint
	var why error
	for range maxLookups {
		if path == "" {
			var err error
			if path, err = h.devicePath(ctx, id); err != nil {
				return nil, err
			}
		}
		dev, err := h.prove(id, path, opts.Exclusive)
		if !errors.Is(err, errNotProven) {
			return dev, err
		}
		why, path = err, ""
	}
	return nil, fmt.Errorf("disk %s: no loop device proved to be bound to its image in %d lookups (last: %v): %w", id, maxLookups, why, cloud.ErrIdentity)
}

// maxLookups bounds how often OpenDevice looks a disk's device up again
// after one failed to prove to be the disk.
const maxLookups = 3

// errNotProven: a device is not (or no longer) the disk's.
var errNotProven = errors.New("not the disk's device")

// prove opens the loop device at path and proves, on the descriptor, that
// it is bound to the image of disk id, whole and to stay: see OpenDevice.
// It returns the open device, or errNotProven. Exclusive opens the proven
// device a second time, with O_EXCL, while the first descriptor keeps it
// bound to the image.
func (h *Host) prove(id diskID, path string, exclusive bool) (*cloud.Device, error) {
	if _, ok := loopdev.Number(path); !ok {
		return nil, fmt.Errorf("%s is not a loop device: %w", path, errNotProven)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: %v: %w", path, err, errNotProven)
	}
	if err != nil {
		return nil, err
	}
	number, d, err := h.check(f, id)
	if err != nil {
		f.Close()
		return nil, err
	}
	if !exclusive {
		return cloud.NewDevice(d, path, number, f.Close), nil
	}
	x, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_EXCL, 0)
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("%s, disk %s's device, is held exclusively (a filesystem on it is mounted, or it is being released): %w", path, id, cloud.ErrInUse)
		}
		return nil, err
	}
	return cloud.NewDevice(d, path, number, func() error { return errors.Join(x.Close(), f.Close()) }), nil
}

// check is prove's proof on the open device f: its number, and the disk.
func (h *Host) check(f *os.File, id diskID) (uint64, cloud.Disk, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, cloud.Disk{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(uint64(st.Rdev)) != loopdev.Major {
		return 0, cloud.Disk{}, fmt.Errorf("%s is no loop device: %w", f.Name(), errNotProven)
	}
	b, err := loopdev.BindingOf(f)
	if errors.Is(err, unix.ENXIO) {
		return 0, cloud.Disk{}, fmt.Errorf("%s is bound to nothing: %w", f.Name(), errNotProven)
	}
	if err != nil {
		return 0, cloud.Disk{}, err
	}
	img, err := h.c.imageID(id)
	if err != nil {
		return 0, cloud.Disk{}, err
	}
	switch {
	case b.File != img:
		return 0, cloud.Disk{}, fmt.Errorf("%s is bound to another file than the image of disk %s: %w", f.Name(), id, errNotProven)
	case b.AutoClear:
		return 0, cloud.Disk{}, fmt.Errorf("%s is being released: %w", f.Name(), errNotProven)
	}
	// The record is read after the device was opened: a detach that
	// finished before is seen here, and one that starts now cannot
	// release the device while it is open.
	d, err := h.c.s.readDisk(id)
	if err != nil {
		return 0, cloud.Disk{}, err
	}
	if d.AttachedTo != h.node {
		return 0, cloud.Disk{}, fmt.Errorf("disk %s is not attached to node %s: %w", id, h.node, cloud.ErrNotFound)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, cloud.Disk{}, err
	}
	if size != d.SizeBytes {
		return 0, cloud.Disk{}, fmt.Errorf("%s has %d bytes, disk %s has %d: %w", f.Name(), size, id, d.SizeBytes, errNotProven)
	}
	return uint64(st.Rdev), d, nil
}

// devicePath returns the loop device of a disk attached to this node,
// binding the disk's image to one the first time. A disk that is not
// attached to this node is ErrNotFound. The path is only a candidate:
// OpenDevice proves it.
//
// Never two devices for one disk: under the disk's lock, the devices bound
// to the image (by inode) are looked up before one is made, so repeat calls,
// calls from another process and calls after a restart return the same
// device. A device being released (by a detach whose last opener has not
// closed yet) is waited for, not reused. The device is capped at the disk's
// recorded size.
func (h *Host) devicePath(ctx context.Context, id diskID) (string, error) {
	var path string
	err := h.c.locked(ctx, func() error {
		d, err := h.c.s.readDisk(id)
		if err != nil {
			return err
		}
		if d.AttachedTo != h.node {
			return fmt.Errorf("disk %s is not attached to node %s: %w", id, h.node, cloud.ErrNotFound)
		}
		devs, fid, err := h.c.devicesOf(id)
		if err != nil {
			return err
		}
		for _, dev := range devs {
			if !dev.AutoClear && dev.SizeBytes == d.SizeBytes {
				path = dev.Path // the lowest-numbered healthy device
				return nil
			}
			// Being released, or bound with a size that is not the
			// disk's (by hand, or from before a resize): let it go.
			if err := loopdev.Release(ctx, dev.Path, fid); err != nil {
				return fmt.Errorf("disk %s: stale %s (%d bytes, disk has %d): %w", id, dev.Path, dev.SizeBytes, d.SizeBytes, err)
			}
		}
		path, err = bindImage(ctx, h.c.s.imagePath(id), d.SizeBytes)
		if err == nil {
			h.c.s.hit(crash.LocalDeviceBound)
		}
		return err
	}, diskKey(id))
	if err != nil {
		return "", err
	}
	return path, nil
}

// BindOptions are how the local backend binds the image of a disk of size
// bytes to a loop device: capped at the disk's size, with direct I/O where
// the state directory's file system allows it (else buffered; see
// loopdev.Options.DirectIO). A filesystem on the disk is then cached once,
// in the node's page cache as that filesystem's, not a second time as
// pages of the image; and the blank check of a new disk reads the image's
// holes without filling a page of the cache for each. csid bench binds the
// image of its mkfs+mount floor the same way.
func BindOptions(size int64) loopdev.Options {
	return loopdev.Options{SizeLimit: size, DirectIO: true}
}

func bindImage(ctx context.Context, img string, size int64) (string, error) {
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if fi.Size() < size {
		return "", fmt.Errorf("image %s has %d bytes, its record says %d: the state directory is damaged", img, fi.Size(), size)
	}
	dev, err := loopdev.Attach(ctx, f, BindOptions(size))
	if err != nil {
		return "", err
	}
	return dev.Path, nil
}

// Devices lists the loop devices on this machine bound to images of this
// state directory, keyed by disk ID; see cloud.Host. It reports every such
// device, also of disks attached to other nodes, detached or deleted: those
// are leaks for `csid check` to show. Of a disk bound to several devices
// (also a leak), it reports the highest-numbered.
func (h *Host) Devices(ctx context.Context) (map[string]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	bound, err := h.c.boundDevices()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(bound))
	for id, paths := range bound {
		out[id] = paths[len(paths)-1]
	}
	return out, nil
}

// boundDevices lists the loop devices on this machine bound to images of
// this state directory, by disk id, each disk's in device-number order.
func (c *Cloud) boundDevices() (map[string][]string, error) {
	all, err := loopdev.List()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, dev := range all {
		name, ok := strings.CutSuffix(filepath.Base(dev.BackingFile), imageSuffix)
		if !ok {
			continue
		}
		id, ok := parseDiskID(name)
		if !ok {
			continue
		}
		ours, err := c.backs(dev, id)
		if err != nil {
			return nil, err
		}
		if ours {
			out[string(id)] = append(out[string(id)], dev.Path)
		}
	}
	return out, nil
}

// imageID is the identity of the image of disk id, looked at without
// following a link: an image replaced by a link is no disk's.
func (c *Cloud) imageID(id diskID) (loopdev.FileID, error) {
	fi, err := os.Lstat(c.s.imagePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return loopdev.FileID{}, fmt.Errorf("disk %s has no image: %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return loopdev.FileID{}, err
	}
	if !fi.Mode().IsRegular() {
		return loopdev.FileID{}, fmt.Errorf("the image of disk %s is not a regular file: %w", id, cloud.ErrIdentity)
	}
	return loopdev.IDOf(fi)
}

// backs reports whether dev is bound to the image of disk id of this state
// directory: by inode while the image exists, by path once it is deleted.
func (c *Cloud) backs(dev loopdev.Device, id diskID) (bool, error) {
	if dev.Deleted {
		return filepath.Dir(dev.BackingFile) == c.s.disks, nil
	}
	fi, err := os.Stat(c.s.imagePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	want, err := loopdev.IDOf(fi)
	if err != nil {
		return false, err
	}
	got, err := loopdev.Backing(dev.Path)
	if errors.Is(err, unix.ENXIO) || errors.Is(err, os.ErrNotExist) {
		return false, nil // released meanwhile
	}
	if err != nil {
		return false, err
	}
	return got == want, nil
}
