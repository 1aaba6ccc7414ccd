package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

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

	first, err := devicePath(context.Background(), c.Host("node-a"), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A restart of csid: a new client of the same directory.
	c = open(t, dir, Options{})
	again, err := devicePath(context.Background(), c.Host("node-a"), d.ID)
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
			paths[i], errs[i] = devicePath(context.Background(), client.Host("node-a"), d.ID)
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
	dev, err := devicePath(context.Background(), c.Host("node-a"), d.ID)
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
// keep the old size), and replaced by OpenDevice when its size is wrong.
func TestStaleDevicesAreReplaced(t *testing.T) {
	testutil.RequireRoot(t)
	dir := newDir(t)
	c := open(t, dir, Options{})
	d := create(t, c, "pvc-1", 16*mib)
	if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	// Its first attach makes its image.
	if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DetachDisk(context.Background(), d.ID, "node-a"); err != nil {
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
	dev, err := devicePath(context.Background(), c.Host("node-a"), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	devs := loopsOf(t, c, d.ID)
	if len(devs) != 1 || devs[0].Path != dev || devs[0].SizeBytes != 32*mib {
		t.Fatalf("devices of the disk: %+v, want one of 32 MiB at %s (the leak was %s)", devs, dev, leaked.Path)
	}
}

// devicePath opens the device of a disk, proven, and closes it again: the
// path of the device the disk has.
func devicePath(ctx context.Context, h *Host, diskID string) (string, error) {
	dev, err := h.OpenDevice(ctx, diskID, cloud.OpenOptions{})
	if err != nil {
		return "", err
	}
	return dev.Path, dev.Close()
}

// A disk's device stays that disk's while OpenDevice's caller holds it: a
// detach cannot release it (nor, so, give it to another disk). It waits
// for the holder and gives up with its context, and the disk stays
// attached; once the device is closed, the release completes. Held
// exclusively, the device makes the detach fail at once.
func TestAnOpenDeviceStaysTheDisks(t *testing.T) {
	testutil.RequireRoot(t)
	c := open(t, newDir(t), Options{})
	d := attached(t, c, 16*mib)
	h := c.Host("node-a")
	ctx := context.Background()

	dev, err := h.OpenDevice(ctx, d.ID, cloud.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = c.DetachDisk(short, d.ID, "node-a")
	cancel()
	if !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("detach of a device held open: %v, want ErrTransient", err)
	}
	if got, _ := c.GetDisk(ctx, d.ID); got.AttachedTo != "node-a" {
		t.Fatalf("the detach that could not release the device detached the disk: %+v", got)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 1 || devs[0].Path != dev.Path || !devs[0].AutoClear {
		t.Fatalf("loop devices of the disk while held: %+v, want %s, still bound, to be released", devs, dev.Path)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 0 {
		t.Fatalf("closed, the device is still bound: %+v", devs)
	}

	// The disk is still attached: it gets a device again, and held
	// exclusively, it is not released at all.
	dev, err = h.OpenDevice(ctx, d.ID, cloud.OpenOptions{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DetachDisk(ctx, d.ID, "node-a"); !errors.Is(err, cloud.ErrTransient) {
		t.Fatalf("detach of a device held exclusively: %v, want ErrTransient", err)
	}
	if devs := loopsOf(t, c, d.ID); len(devs) != 1 || devs[0].AutoClear {
		t.Fatalf("the refused detach touched the device: %+v", devs)
	}
	dev.Close()
	if _, err := c.DetachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.OpenDevice(ctx, d.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("OpenDevice of the detached disk: %v, want ErrNotFound", err)
	}
}

// An exclusive open of a device whose filesystem is mounted is ErrInUse,
// and a shared one is not; a hint that is no loop device is not trusted
// (one that is another disk's: the contract suite).
func TestOpenDeviceExclusiveAndHints(t *testing.T) {
	testutil.RequireRoot(t)
	c := open(t, newDir(t), Options{})
	d := attached(t, c, 16*mib)
	h := c.Host("node-a")
	ctx := context.Background()
	dev, err := h.OpenDevice(ctx, d.ID, cloud.OpenOptions{Hint: "/dev/null"})
	if err != nil {
		t.Fatal(err)
	}
	path := dev.Path
	dev.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", path).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	mnt := t.TempDir()
	if err := unix.Mount(path, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, 0)
	if _, err := h.OpenDevice(ctx, d.ID, cloud.OpenOptions{Exclusive: true}); !errors.Is(err, cloud.ErrInUse) {
		t.Fatalf("exclusive OpenDevice of a mounted device: %v, want ErrInUse", err)
	}
	shared, err := h.OpenDevice(ctx, d.ID, cloud.OpenOptions{Hint: path})
	if err != nil || shared.Path != path {
		t.Fatalf("OpenDevice of a mounted device: %+v, %v; want %s", shared, err, path)
	}
	shared.Close()
}

// BenchmarkOpenDevice is what proving a device costs a node op: with the
// record's device as a hint (a publish, an expansion), and without (a
// stage: the device is looked up under the state directory's lock).
func BenchmarkOpenDevice(b *testing.B) {
	testutil.RequireRoot(b)
	dir := b.TempDir()
	c, err := Open(context.Background(), dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
		b.Fatal(err)
	}
	op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "bench", SizeBytes: 16 * mib})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.AttachDisk(context.Background(), op.DiskID, "node-a"); err != nil {
		b.Fatal(err)
	}
	h := c.Host("node-a")
	defer func() {
		if _, err := c.DetachDisk(context.Background(), op.DiskID, "node-a"); err != nil {
			b.Error(err)
		}
	}()
	path, err := devicePath(context.Background(), h, op.DiskID)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts cloud.OpenOptions
	}{{"hint", cloud.OpenOptions{Hint: path}}, {"lookup", cloud.OpenOptions{}}, {"hint-exclusive", cloud.OpenOptions{Hint: path, Exclusive: true}}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				dev, err := h.OpenDevice(context.Background(), op.DiskID, bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				dev.Close()
			}
		})
	}
}
