package yandexfake_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func TestHoldOperations(t *testing.T) {
	c := start(t, yandexfake.Options{})
	addInstance(t, c, "vm-a", "ru-central1-a", 0)
	c.fake.HoldOperations(yandexfake.MethodDiskCreate)
	op, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), ZoneId: "ru-central1-a", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	var meta compute.CreateDiskMetadata
	if err := op.Metadata.UnmarshalTo(&meta); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := c.ops.Get(c.ctx, &operation.GetOperationRequest{OperationId: op.Id})
		if err != nil || got.Done {
			t.Fatalf("held operation: done=%v err=%v", got.GetDone(), err)
		}
	}
	d, err := c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: meta.DiskId})
	if err != nil || d.Status != compute.Disk_CREATING {
		t.Fatalf("disk being created: %v %v", d, err)
	}
	_, err = c.inst.AttachDisk(c.ctx, attachReq("vm-a", meta.DiskId, meta.DiskId))
	wantCode(t, "attach of a disk being created", err, codes.FailedPrecondition)
	_, err = c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: meta.DiskId})
	wantCode(t, "delete of a disk being created", err, codes.FailedPrecondition)
	c.fake.ReleaseOperations()
	var done compute.Disk
	c.response(t, op, &done)
	if done.Status != compute.Disk_READY {
		t.Fatalf("disk created: %v", &done)
	}
}

func TestOperationDelay(t *testing.T) {
	const delay = 50 * time.Millisecond
	c := start(t, yandexfake.Options{OperationDelay: delay})
	op, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), ZoneId: "ru-central1-a", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	done := c.wait(t, op)
	if ran := done.ModifiedAt.AsTime().Sub(done.CreatedAt.AsTime()); ran < delay {
		t.Fatalf("operation done after %v, delay %v", ran, delay)
	}
	c.fake.SetOperationDelay(0)
	op, err = c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), ZoneId: "ru-central1-a", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if op.Done {
		t.Fatal("an operation answered done by the call that started it")
	}
	got, err := c.ops.Get(c.ctx, &operation.GetOperationRequest{OperationId: op.Id})
	if err != nil || !got.Done {
		t.Fatalf("without a delay an operation completes at the next call: done=%v err=%v", got.GetDone(), err)
	}
}

func TestFailOperations(t *testing.T) {
	c := start(t, yandexfake.Options{Quota: yandexfake.Quota{Disks: 1}})
	c.fake.FailOperations(yandexfake.MethodDiskCreate, codes.Internal, 1)
	op, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "x", ZoneId: "ru-central1-a", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	done := c.wait(t, op)
	if done.GetError() == nil || codes.Code(done.GetError().Code) != codes.Internal {
		t.Fatalf("operation result: %v", done.Result)
	}
	var meta compute.CreateDiskMetadata
	if err := op.Metadata.UnmarshalTo(&meta); err != nil {
		t.Fatal(err)
	}
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: meta.DiskId})
	wantCode(t, "the disk of a failed create", err, codes.NotFound)
	// Its name and quota are free again; the next create succeeds.
	c.createDisk(t, &compute.CreateDiskRequest{Name: "x"})
}

func TestIdempotencyKey(t *testing.T) {
	c := start(t, yandexfake.Options{})
	ctx := metadata.AppendToOutgoingContext(c.ctx, "idempotency-key", "11111111-2222-3333-4444-555555555555")
	req := &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "once", ZoneId: "ru-central1-a", Size: 1 << 30}
	first, err := c.disks.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, first)
	again, err := c.disks.Create(ctx, req)
	if err != nil || again.Id != first.Id {
		t.Fatalf("repeat with the same key: %v %v, want operation %s", again.GetId(), err, first.Id)
	}
	_, err = c.disks.Create(c.ctx, req)
	wantCode(t, "repeat without the key", err, codes.AlreadyExists)
}

func TestOperationGet(t *testing.T) {
	c := start(t, yandexfake.Options{})
	_, err := c.ops.Get(c.ctx, &operation.GetOperationRequest{OperationId: "fhonosuchop000000000"})
	wantCode(t, "an unknown operation", err, codes.NotFound)
	_, err = c.ops.Get(c.ctx, &operation.GetOperationRequest{})
	wantCode(t, "no operation id", err, codes.InvalidArgument)
	_, err = c.ops.Cancel(c.ctx, &operation.CancelOperationRequest{OperationId: "fhonosuchop000000000"})
	wantCode(t, "cancel", err, codes.Unimplemented)
}
