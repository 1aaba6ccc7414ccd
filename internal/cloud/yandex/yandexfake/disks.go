package yandexfake

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
)

// The API's field rules (from the request messages' documentation).
var (
	nameRE       = regexp.MustCompile(`^([a-z]([-_a-z0-9]{0,61}[a-z0-9])?)?$`)
	labelKeyRE   = regexp.MustCompile(`^[a-z][-_./\\@0-9a-z]{0,62}$`)
	labelValueRE = regexp.MustCompile(`^[-_./\\@0-9a-z]{0,63}$`)
)

const (
	maxLabels         = 64
	maxDescription    = 256
	defaultBlockSize  = 4096
	nonreplicatedUnit = 93 << 30
)

// Quota subjects of the QuotaFailure details.
const (
	QuotaDiskCount     = "compute.disks.count"
	QuotaDiskBytes     = "compute.disks.size"
	QuotaInstanceDisks = "compute.instance.secondaryDisks"
)

// diskState is a disk; pb is owned by the fake (clone it to hand out).
type diskState struct {
	pb *compute.Disk
	// busy is the operation in flight on the disk, nil when none.
	busy *opState
	// reserved is the growth an Update in flight has taken from the quota.
	reserved int64
}

type diskService struct {
	compute.UnimplementedDiskServiceServer
	f *Fake
}

// Get reports a disk.
func (s diskService) Get(_ context.Context, req *compute.GetDiskRequest) (*compute.Disk, error) {
	if err := checkID("disk_id", req.GetDiskId()); err != nil {
		return nil, err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	d, err := s.f.disk(req.GetDiskId())
	if err != nil {
		return nil, err
	}
	return proto.Clone(d.pb).(*compute.Disk), nil
}

// disk looks a disk up. Callers hold f.mu.
func (f *Fake) disk(id string) (*diskState, error) {
	d, ok := f.disks[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "disk %s not found", id)
	}
	return d, nil
}

// List lists the folder's disks, ordered by id.
func (s diskService) List(_ context.Context, req *compute.ListDisksRequest) (*compute.ListDisksResponse, error) {
	f := s.f
	if err := f.checkFolder(req.GetFolderId()); err != nil {
		return nil, err
	}
	page, err := parsePage(req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	match, err := parseFilter(req.GetFilter())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "filter: %v", err)
	}
	if req.GetOrderBy() != "" && req.GetOrderBy() != "id asc" && req.GetOrderBy() != "id" {
		return nil, status.Errorf(codes.InvalidArgument, "order_by %q: this fake orders by id only", req.GetOrderBy())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &compute.ListDisksResponse{}
	resp.Disks, resp.NextPageToken = takePage(page, slices.Sorted(maps.Keys(f.disks)), func(id string) (*compute.Disk, bool) {
		d := f.disks[id].pb
		return d, match(d)
	})
	return resp, nil
}

func (f *Fake) checkFolder(id string) error {
	if err := checkID("folder_id", id); err != nil {
		return err
	}
	if id != f.opts.FolderID {
		return status.Errorf(codes.PermissionDenied, "permission denied for folder %s", id)
	}
	return nil
}

// Create starts creating a disk.
func (s diskService) Create(ctx context.Context, req *compute.CreateDiskRequest) (*operation.Operation, error) {
	f := s.f
	if err := f.validateCreate(req); err != nil {
		return nil, err
	}
	typeID := req.GetTypeId()
	if typeID == "" {
		typeID = DefaultDiskType
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if op := f.idempotent(ctx, MethodDiskCreate); op != nil {
		return op, nil
	}
	if err := f.nameFree(req.GetName(), ""); err != nil {
		return nil, err
	}
	if err := f.checkQuota(1, req.GetSize()); err != nil {
		return nil, err
	}
	d := &diskState{pb: &compute.Disk{
		Id:          f.newID("fhm"),
		FolderId:    f.opts.FolderID,
		CreatedAt:   timestamppb.New(time.Now()),
		Name:        req.GetName(),
		Description: req.GetDescription(),
		Labels:      maps.Clone(req.GetLabels()),
		TypeId:      typeID,
		ZoneId:      req.GetZoneId(),
		Size:        req.GetSize(),
		BlockSize:   defaultBlockSize,
		Status:      compute.Disk_CREATING,
	}}
	id := d.pb.Id
	f.disks[id] = d
	return f.startOp(ctx, opSpec{
		method:      MethodDiskCreate,
		description: "Create disk",
		metadata:    &compute.CreateDiskMetadata{DiskId: id},
		disk:        d,
		apply: func() (proto.Message, []effect) {
			d.pb.Status = compute.Disk_READY
			return proto.Clone(d.pb), nil
		},
		undo: func() { delete(f.disks, id) },
	})
}

// validateCreate checks a create request's fields as the API does.
func (f *Fake) validateCreate(req *compute.CreateDiskRequest) error {
	if err := f.checkFolder(req.GetFolderId()); err != nil {
		return err
	}
	if err := checkName(req.GetName()); err != nil {
		return err
	}
	if len(req.GetDescription()) > maxDescription {
		return status.Errorf(codes.InvalidArgument, "description: longer than %d", maxDescription)
	}
	if err := checkLabels(req.GetLabels()); err != nil {
		return err
	}
	if !slices.Contains(f.opts.Zones, req.GetZoneId()) {
		return status.Errorf(codes.InvalidArgument, "zone_id %q: no such zone", req.GetZoneId())
	}
	typeID := req.GetTypeId()
	if typeID != "" && !slices.Contains(f.opts.DiskTypes, typeID) {
		return status.Errorf(codes.InvalidArgument, "type_id %q: no such disk type", typeID)
	}
	if req.GetSource() != nil {
		return status.Error(codes.Unimplemented, "disks from an image or a snapshot are not supported by this fake")
	}
	if bs := req.GetBlockSize(); bs != 0 && bs != defaultBlockSize {
		return status.Errorf(codes.InvalidArgument, "block_size %d: this fake has %d only", bs, defaultBlockSize)
	}
	return checkSize(req.GetSize(), MaxDiskBytes, typeID)
}

func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return status.Errorf(codes.InvalidArgument, "name %q: the value must match %s", name, nameRE)
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return status.Errorf(codes.InvalidArgument, "labels: %d, at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if !labelKeyRE.MatchString(k) {
			return status.Errorf(codes.InvalidArgument, "label key %q: must match %s", k, labelKeyRE)
		}
		if !labelValueRE.MatchString(v) {
			return status.Errorf(codes.InvalidArgument, "label %s: value %q must match %s", k, v, labelValueRE)
		}
	}
	return nil
}

