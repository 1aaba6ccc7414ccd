package yandex

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// The API's refusal to grow an attached disk is ErrAttached (csid's queue),
// never an untyped error (Internal): whether the call itself is refused
// (the disk attached since csid looked) or the operation fails.
func TestAttachedGrowRefusalIsErrAttached(t *testing.T) {
	f, keyFile := StartFake(t, yandexfake.Options{})
	zone := f.Zones()[0]
	if err := f.AddInstance("node-a", zone, 0); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := Open(t, FakeOptions(f, keyFile))
	do := cloudtest.Done(t, c)
	d := do(c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-1", SizeBytes: 1 << 30}))

	// The grow's operation fails with FailedPrecondition, the disk detached:
	// busy, worth another try.
	f.FailOperations(yandexfake.MethodDiskUpdate, codes.FailedPrecondition, 2)
	op, err := c.ResizeDisk(ctx, d.ID, 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); !errors.Is(err, cloud.ErrTransient) || errors.Is(err, cloud.ErrAttached) {
		t.Fatalf("a grow operation failed with FailedPrecondition, the disk detached: %v, want ErrTransient", err)
	}
	// Again, and the disk attached by the time csid reads the failure: the
	// queue's error.
	op, err = c.ResizeDisk(ctx, d.ID, 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	do(c.AttachDisk(ctx, d.ID, "node-a")) // the failed grow has ended: the attach may start
	if _, err := c.WaitOperation(ctx, op.ID); !errors.Is(err, cloud.ErrAttached) {
		t.Fatalf("a grow operation failed with FailedPrecondition, the disk attached: %v, want ErrAttached", err)
	}

	// The call refused, and the disk found attached when csid looks again.
	refusal := apiError(status.Error(codes.FailedPrecondition, "disk is attached to a running instance"), "grow")
	if err := c.refused(ctx, refusal, d.ID); !errors.Is(err, cloud.ErrAttached) {
		t.Fatalf("a grow refused with the disk attached: %v, want ErrAttached", err)
	}
	// Refused while detached: busy, worth another try, not the queue.
	do(c.DetachDisk(ctx, d.ID, "node-a"))
	if err := c.refused(ctx, refusal, d.ID); !errors.Is(err, cloud.ErrTransient) || errors.Is(err, cloud.ErrAttached) {
		t.Fatalf("a grow refused with the disk detached: %v, want ErrTransient", err)
	}
}

// A label change is allowed on an attached disk (a deferred expand records
// its target there): its operation failing is busy, worth another try,
// never ErrAttached, though its metadata is a grow's too.
func TestFailedLabelUpdateOfAttachedDiskIsTransient(t *testing.T) {
	f, keyFile := StartFake(t, yandexfake.Options{})
	if err := f.AddInstance("node-a", f.Zones()[0], 0); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := Open(t, FakeOptions(f, keyFile))
	do := cloudtest.Done(t, c)
	d := do(c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-1", SizeBytes: 1 << 30}))
	do(c.AttachDisk(ctx, d.ID, "node-a"))

	f.FailOperations(yandexfake.MethodDiskUpdate, codes.FailedPrecondition, 1)
	op, err := c.UpdateDiskTags(ctx, d.ID, map[string]string{"csid.dev/resize-to": "2147483648"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); !errors.Is(err, cloud.ErrTransient) || errors.Is(err, cloud.ErrAttached) {
		t.Fatalf("a label update of an attached disk failed with FailedPrecondition: %v, want ErrTransient", err)
	}
	// Tried again (a second UpdateDiskTags, a new operation id): it succeeds on
	// the attached disk, and its wait reads the labels set.
	op, err = c.UpdateDiskTags(ctx, d.ID, map[string]string{"csid.dev/resize-to": "2147483648"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.WaitOperation(ctx, op.ID); err != nil || got.Tags["csid.dev/resize-to"] != "2147483648" {
		t.Fatalf("a label update of an attached disk: %+v, %v", got, err)
	}
}
