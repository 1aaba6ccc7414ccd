package yandex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// The host's tests stand loop devices in for attached disks, as the fake
// API's node simulator does: the image of disk X is a file named X, and
// the serial of a loop device is the base name of its backing file
// (LoopSerial), read for the descriptor's device number as VirtioSerial
// reads a virtio disk's.

// attachedDisks is the cloud as the host asks it: which disks are attached
// where. Only GetDisk is called.
type attachedDisks struct {
	cloud.Cloud
	mu    sync.Mutex
	disks map[string]cloud.Disk
}

func (a *attachedDisks) GetDisk(_ context.Context, id string) (cloud.Disk, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.disks[id]
	if !ok {
		return cloud.Disk{}, fmt.Errorf("disk %s: %w", id, cloud.ErrNotFound)
	}
	return d, nil
}

// node is a test's instance: a by-id directory, the images and their loop
// devices.
type node struct {
	t     *testing.T
	dir   string
	byID  string
	cloud *attachedDisks
}

const testInstance = "fhm0instance00000001"

func newNode(t *testing.T) *node {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	n := &node{t: t, dir: dir, byID: filepath.Join(dir, "by-id"), cloud: &attachedDisks{disks: map[string]cloud.Disk{}}}
	for _, d := range []string{n.byID, filepath.Join(dir, "images")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n *node) host(wait time.Duration) *Host {
	return NewHost(HostOptions{InstanceID: testInstance, Cloud: n.cloud, ByIDDir: n.byID, Serial: LoopSerial, DeviceWait: wait}).(*Host)
}

// disk makes disk id attached to the instance, its image bound to a loop
// device (released at the end of the test); it returns the device.
func (n *node) disk(id string) string {
	n.t.Helper()
	img := filepath.Join(n.dir, "images", id)
	f, err := os.Create(img)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(8 << 20); err != nil {
		n.t.Fatal(err)
	}
	dev, err := loopdev.Attach(context.Background(), f, loopdev.Options{})
	if err != nil {
		n.t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		n.t.Fatal(err)
	}
	fid, _ := loopdev.IDOf(fi)
	n.t.Cleanup(func() {
		// Bounded: a device a failed test left open must not hang it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := loopdev.Release(ctx, dev.Path, fid); err != nil {
			n.t.Errorf("release %s: %v", dev.Path, err)
		}
	})
	n.cloud.mu.Lock()
	n.cloud.disks[id] = cloud.Disk{ID: id, SizeBytes: 8 << 20, AttachedTo: testInstance, Tags: map[string]string{"csid.dev/volume-id": "vol-" + id}}
	n.cloud.mu.Unlock()
	return dev.Path
}

// link makes the by-id entry of disk id point at target.
func (n *node) link(id, target string) {
	n.t.Helper()
	if err := os.Symlink(target, filepath.Join(n.byID, "virtio-"+id)); err != nil {
		n.t.Fatal(err)
	}
}

// open is h.OpenDevice, with the device closed at the end of the test
// however it ends (before its loop device is released).
func (n *node) open(ctx context.Context, h cloud.Host, id string, opts cloud.OpenOptions) (*cloud.Device, error) {
	dev, err := h.OpenDevice(ctx, id, opts)
	if dev != nil {
		n.t.Cleanup(func() { dev.Close() })
	}
	return dev, err
}

const (
	diskA = "fhm0diska00000000001"
	diskB = "fhm0diskb00000000002"
)

