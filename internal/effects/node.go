package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// DefaultFsType is the filesystem of a mount volume whose capability names
// none.
const DefaultFsType = "ext4"

// Node runs a node's events: it finds the disk's device through the host,
// and formats, mounts and grows through the mounter.
type Node struct {
	Host    cloud.Host
	Mounter mounter.Mounter
}

// Executors returns the node's executors by event.
func (n *Node) Executors() map[fsm.Event]ops.Executor {
	return kinded(map[fsm.Event]ops.Executor{
		fsm.NodeStage:     stageExec{n},
		fsm.NodeUnstage:   unstageExec{n},
		fsm.NodePublish:   nodePublishExec{n},
		fsm.NodeUnpublish: nodeUnpublishExec{n},
		fsm.NodeExpand:    nodeExpandExec{n},
	})
}

// diskOf is the disk a node op works on: the volume's, or (for a volume a
// node adopted) the one the publish context names.
func diskOf(v store.Volume, publishContext map[string]string) (string, error) {
	if v.DiskID != "" {
		return v.DiskID, nil
	}
	if id := publishContext[PublishContextDiskID]; id != "" {
		return id, nil
	}
	return "", ops.Errorf(ops.Conflict, "volume %s: no disk recorded and no %s in the publish context", v.ID, PublishContextDiskID)
}

// device finds the block device of the volume's disk on this node.
func (n *Node) device(ctx context.Context, v store.Volume, publishContext map[string]string) (string, error) {
	diskID, err := diskOf(v, publishContext)
	if err != nil {
		return "", err
	}
	dev, err := n.Host.DevicePath(ctx, diskID)
	if errors.Is(err, cloud.ErrNotFound) {
		return "", ops.Errorf(ops.Conflict, "disk %s of volume %s is not attached to node %s", diskID, v.ID, n.Host.NodeID())
	}
	return dev, err
}

// checkpointMade is the checkpoint of a node op that names what its mount
// makes (a mounter.Made, as JSON), written before anything is made.
const checkpointMade = "made"

// record says what the op's mount of source at target will make there
// (mounter.Plan), and records it durably before anything is made: one
// checkpoint, so that a failed op undoes exactly that (undo), also after a
// restart. A resumed op reads back what its first run recorded. A target
// csid may not mount on (another mount, content, a symbolic link) is
// refused here, and nothing is recorded or made.
func (n *Node) record(ctx context.Context, x *ops.Exec, kind mounter.MountKind, source, target string) error {
	if _, ok := x.Checkpointed(checkpointMade); ok {
		return nil
	}
	made, err := n.Mounter.Plan(ctx, kind, source, target)
	if err != nil || made.Nothing() {
		return err
	}
	raw, err := json.Marshal(made)
	if err != nil {
		return err
	}
	return x.Checkpoint(checkpointMade, string(raw))
}

// undo removes what the op recorded it would make at target, and nothing
// else: an op that recorded nothing made nothing.
func (n *Node) undo(ctx context.Context, x *ops.Exec, target string) error {
	raw, ok := x.Checkpointed(checkpointMade)
	if !ok {
		return nil
	}
	var made mounter.Made
	if err := json.Unmarshal([]byte(raw), &made); err != nil {
		return fmt.Errorf("op %d: checkpoint %s: %w", x.Op.Seq, checkpointMade, err)
	}
	return n.Mounter.Undo(ctx, target, made)
}

type stageExec struct{ n *Node }

// Execute stages a volume: a mount volume's device is formatted if (and only
// if) a successful probe finds it blank, mounted at the staging path, and
// its filesystem grown to the device when the device is larger (after an
// offline expansion). A block volume's staging only finds its device.
func (e stageExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodeStageArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	dev, err := e.n.device(ctx, x.Volume, a.PublishContext)
	if err != nil {
		return ops.Result{}, err
	}
	crash.Point(crash.NodeAfterLosetup)
	size, err := e.n.Mounter.DeviceSize(ctx, dev)
	if err != nil {
		return ops.Result{}, err
	}
	if a.Capability.AccessType == "block" {
		return ops.Result{Device: dev, CapacityBytes: size}, nil
	}
	fsType := a.Capability.FsType
	if fsType == "" {
		fsType = DefaultFsType
	}
	m := e.n.Mounter
	if err := e.n.record(ctx, x, mounter.FilesystemMount, dev, a.StagingPath); err != nil {
		return ops.Result{}, fmt.Errorf("stage %s at %s: %w", dev, a.StagingPath, err)
	}
	// The mounter logs a format through the context's logger: only its own
	// probe knows the device is blank.
	if err := m.FormatAndMount(x.Log.WithContext(ctx), dev, a.StagingPath, fsType, a.Capability.MountFlags); err != nil {
		return ops.Result{}, fmt.Errorf("stage %s at %s: %w", dev, a.StagingPath, err)
	}
	crash.Point(crash.MounterAfterMount)
	if grown, err := m.GrowFilesystem(ctx, dev, a.StagingPath); err != nil {
		return ops.Result{}, fmt.Errorf("grow the filesystem of %s: %w", dev, err)
	} else if grown {
		x.Log.Info().Str("device", dev).Msg("grew the filesystem to the device")
	}
	return ops.Result{Device: dev, CapacityBytes: size}, nil
}

// Compensate undoes what a failed stage recorded it made at the staging
// path (its mount, and the directory if it created it), nothing else. It
// never undoes a format: data, once written, is the user's.
func (e stageExec) Compensate(ctx context.Context, x *ops.Exec) error {
	a, err := ops.DecodeArgs[ops.NodeStageArgs](x.Op)
	if err != nil {
		return err
	}
	return e.n.undo(ctx, x, a.StagingPath)
}

