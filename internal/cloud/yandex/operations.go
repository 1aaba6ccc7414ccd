package yandex

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	computepb "github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	operationpb "github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csid-dev/csid/internal/cloud"
)

// Operations. A call that starts work in Yandex returns Yandex's
// operation, whose id csid checkpoints and polls (OperationService.Get)
// after a restart as before. A call that finds its work done already
// (the disk exists, is attached, is gone, is large enough) starts nothing
// in Yandex; it returns a disk operation instead, whose id names the kind
// and the disk ("csid.<kind>.<disk id>", never a Yandex id) and whose wait
// reads the disk: a create's waits until the disk is ready.
const diskOpPrefix = "csid."

var diskOpPattern = regexp.MustCompile(`^csid\.(create|delete|attach|detach|resize|tag)\.([a-z][a-z0-9]{19})$`)

// labelOpPrefix starts the id of the Yandex operation of a label change
// ("csid.labels.<operation id>"): its metadata, UpdateDiskMetadata, is a
// grow's too, and a label change, allowed on an attached disk, never fails
// for the disk's attachment (ErrAttached), as a grow may.
const labelOpPrefix = diskOpPrefix + "labels."

// maxPoll bounds the pause between two polls of an operation.
const maxPoll = 5 * time.Second

func doneOp(kind cloud.OpKind, diskID string, done bool) cloud.Operation {
	return cloud.Operation{ID: diskOpPrefix + string(kind) + "." + diskID, Kind: kind, DiskID: diskID, Done: done}
}

// operation converts the operation a call started.
func (c *Cloud) operation(op *operationpb.Operation, kind cloud.OpKind, diskID, nodeID string) (cloud.Operation, error) {
	if op == nil || !idPattern.MatchString(op.GetId()) {
		return cloud.Operation{}, fmt.Errorf("yandex: a %s call returned no operation id (%q): %w", kind, op.GetId(), cloud.ErrTransient)
	}
	if diskID == "" {
		m := new(computepb.CreateDiskMetadata)
		if err := op.GetMetadata().UnmarshalTo(m); err != nil || m.GetDiskId() == "" {
			return cloud.Operation{}, fmt.Errorf("yandex: create operation %s names no disk: %w", op.GetId(), cloud.ErrTransient)
		}
		diskID = m.GetDiskId()
	}
	return cloud.Operation{ID: op.GetId(), Kind: kind, DiskID: diskID, NodeID: nodeID, Done: op.GetDone()}, nil
}

// WaitOperation polls an operation until it is done, with a pause that
// doubles from Options.PollInterval up to 5s, and returns the disk as it
// left it.
func (c *Cloud) WaitOperation(ctx context.Context, opID string) (cloud.Disk, error) {
	if m := diskOpPattern.FindStringSubmatch(opID); m != nil {
		return c.waitDisk(ctx, cloud.OpKind(m[1]), m[2])
	}
	yid, labels := strings.CutPrefix(opID, labelOpPrefix)
	if !idPattern.MatchString(yid) {
		return cloud.Disk{}, fmt.Errorf("operation id %q is not a Yandex operation id: %w", opID, cloud.ErrNotFound)
	}
	pause := c.opts.PollInterval
	for {
		op, err := c.api.operations.Get(ctx, &operationpb.GetOperationRequest{OperationId: yid})
		if err != nil {
			return cloud.Disk{}, apiError(err, "get operation "+yid)
		}
		if op.GetDone() {
			return c.result(ctx, op, labels)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return cloud.Disk{}, err
		}
		pause = min(2*pause, maxPoll)
	}
}

