package effects

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// Confirmer is the engine's ops.Confirmer for a process with a controller
// (c), a node (n), or both: each confirms the requests of its own events.
func Confirmer(c *Controller, n *Node) ops.Confirmer {
	return func(ctx context.Context, req ops.Request, v *store.Volume) (*ops.Correction, error) {
		var fix *ops.Correction
		var err error
		switch req.Event {
		case fsm.Create, fsm.ControllerPublish, fsm.ControllerUnpublish, fsm.Expand:
			if c != nil {
				fix, err = c.Confirm(ctx, req, v)
			}
		case fsm.NodeStage, fsm.NodePublish:
			if n != nil {
				fix, err = n.Confirm(ctx, req, v)
			}
		}
		return fix, kindOf(err)
	}
}

// Confirm checks with the cloud what a controller request's record says is
// done already (see ops.Confirmer): a volume's disk exists at its size
// (CreateVolume, ControllerExpandVolume), is attached to the node
// (ControllerPublishVolume), or is not (ControllerUnpublishVolume). A disk
// detached out of band from a NODE_READY record is rolled back to CREATED,
// and the publish attaches it again; an attachment the record lacks is
// adopted, and the unpublish detaches it. What cannot be brought in line
// (the disk gone, smaller than recorded, attached to another node) is an
// error naming it, never "done".
func (c *Controller) Confirm(ctx context.Context, req ops.Request, v *store.Volume) (*ops.Correction, error) {
	if v.DiskID == "" {
		return nil, nil
	}
	d, err := c.Cloud.GetDisk(ctx, v.DiskID)
	if errors.Is(err, cloud.ErrNotFound) {
		if req.Event == fsm.ControllerUnpublish {
			return nil, nil // nothing is attached anywhere
		}
		return nil, ops.Errorf(ops.Conflict, "volume %s is recorded, but its disk %s no longer exists in the cloud; `csid check` reports it", v.ID, v.DiskID)
	}
	if err != nil {
		return nil, fmt.Errorf("confirm volume %s with the cloud: %w", v.ID, err)
	}
	switch a := req.Args.(type) {
	case *ops.CreateArgs, *ops.ExpandArgs:
		if d.SizeBytes < v.CapacityBytes {
			return nil, ops.Errorf(ops.Conflict, "volume %s is recorded with %d bytes, but the cloud has its disk %s at %d bytes; `csid check` reports it",
				v.ID, v.CapacityBytes, d.ID, d.SizeBytes)
		}
	case *ops.ControllerPublishArgs:
		return c.confirmAttached(v, d, a.Node)
	case *ops.ControllerUnpublishArgs:
		return c.confirmDetached(v, d, a.Node)
	}
	return nil, nil
}

// confirmAttached confirms that disk d of v is attached to node, as the
// record says.
func (c *Controller) confirmAttached(v *store.Volume, d cloud.Disk, node string) (*ops.Correction, error) {
	switch {
	case d.AttachedTo == node:
		return nil, nil
	case d.AttachedTo == "" && v.State == fsm.NodeReady:
		nv := v.Clone()
		nv.State, nv.Attachment = fsm.Created, nil
		return &ops.Correction{Volume: nv, Event: fsm.Rollback, Guard: fsm.Detached,
			Why: fmt.Sprintf("the cloud has disk %s detached, the record said attached to %s", d.ID, node)}, nil
	case d.AttachedTo == "":
		return nil, ops.Errorf(ops.Conflict, "volume %s is %s on node %s, but the cloud has its disk %s detached; `csid check` reports it",
			v.ID, v.State, node, d.ID)
	default:
		return nil, ops.Errorf(ops.Conflict, "volume %s is recorded attached to node %s, but the cloud has its disk %s attached to %s; `csid check` reports it",
			v.ID, node, d.ID, d.AttachedTo)
	}
}

// confirmDetached confirms that disk d of v is not attached to node (any
// node, when node is ""), as the record says.
func (c *Controller) confirmDetached(v *store.Volume, d cloud.Disk, node string) (*ops.Correction, error) {
	if d.AttachedTo == "" || (node != "" && d.AttachedTo != node) || v.State != fsm.Created {
		return nil, nil
	}
	nv := v.Clone()
	nv.State = fsm.NodeReady
	nv.Attachment = &store.Attachment{Node: d.AttachedTo, PublishContext: map[string]string{PublishContextDiskID: d.ID}}
	return &ops.Correction{Volume: nv, Event: fsm.Adopt, Guard: fsm.Attached,
		Why: fmt.Sprintf("the cloud has disk %s attached to %s, the record said detached", d.ID, d.AttachedTo)}, nil
}

// Confirm checks with the host what a node request's record says is done
// already (see ops.Confirmer): a repeated NodeStageVolume or
// NodePublishVolume is answered from the record only while the mount it
// names is there. When it is gone, the record is rolled back to what the
// host has (every mount of the volume it names is looked at), and the
// request mounts again. While it is there, it must be a mount of the
// volume's disk's device (proven, see confirmDevice); a raw block volume's
// stage, which mounts nothing, is answered only while that device proves
// to be on this node.
func (n *Node) Confirm(ctx context.Context, req ops.Request, v *store.Volume) (*ops.Correction, error) {
	var path string
	kind := mounter.FilesystemMount
	if v.Capability.AccessType == "block" {
		kind = mounter.DeviceBind
	}
	switch a := req.Args.(type) {
	case *ops.NodeStageArgs:
		if kind == mounter.DeviceBind {
			return nil, n.confirmDevice(ctx, v, "", kind) // a raw block volume's staging path is no mount
		}
		path = a.StagingPath
	case *ops.NodePublishArgs:
		path = a.TargetPath
	default:
		return nil, nil
	}
	if ok, err := n.Mounter.IsMounted(ctx, path); err != nil {
		return nil, err
	} else if ok {
		return nil, n.confirmDevice(ctx, v, path, kind)
	}
	var lookErr error
	nv, guard, why := ops.ForgetUnmounted(v, func(p string) bool {
		ok, err := n.Mounter.IsMounted(ctx, p)
		lookErr = cmp.Or(lookErr, err)
		return ok
	})
	if lookErr != nil {
		return nil, lookErr
	}
	if nv == nil {
		return nil, nil
	}
	return &ops.Correction{Volume: nv, Event: fsm.Rollback, Guard: guard, Why: why}, nil
}

// confirmDevice confirms that the volume's disk's device proves to be on
// this node, carrying its id, and that the mount at path (when path is not
// "") is of it, as kind. A disk detached behind the node's back, or a path
// mounted from another device (a disk detached while its device node was
// bound, the device given to another; a mount swapped by hand), is an
// error naming it, never "done"; nothing is changed (`csid check` reports
// the mount).
func (n *Node) confirmDevice(ctx context.Context, v *store.Volume, path string, kind mounter.MountKind) error {
	dev, err := n.open(ctx, *v, nil, cloud.OpenOptions{Hint: hint(*v)})
	if err != nil {
		return fmt.Errorf("volume %s is recorded staged on this node: %w", v.ID, err)
	}
	defer dev.Close()
	if path == "" {
		return nil
	}
	if ok, err := n.mountOf(ctx, dev, path, kind); err != nil {
		return err
	} else if !ok {
		return ops.Errorf(ops.Conflict, "%s, recorded as a mount of volume %s, is not a mount of its disk %s (%s); `csid check` reports it", path, v.ID, dev.Disk.ID, dev.Path)
	}
	return nil
}
