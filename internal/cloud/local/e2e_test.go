package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/testutil"
)

// The offline expansion end to end, on real loop devices, for each
// filesystem: create, attach, the device appears on the node, format,
// mount, write, unmount, detach, resize to double, attach, mount: the
// filesystem has grown to the new size and the file is intact. Midway the
// node restarts (its clients are dropped) and finds the same device.
func TestOfflineExpansionEndToEnd(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			t.Parallel()
			size := map[string]int64{"ext4": 64 * mib, "xfs": 300 * mib}[fsType]
			dir := newDir(t)
			staging := filepath.Join(filepath.Dir(dir), "staging")
			t.Cleanup(func() { // before newDir's cleanup releases the devices
				for {
					if err := unix.Unmount(staging, 0); err != nil {
						return
					}
				}
			})
			ctx := context.Background()
			controller := open(t, dir, Options{})
			node := open(t, dir, Options{})
			m := mounter.NewWithState(filepath.Join(filepath.Dir(dir), "grow"))
			if err := node.RegisterNode(ctx, cloud.Node{ID: "node-a", MaxAttachments: 4}); err != nil {
				t.Fatal(err)
			}
			wait := func(op cloud.Operation, err error) cloud.Disk {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				d, err := controller.WaitOperation(ctx, op.ID)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}

			d := wait(controller.CreateDisk(ctx, cloud.DiskSpec{Name: "pvc-e2e", SizeBytes: size}))
			wait(controller.AttachDisk(ctx, d.ID, "node-a"))
			dev, err := devicePath(ctx, node.Host("node-a"), d.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := m.DeviceSize(ctx, dev); err != nil || got != size {
				t.Fatalf("device %s: %d bytes, %v; want %d", dev, got, err, size)
			}
			if _, err := m.FormatAndMount(ctx, dev, staging, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			data := []byte("written before the expansion")
			if err := os.WriteFile(filepath.Join(staging, "file"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			before, err := m.Stats(ctx, staging)
			if err != nil {
				t.Fatal(err)
			}

			// The node restarts while the volume is staged: nothing in
			// memory, the same device.
			node.Close()
			node = open(t, dir, Options{})
			if again, err := devicePath(ctx, node.Host("node-a"), d.ID); err != nil || again != dev {
				t.Fatalf("after the node's restart: %q, %v; want %s", again, err, dev)
			}
			if n := len(loopsOf(t, node, d.ID)); n != 1 {
				t.Fatalf("%d loop devices for one disk", n)
			}

			// Offline: a resize while attached is refused.
			if _, err := controller.ResizeDisk(ctx, d.ID, 2*size); err == nil {
				t.Fatal("resize of an attached disk succeeded")
			}
			if err := m.Unmount(ctx, staging); err != nil {
				t.Fatal(err)
			}
			wait(controller.DetachDisk(ctx, d.ID, "node-a"))
			if n := len(loopsOf(t, node, d.ID)); n != 0 {
				t.Fatalf("%d loop devices after the detach", n)
			}
			if grown := wait(controller.ResizeDisk(ctx, d.ID, 2*size)); grown.SizeBytes != 2*size {
				t.Fatalf("resize left %+v", grown)
			}
			wait(controller.AttachDisk(ctx, d.ID, "node-a"))
			dev, err = devicePath(ctx, node.Host("node-a"), d.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := m.DeviceSize(ctx, dev); err != nil || got != 2*size {
				t.Fatalf("device %s after the resize: %d bytes, %v; want %d", dev, got, err, 2*size)
			}

			// Staging again, as NodeStageVolume does: mount, grow.
			if _, err := m.FormatAndMount(ctx, dev, staging, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := m.GrowFilesystem(ctx, dev, staging); err != nil {
				t.Fatal(err)
			}
			after, err := m.Stats(ctx, staging)
			if err != nil {
				t.Fatal(err)
			}
			if after.TotalBytes < before.TotalBytes+size*9/10 || after.TotalBytes > 2*size {
				t.Fatalf("the filesystem has %d bytes (had %d) on a device of %d", after.TotalBytes, before.TotalBytes, 2*size)
			}
			if got, err := os.ReadFile(filepath.Join(staging, "file")); err != nil || string(got) != string(data) {
				t.Fatalf("the file after the expansion: %q, %v", got, err)
			}

			if err := m.Unmount(ctx, staging); err != nil {
				t.Fatal(err)
			}
			wait(controller.DetachDisk(ctx, d.ID, "node-a"))
			wait(controller.DeleteDisk(ctx, d.ID))
			if devs, err := node.Host("node-a").Devices(ctx); err != nil || len(devs) != 0 {
				t.Fatalf("devices left: %v, %v", devs, err)
			}
		})
	}
}
