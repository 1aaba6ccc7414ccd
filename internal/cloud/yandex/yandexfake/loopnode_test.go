package yandexfake_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

func newLoopNode(t *testing.T, c *client, instanceID string) *yandexfake.LoopNode {
	t.Helper()
	addInstance(t, c, instanceID, "ru-central1-a", 0)
	n, err := yandexfake.NewLoopNode(c.fake, instanceID, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close loop node %s: %v", instanceID, err)
		}
	})
	return n
}

// device returns the loop device the by-id link of a disk names, checking
// that its backing file is the disk's image on that node.
func device(t *testing.T, n *yandexfake.LoopNode, diskID string) string {
	t.Helper()
	dev, err := os.Readlink(filepath.Join(n.ByIDDir(), "virtio-"+diskID))
	if err != nil {
		t.Fatalf("by-id link of %s: %v", diskID, err)
	}
	raw, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil {
		t.Fatalf("backing file of %s: %v", dev, err)
	}
	backing := strings.TrimSpace(string(raw))
	if backing != n.ImagePath(diskID) || filepath.Base(backing) != diskID {
		t.Fatalf("%s is backed by %s, want the image %s", dev, backing, n.ImagePath(diskID))
	}
	return dev
}

func deviceBytes(t *testing.T, dev string) int64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "size"))
	if err != nil {
		t.Fatal(err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return sectors * 512
}

// bound returns the loop devices bound to the image file at path.
func bound(t *testing.T, path string) []loopdev.Device {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := loopdev.IDOf(fi)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := loopdev.Find(id, func(b string) bool { return filepath.Base(b) == filepath.Base(path) })
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func rw(t *testing.T, dev string, write []byte) []byte {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const off = 1 << 20
	if write != nil {
		if _, err := f.WriteAt(write, off); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	buf := make([]byte, 16)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestLoopNode(t *testing.T) {
	testutil.RequireRoot(t)
	c := start(t, yandexfake.Options{})
	a := newLoopNode(t, c, "vm-a")
	b := newLoopNode(t, c, "vm-b")
	d := c.createDisk(t, &compute.CreateDiskRequest{Size: 16 << 20})

	c.attach(t, "vm-a", d.Id)
	dev := device(t, a, d.Id)
	if got := deviceBytes(t, dev); got != 16<<20 {
		t.Fatalf("device of %d bytes, disk of %d", got, 16<<20)
	}
	if a.Devices()[d.Id] != dev {
		t.Fatalf("Devices: %v", a.Devices())
	}
	data := []byte("written on vm-a!")
	rw(t, dev, data)

	c.detach(t, "vm-a", d.Id)
	if _, err := os.Lstat(filepath.Join(a.ByIDDir(), "virtio-"+d.Id)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("by-id link after detach: %v", err)
	}
	if devs := bound(t, a.ImagePath(d.Id)); len(devs) != 0 {
		t.Fatalf("image still bound after detach: %v", devs)
	}

	op, err := c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size"}}, Size: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, op)
	if fi, err := os.Stat(a.ImagePath(d.Id)); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("image after a grow: %v %v", fi, err)
	}

	c.attach(t, "vm-b", d.Id)
	dev = device(t, b, d.Id)
	if _, err := os.Stat(a.ImagePath(d.Id)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the image stayed on vm-a after the disk moved: %v", err)
	}
	if got := rw(t, dev, nil); !bytes.Equal(got, data) {
		t.Fatalf("data on vm-b %q, want %q", got, data)
	}
	if got := deviceBytes(t, dev); got != 32<<20 {
		t.Fatalf("device of %d bytes after the grow", got)
	}

	c.fake.SetGrowAttached(true)
	op, err = c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size"}}, Size: 48 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, op)
	if got := deviceBytes(t, dev); got != 48<<20 {
		t.Fatalf("device of %d bytes after an online grow", got)
	}

	c.detach(t, "vm-b", d.Id)
	op, err = c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, op)
	if _, err := os.Stat(b.ImagePath(d.Id)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("image after the disk's delete: %v", err)
	}
}

// TestLoopNodeDetachInUse: a disk detached while its device is held (as a
// mounted disk unplugged under a guest) is detached; the device goes when
// its user lets go.
func TestLoopNodeDetachInUse(t *testing.T) {
	testutil.RequireRoot(t)
	c := start(t, yandexfake.Options{})
	a := newLoopNode(t, c, "vm-a")
	d := c.createDisk(t, &compute.CreateDiskRequest{Size: 8 << 20})
	c.attach(t, "vm-a", d.Id)
	dev := device(t, a, d.Id)
	held, err := os.OpenFile(dev, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.detach(t, "vm-a", d.Id)
	if f := a.Forced(); len(f) != 1 || f[0] != d.Id {
		t.Fatalf("Forced: %v", f)
	}
	held.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(bound(t, a.ImagePath(d.Id))) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the device of a disk detached in use stayed bound after its user closed it")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