func checkSize(size, limit int64, typeID string) error {
	if size < MinDiskBytes || size > limit {
		return status.Errorf(codes.InvalidArgument, "size %d: the value must be between %d and %d", size, MinDiskBytes, limit)
	}
	if (typeID == "network-ssd-nonreplicated" || typeID == "network-ssd-io-m3") && size%nonreplicatedUnit != 0 {
		return status.Errorf(codes.InvalidArgument, "size %d: a %s disk is a multiple of 93 GiB", size, typeID)
	}
	return nil
}

// nameFree fails with AlreadyExists when another disk than except has the
// name. Callers hold f.mu.
func (f *Fake) nameFree(name, except string) error {
	if name == "" {
		return nil
	}
	for id, d := range f.disks {
		if id != except && d.pb.Name == name {
			return status.Errorf(codes.AlreadyExists, "disk with name %q already exists", name)
		}
	}
	return nil
}

// checkQuota fails with ResourceExhausted (and a QuotaFailure) when adding
// disks disks of bytes bytes exceeds the quota. Callers hold f.mu.
func (f *Fake) checkQuota(disks int, bytes int64) error {
	q := f.opts.Quota
	var count int
	var used int64
	for _, d := range f.disks {
		count++
		used += d.pb.Size + d.reserved
	}
	if q.Disks > 0 && count+disks > q.Disks {
		return quotaError(QuotaDiskCount, "quota limit %s exceeded: %d disks of %d", QuotaDiskCount, count+disks, q.Disks)
	}
	if q.Bytes > 0 && used+bytes > q.Bytes {
		return quotaError(QuotaDiskBytes, "quota limit %s exceeded: %d bytes of %d", QuotaDiskBytes, used+bytes, q.Bytes)
	}
	return nil
}

func quotaError(subject, format string, args ...any) error {
	st := status.Newf(codes.ResourceExhausted, format, args...)
	st, err := st.WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject: subject, Description: st.Message(),
	}}})
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return st.Err()
}

// mutable fails unless the disk can start an operation: READY and not busy.
func mutable(d *diskState) error {
	if d.busy != nil {
		return status.Errorf(codes.FailedPrecondition, "disk %s is busy: operation %s is in progress", d.pb.Id, d.busy.pb.Id)
	}
	if d.pb.Status != compute.Disk_READY {
		return status.Errorf(codes.FailedPrecondition, "disk %s is %s", d.pb.Id, d.pb.Status)
	}
	return nil
}

// mutableDisk returns the operation an earlier call of method with the
// same idempotency key started, or else the disk id names if it can start
// an operation. Callers hold f.mu.
func (f *Fake) mutableDisk(ctx context.Context, method, id string) (*diskState, *operation.Operation, error) {
	if op := f.idempotent(ctx, method); op != nil {
		return nil, op, nil
	}
	d, err := f.disk(id)
	if err != nil {
		return nil, nil, err
	}
	if err := mutable(d); err != nil {
		return nil, nil, err
	}
	return d, nil, nil
}

