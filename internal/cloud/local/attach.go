package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/loopdev"
)

// RegisterNode records a node of this machine with its attach limit (0: no
// limit); see cloud.Registrar.
func (c *Cloud) RegisterNode(ctx context.Context, node cloud.Node) error {
	if err := checkNodeID(node.ID); err != nil {
		return err
	}
	if node.MaxAttachments < 0 {
		return fmt.Errorf("node %s: negative attach limit: %w", node.ID, cloud.ErrInvalid)
	}
	zone, err := c.checkZone(node.Zone)
	if err != nil {
		return err
	}
	node.Zone = zone
	return c.locked(ctx, func() error {
		nodes, err := c.s.readNodes()
		if err != nil {
			return ioFailure("read nodes", err)
		}
		if old, ok := nodes[node.ID]; ok && old == node {
			return nil
		}
		nodes[node.ID] = node
		if err := c.s.writeNodes(nodes); err != nil {
			return ioFailure("write nodes", err)
		}
		return nil
	}, nodesKey)
}

// AttachDisk records the attachment of a disk to a registered node; see
// cloud.Cloud. The node's Host makes the loop device when asked for it.
// The disk's image is made if the disk has none yet (ensureImage), and the
// disk is entered in the node's attachment index, before its record says
// attached; a node with a limit is counted from the index, under the lock
// of its attachments, so two attaches cannot both take its last slot.
func (c *Cloud) AttachDisk(ctx context.Context, diskIDStr, nodeID string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	if err := checkNodeID(nodeID); err != nil {
		return cloud.Operation{}, err
	}
	node, err := c.GetNode(ctx, nodeID)
	if err != nil {
		return cloud.Operation{}, err
	}
	hash := nodeHash(nodeID)
	keys := []string{diskKey(id)}
	if node.MaxAttachments > 0 {
		keys = []string{attachKey(hash), diskKey(id)}
	}
	var op cloud.Operation
	err = c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readExisting(id)
		if err != nil {
			return err
		}
		switch d.AttachedTo {
		case nodeID:
			op, err = c.record(cloud.OpAttach, id, nodeID, started, &d, nil)
			return err
		case "":
		default:
			return fmt.Errorf("disk %s is attached to %s: %w", id, d.AttachedTo, cloud.ErrAttached)
		}
		if node.MaxAttachments > 0 {
			if err := c.checkRoom(node, hash); err != nil {
				return err
			}
		}
		if err := c.s.ensureImage(d); err != nil {
			return c.recordedFailure(&op, cloud.OpAttach, id, nodeID, started, ioFailure("make the disk's image", err))
		}
		if err := c.s.indexAttachment(hash, id); err != nil {
			return c.recordedFailure(&op, cloud.OpAttach, id, nodeID, started, ioFailure("index the attachment", err))
		}
		c.s.hit(crash.LocalAttachIndexed)
		d.AttachedTo = nodeID
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpAttach, id, nodeID, started, ioFailure("write disk record", err))
		}
		c.s.hit(crash.LocalAttachRecorded)
		op, err = c.record(cloud.OpAttach, id, nodeID, started, &d, nil)
		return err
	}, keys...)
	return op, err
}

// checkRoom fails with ErrLimitReached when the node holds as many disks
// as its limit. The index may hold stale entries (a crash between an entry
// and its record): at the limit, they are checked against the records and
// removed before the count is believed. The caller holds the lock of the
// node's attachments.
func (c *Cloud) checkRoom(node cloud.Node, hash string) error {
	ids, err := c.s.attachments(hash)
	if err != nil {
		return ioFailure("read the attachment index", err)
	}
	if len(ids) < node.MaxAttachments {
		return nil
	}
	n := 0
	for _, id := range ids {
		stale, err := c.s.notAttachedTo(id, hash)
		if err != nil {
			return ioFailure("read disk", err)
		}
		if !stale {
			n++
			continue
		}
		if err := c.s.unindexAttachment(hash, id); err != nil {
			return ioFailure("remove a stale attachment entry", err)
		}
	}
	if n >= node.MaxAttachments {
		return fmt.Errorf("node %s holds %d disks, its limit: %w", node.ID, n, cloud.ErrLimitReached)
	}
	return nil
}

// DetachDisk detaches a disk from a node; see cloud.Cloud. The loop device
// of the disk on this machine is released first, as a cloud takes a disk
// away from its instance; a device still in use (mounted) makes the call
// fail with ErrTransient and the disk stays attached: unmount it and retry.
// The attachment entry goes after the record says detached.
func (c *Cloud) DetachDisk(ctx context.Context, diskIDStr, nodeID string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			op, err = c.record(cloud.OpDetach, id, nodeID, started, nil, nil)
			return err
		}
		if err != nil {
			return ioFailure("read disk", err)
		}
		if d.AttachedTo != nodeID {
			op, err = c.record(cloud.OpDetach, id, nodeID, started, &d, nil)
			return err
		}
		if err := c.releaseDevices(ctx, id); err != nil {
			if errors.Is(err, loopdev.ErrBusy) {
				return fmt.Errorf("disk %s is still in use on node %s (unmount it first): %v: %w", id, nodeID, err, cloud.ErrTransient)
			}
			return err
		}
		c.s.hit(crash.LocalDetachReleased)
		d.AttachedTo = ""
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpDetach, id, nodeID, started, ioFailure("write disk record", err))
		}
		c.s.hit(crash.LocalDetachRecorded)
		// A stale entry is harmless (see checkRoom).
		_ = c.s.unindexAttachment(nodeHash(nodeID), id)
		op, err = c.record(cloud.OpDetach, id, nodeID, started, &d, nil)
		return err
	}, diskKey(id))
	return op, err
}
