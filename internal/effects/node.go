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

// checkpointMade is the checkpoint of a node op that names what its mount
// makes (a mounter.Made, as JSON), written before anything is made.
const checkpointMade = "made"

// record says what the op's mount of source at target will make there
// (mounter.Plan), and records it durably before anything is made
// (recordMade). A target csid may not mount on (another mount, content, a
// symbolic link) is refused here, and nothing is recorded or made.
func (n *Node) record(ctx context.Context, x *ops.Exec, kind mounter.MountKind, source, target string) error {
	if _, ok := x.Checkpointed(checkpointMade); ok {
		return nil
	}
	made, err := n.Mounter.Plan(ctx, kind, source, target)
	if err != nil {
		return err
	}
	return recordMade(x, made)
}

// recordMade records durably what the op's mount will make: one
// checkpoint, so that a failed op undoes exactly that (undo), also after a
// restart. A resumed op keeps what its first run recorded; a mount that
// makes nothing records nothing.
func recordMade(x *ops.Exec, made mounter.Made) error {
	if _, ok := x.Checkpointed(checkpointMade); ok || made.Nothing() {
		return nil
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
// offline expansion). A block volume's staging only finds its device. The
// device is the volume's disk, proven when it is opened and held open
// until the stage is done (see device.go); a raw block volume's is opened
// exclusively: no filesystem of it may be mounted.
func (e stageExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodeStageArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	block := a.Capability.AccessType == "block"
	dev, err := e.n.open(ctx, x.Volume, a.PublishContext, cloud.OpenOptions{Exclusive: block})
	if err != nil {
		return ops.Result{}, err
	}
	defer dev.Close()
	crash.Point(crash.NodeAfterLosetup)
	size, err := e.n.Mounter.DeviceSize(ctx, dev.Path)
	if err != nil {
		return ops.Result{}, err
	}
	if !block {
		if err := e.n.notBound(ctx, x.Op.VolumeID, dev); err != nil {
			return ops.Result{}, err
		}
		if err := e.n.mountFilesystem(ctx, x, a, dev.Path); err != nil {
			return ops.Result{}, err
		}
	}
	return ops.Result{Device: dev.Path, CapacityBytes: size}, nil
}

// mountFilesystem formats the device if it is blank, mounts it at the
// staging path, and grows its filesystem to it unless it has just made that
// filesystem (which fills the device).
func (n *Node) mountFilesystem(ctx context.Context, x *ops.Exec, a *ops.NodeStageArgs, dev string) error {
	fsType := a.Capability.FsType
	if fsType == "" {
		fsType = DefaultFsType
	}
	m := n.Mounter
	// The mounter logs a format through the context's logger: only its own
	// probe knows the device is blank. It hands what its mount will make
	// to recordMade before it makes it, while it probes and formats the
	// device.
	record := func(made mounter.Made) error { return recordMade(x, made) }
	formatted, err := m.FormatAndMount(x.Log.WithContext(ctx), dev, a.StagingPath, fsType, a.Capability.MountFlags, record)
	if err != nil {
		return fmt.Errorf("stage %s at %s: %w", dev, a.StagingPath, err)
	}
	crash.Point(crash.MounterAfterMount)
	if formatted {
		// A filesystem this call made fills its device. A stage resumed
		// after a crash here finds the mount and no format, and looks.
		return nil
	}
	if grown, err := m.GrowFilesystem(ctx, dev, a.StagingPath); err != nil {
		return fmt.Errorf("grow the filesystem of %s: %w", dev, err)
	} else if grown {
		x.Log.Info().Str("device", dev).Msg("grew the filesystem to the device")
	}
	return nil
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
// (a raw block volume) at the target path, read-only if asked. Either way
// the volume's disk is proven first and held open until the bind is made:
// a raw block volume's device is opened exclusively (no filesystem of it
// can be mounted, and the backend cannot release it, meanwhile), and a
// filesystem volume's staging mount must be of the disk's device.
func (e nodePublishExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.NodePublishArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	m := e.n.Mounter
	if a.Capability.AccessType == "block" {
		dev, err := e.n.open(ctx, x.Volume, nil, cloud.OpenOptions{Hint: hint(x.Volume), Exclusive: true})
		if err != nil {
			return ops.Result{}, err
		}
		defer dev.Close()
		if err := e.n.record(ctx, x, mounter.DeviceBind, dev.Path, a.TargetPath); err != nil {
			return ops.Result{}, err
		}
		return ops.Result{Device: dev.Path}, m.BindMountDevice(ctx, dev.Path, a.TargetPath, a.ReadOnly)
	}
	dev, err := e.n.stagedFrom(ctx, x.Volume, a.StagingPath)
	if err != nil {
		return ops.Result{}, err
	}
	defer dev.Close()
	if err := e.n.record(ctx, x, mounter.DirBind, a.StagingPath, a.TargetPath); err != nil {
		return ops.Result{}, err
	}
	return ops.Result{Device: dev.Path}, m.BindMount(ctx, a.StagingPath, a.TargetPath, a.ReadOnly)
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
// The device is the volume's disk, proven and held open while it grows;
// the growth checks that the staging path is a mount of it.
func (e nodeExpandExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	st := x.Volume.Stage
	if st == nil {
		return ops.Result{}, ops.Errorf(ops.Conflict, "volume %s is not staged on this node", x.Op.VolumeID)
	}
	dev, err := e.n.open(ctx, x.Volume, nil, cloud.OpenOptions{Hint: st.Device})
	if err != nil {
		return ops.Result{}, err
	}
	defer dev.Close()
	if _, err := e.n.Mounter.GrowFilesystem(ctx, dev.Path, st.Path); err != nil {
		return ops.Result{}, fmt.Errorf("grow the filesystem of %s: %w", dev.Path, err)
	}
	size, err := e.n.Mounter.DeviceSize(ctx, dev.Path)
	if err != nil {
		return ops.Result{}, err
	}
	return ops.Result{CapacityBytes: size}, nil
}

func (nodeExpandExec) Compensate(context.Context, *ops.Exec) error { return nil }

// Adopt is the node's ops.Adopter: the first time a node is asked to stage
// a volume it has no record of (a node process keeps its own records), it
// finds the disk the publish context names attached to this node and starts
// a record for it in NODE_READY. A disk not attached here is NotFound; a
// disk that does not carry the volume's id (an id no controller issued, or
// another volume's publish context) is refused: no record is started, and
// nothing is mounted.
func (n *Node) Adopt(ctx context.Context, volumeID string, a *ops.NodeStageArgs) (*store.Volume, error) {
	v, err := n.adopt(ctx, volumeID, a)
	return v, kindOf(err)
}

func (n *Node) adopt(ctx context.Context, volumeID string, a *ops.NodeStageArgs) (*store.Volume, error) {
	diskID := a.PublishContext[PublishContextDiskID]
	if diskID == "" {
		return nil, ops.Errorf(ops.NotFound, "volume %s is unknown to this node and the publish context names no disk (%s)", volumeID, PublishContextDiskID)
	}
	dev, err := n.Host.OpenDevice(ctx, diskID, cloud.OpenOptions{})
	if errors.Is(err, cloud.ErrNotFound) {
		return nil, ops.Errorf(ops.NotFound, "volume %s (disk %s) is not attached to node %s", volumeID, diskID, n.Host.NodeID())
	} else if err != nil {
		return nil, err
	}
	defer dev.Close()
	if err := carries(dev.Disk, volumeID); err != nil {
		return nil, err
	}
	size, err := n.Mounter.DeviceSize(ctx, dev.Path)
	if err != nil {
		return nil, err
	}
	return &store.Volume{ID: volumeID, DiskID: diskID, CapacityBytes: size, Capability: a.Capability,
		Attachment: &store.Attachment{Node: n.Host.NodeID(), PublishContext: a.PublishContext}}, nil
}
