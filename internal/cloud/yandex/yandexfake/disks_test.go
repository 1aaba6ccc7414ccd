package yandexfake_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func TestDiskLifecycle(t *testing.T) {
	c := start(t, yandexfake.Options{})
	op, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "pv-1",
		ZoneId: "ru-central1-a", Size: 2 << 30, TypeId: "network-ssd", Labels: map[string]string{"csid": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if op.Done {
		t.Fatal("Create answered a done operation; the API's are asynchronous")
	}
	var meta compute.CreateDiskMetadata
	if err := op.Metadata.UnmarshalTo(&meta); err != nil || meta.DiskId == "" {
		t.Fatalf("create metadata: %v %v", meta.DiskId, err)
	}
	if len(meta.DiskId) != 20 {
		t.Errorf("disk id %q: want 20 characters like the API's", meta.DiskId)
	}
	var d compute.Disk
	c.response(t, op, &d)
	if d.Id != meta.DiskId || d.Status != compute.Disk_READY || d.Size != 2<<30 || d.TypeId != "network-ssd" || d.Labels["csid"] != "yes" {
		t.Fatalf("created disk: %v", &d)
	}
	got, err := c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: d.Id})
	if err != nil || got.Name != "pv-1" {
		t.Fatalf("Get: %v %v", got, err)
	}

	_, err = c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "pv-1", ZoneId: "ru-central1-a", Size: 1 << 30})
	wantCode(t, "create with a name taken", err, codes.AlreadyExists)

	op, err = c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size", "labels"}},
		Size: 3 << 30, Labels: map[string]string{"other": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	c.response(t, op, &d)
	if d.Size != 3<<30 || len(d.Labels) != 1 || d.Labels["other"] != "x" {
		t.Fatalf("updated disk: %v", &d)
	}

	op, err = c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	if err != nil {
		t.Fatal(err)
	}
	if done := c.wait(t, op); done.GetError() != nil {
		t.Fatal(done.GetError())
	}
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: d.Id})
	wantCode(t, "get of a deleted disk", err, codes.NotFound)
}
