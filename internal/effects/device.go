package effects

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// The device a node op uses is the volume's disk, proven at the moment of
// use: the op opens it through the backend, which proves on the open
// descriptor, by an identity it guarantees, that it is the disk
// (cloud.Host.OpenDevice), and the op formats, mounts, binds or grows it
// while it holds it open; the disk must carry the volume's id. A device
// path in the volume's record (Stage.Device) is only a hint of where to
// look first.

// diskOf is the disk a node op works on: the volume's, or (for a volume a
// node adopted) the one the publish context names. A publish context that
// names another disk than the volume's record is refused: it is not this
// volume's.
func diskOf(v store.Volume, publishContext map[string]string) (string, error) {
	named := publishContext[PublishContextDiskID]
	switch {
	case v.DiskID != "" && named != "" && named != v.DiskID:
		return "", ops.Errorf(ops.Conflict, "the publish context names disk %s, and volume %s's disk is %s: it is not this volume's publish context", named, v.ID, v.DiskID)
	case v.DiskID != "":
		return v.DiskID, nil
	case named != "":
		return named, nil
	}
	return "", ops.Errorf(ops.Conflict, "volume %s: no disk recorded and no %s in the publish context", v.ID, PublishContextDiskID)
}

// open opens the device of the volume's disk on this node, proven by the
// backend to be that disk, and checks that the disk carries the volume's
// id. The caller uses dev.Path while the device is open, then closes it.
func (n *Node) open(ctx context.Context, v store.Volume, publishContext map[string]string, opts cloud.OpenOptions) (*cloud.Device, error) {
	diskID, err := diskOf(v, publishContext)
	if err != nil {
		return nil, err
	}
	dev, err := n.Host.OpenDevice(ctx, diskID, opts)
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		return nil, ops.Errorf(ops.Conflict, "disk %s of volume %s is not attached to node %s", diskID, v.ID, n.Host.NodeID())
	case errors.Is(err, cloud.ErrInUse):
		return nil, n.inUse(ctx, v.ID, diskID, opts, err)
	case err != nil:
		return nil, err
	}
	if err := carries(dev.Disk, v.ID); err != nil {
		dev.Close()
		return nil, err
	}
	return dev, nil
}

// carries checks that disk d carries volume id: its csid.dev/volume-id
// tag, which the controller gives a disk when it creates it. A disk is
// used under the id it was made for and no other.
func carries(d cloud.Disk, volumeID string) error {
	switch owner := d.Tags[TagVolumeID]; owner {
	case volumeID:
		return nil
	case "":
		return ops.Errorf(ops.Conflict, "disk %s carries no volume id (tag %s): csid did not create it for volume %s and uses it as no volume; the publish context names the wrong disk",
			d.ID, TagVolumeID, volumeID)
	default:
		return ops.Errorf(ops.Conflict, "disk %s is volume %s's (tag %s), not volume %s's, and is never used as another volume; the publish context names another volume's disk",
			d.ID, owner, TagVolumeID, volumeID)
	}
}

// inUse explains why the disk's device could not be opened exclusively:
// a filesystem on it is mounted (named from the mount table, by device
// number), or another process holds it so for a moment (a detach
// releasing it), which is worth a retry.
func (n *Node) inUse(ctx context.Context, volumeID, diskID string, opts cloud.OpenOptions, cause error) error {
	opts.Exclusive = false
	dev, err := n.Host.OpenDevice(ctx, diskID, opts)
	if err != nil {
		return ops.Mark(cause, ops.Transient)
	}
	defer dev.Close()
	uses, err := n.Mounter.DeviceUses(ctx, dev.Path)
	if err != nil {
		return err
	}
	if fs := mounter.Paths(uses, mounter.FilesystemMount); len(fs) > 0 {
		return ops.Errorf(ops.Conflict, "disk %s of volume %s (%s) is mounted as a filesystem at %s: it is not used as a raw block device while it is",
			diskID, volumeID, dev.Path, strings.Join(fs, ", "))
	}
	return ops.Mark(cause, ops.Transient)
}

// notBound refuses a device whose node is bound on a file anywhere (a raw
// block volume's target): no filesystem of it is mounted meanwhile.
func (n *Node) notBound(ctx context.Context, volumeID string, dev *cloud.Device) error {
	uses, err := n.Mounter.DeviceUses(ctx, dev.Path)
	if err != nil {
		return err
	}
	if raw := mounter.Paths(uses, mounter.DeviceBind); len(raw) > 0 {
		return ops.Errorf(ops.Conflict, "disk %s of volume %s (%s) is bound as a raw block device at %s: its filesystem is not mounted while it is",
			dev.Disk.ID, volumeID, dev.Path, strings.Join(raw, ", "))
	}
	return nil
}

// stagedFrom opens the volume's disk's device (proven) and checks that the
// filesystem mounted at the staging path is on it.
func (n *Node) stagedFrom(ctx context.Context, v store.Volume, staging string) (*cloud.Device, error) {
	if ok, err := n.Mounter.IsMounted(ctx, staging); err != nil {
		return nil, err
	} else if !ok {
		return nil, ops.Errorf(ops.Conflict, "volume %s is not mounted at its staging path %s", v.ID, staging)
	}
	dev, err := n.open(ctx, v, nil, cloud.OpenOptions{Hint: hint(v)})
	if err != nil {
		return nil, err
	}
	ok, err := n.mountOf(ctx, dev, staging, mounter.FilesystemMount)
	if err == nil && !ok {
		err = ops.Errorf(ops.Conflict, "the staging path %s of volume %s is not a mount of its disk %s (%s): something else is mounted there",
			staging, v.ID, dev.Disk.ID, dev.Path)
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return dev, nil
}

// mountOf reports whether path is a mount of kind of the open device dev.
func (n *Node) mountOf(ctx context.Context, dev *cloud.Device, path string, kind mounter.MountKind) (bool, error) {
	uses, err := n.Mounter.DeviceUses(ctx, dev.Path)
	if err != nil {
		return false, err
	}
	return slices.Contains(mounter.Paths(uses, kind), filepath.Clean(path)), nil
}

// hint is the device the volume's stage found: where to look first.
func hint(v store.Volume) string {
	if v.Stage == nil {
		return ""
	}
	return v.Stage.Device
}
