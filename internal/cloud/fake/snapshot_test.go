package fake_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/fake"
)

// A held snapshot is reported not ready, is joined by a repeat call, and
// can be neither restored nor deleted until it is taken; the disk stays
// free for other changes meanwhile.
func TestHeldSnapshotIsNotReady(t *testing.T) {
	c, d := newCloud(t)
	ctx := context.Background()
	release := c.Hold(cloud.OpSnapshot)
	defer release()
	spec := cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID}
	op, err := c.CreateSnapshot(ctx, spec)
	if err != nil || op.Done || op.SnapshotID == "" || op.Kind != cloud.OpSnapshot || op.DiskID != d.ID {
		t.Fatalf("CreateSnapshot = %+v, %v; want an operation in flight naming the snapshot", op, err)
	}
	s, err := c.GetSnapshot(ctx, op.SnapshotID)
	if err != nil || s.Ready || s.SourceDiskID != d.ID || s.SizeBytes != d.SizeBytes {
		t.Fatalf("GetSnapshot while held = %+v, %v; want it reported, not ready", s, err)
	}
	if again, err := c.CreateSnapshot(ctx, spec); err != nil || again.ID != op.ID {
		t.Fatalf("repeat CreateSnapshot = %+v, %v; want to join %s", again, err, op.ID)
	}
	if _, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: "restore", SizeBytes: gib, Source: &cloud.DiskSource{SnapshotID: s.ID}}); !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("restore of a snapshot being taken: %v, want ErrTransient", err)
	}
	if _, err := c.DeleteSnapshot(ctx, s.ID); !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("delete of a snapshot being taken: %v, want ErrTransient (busy)", err)
	}
	// The disk is not busy: a snapshot does not hold it.
	cloudtest.Done(t, c)(c.ResizeDisk(ctx, d.ID, 2*gib))
	release()
	cloudtest.Done(t, c)(op, nil)
	if s, err := c.GetSnapshot(ctx, op.SnapshotID); err != nil || !s.Ready || s.SizeBytes != gib {
		t.Fatalf("GetSnapshot after release = %+v, %v; want ready, of the size at the call", s, err)
	}
}

