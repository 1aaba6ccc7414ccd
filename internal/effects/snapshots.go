package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// Tags csid stores with each snapshot it takes, so that its records can be
// rebuilt from the provider (a controller whose state file was lost), and
// with a disk created from a source, so that a rebuilt volume knows it.
// A snapshot also carries TagName, TagParameters and TagDriver.
const (
	// TagSnapshotID is csid's id of the snapshot.
	TagSnapshotID = "csid.dev/snapshot-id"
	// TagSourceVolume is the id of the volume a snapshot was taken of.
	TagSourceVolume = "csid.dev/source-volume-id"
	// TagSource is a disk's content source, "snapshot:<id>" or
	// "volume:<id>" (csid's ids).
	TagSource = "csid.dev/source"
)

// Checkpoint key of the provider's snapshot an executor waits on (with
// cpCloudOp, its operation).
const cpCloudSnapshot = "cloud-snapshot"

// SnapshotMade reports whether csid's driver named driver took snapshot s
// (see Made for disks).
func SnapshotMade(s cloud.Snapshot, driver string) bool {
	owner, tagged := s.Tags[TagDriver]
	return s.Tags[TagSnapshotID] != "" && (!tagged || owner == driver)
}

// SourceTag is the TagSource value of a volume's source ("" for none).
func SourceTag(src *store.Source) string {
	switch {
	case src == nil:
		return ""
	case src.SnapshotID != "":
		return "snapshot:" + src.SnapshotID
	default:
		return "volume:" + src.VolumeID
	}
}

// diskSource is the provider's source of a volume created from src.
func diskSource(src *store.Source) *cloud.DiskSource {
	switch {
	case src == nil:
		return nil
	case src.SnapshotID != "":
		return &cloud.DiskSource{SnapshotID: src.CloudSnapshotID}
	default:
		return &cloud.DiskSource{DiskID: src.DiskID}
	}
}

// startOrResumeSnapshot is startOrResume for a snapshot's operation: it
// returns the provider's id of the snapshot the operation makes or
// deletes, the one recorded with it when resumed.
func startOrResumeSnapshot(ctx context.Context, x *ops.Exec, c cloud.Cloud, start func() (cloud.Operation, error)) (string, error) {
	id, started := "", false
	_, err := startOrResume(ctx, x, c, func() (cloud.Operation, error) {
		op, err := start()
		id, started = op.SnapshotID, true
		return op, err
	})
	if !started {
		id, _ = x.Checkpointed(cpCloudSnapshot)
	}
	return id, err
}

type snapshotCreateExec struct {
	c      cloud.Cloud
	sn     cloud.Snapshotter
	driver string
}

// Execute takes the snapshot, named by csid's snapshot id (the provider's
// idempotency key), and answers once the provider has cut it and says it
// is ready to restore from.
func (e snapshotCreateExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	s := x.Snapshot
	params, err := json.Marshal(s.Parameters)
	if err != nil {
		return ops.Result{}, err
	}
	tags := map[string]string{TagSnapshotID: s.ID, TagName: s.Name, TagSourceVolume: s.SourceVolumeID, TagParameters: string(params)}
	if e.driver != "" {
		tags[TagDriver] = e.driver
	}
	spec := cloud.SnapshotSpec{Name: s.ID, SourceDiskID: s.SourceDiskID, Tags: tags}
	id, err := startOrResumeSnapshot(ctx, x, e.c, func() (cloud.Operation, error) { return e.sn.CreateSnapshot(ctx, spec) })
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		return ops.Result{}, ops.Errorf(ops.NotFound, "volume %s: its disk %s does not exist (any more): %v", s.SourceVolumeID, s.SourceDiskID, err)
	case errors.Is(err, cloud.ErrNotSupported):
		return ops.Result{}, fmt.Errorf("the provider cannot take a consistent snapshot of volume %s now (unpublish it first): %w", s.SourceVolumeID, err)
	case err != nil:
		return ops.Result{}, err
	}
	crash.Point(crash.CloudAfterSnapshot)
	got, err := e.sn.GetSnapshot(ctx, id)
	if err != nil {
		return ops.Result{}, fmt.Errorf("read snapshot %s, just taken: %w", id, err)
	}
	if !got.Ready {
		return ops.Result{}, ops.Mark(fmt.Errorf("the provider's snapshot %s is cut but not ready yet", id), ops.Transient)
	}
	return ops.Result{CloudSnapshotID: got.ID, CapacityBytes: got.SizeBytes, ReadyToUse: got.Ready, CutAt: got.CreatedAt}, nil
}

