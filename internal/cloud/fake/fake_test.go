package fake_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/fake"
)

const gib = int64(1) << 30

var allKinds = []cloud.OpKind{cloud.OpCreate, cloud.OpDelete, cloud.OpAttach, cloud.OpDetach, cloud.OpResize, cloud.OpTag, cloud.OpSnapshot, cloud.OpDeleteSnapshot}

func provider(latency time.Duration) func(t *testing.T) cloudtest.Provider {
	return func(t *testing.T) cloudtest.Provider {
		c := fake.New(fake.Options{Zones: []string{"zone-a", "zone-b"}, CapacityBytes: 1 << 40})
		for _, k := range allKinds {
			c.SetLatency(k, latency)
		}
		return cloudtest.Provider{
			Cloud:  c,
			Reopen: func(*testing.T) cloud.Cloud { return c }, // the state is the provider's, not the client's
			Host:   func(_ *testing.T, node string) cloud.Host { return c.Host(node) },
			WriteDisk: func(t *testing.T, id string, off int64, data []byte) {
				if err := c.WriteDisk(id, off, data); err != nil {
					t.Fatal(err)
				}
			},
			ReadDisk: func(t *testing.T, id string, off int64, n int) []byte {
				b, err := c.ReadDisk(id, off, n)
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
		}
	}
}

func TestContract(t *testing.T) {
	cloudtest.Run(t, provider(0))
}

// With latency, every operation is still in flight when its call returns:
// the contract holds for callers that wait, and for resumed waits.
func TestContractWithLatency(t *testing.T) {
	cloudtest.Run(t, provider(2*time.Millisecond))
}

func newCloud(t *testing.T) (*fake.Cloud, cloud.Disk) {
	t.Helper()
	c := fake.New(fake.Options{})
	if err := c.AddNode(cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	d := cloudtest.Done(t, c)(c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}))
	return c, d
}

func TestIDsAreDeterministic(t *testing.T) {
	a, da := newCloud(t)
	b, db := newCloud(t)
	if da.ID != db.ID || da.ID != "disk-0000000000000001" {
		t.Fatalf("first disks %s and %s, want disk-0000000000000001 twice", da.ID, db.ID)
	}
	if a.Calls()[0].OpID != b.Calls()[0].OpID {
		t.Fatal("operation ids differ between two identical runs")
	}
}

// The proof the engine needs: an attach that starts while a resize runs is
// refused, and the call log shows no attach began before the resize ended.
func TestHoldShowsOperationOrder(t *testing.T) {
	c, d := newCloud(t)
	release := c.Hold(cloud.OpResize)
	defer release()

	resize, err := c.ResizeDisk(context.Background(), d.ID, 2*gib)
	if err != nil {
		t.Fatal(err)
	}
	// Held: not finished, so a wait gives up with its context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.WaitOperation(ctx, resize.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on a held resize: %v, want context.Canceled", err)
	}
	if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("attach during a resize: %v, want ErrTransient (busy)", err)
	}
	// The same resize again joins the one in flight.
	again, err := c.ResizeDisk(context.Background(), d.ID, 2*gib)
	if err != nil || again.ID != resize.ID {
		t.Fatalf("repeat resize = %+v, %v; want to join %s", again, err, resize.ID)
	}
	if got, _ := c.GetDisk(context.Background(), d.ID); got.SizeBytes != gib {
		t.Fatalf("size changed before the resize finished: %+v", got)
	}

	release()
	if got := cloudtest.Done(t, c)(resize, nil); got.SizeBytes != 2*gib {
		t.Fatalf("resize left %+v", got)
	}
	cloudtest.Done(t, c)(c.AttachDisk(context.Background(), d.ID, "node-a"))

	var resizeEnd time.Time
	attaches := 0
	for _, call := range c.Calls() {
		switch {
		case call.OpID == resize.ID:
			if call.End.IsZero() {
				t.Fatalf("resize call %+v has no end", call)
			}
			resizeEnd = call.End
		case call.Method == "AttachDisk" && call.Err == nil:
			attaches++
			if resizeEnd.IsZero() || call.Start.Before(resizeEnd) {
				t.Fatalf("attach %+v started before the resize ended (%v)", call, resizeEnd)
			}
		}
	}
	if attaches != 1 {
		t.Fatalf("%d successful attaches in the log, want 1:\n%v", attaches, c.Calls())
	}
}

func TestLatencyDelaysCompletion(t *testing.T) {
	c, d := newCloud(t)
	const lat = 5 * time.Millisecond
	c.SetLatency(cloud.OpAttach, lat)
	cloudtest.Done(t, c)(c.AttachDisk(context.Background(), d.ID, "node-a"))
	calls := c.Calls()
	last := calls[len(calls)-1]
	if last.Method != "AttachDisk" || last.End.Sub(last.Start) < lat {
		t.Fatalf("attach call %+v finished sooner than its latency %v", last, lat)
	}
}

func TestFailCalls(t *testing.T) {
	c, d := newCloud(t)
	boom := fmt.Errorf("throttled: %w", cloud.ErrTransient)
	c.FailCalls(cloud.OpAttach, 2, boom)
	for i := range 2 {
		if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); !errors.Is(err, boom) {
			t.Fatalf("attach %d: %v, want the injected error", i, err)
		}
	}
	if got, _ := c.GetDisk(context.Background(), d.ID); got.AttachedTo != "" {
		t.Fatalf("a failed call attached the disk: %+v", got)
	}
	if got := cloudtest.Done(t, c)(c.AttachDisk(context.Background(), d.ID, "node-a")); got.AttachedTo != "node-a" {
		t.Fatalf("third attach: %+v", got)
	}
	c.FailCalls(fake.KindGetDisk, 1, boom)
	if _, err := c.GetDisk(context.Background(), d.ID); !errors.Is(err, boom) {
		t.Fatalf("GetDisk: %v, want the injected error", err)
	}
}

