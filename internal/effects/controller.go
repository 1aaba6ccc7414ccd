// Package effects is what each lifecycle event does to the cloud and to the
// host: the executors the operation engine runs. Every executor is
// idempotent (a second run after a crash at any point converges and never
// repeats a destructive step) and records the id of a cloud operation before
// waiting on it, so that a resumed op waits on the same operation instead of
// starting another.
package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// PublishContextDiskID is the publish_context key that tells the node which
// disk to find (CSI passes publish_context to NodeStageVolume).
const PublishContextDiskID = "csid.dev/disk-id"

// Tags csid stores with each disk, so that its records can be rebuilt from
// the cloud (a controller whose state file was lost). TagDriver names the
// CSI driver (csid serve --driver-name) that made the disk, so that csids
// of several driver names can share a cloud; disks made before the tag
// existed have none.
const (
	TagVolumeID   = "csid.dev/volume-id"
	TagName       = "csid.dev/name"
	TagCapability = "csid.dev/capability"
	TagParameters = "csid.dev/parameters"
	TagDriver     = "csid.dev/driver"
	// TagResizeTo holds the target size (bytes, decimal) of a resize
	// queued for the disk's detach; it is cleared once the disk is grown.
	TagResizeTo = "csid.dev/resize-to"
)

// Made reports whether csid's driver named driver made disk d: it has
// csid's volume-id tag, and a driver tag naming driver or none (a disk made
// before the tag existed).
func Made(d cloud.Disk, driver string) bool {
	owner, tagged := d.Tags[TagDriver]
	return d.Tags[TagVolumeID] != "" && (!tagged || owner == driver)
}

// checkpoint key of the cloud operation an executor waits on.
const cpCloudOp = "cloud-op"

// Controller runs the controller's events against a cloud.
type Controller struct {
	Cloud cloud.Cloud
	// DriverName is written in TagDriver of the disks it creates.
	DriverName string
}

// Executors returns the controller's executors by event: the snapshot
// events' too when the cloud takes snapshots (cloud.Snapshotter).
func (c *Controller) Executors() map[fsm.Event]ops.Executor {
	execs := map[fsm.Event]ops.Executor{
		fsm.Create:              createExec{c.Cloud, c.DriverName},
		fsm.Delete:              deleteExec{c.Cloud},
		fsm.ControllerPublish:   publishExec{c.Cloud},
		fsm.ControllerUnpublish: unpublishExec{c.Cloud},
		fsm.Expand:              expandExec{c.Cloud},
	}
	if sn, ok := c.Cloud.(cloud.Snapshotter); ok {
		execs[fsm.SnapshotCreate] = snapshotCreateExec{c: c.Cloud, sn: sn, driver: c.DriverName}
		execs[fsm.SnapshotDelete] = snapshotDeleteExec{c: c.Cloud, sn: sn}
	}
	return kinded(execs)
}

// Snapshots reports whether the controller takes snapshots and creates
// volumes from sources: its cloud implements cloud.Snapshotter.
func (c *Controller) Snapshots() bool {
	_, ok := c.Cloud.(cloud.Snapshotter)
	return ok
}

// startOrResume waits on the cloud operation the op recorded, or starts one
// with start, records its id, and waits on it. A recorded operation the
// cloud has forgotten is started again (every start is idempotent). An
// operation the cloud reports already done is not recorded: that would cost
// a commit for nothing, since after a crash the repeated call finds its work
// done (the local backend's operations always are). A snapshot's operation
// is recorded with the snapshot it makes or deletes (cpCloudSnapshot), in
// one commit.
func startOrResume(ctx context.Context, x *ops.Exec, c cloud.Cloud, start func() (cloud.Operation, error)) (cloud.Disk, error) {
	if id, ok := x.Checkpointed(cpCloudOp); ok {
		d, err := c.WaitOperation(ctx, id)
		if !errors.Is(err, cloud.ErrNotFound) || id == "" {
			return d, err
		}
		x.Log.Info().Str("cloud_op", id).Msg("the cloud forgot the recorded operation; starting it again")
	}
	op, err := start()
	if err != nil {
		return cloud.Disk{}, err
	}
	if !op.Done {
		cp := map[string]string{cpCloudOp: op.ID}
		if op.SnapshotID != "" {
			cp[cpCloudSnapshot] = op.SnapshotID
		}
		if err := x.CheckpointAll(cp); err != nil {
			return cloud.Disk{}, err
		}
	}
	return c.WaitOperation(ctx, op.ID)
}

type createExec struct {
	c      cloud.Cloud
	driver string
}