// result is what a finished operation left: the disk, or its error.
// labels says the operation is a label change (see labelOpPrefix).
func (c *Cloud) result(ctx context.Context, op *operationpb.Operation, labels bool) (cloud.Disk, error) {
	kind, diskID, nodeID, err := describe(op)
	if err != nil {
		return cloud.Disk{}, err
	}
	if labels && kind == cloud.OpResize {
		kind = cloud.OpTag
	}
	if e := op.GetError(); e != nil {
		err := apiError(status.ErrorProto(e), fmt.Sprintf("operation %s (%s of disk %s)", op.GetId(), kind, diskID))
		if kind == cloud.OpResize || kind == cloud.OpDelete {
			// Refused for the disk's attachment (ErrAttached) or because it
			// was busy (ErrTransient): the disk as it is now tells.
			err = c.refused(ctx, err, diskID)
		}
		return cloud.Disk{}, err
	}
	switch kind {
	case cloud.OpDelete:
		return cloud.Disk{}, nil
	case cloud.OpAttach, cloud.OpDetach:
		d, err := c.GetDisk(ctx, diskID)
		if err != nil {
			return cloud.Disk{}, err
		}
		d.AttachedTo = ""
		if kind == cloud.OpAttach {
			d.AttachedTo = nodeID
		}
		return d, nil
	}
	disk := new(computepb.Disk)
	if err := op.GetResponse().UnmarshalTo(disk); err != nil {
		// A response without the disk: read it.
		return c.GetDisk(ctx, diskID)
	}
	return toDisk(disk), nil
}

// describe tells what an operation does from its metadata.
func describe(op *operationpb.Operation) (kind cloud.OpKind, diskID, nodeID string, err error) {
	md := op.GetMetadata()
	var m proto.Message
	switch {
	case md.MessageIs(&computepb.CreateDiskMetadata{}):
		m, kind = new(computepb.CreateDiskMetadata), cloud.OpCreate
	case md.MessageIs(&computepb.UpdateDiskMetadata{}):
		// A grow or a change of labels: the metadata does not say which
		// (the id csid gives a label change does, labelOpPrefix); both
		// read back the same (the disk the response holds).
		m, kind = new(computepb.UpdateDiskMetadata), cloud.OpResize
	case md.MessageIs(&computepb.DeleteDiskMetadata{}):
		m, kind = new(computepb.DeleteDiskMetadata), cloud.OpDelete
	case md.MessageIs(&computepb.AttachInstanceDiskMetadata{}):
		m, kind = new(computepb.AttachInstanceDiskMetadata), cloud.OpAttach
	case md.MessageIs(&computepb.DetachInstanceDiskMetadata{}):
		m, kind = new(computepb.DetachInstanceDiskMetadata), cloud.OpDetach
	default:
		return "", "", "", fmt.Errorf("operation %s is not an operation on a disk (%s): %w", op.GetId(), md.GetTypeUrl(), cloud.ErrNotFound)
	}
	if err := md.UnmarshalTo(m); err != nil {
		return "", "", "", fmt.Errorf("operation %s: metadata: %v: %w", op.GetId(), err, cloud.ErrTransient)
	}
	type diskMD interface{ GetDiskId() string }
	type nodeMD interface{ GetInstanceId() string }
	diskID = m.(diskMD).GetDiskId()
	if n, ok := m.(nodeMD); ok {
		nodeID = n.GetInstanceId()
	}
	return kind, diskID, nodeID, nil
}

// waitDisk is the wait of a disk operation (see diskOpPrefix).
func (c *Cloud) waitDisk(ctx context.Context, kind cloud.OpKind, diskID string) (cloud.Disk, error) {
	pause := c.opts.PollInterval
	for {
		d, err := c.disk(ctx, diskID)
		switch {
		case errors.Is(err, cloud.ErrNotFound) && kind == cloud.OpDelete:
			return cloud.Disk{}, nil
		case errors.Is(err, cloud.ErrNotFound) && kind == cloud.OpDetach:
			return cloud.Disk{ID: diskID}, nil
		case err != nil:
			return cloud.Disk{}, err
		case kind == cloud.OpDelete:
			return cloud.Disk{}, nil
		case d.GetStatus() == computepb.Disk_ERROR:
			return cloud.Disk{}, fmt.Errorf("yandex: disk %s is in status ERROR: %w", diskID, cloud.ErrTransient)
		case kind != cloud.OpCreate || d.GetStatus() == computepb.Disk_READY:
			return toDisk(d), nil
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return cloud.Disk{}, err
		}
		pause = min(2*pause, maxPoll)
	}
}