// Delete starts deleting a disk that is not attached.
func (s diskService) Delete(ctx context.Context, req *compute.DeleteDiskRequest) (*operation.Operation, error) {
	f := s.f
	if err := checkID("disk_id", req.GetDiskId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, op, err := f.mutableDisk(ctx, MethodDiskDelete, req.GetDiskId())
	if op != nil || err != nil {
		return op, err
	}
	if len(d.pb.InstanceIds) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "disk %s is attached to instance %s", d.pb.Id, d.pb.InstanceIds[0])
	}
	id := d.pb.Id
	d.pb.Status = compute.Disk_DELETING
	return f.startOp(ctx, opSpec{
		method:      MethodDiskDelete,
		description: "Delete disk",
		metadata:    &compute.DeleteDiskMetadata{DiskId: id},
		disk:        d,
		apply: func() (proto.Message, []effect) {
			delete(f.disks, id)
			return &emptypb.Empty{}, f.imageDeleted(id)
		},
		undo: func() { d.pb.Status = compute.Disk_READY },
	})
}

// Update starts changing a disk's labels, size, name or description.
func (s diskService) Update(ctx context.Context, req *compute.UpdateDiskRequest) (*operation.Operation, error) {
	f := s.f
	if err := checkID("disk_id", req.GetDiskId()); err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, status.Error(codes.InvalidArgument, "update_mask is required by this fake")
	}
	for _, p := range paths {
		if !slices.Contains([]string{"labels", "size", "name", "description"}, p) {
			return nil, status.Errorf(codes.InvalidArgument, "update_mask: path %q cannot be updated", p)
		}
	}
	if slices.Contains(paths, "labels") {
		if err := checkLabels(req.GetLabels()); err != nil {
			return nil, err
		}
	}
	if slices.Contains(paths, "name") {
		if err := checkName(req.GetName()); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, op, err := f.mutableDisk(ctx, MethodDiskUpdate, req.GetDiskId())
	if op != nil || err != nil {
		return op, err
	}
	u, err := f.planUpdate(d, req, paths)
	if err != nil {
		return nil, err
	}
	d.reserved = u.grow
	return f.startOp(ctx, opSpec{
		method:      MethodDiskUpdate,
		description: "Update disk",
		metadata:    &compute.UpdateDiskMetadata{DiskId: d.pb.Id},
		disk:        d,
		apply:       func() (proto.Message, []effect) { return f.applyUpdate(d, u), u.effects },
		undo:        func() { d.reserved = 0 },
	})
}

// diskUpdate is an Update's change, checked when it starts.
type diskUpdate struct {
	paths   []string
	req     *compute.UpdateDiskRequest
	grow    int64
	effects []effect
}

// planUpdate checks an update against the disk and the quota. Callers
// hold f.mu.
func (f *Fake) planUpdate(d *diskState, req *compute.UpdateDiskRequest, paths []string) (diskUpdate, error) {
	u := diskUpdate{paths: paths, req: proto.Clone(req).(*compute.UpdateDiskRequest)}
	if slices.Contains(paths, "name") {
		if err := f.nameFree(req.GetName(), d.pb.Id); err != nil {
			return u, err
		}
	}
	if !slices.Contains(paths, "size") || req.GetSize() == d.pb.Size {
		return u, nil
	}
	size := req.GetSize()
	if size < d.pb.Size {
		return u, status.Errorf(codes.InvalidArgument, "size %d: a disk cannot shrink (it has %d)", size, d.pb.Size)
	}
	if err := checkSize(size, MaxUpdateDiskBytes, d.pb.TypeId); err != nil {
		return u, err
	}
	attached := ""
	if len(d.pb.InstanceIds) > 0 {
		attached = d.pb.InstanceIds[0]
		if !f.opts.GrowAttached {
			return u, status.Errorf(codes.FailedPrecondition,
				"disk %s is attached to instance %s: this disk cannot be resized while attached; detach it or stop the instance", d.pb.Id, attached)
		}
	}
	if err := f.checkQuota(0, size-d.pb.Size); err != nil {
		return u, err
	}
	u.grow = size - d.pb.Size
	id := d.pb.Id
	u.effects = f.imageGrown(id, size, attached)
	return u, nil
}

// applyUpdate makes an update's change. Callers hold f.mu.
func (f *Fake) applyUpdate(d *diskState, u diskUpdate) proto.Message {
	for _, p := range u.paths {
		switch p {
		case "labels":
			d.pb.Labels = maps.Clone(u.req.GetLabels())
		case "size":
			d.pb.Size = max(d.pb.Size, u.req.GetSize())
		case "name":
			d.pb.Name = u.req.GetName()
		case "description":
			d.pb.Description = u.req.GetDescription()
		}
	}
	d.reserved = 0
	return proto.Clone(d.pb)
}

// ListOperations lists a disk's operations in the order they started.
func (s diskService) ListOperations(_ context.Context, req *compute.ListDiskOperationsRequest) (*compute.ListDiskOperationsResponse, error) {
	f := s.f
	if err := checkID("disk_id", req.GetDiskId()); err != nil {
		return nil, err
	}
	page, err := parsePage(req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.disk(req.GetDiskId())
	if err != nil {
		return nil, err
	}
	resp := &compute.ListDiskOperationsResponse{}
	resp.Operations, resp.NextPageToken = takePage(page, slices.Sorted(maps.Keys(f.ops)), func(id string) (*operation.Operation, bool) {
		op := f.ops[id]
		return op.pb, op.disk == d
	})
	return resp, nil
}
