package local

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// attached creates a disk attached to node-a.
func attached(t *testing.T, c *Cloud, size int64) cloud.Disk {
	t.Helper()
	if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	d := create(t, c, "pvc-1", size)
	if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	return d
}

// loopsOf returns the loop devices bound to a disk's image.
func loopsOf(t *testing.T, c *Cloud, id string) []loopdev.Device {
	t.Helper()
	devs, _, err := c.devicesOf(diskID(id))
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// After a restart (a new client, nothing in memory), the node finds the
// same loop device; and however many clients ask at once, a disk never gets
// a second one.
func TestDeviceIsFoundAgainNeverDuplicated(t *testing.T) {
	testutil.RequireRoot(t)
	dir := newDir(t)
	c := open(t, dir, Options{})
	d := attached(t, c, 64*mib)

	first, err := c.Host("node-a").DevicePath(context.Background(), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A restart of csid: a new client of the same directory.
	c = open(t, dir, Options{})
	again, err := c.Host("node-a").DevicePath(context.Background(), d.ID)
	if err != nil || again != first {
		t.Fatalf("after a restart: %q, %v; want %q", again, err, first)
	}

	// Several clients (each with its own flock, like processes) at once.
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range paths {
		client := open(t, dir, Options{})
		wg.Go(func() {
			paths[i], errs[i] = client.Host("node-a").DevicePath(context.Background(), d.ID)
		})
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != first {
			t.Fatalf("client %d: %q, %v; want %q", i, paths[i], errs[i], first)
		}
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 1 || devs[0].Path != first || devs[0].SizeBytes != 64*mib {
		t.Fatalf("loop devices of the disk: %+v, want exactly %s of 64 MiB", devs, first)
	}
	devices, err := c.Host("node-a").Devices(context.Background())
	if err != nil || len(devices) != 1 || devices[d.ID] != first {
		t.Fatalf("Devices = %v, %v; want {%s: %s}", devices, err, d.ID, first)
	}

	if _, err := c.DetachDisk(context.Background(), d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 0 {
		t.Fatalf("detach left %+v", devs)
	}
}

// A disk still in use on the node (mounted: an exclusive opener) is not
// yanked away: the detach fails with ErrTransient and the disk stays
// attached, with its device, until the node lets go.
func TestDetachRefusesADeviceInUse(t *testing.T) {
	testutil.RequireRoot(t)
	dir := newDir(t)
	c := open(t, dir, Options{})
	d := attached(t, c, 16*mib)
	dev, err := c.Host("node-a").DevicePath(context.Background(), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(dev, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DetachDisk(context.Background(), d.ID, "node-a")
	holder.Close()
	if !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("detach of a device in use: %v, want ErrTransient", err)
	}
	if got, _ := c.GetDisk(context.Background(), d.ID); got.AttachedTo != "node-a" {
		t.Fatalf("the refused detach detached: %+v", got)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 1 || devs[0].Path != dev {
		t.Fatalf("the refused detach touched the device: %+v", devs)
	}
	if _, err := c.DetachDisk(context.Background(), d.ID, "node-a"); err != nil {
		t.Fatalf("detach once the device is free: %v", err)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 0 {
		t.Fatalf("detach left %+v", devs)
	}
}

// A device left bound to a detached disk (a leak: someone ran losetup by
// hand) is reported by Devices, released before the disk grows (it would
// keep the old size), and replaced by DevicePath when its size is wrong.
func TestStaleDevicesAreReplaced(t *testing.T) {
	testutil.RequireRoot(t)
	dir := newDir(t)
	c := open(t, dir, Options{})
	d := create(t, c, "pvc-1", 16*mib)
	if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	leak := func() loopdev.Device {
		t.Helper()
		img, err := os.OpenFile(c.s.imagePath(diskID(d.ID)), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		dev, err := loopdev.Attach(context.Background(), img, loopdev.Options{SizeLimit: 8 * mib})
		if err != nil {
			t.Fatal(err)
		}
		return dev
	}

	leaked := leak()
	devices, err := c.Host("node-a").Devices(context.Background())
	if err != nil || devices[d.ID] != leaked.Path {
		t.Fatalf("Devices = %v, %v; want the leaked %s", devices, err, leaked.Path)
	}
	if _, err := c.ResizeDisk(context.Background(), d.ID, 32*mib); err != nil {
		t.Fatal(err)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 0 {
		t.Fatalf("the resize kept %+v", devs)
	}

	leaked = leak()
	if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	dev, err := c.Host("node-a").DevicePath(context.Background(), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	devs := loopsOf(t, c, d.ID)
	if len(devs) != 1 || devs[0].Path != dev || devs[0].SizeBytes != 32*mib {
		t.Fatalf("devices of the disk: %+v, want one of 32 MiB at %s (the leak was %s)", devs, dev, leaked.Path)
	}
}