func (e createExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.CreateArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	zone, err := pickZone(e.c, a.Zones)
	if err != nil {
		return ops.Result{}, err
	}
	spec, err := diskSpec(x.Op.VolumeID, zone, e.driver, a, x.Volume.Source)
	if err != nil {
		return ops.Result{}, err
	}
	d, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.CreateDisk(ctx, spec) })
	if err != nil {
		return ops.Result{}, err
	}
	crash.Point(crash.CloudAfterCreate)
	return ops.Result{DiskID: d.ID, CapacityBytes: d.SizeBytes, Zone: d.Zone}, nil
}

// Compensate deletes the disk a failed create may have made. It finds it by
// its recorded operation or, failing that, by name.
func (e createExec) Compensate(ctx context.Context, x *ops.Exec) error {
	var diskID string
	if id, ok := x.Checkpointed(cpCloudOp); ok {
		d, err := e.c.WaitOperation(ctx, id)
		switch {
		case err == nil:
			diskID = d.ID
		case !errors.Is(err, cloud.ErrNotFound) && !isPermanent(err):
			return err
		}
	}
	if diskID == "" {
		d, err := findByName(ctx, e.c, x.Op.VolumeID)
		if err != nil || d == nil {
			return err
		}
		diskID = d.ID
	}
	op, err := e.c.DeleteDisk(ctx, diskID)
	if err != nil {
		return err
	}
	_, err = e.c.WaitOperation(ctx, op.ID)
	return err
}

// isPermanent reports whether a cloud error says the operation ended without
// effect for good (as opposed to "try again").
func isPermanent(err error) bool {
	return !errors.Is(err, cloud.ErrTransient) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// findByName pages through the disks for the one named name (rare: only a
// compensation that lost its operation id).
func findByName(ctx context.Context, c cloud.Cloud, name string) (*cloud.Disk, error) {
	token := ""
	for {
		page, err := c.ListDisks(ctx, cloud.ListOptions{PageToken: token, MaxResults: 500})
		if err != nil {
			return nil, err
		}
		for i := range page.Disks {
			if page.Disks[i].Name == name {
				return &page.Disks[i], nil
			}
		}
		if page.NextToken == "" {
			return nil, nil
		}
		token = page.NextToken
	}
}

func pickZone(c cloud.Cloud, wanted []string) (string, error) {
	if len(wanted) == 0 {
		return "", nil
	}
	have := c.Zones()
	for _, z := range wanted {
		if slices.Contains(have, z) {
			return z, nil
		}
	}
	return "", ops.Errorf(ops.Exhausted, "cannot create a disk in any of the requested zones %v; this backend has %v", wanted, have)
}

// diskSpec is the disk of a create: named by the volume id, tagged with
// what a rebuild of the record needs, copied from src when set.
func diskSpec(volumeID, zone, driver string, a *ops.CreateArgs, src *store.Source) (cloud.DiskSpec, error) {
	capJSON, err := json.Marshal(a.Capability)
	if err != nil {
		return cloud.DiskSpec{}, err
	}
	params, err := json.Marshal(a.Parameters)
	if err != nil {
		return cloud.DiskSpec{}, err
	}
	tags := map[string]string{TagVolumeID: volumeID, TagName: a.Name, TagCapability: string(capJSON), TagParameters: string(params)}
	if driver != "" {
		tags[TagDriver] = driver
	}
	if src != nil {
		tags[TagSource] = SourceTag(src)
	}
	return cloud.DiskSpec{Name: volumeID, SizeBytes: a.SizeBytes, Zone: zone, Tags: tags, Source: diskSource(src),
		Type: a.Parameters[ops.ParamDiskType]}, nil
}

type deleteExec struct{ c cloud.Cloud }

func (e deleteExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	if x.Volume.DiskID == "" {
		return ops.Result{}, nil
	}
	_, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.DeleteDisk(ctx, x.Volume.DiskID) })
	if errors.Is(err, cloud.ErrAttached) {
		return ops.Result{}, ops.Errorf(ops.Conflict,
			"disk %s of volume %s is still attached in the cloud; unpublish it first", x.Volume.DiskID, x.Op.VolumeID)
	}
	return ops.Result{}, err
}

func (deleteExec) Compensate(context.Context, *ops.Exec) error { return nil }

type publishExec struct{ c cloud.Cloud }

func (e publishExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.ControllerPublishArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	if _, err := e.c.GetNode(ctx, a.Node); errors.Is(err, cloud.ErrNotFound) || errors.Is(err, cloud.ErrInvalid) {
		// A node id the backend cannot even hold names no node it has.
		return ops.Result{}, ops.Errorf(ops.NotFound, "node %s does not exist", a.Node)
	} else if err != nil {
		return ops.Result{}, err
	}
	_, err = startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.AttachDisk(ctx, x.Volume.DiskID, a.Node) })
	// kindOf makes these Conflict and Exhausted.
	switch {
	case errors.Is(err, cloud.ErrAttached):
		return ops.Result{}, fmt.Errorf("disk %s of volume %s is attached to another node: %w", x.Volume.DiskID, x.Op.VolumeID, err)
	case errors.Is(err, cloud.ErrLimitReached):
		return ops.Result{}, fmt.Errorf("node %s cannot take another disk: %w", a.Node, err)
	case err != nil:
		return ops.Result{}, err
	}
	crash.Point(crash.CloudAfterAttach)
	return ops.Result{PublishContext: map[string]string{PublishContextDiskID: x.Volume.DiskID}}, nil
}