type unstageExec struct{ n *Node }

func (e unstageExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodeUnstageArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	if x.Volume.Capability.AccessType == "block" {
		// A raw block volume's staging path is kubelet's directory, never
		// csid's mount: nothing to undo there.
		return ops.Result{}, nil
	}
	return ops.Result{}, e.n.Mounter.Unmount(ctx, a.StagingPath)
}

func (unstageExec) Compensate(context.Context, *ops.Exec) error { return nil }

type nodePublishExec struct{ n *Node }

// Execute bind-mounts the staging mount (a filesystem volume) or the device
// (a raw block volume) at the target path, read-only if asked.
func (e nodePublishExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodePublishArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	m := e.n.Mounter
	if a.Capability.AccessType == "block" {
		dev, err := e.n.publishDevice(ctx, x.Volume)
		if err != nil {
			return ops.Result{}, err
		}
		if err := e.n.record(ctx, x, mounter.DeviceBind, dev, a.TargetPath); err != nil {
			return ops.Result{}, err
		}
		return ops.Result{}, m.BindMountDevice(ctx, dev, a.TargetPath, a.ReadOnly)
	}
	if ok, err := m.IsMounted(ctx, a.StagingPath); err != nil {
		return ops.Result{}, err
	} else if !ok {
		return ops.Result{}, ops.Errorf(ops.Conflict, "volume %s is not mounted at its staging path %s", x.Op.VolumeID, a.StagingPath)
	}
	if err := e.n.record(ctx, x, mounter.DirBind, a.StagingPath, a.TargetPath); err != nil {
		return ops.Result{}, err
	}
	return ops.Result{}, m.BindMount(ctx, a.StagingPath, a.TargetPath, a.ReadOnly)
}

// publishDevice is the device a raw block volume's publish binds: the one
// its stage found, or the disk's device on this node.
func (n *Node) publishDevice(ctx context.Context, v store.Volume) (string, error) {
	if v.Stage != nil && v.Stage.Device != "" {
		return v.Stage.Device, nil
	}
	return n.device(ctx, v, nil)
}

// Compensate undoes what a failed publish recorded it made at the target
// (its mount, and the directory or file if it created it), nothing else.
func (e nodePublishExec) Compensate(ctx context.Context, x *ops.Exec) error {
	a, err := ops.DecodeArgs[ops.NodePublishArgs](x.Op)
	if err != nil {
		return err
	}
	return e.n.undo(ctx, x, a.TargetPath)
}

type nodeUnpublishExec struct{ n *Node }

// Execute unmounts the target and removes it (the CSI spec makes the plugin
// remove what it created at the target path).
func (e nodeUnpublishExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodeUnpublishArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	return ops.Result{}, e.n.Mounter.Unmount(ctx, a.TargetPath)
}

func (nodeUnpublishExec) Compensate(context.Context, *ops.Exec) error { return nil }

type nodeExpandExec struct{ n *Node }

// Execute grows the staged filesystem to its device and reports the size.
func (e nodeExpandExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	st := x.Volume.Stage
	if st == nil {
		return ops.Result{}, ops.Errorf(ops.Conflict, "volume %s is not staged on this node", x.Op.VolumeID)
	}
	dev := st.Device
	if dev == "" {
		var err error
		if dev, err = e.n.Mounter.DeviceOf(ctx, st.Path); err != nil {
			return ops.Result{}, err
		}
	}
	if _, err := e.n.Mounter.GrowFilesystem(ctx, dev, st.Path); err != nil {
		return ops.Result{}, fmt.Errorf("grow the filesystem of %s: %w", dev, err)
	}
	size, err := e.n.Mounter.DeviceSize(ctx, dev)
	if err != nil {
		return ops.Result{}, err
	}
	return ops.Result{CapacityBytes: size}, nil
}

func (nodeExpandExec) Compensate(context.Context, *ops.Exec) error { return nil }

// Adopt is the node's ops.Adopter: the first time a node is asked to stage
// a volume it has no record of (a node process keeps its own records), it
// finds the disk the publish context names attached to this node and starts
// a record for it in NODE_READY. A disk not attached here is NotFound.
func (n *Node) Adopt(ctx context.Context, volumeID string, a *ops.NodeStageArgs) (*store.Volume, error) {
	v, err := n.adopt(ctx, volumeID, a)
	return v, kindOf(err)
}

func (n *Node) adopt(ctx context.Context, volumeID string, a *ops.NodeStageArgs) (*store.Volume, error) {
	diskID := a.PublishContext[PublishContextDiskID]
	if diskID == "" {
		return nil, ops.Errorf(ops.NotFound, "volume %s is unknown to this node and the publish context names no disk (%s)", volumeID, PublishContextDiskID)
	}
	dev, err := n.Host.DevicePath(ctx, diskID)
	if errors.Is(err, cloud.ErrNotFound) {
		return nil, ops.Errorf(ops.NotFound, "volume %s (disk %s) is not attached to node %s", volumeID, diskID, n.Host.NodeID())
	} else if err != nil {
		return nil, err
	}
	size, err := n.Mounter.DeviceSize(ctx, dev)
	if err != nil {
		return nil, err
	}
	return &store.Volume{ID: volumeID, DiskID: diskID, CapacityBytes: size, Capability: a.Capability,
		Attachment: &store.Attachment{Node: n.Host.NodeID(), PublishContext: a.PublishContext}}, nil
}