// The disk's device is found by its by-id link and proven by its serial on
// the open descriptor: the Device names the device node (not the link),
// its number, and the disk as the cloud reports it.
func TestOpenDeviceFindsAndProvesTheDisk(t *testing.T) {
	n := newNode(t)
	devA := n.disk(diskA)
	n.link(diskA, devA)
	h := n.host(time.Minute)
	dev, err := n.open(context.Background(), h, diskA, cloud.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var st unix.Stat_t
	if err := unix.Stat(devA, &st); err != nil {
		t.Fatal(err)
	}
	if dev.Path != devA || dev.Number != uint64(st.Rdev) || dev.Disk.ID != diskA || dev.Disk.Tags["csid.dev/volume-id"] != "vol-"+diskA {
		t.Fatalf("device %+v, want %s (%d) of disk %s", dev, devA, st.Rdev, diskA)
	}

	// A relative link, as udev writes them, is resolved against the by-id
	// directory.
	rel, err := filepath.Rel(n.byID, devA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(n.byID, "virtio-"+diskA)); err != nil {
		t.Fatal(err)
	}
	n.link(diskA, rel)
	again, err := n.open(context.Background(), h, diskA, cloud.OpenOptions{})
	if err != nil || again.Path != devA {
		t.Fatalf("through the relative link %s: %+v, %v", rel, again, err)
	}
	again.Close()
}

// A link that names another disk's device is refused (the serial is the
// other disk's), and so is a link to a link, even one that leads to the
// right device: the host follows no link but the by-id entry's own. A
// hint (a path remembered earlier) that is another disk's device now is
// dropped, and the disk found by its link.
func TestOpenDeviceRefusesWhatIsNotTheDisk(t *testing.T) {
	n := newNode(t)
	devA, devB := n.disk(diskA), n.disk(diskB)
	h := n.host(time.Minute)
	ctx := context.Background()

	n.link(diskA, devB)
	if dev, err := n.open(ctx, h, diskA, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrIdentity) {
		t.Fatalf("a link to disk B's device opened as disk A: %+v, %v", dev, err)
	}

	// A chain: virtio-A -> hop -> A's device.
	if err := os.Remove(filepath.Join(n.byID, "virtio-"+diskA)); err != nil {
		t.Fatal(err)
	}
	hop := filepath.Join(n.dir, "hop")
	if err := os.Symlink(devA, hop); err != nil {
		t.Fatal(err)
	}
	n.link(diskA, hop)
	if dev, err := n.open(ctx, h, diskA, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrIdentity) {
		t.Fatalf("a link to a link was followed: %+v, %v", dev, err)
	}

	// A by-id directory that is itself a link is not followed either.
	if err := os.Remove(filepath.Join(n.byID, "virtio-"+diskA)); err != nil {
		t.Fatal(err)
	}
	n.link(diskA, devA)
	linkedDir := filepath.Join(n.dir, "by-id-link")
	if err := os.Symlink(n.byID, linkedDir); err != nil {
		t.Fatal(err)
	}
	viaLink := NewHost(HostOptions{InstanceID: testInstance, Cloud: n.cloud, ByIDDir: linkedDir, Serial: LoopSerial, DeviceWait: time.Minute})
	if dev, err := n.open(ctx, viaLink, diskA, cloud.OpenOptions{}); err == nil || !errors.Is(err, unix.ELOOP) {
		t.Fatalf("a by-id directory that is a link: %+v, %v", dev, err)
	}

	// The hint is B's device: dropped; the link finds A's.
	dev, err := n.open(ctx, h, diskA, cloud.OpenOptions{Hint: devB})
	if err != nil || dev.Path != devA {
		t.Fatalf("with a stale hint: %+v, %v", dev, err)
	}
	dev.Close()
	// The hint, right, is used (and a link to elsewhere would not be read).
	if err := os.Remove(filepath.Join(n.byID, "virtio-"+diskA)); err != nil {
		t.Fatal(err)
	}
	n.link(diskA, devB)
	dev, err = n.open(ctx, h, diskA, cloud.OpenOptions{Hint: devA})
	if err != nil || dev.Path != devA {
		t.Fatalf("with the right hint: %+v, %v", dev, err)
	}
	dev.Close()
	// A hint that is a link is not followed.
	if _, err := n.open(ctx, h, diskA, cloud.OpenOptions{Hint: hop}); !errors.Is(err, cloud.ErrIdentity) {
		t.Fatalf("a hint that is a link: %v", err)
	}
}

// A disk the cloud does not report attached here is ErrNotFound at once,
// not after the device wait; so is an id that is not Yandex's (never made
// into a path).
func TestOpenDeviceNotAttachedHere(t *testing.T) {
	n := newNode(t)
	devA := n.disk(diskA)
	n.link(diskA, devA)
	h := n.host(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.cloud.mu.Lock()
	n.cloud.disks[diskB] = cloud.Disk{ID: diskB, AttachedTo: "fhm0another000000001"}
	n.cloud.mu.Unlock()
	for _, id := range []string{diskB, "fhm0unknown000000001", "../../../dev/sda", "virtio-x", strings.ToUpper(diskA)} {
		if _, err := n.open(ctx, h, id, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("disk %q: %v, want ErrNotFound", id, err)
		}
	}
}

// udev links a disk some time after the attach finished: OpenDevice waits
// for the link (here made only once the host has looked and not found it),
// and, when none comes within the bound, answers ErrTransient.
func TestOpenDeviceWaitsForTheDeviceToAppear(t *testing.T) {
	n := newNode(t)
	devA := n.disk(diskA)
	h := n.host(time.Minute)
	var once sync.Once
	h.missed = func() { once.Do(func() { n.link(diskA, devA) }) }
	dev, err := n.open(context.Background(), h, diskA, cloud.OpenOptions{})
	if err != nil || dev.Path != devA {
		t.Fatalf("a device that appeared late: %+v, %v", dev, err)
	}
	dev.Close()

	n.disk(diskB)
	misses := 0
	short := n.host(200 * time.Millisecond)
	short.missed = func() { misses++ }
	if _, err := n.open(context.Background(), short, diskB, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrTransient) || misses < 2 {
		t.Fatalf("a device that never appeared: %v after %d looks, want ErrTransient after several", err, misses)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.missed = cancel
	if _, err := n.open(ctx, h, diskB, cloud.OpenOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("the wait outlived its context: %v", err)
	}
}

// Exclusive holds the device with O_EXCL until Close: a second exclusive
// open is ErrInUse, and one after Close succeeds.
func TestOpenDeviceExclusive(t *testing.T) {
	n := newNode(t)
	devA := n.disk(diskA)
	n.link(diskA, devA)
	h := n.host(time.Minute)
	ctx := context.Background()
	x, err := n.open(ctx, h, diskA, cloud.OpenOptions{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if dev, err := n.open(ctx, h, diskA, cloud.OpenOptions{Exclusive: true}); !errors.Is(err, cloud.ErrInUse) {
		t.Fatalf("a second exclusive open: %+v, %v", dev, err)
	}
	shared, err := n.open(ctx, h, diskA, cloud.OpenOptions{})
	if err != nil {
		t.Fatalf("a shared open beside the exclusive one: %v", err)
	}
	shared.Close()
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := n.open(ctx, h, diskA, cloud.OpenOptions{Exclusive: true})
	if err != nil {
		t.Fatalf("exclusive after Close: %v", err)
	}
	again.Close()
}

// Devices lists the by-id entries that prove to be disks: not a link to
// another disk's device, not a chain, not a name that is no disk id.
func TestDevicesListsProvenDisksOnly(t *testing.T) {
	n := newNode(t)
	devA, devB := n.disk(diskA), n.disk(diskB)
	n.link(diskA, devA)
	n.link("fhm0liar000000000003", devB)
	hop := filepath.Join(n.dir, "hop")
	if err := os.Symlink(devB, hop); err != nil {
		t.Fatal(err)
	}
	n.link(diskB, hop)
	if err := os.Symlink(devA, filepath.Join(n.byID, "virtio-not-an-id")); err != nil {
		t.Fatal(err)
	}
	got, err := n.host(time.Minute).Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[diskA] != devA {
		t.Fatalf("devices %v, want only %s: %s", got, diskA, devA)
	}
	// No by-id directory yet (udev makes it with the first disk): none.
	none := NewHost(HostOptions{InstanceID: testInstance, Cloud: n.cloud, ByIDDir: filepath.Join(n.dir, "no-by-id"), Serial: LoopSerial})
	if got, err := none.Devices(context.Background()); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("devices without a by-id directory: %v, %v; want none", got, err)
	}
}

// A stale link (to another disk's device) that udev replaces while the
// host proves it: the device is dropped, and the link, read again after a
// pause, names the disk's device.
func TestOpenDeviceLooksAgainAfterAStaleLink(t *testing.T) {
	n := newNode(t)
	devA, devB := n.disk(diskA), n.disk(diskB)
	n.link(diskA, devB)
	replaced := false
	h := NewHost(HostOptions{InstanceID: testInstance, Cloud: n.cloud, ByIDDir: n.byID, DeviceWait: time.Minute,
		Serial: func(f *os.File) (string, error) {
			serial, err := LoopSerial(f)
			if serial == diskB && !replaced { // udev, late: the link is replaced as the host reads B's serial
				replaced = true
				if err := os.Remove(filepath.Join(n.byID, "virtio-"+diskA)); err != nil {
					t.Error(err)
				}
				n.link(diskA, devA)
			}
			return serial, err
		}})
	dev, err := n.open(context.Background(), h, diskA, cloud.OpenOptions{})
	if err != nil || dev.Path != devA || !replaced {
		t.Fatalf("after the link was replaced: %+v, %v (replaced: %v)", dev, err, replaced)
	}
}