func TestFailOperationsChangeNothing(t *testing.T) {
	c := fake.New(fake.Options{CapacityBytes: 4 * gib})
	boom := fmt.Errorf("backend lost it: %w", cloud.ErrTransient)
	c.FailOperations(cloud.OpCreate, 1, boom)
	op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib})
	if err != nil {
		t.Fatalf("the call itself must succeed: %v", err)
	}
	if _, err := c.WaitOperation(context.Background(), op.ID); !errors.Is(err, boom) {
		t.Fatalf("wait: %v, want the injected error", err)
	}
	if _, err := c.GetDisk(context.Background(), op.DiskID); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("the failed create left a disk: %v", err)
	}
	if free, _ := c.Capacity(context.Background(), ""); free != 4*gib {
		t.Fatalf("the failed create kept its reservation: %d free", free)
	}
	// The name is free: a retry creates the disk.
	d := cloudtest.Done(t, c)(c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}))
	if d.ID == op.DiskID {
		t.Fatalf("the retry reused the failed disk's id %s", d.ID)
	}
}

func TestDroppedReplyIsRecoveredByRepeating(t *testing.T) {
	c := fake.New(fake.Options{})
	lost := fmt.Errorf("connection reset: %w", cloud.ErrTransient)
	c.DropReplies(cloud.OpCreate, 1, lost)
	if _, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}); !errors.Is(err, lost) {
		t.Fatalf("create: %v, want the lost reply", err)
	}
	d := cloudtest.Done(t, c)(c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}))
	page, err := c.ListDisks(context.Background(), cloud.ListOptions{})
	if err != nil || len(page.Disks) != 1 || page.Disks[0].ID != d.ID {
		t.Fatalf("ListDisks = %+v, %v; want only %s (the create happened once)", page, err, d.ID)
	}
}

func TestZones(t *testing.T) {
	c := fake.New(fake.Options{Zones: []string{"zone-a", "zone-b"}})
	if err := c.AddNode(cloud.Node{ID: "node-b", Zone: "zone-b"}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddNode(cloud.Node{ID: "node-x", Zone: "zone-x"}); !errors.Is(err, cloud.ErrInvalid) {
		t.Fatalf("node in an unknown zone: %v, want ErrInvalid", err)
	}
	d := cloudtest.Done(t, c)(c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}))
	if d.Zone != "zone-a" {
		t.Fatalf("default zone %q, want zone-a", d.Zone)
	}
	if _, err := c.AttachDisk(context.Background(), d.ID, "node-b"); !errors.Is(err, cloud.ErrInvalid) {
		t.Fatalf("attach across zones: %v, want ErrInvalid", err)
	}
	db := cloudtest.Done(t, c)(c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-2", SizeBytes: gib, Zone: "zone-b"}))
	cloudtest.Done(t, c)(c.AttachDisk(context.Background(), db.ID, "node-b"))
}

func TestHostDevicesAreStable(t *testing.T) {
	c, d := newCloud(t)
	h := c.Host("node-a")
	cloudtest.Done(t, c)(c.AttachDisk(context.Background(), d.ID, "node-a"))
	d1, err := h.OpenDevice(context.Background(), d.ID, cloud.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := c.Host("node-a").OpenDevice(context.Background(), d.ID, cloud.OpenOptions{Hint: "/dev/elsewhere"})
	if d1.Path != fake.DevicePrefix+d.ID || d1.Path != d2.Path || d1.Number != d2.Number || d2.Disk.ID != d.ID {
		t.Fatalf("devices %+v and %+v, want %q of %s", d1, d2, fake.DevicePrefix+d.ID, d.ID)
	}
}

// Many callers at once: run with -race; the final state must add up.
func TestConcurrentUse(t *testing.T) {
	c := fake.New(fake.Options{})
	c.SetLatency(cloud.OpAttach, time.Millisecond)
	const workers = 8
	for i := range workers {
		if err := c.AddNode(cloud.Node{ID: fmt.Sprintf("node-%d", i), MaxAttachments: 2}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		wg.Go(func() {
			ctx := context.Background()
			node := fmt.Sprintf("node-%d", i)
			for j := range 20 {
				op, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: fmt.Sprintf("pvc-%d", j%5), SizeBytes: gib})
				if err != nil {
					errs <- err
					return
				}
				d, err := c.WaitOperation(ctx, op.ID)
				if err != nil {
					errs <- err
					return
				}
				// Several workers race for one disk: one wins, the
				// others see it attached or busy.
				if op, err := c.AttachDisk(ctx, d.ID, node); err == nil {
					if _, err := c.WaitOperation(ctx, op.ID); err != nil {
						errs <- err
						return
					}
					if op, err := c.DetachDisk(ctx, d.ID, node); err == nil {
						_, _ = c.WaitOperation(ctx, op.ID)
					}
				} else if !errors.Is(err, cloud.ErrAttached) && !errors.Is(err, cloud.ErrTransient) {
					errs <- err
					return
				}
				_, _ = c.ListDisks(ctx, cloud.ListOptions{MaxResults: 2})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	page, err := c.ListDisks(context.Background(), cloud.ListOptions{})
	if err != nil || len(page.Disks) != 5 {
		t.Fatalf("ListDisks = %d disks, %v; want 5 (one per name):\n%s", len(page.Disks), err, c)
	}
}