// Compensate detaches what a failed or cancelled publish may have attached,
// after the attach it started (if any) has finished.
func (e publishExec) Compensate(ctx context.Context, x *ops.Exec) error {
	a, err := ops.DecodeArgs[ops.ControllerPublishArgs](x.Op)
	if err != nil {
		return err
	}
	if id, ok := x.Checkpointed(cpCloudOp); ok {
		if _, err := e.c.WaitOperation(ctx, id); err != nil && !isPermanent(err) && !errors.Is(err, cloud.ErrNotFound) {
			return err
		}
	}
	return detach(ctx, e.c, x.Volume.DiskID, a.Node)
}

func detach(ctx context.Context, c cloud.Cloud, diskID, node string) error {
	op, err := c.DetachDisk(ctx, diskID, node)
	if err != nil {
		return err
	}
	_, err = c.WaitOperation(ctx, op.ID)
	return err
}

type unpublishExec struct{ c cloud.Cloud }

func (e unpublishExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	node := x.Volume.Node()
	if a, err := ops.DecodeArgs[ops.ControllerUnpublishArgs](x.Op); err == nil && a.Node != "" {
		node = a.Node
	}
	_, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.DetachDisk(ctx, x.Volume.DiskID, node) })
	if err != nil {
		return ops.Result{}, err
	}
	crash.Point(crash.UnpublishAfterDetach)
	return ops.Result{}, nil
}

func (unpublishExec) Compensate(context.Context, *ops.Exec) error { return nil }

type expandExec struct{ c cloud.Cloud }

// Execute grows the disk, then clears the disk's resize-to tag if the size
// reached covers it. It answers only once the cloud reports the new size:
// after that, a failure cannot be reported any more. An expand [deferred]
// (a resize queued for the detach) grows nothing: it records the target in
// the disk's resize-to tag, where a rebuild of the records finds it.
func (e expandExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	a, err := ops.DecodeArgs[ops.ExpandArgs](x.Op)
	if err != nil {
		return ops.Result{}, err
	}
	if x.Op.Guard == fsm.Deferred {
		_, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) {
			return e.c.UpdateDiskTags(ctx, x.Volume.DiskID, map[string]string{TagResizeTo: strconv.FormatInt(a.RequiredBytes, 10)})
		})
		return ops.Result{}, err
	}
	d, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.ResizeDisk(ctx, x.Volume.DiskID, a.RequiredBytes) })
	switch {
	case errors.Is(err, cloud.ErrAttached):
		// csid holds the volume detached; the cloud disagrees (a detach
		// still finishing). Worth another try.
		return ops.Result{}, ops.Mark(fmt.Errorf("disk %s is still attached in the cloud: %w", x.Volume.DiskID, err), ops.Transient)
	case err != nil:
		return ops.Result{}, err
	}
	crash.Point(crash.ResizeAfterCloudResize)
	if d.SizeBytes < a.RequiredBytes {
		return ops.Result{}, fmt.Errorf("the cloud reports disk %s at %d bytes after a resize to %d", d.ID, d.SizeBytes, a.RequiredBytes)
	}
	if ResizeTagReached(d) {
		// Not checkpointed: clearing a tag again is harmless.
		op, err := e.c.UpdateDiskTags(ctx, d.ID, map[string]string{TagResizeTo: ""})
		if err == nil {
			_, err = e.c.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			return ops.Result{}, fmt.Errorf("clear the resize-to tag of disk %s, grown to %d bytes: %w", d.ID, d.SizeBytes, err)
		}
	}
	return ops.Result{CapacityBytes: d.SizeBytes}, nil
}

func (expandExec) Compensate(context.Context, *ops.Exec) error { return nil }

// ResizeTagReached reports whether disk d has a resize-to tag that its size
// covers (or one that does not parse, which nothing can act on).
func ResizeTagReached(d cloud.Disk) bool {
	_, ok := d.Tags[TagResizeTo]
	return ok && ResizeTag(d) == 0
}

// ResizeTag returns the target of the resize queued on disk d by its tag,
// or 0 when none is (or the tag does not parse).
func ResizeTag(d cloud.Disk) int64 {
	n, err := strconv.ParseInt(d.Tags[TagResizeTo], 10, 64)
	if err != nil || n <= d.SizeBytes {
		return 0
	}
	return n
}
