package yandexfake_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func addInstance(t *testing.T, c *client, id, zone string, maxDisks int) {
	t.Helper()
	if err := c.fake.AddInstance(id, zone, maxDisks); err != nil {
		t.Fatal(err)
	}
}

func attachReq(instanceID, diskID, device string) *compute.AttachInstanceDiskRequest {
	return &compute.AttachInstanceDiskRequest{InstanceId: instanceID, AttachedDiskSpec: &compute.AttachedDiskSpec{
		DeviceName: device, Disk: &compute.AttachedDiskSpec_DiskId{DiskId: diskID}}}
}

func TestAttachDetach(t *testing.T) {
	c := start(t, yandexfake.Options{})
	addInstance(t, c, "vm-a", "ru-central1-a", 2)
	addInstance(t, c, "vm-b", "ru-central1-a", 2)
	addInstance(t, c, "vm-far", "ru-central1-b", 2)
	d1 := c.createDisk(t, &compute.CreateDiskRequest{Name: "one"})
	d2 := c.createDisk(t, &compute.CreateDiskRequest{Name: "two"})
	d3 := c.createDisk(t, &compute.CreateDiskRequest{Name: "three"})

	in := c.attach(t, "vm-a", d1.Id)
	if len(in.SecondaryDisks) != 1 || in.SecondaryDisks[0].DiskId != d1.Id || in.SecondaryDisks[0].DeviceName != d1.Id ||
		in.SecondaryDisks[0].Mode != compute.AttachedDisk_READ_WRITE {
		t.Fatalf("instance after attach: %v", in.SecondaryDisks)
	}
	got, err := c.inst.Get(c.ctx, &compute.GetInstanceRequest{InstanceId: "vm-a"})
	if err != nil || len(got.SecondaryDisks) != 1 || got.ZoneId != "ru-central1-a" {
		t.Fatalf("Get instance: %v %v", got, err)
	}
	disk, err := c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: d1.Id})
	if err != nil || len(disk.InstanceIds) != 1 || disk.InstanceIds[0] != "vm-a" {
		t.Fatalf("disk after attach: %v %v", disk, err)
	}

	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-b", d1.Id, d1.Id))
	wantCode(t, "attach of a disk attached elsewhere", err, codes.FailedPrecondition)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", d1.Id, d1.Id))
	wantCode(t, "attach of a disk attached here", err, codes.FailedPrecondition)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-far", d2.Id, d2.Id))
	wantCode(t, "attach to an instance of another zone", err, codes.FailedPrecondition)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", d2.Id, d1.Id))
	wantCode(t, "attach under a device name taken", err, codes.FailedPrecondition)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", d2.Id, "Bad_Name"))
	wantCode(t, "attach under a malformed device name", err, codes.InvalidArgument)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-nope", d2.Id, d2.Id))
	wantCode(t, "attach to an unknown instance", err, codes.NotFound)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", "fhmnosuchdisk0000000", "x"))
	wantCode(t, "attach of an unknown disk", err, codes.NotFound)

	c.attach(t, "vm-a", d2.Id)
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", d3.Id, d3.Id))
	wantCode(t, "attach to a full instance", err, codes.ResourceExhausted)
	if s := quotaSubject(err); s != yandexfake.QuotaInstanceDisks {
		t.Fatalf("full instance: quota subject %q, want %q", s, yandexfake.QuotaInstanceDisks)
	}

	// Detach by device name.
	op, err := c.inst.DetachDisk(c.ctx, &compute.DetachInstanceDiskRequest{InstanceId: "vm-a",
		Disk: &compute.DetachInstanceDiskRequest_DeviceName{DeviceName: d2.Id}})
	if err != nil {
		t.Fatal(err)
	}
	c.response(t, op, in)
	if len(in.SecondaryDisks) != 1 || in.SecondaryDisks[0].DiskId != d1.Id {
		t.Fatalf("instance after detach by device name: %v", in.SecondaryDisks)
	}
	_, err = c.inst.DetachDisk(c.ctx, &compute.DetachInstanceDiskRequest{InstanceId: "vm-a",
		Disk: &compute.DetachInstanceDiskRequest_DiskId{DiskId: d2.Id}})
	wantCode(t, "detach of a disk not attached", err, codes.FailedPrecondition)
	in = c.detach(t, "vm-a", d1.Id)
	if len(in.SecondaryDisks) != 0 {
		t.Fatalf("instance after detach: %v", in.SecondaryDisks)
	}
	c.attach(t, "vm-b", d1.Id)
}

func TestZones(t *testing.T) {
	c := start(t, yandexfake.Options{Zones: []string{"ru-central1-a", "ru-central1-d"}})
	resp, err := c.zones.List(c.ctx, &compute.ListZonesRequest{})
	if err != nil || len(resp.Zones) != 2 || resp.Zones[1].Id != "ru-central1-d" || resp.Zones[1].RegionId != "ru-central1" {
		t.Fatalf("zones: %v %v", resp, err)
	}
	_, err = c.zones.Get(c.ctx, &compute.GetZoneRequest{ZoneId: "ru-central1-b"})
	wantCode(t, "an unknown zone", err, codes.NotFound)
}
