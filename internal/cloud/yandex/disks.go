package yandex

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	computepb "github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/csid-dev/csid/internal/cloud"
)

// CreateDisk starts creating a disk named spec.Name (a Yandex resource
// name: csid's volume ids are). The name is the idempotency key: a disk of
// that name that is csid's, of the same rounded size and type, is the
// disk; of another size or type, ErrAlreadyExists.
func (c *Cloud) CreateDisk(ctx context.Context, spec cloud.DiskSpec) (cloud.Operation, error) {
	if !namePattern.MatchString(spec.Name) {
		return cloud.Operation{}, fmt.Errorf("disk name %q is not a Yandex resource name ([a-z]([-_a-z0-9]{0,61}[a-z0-9])?): %w", spec.Name, cloud.ErrInvalid)
	}
	if spec.Source != nil {
		return cloud.Operation{}, fmt.Errorf("a disk from a snapshot or a disk: %w", cloud.ErrNotSupported)
	}
	size, err := roundSize(spec.SizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	zone, err := c.zone(spec.Zone)
	if err != nil {
		return cloud.Operation{}, err
	}
	typ := spec.Type
	if typ == "" {
		typ = DefaultDiskType
	} else if !slices.Contains(DiskTypes, typ) {
		return cloud.Operation{}, fmt.Errorf("disk type %q is not one of %v: %w", typ, DiskTypes, cloud.ErrInvalid)
	}
	labels, err := tagsToLabels(spec.Tags, c.opts.Driver)
	if err != nil {
		return cloud.Operation{}, err
	}
	if op, found, err := c.existing(ctx, spec.Name, size, zone, typ); found || err != nil {
		return op, err
	}
	yop, err := c.api.disks.Create(ctx, &computepb.CreateDiskRequest{
		FolderId: c.opts.FolderID, Name: spec.Name, Labels: labels, TypeId: typ, ZoneId: zone, Size: size,
		Description: "made by csid (" + c.opts.Driver + ")",
	})
	if status := apiError(err, "create disk "+spec.Name); status != nil {
		if errors.Is(status, cloud.ErrAlreadyExists) {
			// A concurrent create of the name won: it is ours if it matches.
			if op, found, err := c.existing(ctx, spec.Name, size, zone, typ); found || err != nil {
				return op, err
			}
		}
		return cloud.Operation{}, status
	}
	return c.operation(yop, cloud.OpCreate, "", "")
}

// existing looks for the disk named name: found with its create operation
// (a done one if it is ready) when it is csid's and matches, ErrAlreadyExists
// when it does not.
func (c *Cloud) existing(ctx context.Context, name string, size int64, zone, typ string) (cloud.Operation, bool, error) {
	d, err := c.diskByName(ctx, name)
	if err != nil || d == nil {
		return cloud.Operation{}, false, err
	}
	if !c.ours(d) {
		return cloud.Operation{}, false, fmt.Errorf("disk %s named %q was not made by this csid (%s): %w", d.GetId(), name, c.opts.Driver, cloud.ErrAlreadyExists)
	}
	have := d.GetTypeId()
	if have == "" {
		have = DefaultDiskType
	}
	if d.GetSize() != size || have != typ || d.GetZoneId() != zone {
		return cloud.Operation{}, false, fmt.Errorf("disk %s named %q is %d bytes of %s in %s, not %d bytes of %s in %s: %w",
			d.GetId(), name, d.GetSize(), have, d.GetZoneId(), size, typ, zone, cloud.ErrAlreadyExists)
	}
	return doneOp(cloud.OpCreate, d.GetId(), d.GetStatus() == computepb.Disk_READY), true, nil
}

func (c *Cloud) diskByName(ctx context.Context, name string) (*computepb.Disk, error) {
	var found *computepb.Disk
	err := c.eachDisk(ctx, fmt.Sprintf("name = %q", name), func(d *computepb.Disk) bool {
		if d.GetName() == name {
			found = d
			return false
		}
		return true
	})
	return found, err
}

// eachDisk calls f on every disk of the folder (that filter selects) until
// f returns false.
func (c *Cloud) eachDisk(ctx context.Context, filter string, f func(*computepb.Disk) bool) error {
	token := ""
	for {
		resp, err := c.api.disks.List(ctx, &computepb.ListDisksRequest{
			FolderId: c.opts.FolderID, PageSize: 1000, PageToken: token, Filter: filter})
		if err != nil {
			return apiError(err, "list disks of folder "+c.opts.FolderID)
		}
		for _, d := range resp.GetDisks() {
			if !f(d) {
				return nil
			}
		}
		token = resp.GetNextPageToken()
		if token == "" {
			return nil
		}
	}
}

// ours reports whether csid (this driver) made d.
func (c *Cloud) ours(d *computepb.Disk) bool {
	_, owner := labelsToTags(d.GetLabels())
	return owner == c.opts.Driver
}

// disk reads one of csid's disks: a disk that is not csid's is ErrNotFound
// (csid never touches what it did not make).
func (c *Cloud) disk(ctx context.Context, id string) (*computepb.Disk, error) {
	d, err := c.api.disks.Get(ctx, &computepb.GetDiskRequest{DiskId: id})
	if err != nil {
		return nil, apiError(err, "get disk "+id)
	}
	if !c.ours(d) {
		return nil, fmt.Errorf("disk %s was not made by this csid (%s): %w", id, c.opts.Driver, cloud.ErrNotFound)
	}
	return d, nil
}

// GetDisk reports one of csid's disks.
func (c *Cloud) GetDisk(ctx context.Context, diskID string) (cloud.Disk, error) {
	if err := checkDiskID(diskID, true); err != nil {
		return cloud.Disk{}, err
	}
	d, err := c.disk(ctx, diskID)
	if err != nil {
		return cloud.Disk{}, err
	}
	return toDisk(d), nil
}

// toDisk converts a Yandex disk.
func toDisk(d *computepb.Disk) cloud.Disk {
	tags, _ := labelsToTags(d.GetLabels())
	out := cloud.Disk{ID: d.GetId(), Name: d.GetName(), SizeBytes: d.GetSize(), Zone: d.GetZoneId(), Tags: tags,
		Type: d.GetTypeId(), CreatedAt: d.GetCreatedAt().AsTime()}
	if ids := d.GetInstanceIds(); len(ids) > 0 {
		out.AttachedTo = ids[0]
	}
	return out
}

// ListDisks returns a page of csid's disks ordered by id. The token is the
// last disk id of the previous page; a page walks the folder's listing
// (the API's own order is by id) from its start.
func (c *Cloud) ListDisks(ctx context.Context, opts cloud.ListOptions) (cloud.DiskPage, error) {
	if opts.MaxResults < 0 {
		return cloud.DiskPage{}, fmt.Errorf("page size %d: %w", opts.MaxResults, cloud.ErrInvalid)
	}
	if opts.PageToken != "" && !idPattern.MatchString(opts.PageToken) {
		return cloud.DiskPage{}, fmt.Errorf("page token %q: %w", opts.PageToken, cloud.ErrInvalid)
	}
	max := opts.MaxResults
	if max == 0 {
		max = 1000
	}
	var all []cloud.Disk
	err := c.eachDisk(ctx, "", func(d *computepb.Disk) bool {
		if c.ours(d) && d.GetId() > opts.PageToken {
			all = append(all, toDisk(d))
		}
		return true
	})
	if err != nil {
		return cloud.DiskPage{}, err
	}
	slices.SortFunc(all, func(a, b cloud.Disk) int { return strings.Compare(a.ID, b.ID) })
	page := cloud.DiskPage{Disks: all}
	if len(all) > max {
		page.Disks = all[:max]
		page.NextToken = all[max-1].ID
	}
	return page, nil
}

// DeleteDisk starts deleting a disk; one that is gone (or not csid's) is
// done at once.
func (c *Cloud) DeleteDisk(ctx context.Context, diskID string) (cloud.Operation, error) {
	if err := checkDiskID(diskID, false); err != nil {
		return cloud.Operation{}, err
	}
	d, err := c.disk(ctx, diskID)
	if errors.Is(err, cloud.ErrNotFound) {
		return doneOp(cloud.OpDelete, diskID, true), nil
	} else if err != nil {
		return cloud.Operation{}, err
	}
	if len(d.GetInstanceIds()) > 0 {
		return cloud.Operation{}, fmt.Errorf("disk %s is attached to %v: %w", diskID, d.GetInstanceIds(), cloud.ErrAttached)
	}
	yop, err := c.api.disks.Delete(ctx, &computepb.DeleteDiskRequest{DiskId: diskID})
	if err := apiError(err, "delete disk "+diskID); err != nil {
		if errors.Is(err, cloud.ErrNotFound) {
			return doneOp(cloud.OpDelete, diskID, true), nil
		}
		return cloud.Operation{}, c.refused(ctx, err, diskID)
	}
	return c.operation(yop, cloud.OpDelete, diskID, "")
}

// ResizeDisk starts growing a detached disk. Yandex refuses to grow an
// attached disk (FailedPrecondition), which is ErrAttached here.
func (c *Cloud) ResizeDisk(ctx context.Context, diskID string, sizeBytes int64) (cloud.Operation, error) {
	if err := checkDiskID(diskID, false); err != nil {
		return cloud.Operation{}, err
	}
	size, err := roundSize(sizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	d, err := c.disk(ctx, diskID)
	if err != nil {
		return cloud.Operation{}, err
	}
	if d.GetSize() >= size {
		return doneOp(cloud.OpResize, diskID, true), nil
	}
	if len(d.GetInstanceIds()) > 0 {
		return cloud.Operation{}, fmt.Errorf("disk %s is attached to %v: %w", diskID, d.GetInstanceIds(), cloud.ErrAttached)
	}
	yop, err := c.api.disks.Update(ctx, &computepb.UpdateDiskRequest{DiskId: diskID, Size: size,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size"}}})
	if err := apiError(err, fmt.Sprintf("grow disk %s to %d bytes", diskID, size)); err != nil {
		return cloud.Operation{}, c.refused(ctx, err, diskID)
	}
	return c.operation(yop, cloud.OpResize, diskID, "")
}

// UpdateDiskTags starts setting tags on a disk (its labels are replaced by
// the merged set, which Yandex's update does in one step).
func (c *Cloud) UpdateDiskTags(ctx context.Context, diskID string, tags map[string]string) (cloud.Operation, error) {
	if err := checkDiskID(diskID, false); err != nil {
		return cloud.Operation{}, err
	}
	d, err := c.disk(ctx, diskID)
	if err != nil {
		return cloud.Operation{}, err
	}
	have, _ := labelsToTags(d.GetLabels())
	merged, _, err := cloud.MergeTags(have, tags)
	if err != nil {
		return cloud.Operation{}, err
	}
	labels, err := tagsToLabels(merged, c.opts.Driver)
	if err != nil {
		return cloud.Operation{}, err
	}
	// The labels are the tags reversibly: equal labels are unchanged tags.
	if maps.Equal(labels, d.GetLabels()) {
		return doneOp(cloud.OpTag, diskID, true), nil
	}
	yop, err := c.api.disks.Update(ctx, &computepb.UpdateDiskRequest{DiskId: diskID, Labels: labels,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})
	if err := apiError(err, "label disk "+diskID); err != nil {
		return cloud.Operation{}, err
	}
	op, err := c.operation(yop, cloud.OpTag, diskID, "")
	if err != nil {
		return cloud.Operation{}, err
	}
	op.ID = labelOpPrefix + op.ID
	return op, nil
}

// AttachDisk starts attaching a disk to an instance, read-write, never
// deleted with it, with the disk id as its device name (the node finds it
// as /dev/disk/by-id/virtio-<disk id>).
func (c *Cloud) AttachDisk(ctx context.Context, diskID, nodeID string) (cloud.Operation, error) {
	if err := checkAttachment(diskID, nodeID); err != nil {
		return cloud.Operation{}, err
	}
	d, err := c.disk(ctx, diskID)
	if err != nil {
		return cloud.Operation{}, err
	}
	if ids := d.GetInstanceIds(); slices.Contains(ids, nodeID) {
		return doneOp(cloud.OpAttach, diskID, true), nil
	} else if len(ids) > 0 {
		return cloud.Operation{}, fmt.Errorf("disk %s is attached to %v: %w", diskID, ids, cloud.ErrAttached)
	}
	inst, err := c.instance(ctx, nodeID)
	if err != nil {
		return cloud.Operation{}, err
	}
	if n := len(inst.GetSecondaryDisks()); n >= c.opts.MaxDisks {
		return cloud.Operation{}, fmt.Errorf("instance %s holds %d disks, its limit: %w", nodeID, n, cloud.ErrLimitReached)
	}
	yop, err := c.api.instances.AttachDisk(ctx, &computepb.AttachInstanceDiskRequest{InstanceId: nodeID,
		AttachedDiskSpec: &computepb.AttachedDiskSpec{Mode: computepb.AttachedDiskSpec_READ_WRITE, DeviceName: diskID,
			Disk: &computepb.AttachedDiskSpec_DiskId{DiskId: diskID}}})
	if err := apiError(err, fmt.Sprintf("attach disk %s to instance %s", diskID, nodeID)); err != nil {
		return cloud.Operation{}, c.refused(ctx, err, diskID)
	}
	return c.operation(yop, cloud.OpAttach, diskID, nodeID)
}

// checkAttachment refuses a disk id or an instance id that is not
// Yandex's (ErrInvalid), before an attach or a detach.
func checkAttachment(diskID, nodeID string) error {
	if err := checkDiskID(diskID, false); err != nil {
		return err
	}
	if !nodePattern.MatchString(nodeID) {
		return fmt.Errorf("instance id %q: %w", nodeID, cloud.ErrInvalid)
	}
	return nil
}

// refused names why the API refused a change of a disk that csid's checks
// let through: the disk was attached meanwhile (ErrAttached); else the
// refusal as it maps (a busy disk is ErrTransient, a full instance
// ErrLimitReached).
func (c *Cloud) refused(ctx context.Context, err error, diskID string) error {
	if !errors.Is(err, cloud.ErrTransient) {
		return err
	}
	d, derr := c.disk(ctx, diskID)
	if derr != nil || len(d.GetInstanceIds()) == 0 {
		return err
	}
	return fmt.Errorf("%w (disk %s is attached to %v: %w)", err, diskID, d.GetInstanceIds(), cloud.ErrAttached)
}

// DetachDisk starts detaching a disk from an instance; a disk not attached
// there (or gone) is done at once.
func (c *Cloud) DetachDisk(ctx context.Context, diskID, nodeID string) (cloud.Operation, error) {
	if err := checkAttachment(diskID, nodeID); err != nil {
		return cloud.Operation{}, err
	}
	d, err := c.disk(ctx, diskID)
	if errors.Is(err, cloud.ErrNotFound) {
		return doneOp(cloud.OpDetach, diskID, true), nil
	} else if err != nil {
		return cloud.Operation{}, err
	}
	if !slices.Contains(d.GetInstanceIds(), nodeID) {
		return doneOp(cloud.OpDetach, diskID, true), nil
	}
	yop, err := c.api.instances.DetachDisk(ctx, &computepb.DetachInstanceDiskRequest{InstanceId: nodeID,
		Disk: &computepb.DetachInstanceDiskRequest_DiskId{DiskId: diskID}})
	if err := apiError(err, fmt.Sprintf("detach disk %s from instance %s", diskID, nodeID)); err != nil {
		return cloud.Operation{}, err
	}
	return c.operation(yop, cloud.OpDetach, diskID, nodeID)
}

// roundSize rounds a size up to whole GiB, refusing what Yandex cannot
// make.
func roundSize(size int64) (int64, error) {
	if size <= 0 || size > MaxDiskBytes {
		return 0, fmt.Errorf("size %d bytes is not in (0, %d]: %w", size, MaxDiskBytes, cloud.ErrInvalid)
	}
	r := (size + Granularity - 1) / Granularity * Granularity
	if r > MaxDiskBytes {
		return 0, fmt.Errorf("size %d bytes rounds to %d, beyond %d: %w", size, r, MaxDiskBytes, cloud.ErrInvalid)
	}
	return r, nil
}