// Compensate deletes the provider's snapshot a failed snapshot_create may
// have made, after its operation has finished: found by its recorded id
// or, failing that, by name among the source disk's snapshots.
func (e snapshotCreateExec) Compensate(ctx context.Context, x *ops.Exec) error {
	id, _ := x.Checkpointed(cpCloudSnapshot)
	if op, ok := x.Checkpointed(cpCloudOp); ok {
		if _, err := e.c.WaitOperation(ctx, op); err != nil && !isPermanent(err) && !errors.Is(err, cloud.ErrNotFound) {
			return err
		}
	}
	if id == "" {
		s, err := findSnapshotByName(ctx, e.sn, x.Snapshot.SourceDiskID, x.Snapshot.ID)
		if err != nil || s == nil {
			return err
		}
		id = s.ID
	}
	return deleteSnapshot(ctx, e.c, e.sn, id)
}

// findSnapshotByName pages through a disk's snapshots for the one named
// name (rare: only a compensation that lost its operation's record).
func findSnapshotByName(ctx context.Context, sn cloud.Snapshotter, diskID, name string) (*cloud.Snapshot, error) {
	token := ""
	for {
		page, err := sn.ListSnapshots(ctx, cloud.SnapshotListOptions{SourceDiskID: diskID,
			ListOptions: cloud.ListOptions{PageToken: token, MaxResults: 500}})
		if err != nil {
			return nil, err
		}
		for i := range page.Snapshots {
			if page.Snapshots[i].Name == name {
				return &page.Snapshots[i], nil
			}
		}
		if page.NextToken == "" {
			return nil, nil
		}
		token = page.NextToken
	}
}

func deleteSnapshot(ctx context.Context, c cloud.Cloud, sn cloud.Snapshotter, id string) error {
	op, err := sn.DeleteSnapshot(ctx, id)
	if err != nil {
		return err
	}
	_, err = c.WaitOperation(ctx, op.ID)
	return err
}

type snapshotDeleteExec struct {
	c  cloud.Cloud
	sn cloud.Snapshotter
}

// Execute deletes the provider's snapshot; one that is gone already is
// deleted. Volumes restored from it are not affected.
func (e snapshotDeleteExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	if x.Snapshot.CloudID == "" {
		return ops.Result{}, nil
	}
	_, err := startOrResumeSnapshot(ctx, x, e.c, func() (cloud.Operation, error) { return e.sn.DeleteSnapshot(ctx, x.Snapshot.CloudID) })
	return ops.Result{}, err
}

func (snapshotDeleteExec) Compensate(context.Context, *ops.Exec) error { return nil }

// ConfirmSnapshot is the engine's check of a snapshot a repeated
// CreateSnapshot finds READY (ops.Config.ConfirmSnapshot): it returns why
// the provider no longer has it, or "" when it does. nil when the cloud
// takes no snapshots.
func (c *Controller) ConfirmSnapshot() func(ctx context.Context, s *store.Snapshot) (string, error) {
	sn, ok := c.Cloud.(cloud.Snapshotter)
	if !ok {
		return nil
	}
	return func(ctx context.Context, s *store.Snapshot) (string, error) {
		_, err := sn.GetSnapshot(ctx, s.CloudID)
		switch {
		case errors.Is(err, cloud.ErrNotFound):
			return fmt.Sprintf("the provider has no snapshot %s any more", s.CloudID), nil
		case err != nil:
			return "", kindOf(fmt.Errorf("confirm snapshot %s with the provider: %w", s.ID, err))
		}
		return "", nil
	}
}