// The snapshot holds the content at the call, not at completion; a clone
// of a disk holds the disk's content at its call; beyond the source's size
// a larger disk reads as zeros.
func TestSnapshotCopiesContentAtTheCall(t *testing.T) {
	c, d := newCloud(t)
	ctx := context.Background()
	before := []byte("before the snapshot")
	if err := c.WriteDisk(d.ID, gib-4, []byte("tail")); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteDisk(d.ID, 4090, before); err != nil { // across a block boundary
		t.Fatal(err)
	}
	release := c.Hold(cloud.OpSnapshot)
	op, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteDisk(d.ID, 4090, []byte("after the snapshot!")); err != nil {
		t.Fatal(err)
	}
	release()
	cloudtest.Done(t, c)(op, nil)
	restored := cloudtest.Done(t, c)(c.CreateDisk(ctx, cloud.DiskSpec{Name: "restore", SizeBytes: 2 * gib, Source: &cloud.DiskSource{SnapshotID: op.SnapshotID}}))
	if restored.Source == nil || restored.Source.SnapshotID != op.SnapshotID {
		t.Fatalf("restored disk reports source %+v", restored.Source)
	}
	read := func(id string, off int64, n int) []byte {
		t.Helper()
		b, err := c.ReadDisk(id, off, n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := read(restored.ID, 4090, len(before)); !bytes.Equal(got, before) {
		t.Fatalf("restored disk holds %q, want %q", got, before)
	}
	if got := read(restored.ID, gib-4, 8); !bytes.Equal(got, []byte("tail\x00\x00\x00\x00")) {
		t.Fatalf("restored disk's tail %q, want the source's then zeros", got)
	}
	clone := cloudtest.Done(t, c)(c.CreateDisk(ctx, cloud.DiskSpec{Name: "clone", SizeBytes: gib, Source: &cloud.DiskSource{DiskID: d.ID}}))
	if got := read(clone.ID, 4090, 19); string(got) != "after the snapshot!" {
		t.Fatalf("clone holds %q, want the disk's content at the call", got)
	}
	// Writes to the clone do not reach its source.
	if err := c.WriteDisk(clone.ID, 4090, []byte("clone")); err != nil {
		t.Fatal(err)
	}
	if got := read(d.ID, 4090, 5); string(got) != "after" {
		t.Fatalf("a write to the clone changed the source: %q", got)
	}
	if err := c.WriteDisk(d.ID, gib-2, []byte("abc")); !errors.Is(err, cloud.ErrInvalid) {
		t.Fatalf("write past the end: %v, want ErrInvalid", err)
	}
}

func TestSnapshotFailOperationsChangeNothing(t *testing.T) {
	c, d := newCloud(t)
	ctx := context.Background()
	boom := fmt.Errorf("backend lost it: %w", cloud.ErrTransient)
	c.FailOperations(cloud.OpSnapshot, 1, boom)
	op, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
	if err != nil {
		t.Fatalf("the call itself must succeed: %v", err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); !errors.Is(err, boom) {
		t.Fatalf("wait: %v, want the injected error", err)
	}
	if _, err := c.GetSnapshot(ctx, op.SnapshotID); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("the failed snapshot is still there: %v", err)
	}
	cloudtest.Done(t, c)(c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID}))
	page, err := c.ListSnapshots(ctx, cloud.SnapshotListOptions{})
	if err != nil || len(page.Snapshots) != 1 || page.Snapshots[0].ID == op.SnapshotID {
		t.Fatalf("after a failed snapshot and a retry: %+v, %v; want one new snapshot", page, err)
	}
	c.FailOperations(cloud.OpDeleteSnapshot, 1, boom)
	del, err := c.DeleteSnapshot(ctx, page.Snapshots[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, del.ID); !errors.Is(err, boom) {
		t.Fatalf("wait on the delete: %v, want the injected error", err)
	}
	if _, err := c.GetSnapshot(ctx, page.Snapshots[0].ID); err != nil {
		t.Fatalf("a failed delete removed the snapshot: %v", err)
	}
}

func TestSnapshotDroppedReplyIsRecoveredByRepeating(t *testing.T) {
	c, d := newCloud(t)
	ctx := context.Background()
	lost := fmt.Errorf("connection reset: %w", cloud.ErrTransient)
	c.DropReplies(cloud.OpSnapshot, 1, lost)
	spec := cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID}
	if _, err := c.CreateSnapshot(ctx, spec); !errors.Is(err, lost) {
		t.Fatalf("CreateSnapshot: %v, want the lost reply", err)
	}
	op, err := c.CreateSnapshot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	cloudtest.Done(t, c)(op, nil)
	page, err := c.ListSnapshots(ctx, cloud.SnapshotListOptions{})
	if err != nil || len(page.Snapshots) != 1 || page.Snapshots[0].ID != op.SnapshotID || !page.Snapshots[0].Ready {
		t.Fatalf("ListSnapshots = %+v, %v; want only %s (taken once)", page, err, op.SnapshotID)
	}
}

func TestSnapshotFailCalls(t *testing.T) {
	c, d := newCloud(t)
	ctx := context.Background()
	boom := fmt.Errorf("throttled: %w", cloud.ErrTransient)
	c.FailCalls(cloud.OpSnapshot, 1, cloud.ErrNotSupported)
	if _, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID}); !errors.Is(err, cloud.ErrNotSupported) {
		t.Fatalf("CreateSnapshot: %v, want the injected ErrNotSupported", err)
	}
	sop, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []cloud.OpKind{fake.KindGetSnapshot, fake.KindListSnapshots, cloud.OpDeleteSnapshot} {
		c.FailCalls(kind, 1, boom)
	}
	if _, err := c.GetSnapshot(ctx, sop.SnapshotID); !errors.Is(err, boom) {
		t.Errorf("GetSnapshot: %v, want the injected error", err)
	}
	if _, err := c.ListSnapshots(ctx, cloud.SnapshotListOptions{}); !errors.Is(err, boom) {
		t.Errorf("ListSnapshots: %v, want the injected error", err)
	}
	if _, err := c.DeleteSnapshot(ctx, sop.SnapshotID); !errors.Is(err, boom) {
		t.Errorf("DeleteSnapshot: %v, want the injected error", err)
	}
	if s, err := c.GetSnapshot(ctx, sop.SnapshotID); err != nil || !s.Ready {
		t.Fatalf("the refused calls changed the snapshot: %+v, %v", s, err)
	}
	var logged int
	for _, call := range c.Calls() {
		if call.SnapshotID == sop.SnapshotID {
			logged++
		}
	}
	if logged < 4 {
		t.Fatalf("%d calls about %s in the log, want at least 4:\n%+v", logged, sop.SnapshotID, c.Calls())
	}
}
