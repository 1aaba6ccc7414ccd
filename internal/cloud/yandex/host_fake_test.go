package yandex

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
	"github.com/csid-dev/csid/internal/testutil"
)

// The host against the fake API, through the backend: disks created,
// attached and detached by the API, appearing on the instance as the fake's
// loop node makes them (a loop device of the disk's image, linked from its
// by-id directory as virtio-<disk id>).
func TestHostOnTheFakeAPI(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	f, keyFile := StartFake(t, yandexfake.Options{Zones: []string{"ru-central1-a"}})
	dir := t.TempDir()
	if err := f.AddInstance(testInstance, "ru-central1-a", 4); err != nil {
		t.Fatal(err)
	}
	node, err := yandexfake.NewLoopNode(f, testInstance, filepath.Join(dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	c := Open(t, FakeOptions(f, keyFile))
	h := NewHost(HostOptions{InstanceID: testInstance, Cloud: c, ByIDDir: node.ByIDDir(), Serial: LoopSerial, DeviceWait: time.Minute})
	wait := cloudtest.Done(t, c)

	a := wait(c.CreateDisk(ctx, cloud.DiskSpec{Name: "a", SizeBytes: 1 << 30, Tags: map[string]string{"csid.dev/volume-id": "vol-a"}}))
	b := wait(c.CreateDisk(ctx, cloud.DiskSpec{Name: "b", SizeBytes: 1 << 30}))
	if _, err := h.OpenDevice(ctx, a.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("a disk not attached: %v, want ErrNotFound", err)
	}
	wait(c.AttachDisk(ctx, a.ID, testInstance))
	wait(c.AttachDisk(ctx, b.ID, testInstance))
	dev, err := h.OpenDevice(ctx, a.ID, cloud.OpenOptions{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := node.Devices()[a.ID]; dev.Path != want || dev.Disk.Tags["csid.dev/volume-id"] != "vol-a" {
		t.Fatalf("disk a opened as %+v, want %s with its tags", dev, want)
	}
	dev.Close()
	devs, err := h.Devices(ctx)
	if err != nil || len(devs) != 2 || devs[a.ID] != node.Devices()[a.ID] || devs[b.ID] != node.Devices()[b.ID] {
		t.Fatalf("devices %v, %v; want those of the loop node %v", devs, err, node.Devices())
	}

	// Disk b's device, as a hint for disk a, is dropped.
	dev, err = h.OpenDevice(ctx, a.ID, cloud.OpenOptions{Hint: devs[b.ID]})
	if err != nil || dev.Path != devs[a.ID] {
		t.Fatalf("with disk b's device as the hint: %+v, %v", dev, err)
	}
	dev.Close()

	wait(c.DetachDisk(ctx, a.ID, testInstance))
	if _, err := h.OpenDevice(ctx, a.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("a detached disk: %v, want ErrNotFound", err)
	}
	if devs, err := h.Devices(ctx); err != nil || len(devs) != 1 || devs[b.ID] == "" {
		t.Fatalf("devices after the detach of a: %v, %v", devs, err)
	}
}
