package yandexfake

import (
	"context"
	"regexp"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
)

// deviceNameRE is the API's rule for a device name (the virtio serial).
var deviceNameRE = regexp.MustCompile(`^[a-z][a-z0-9-_]{0,19}$`)

// instanceState is an instance.
type instanceState struct {
	id       string
	zone     string
	maxDisks int
	created  time.Time
	disks    []*compute.AttachedDisk
	// attaching are the device names of the attaches in flight.
	attaching []string
}

func (f *Fake) instancePB(in *instanceState) *compute.Instance {
	out := &compute.Instance{
		Id:         in.id,
		FolderId:   f.opts.FolderID,
		CreatedAt:  timestamppb.New(in.created),
		Name:       in.id,
		ZoneId:     in.zone,
		PlatformId: "standard-v3",
		Status:     compute.Instance_RUNNING,
	}
	for _, d := range in.disks {
		out.SecondaryDisks = append(out.SecondaryDisks, proto.Clone(d).(*compute.AttachedDisk))
	}
	return out
}

type instanceService struct {
	compute.UnimplementedInstanceServiceServer
	f *Fake
}

// Get reports an instance with its secondary disks.
func (s instanceService) Get(_ context.Context, req *compute.GetInstanceRequest) (*compute.Instance, error) {
	if err := checkID("instance_id", req.GetInstanceId()); err != nil {
		return nil, err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	in, err := s.f.instance(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	return s.f.instancePB(in), nil
}

func (f *Fake) instance(id string) (*instanceState, error) {
	in, ok := f.instances[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "instance %s not found", id)
	}
	return in, nil
}

// AttachDisk starts attaching an existing disk to an instance.
func (s instanceService) AttachDisk(ctx context.Context, req *compute.AttachInstanceDiskRequest) (*operation.Operation, error) {
	f := s.f
	spec, err := checkAttachRequest(req)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if op := f.idempotent(ctx, MethodInstanceAttach); op != nil {
		return op, nil
	}
	in, err := f.instance(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	d, err := f.disk(spec.GetDiskId())
	if err != nil {
		return nil, err
	}
	if err := f.canAttach(in, d, spec); err != nil {
		return nil, err
	}
	if spec.DeviceName == "" {
		spec.DeviceName = d.pb.Id // the API makes one up; the disk id is as good
	}
	att := &compute.AttachedDisk{Mode: compute.AttachedDisk_Mode(spec.GetMode()), DeviceName: spec.GetDeviceName(),
		AutoDelete: spec.GetAutoDelete(), DiskId: d.pb.Id}
	if att.Mode == compute.AttachedDisk_MODE_UNSPECIFIED {
		att.Mode = compute.AttachedDisk_READ_WRITE
	}
	in.attaching = append(in.attaching, att.DeviceName)
	unreserve := func() {
		if i := slices.Index(in.attaching, att.DeviceName); i >= 0 {
			in.attaching = slices.Delete(in.attaching, i, i+1)
		}
	}
	diskID, size := d.pb.Id, d.pb.Size
	return f.startOp(ctx, opSpec{
		method:      MethodInstanceAttach,
		description: "Attach disk",
		metadata:    &compute.AttachInstanceDiskMetadata{InstanceId: in.id, DiskId: diskID},
		disk:        d,
		apply: func() (proto.Message, []effect) {
			unreserve()
			in.disks = append(in.disks, att)
			d.pb.InstanceIds = []string{in.id}
			var eff []effect
			if n := f.nodes[in.id]; n != nil {
				eff = append(eff, func(ctx context.Context) error { return n.attach(ctx, diskID, att.DeviceName, size) })
			}
			return f.instancePB(in), eff
		},
		undo: unreserve,
	})
}

func checkAttachRequest(req *compute.AttachInstanceDiskRequest) (*compute.AttachedDiskSpec, error) {
	if err := checkID("instance_id", req.GetInstanceId()); err != nil {
		return nil, err
	}
	spec := req.GetAttachedDiskSpec()
	if spec == nil {
		return nil, status.Error(codes.InvalidArgument, "attached_disk_spec is required")
	}
	if spec.GetDiskSpec() != nil {
		return nil, status.Error(codes.Unimplemented, "creating a disk on attach is not supported by this fake")
	}
	if err := checkID("attached_disk_spec.disk_id", spec.GetDiskId()); err != nil {
		return nil, err
	}
	if n := spec.GetDeviceName(); n != "" && !deviceNameRE.MatchString(n) {
		return nil, status.Errorf(codes.InvalidArgument, "device_name %q: the value must match %s", n, deviceNameRE)
	}
	return proto.Clone(spec).(*compute.AttachedDiskSpec), nil
}

// canAttach checks that d can be attached to in. Callers hold f.mu.
func (f *Fake) canAttach(in *instanceState, d *diskState, spec *compute.AttachedDiskSpec) error {
	if err := mutable(d); err != nil {
		return err
	}
	if d.pb.ZoneId != in.zone {
		return status.Errorf(codes.FailedPrecondition, "disk %s is in zone %s, instance %s in zone %s", d.pb.Id, d.pb.ZoneId, in.id, in.zone)
	}
	if len(d.pb.InstanceIds) > 0 {
		return status.Errorf(codes.FailedPrecondition, "disk %s is already attached to instance %s", d.pb.Id, d.pb.InstanceIds[0])
	}
	name := spec.GetDeviceName()
	if name != "" {
		taken := slices.Contains(in.attaching, name) || slices.ContainsFunc(in.disks, func(a *compute.AttachedDisk) bool { return a.DeviceName == name })
		if taken {
			return status.Errorf(codes.FailedPrecondition, "device name %q is taken on instance %s", name, in.id)
		}
	}
	if len(in.disks)+len(in.attaching) >= in.maxDisks {
		return quotaError(QuotaInstanceDisks, "instance %s has the maximum number of secondary disks (%d)", in.id, in.maxDisks)
	}
	return nil
}

// DetachDisk starts detaching a disk, named by id or device name.
func (s instanceService) DetachDisk(ctx context.Context, req *compute.DetachInstanceDiskRequest) (*operation.Operation, error) {
	f := s.f
	if err := checkID("instance_id", req.GetInstanceId()); err != nil {
		return nil, err
	}
	byID, byName := req.GetDiskId(), req.GetDeviceName()
	if (byID == "") == (byName == "") {
		return nil, status.Error(codes.InvalidArgument, "one of disk_id and device_name is required")
	}
	if len(byID) > maxIDLen || len(byName) > maxIDLen {
		return nil, status.Errorf(codes.InvalidArgument, "disk_id or device_name longer than %d", maxIDLen)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if op := f.idempotent(ctx, MethodInstanceDetach); op != nil {
		return op, nil
	}
	in, err := f.instance(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	if byID != "" {
		if _, err := f.disk(byID); err != nil {
			return nil, err
		}
	}
	i := slices.IndexFunc(in.disks, func(a *compute.AttachedDisk) bool {
		return (byID != "" && a.DiskId == byID) || (byName != "" && a.DeviceName == byName)
	})
	if i < 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "disk %s%s is not attached to instance %s", byID, byName, in.id)
	}
	att := in.disks[i]
	d := f.disks[att.DiskId]
	// A busy disk is refused, as by every mutation; its status is not
	// checked (mutable's READY rule is the attach's and the other
	// mutations'): the API documents no refusal of a detach by status.
	if d.busy != nil {
		return nil, mutable(d)
	}
	return f.startOp(ctx, opSpec{
		method:      MethodInstanceDetach,
		description: "Detach disk",
		metadata:    &compute.DetachInstanceDiskMetadata{InstanceId: in.id, DiskId: att.DiskId},
		disk:        d,
		apply: func() (proto.Message, []effect) {
			in.disks = slices.DeleteFunc(in.disks, func(a *compute.AttachedDisk) bool { return a == att })
			d.pb.InstanceIds = nil
			var eff []effect
			if n := f.nodes[in.id]; n != nil {
				eff = append(eff, func(ctx context.Context) error { return n.detach(ctx, att.DiskId) })
			}
			return f.instancePB(in), eff
		},
	})
}
