package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
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

// DevicePath returns the loop device of a disk attached to this node,
// binding the disk's image to one the first time; see cloud.Host. A disk
// that is not attached to this node (or malformed, or unknown) is
// ErrNotFound.
//
// Never two devices for one disk: under the state lock, the devices bound
// to the image (by inode) are looked up before one is made, so repeat calls,
// calls from another process and calls after a restart return the same
// device. A device being released (by a detach whose last opener has not
// closed yet) is waited for, not reused. The device is capped at the disk's
// recorded size.
func (h *Host) DevicePath(ctx context.Context, diskIDStr string) (string, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return "", fmt.Errorf("disk %q: %w", diskIDStr, cloud.ErrNotFound)
	}
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
		return err
	})
	if err != nil {
		return "", err
	}
	return path, nil
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
	dev, err := loopdev.Attach(ctx, f, loopdev.Options{SizeLimit: size})
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
