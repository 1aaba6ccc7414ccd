package yandexfake_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// TestCloseLeaksNothing: Close ends a call held by latency at once and
// leaves no goroutine of the fake behind.
func TestCloseLeaksNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		c := start(t, yandexfake.Options{})
		c.fake.SetLatency(yandexfake.MethodZoneList, time.Hour)
		c.fake.MetadataServer("vm-1", "ru-central1-a", c.fake.FolderID())
		errc := make(chan error, 1)
		go func() {
			_, err := c.zones.List(c.ctx, &compute.ListZonesRequest{})
			errc <- err
		}()
		for len(c.fake.Calls(yandexfake.MethodZoneList)) == 0 {
			runtime.Gosched()
		}
		c.fake.Close()
		c.fake.Close() // twice is fine
		select {
		case err := <-errc:
			if code := status.Code(err); code != codes.Unavailable && code != codes.Canceled {
				t.Errorf("a call in flight at Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call held by latency outlived Close")
		}
		c.conn.Close()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentUse: many clients creating, attaching, detaching and
// deleting at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	c := start(t, yandexfake.Options{})
	const n = 8
	for i := range n {
		addInstance(t, c, fmt.Sprintf("vm-%d", i), "ru-central1-a", 0)
	}
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- lifecycle(c, fmt.Sprintf("vm-%d", i)) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	list, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID()})
	if err != nil || len(list.Disks) != 0 {
		t.Fatalf("disks left: %v %v", list, err)
	}
}

// lifecycle creates a disk, attaches it to vm, detaches and deletes it.
func lifecycle(c *client, vm string) error {
	done := func(op *operation.Operation, err error) (*operation.Operation, error) {
		for err == nil && !op.Done {
			op, err = c.ops.Get(c.ctx, &operation.GetOperationRequest{OperationId: op.Id})
		}
		if err == nil && op.GetError() != nil {
			err = status.ErrorProto(op.GetError())
		}
		return op, err
	}
	op, err := done(c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), ZoneId: "ru-central1-a", Size: 1 << 30}))
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	var d compute.Disk
	if err := op.GetResponse().UnmarshalTo(&d); err != nil {
		return err
	}
	if _, err := done(c.inst.AttachDisk(c.ctx, attachReq(vm, d.Id, d.Id))); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	if _, err := done(c.inst.DetachDisk(c.ctx, &compute.DetachInstanceDiskRequest{InstanceId: vm,
		Disk: &compute.DetachInstanceDiskRequest_DiskId{DiskId: d.Id}})); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	if _, err := done(c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}
