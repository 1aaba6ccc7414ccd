package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// The crash test runs the test binary again as a child that performs one
// call and kills itself with SIGKILL at a named point inside it. The parent
// then reopens the state directory, checks the invariants, repeats the call
// (as csid's engine does after a restart) and checks that it converged.
const (
	crashPointEnv = "CSID_LOCAL_CRASH_POINT"
	crashDirEnv   = "CSID_LOCAL_CRASH_DIR"
	crashDiskEnv  = "CSID_LOCAL_CRASH_DISK"
)

type crashCase struct {
	point string
	// setup prepares the directory (in the parent) and returns the disk the
	// call works on ("" for a create).
	setup func(t *testing.T, c *Cloud) string
	// call is the interrupted call, run again by the parent; an operation
	// without an id (a call that starts none) is not waited for.
	call func(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error)
	// check verifies the state after the repeated call.
	check func(t *testing.T, c *Cloud, disk string)
	// afterKill, when set, looks at what the kill left, before the
	// directory is opened again.
	afterKill func(t *testing.T, disk string)
}

var crashCases = []crashCase{
	{point: crash.LocalCreateLogged, setup: noDisk, call: createCrashDisk, check: oneWholeDisk},
	{point: crash.LocalCreateNamed, setup: noDisk, call: createCrashDisk, check: oneWholeDisk},
	{point: crash.LocalCreateRecorded, setup: noDisk, call: createCrashDisk, check: oneWholeDisk},
	{point: crash.LocalDeleteLogged, setup: detachedDisk, call: deleteDisk, check: noDisks},
	{point: crash.LocalDeleteRemoved, setup: detachedDisk, call: deleteDisk, check: noDisks},
	{point: crash.LocalResizeGrown, setup: detachedDisk, call: resizeDisk, check: grownDisk},
	{point: crash.LocalAttachImage, setup: detachedDisk, call: attachDisk, check: attachedDisk},
	{point: crash.LocalAttachIndexed, setup: detachedDisk, call: attachDisk, check: attachedDisk},
	{point: crash.LocalAttachRecorded, setup: detachedDisk, call: attachDisk, check: attachedDisk},
	{point: crash.LocalDetachReleased, setup: attachedCrashDisk, call: detachDisk, check: detachedCheck},
	{point: crash.LocalDetachRecorded, setup: attachedCrashDisk, call: detachDisk, check: detachedCheck},
	{point: crash.LocalDeviceBound, setup: rootAttachedDisk, call: bindDevice, check: oneDevice, afterKill: oneDeviceLeft},
}

// Every crash point of the local backend is one of TestCrashPoints' cases.
func TestCrashPointsCoverTheBackend(t *testing.T) {
	cases := map[string]bool{}
	for _, tc := range crashCases {
		cases[tc.point] = true
	}
	for p := range crash.Points {
		if strings.HasPrefix(p, "local.") && !cases[p] {
			t.Errorf("crash point %s has no case in TestCrashPoints", p)
		}
	}
}

func TestCrashPoints(t *testing.T) {
	for _, tc := range crashCases {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			dir := newDir(t)
			c := open(t, dir, Options{})
			if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
				t.Fatal(err)
			}
			disk := tc.setup(t, c)

			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashPointEnv+"="+tc.point, crashDirEnv+"="+dir, crashDiskEnv+"="+disk)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child did not die at %s: %v\n%s", tc.point, err, out)
			}
			if tc.afterKill != nil {
				tc.afterKill(t, disk)
			}

			c = open(t, dir, Options{})
			checkInvariants(t, dir)
			op, err := tc.call(context.Background(), c, disk)
			if err != nil {
				t.Fatalf("repeating the call after the crash: %v", err)
			}
			if op.ID != "" { // a call that starts no operation is not waited for
				if _, err := c.WaitOperation(context.Background(), op.ID); err != nil {
					t.Fatalf("repeated operation: %v", err)
				}
			}
			tc.check(t, c, disk)
		})
	}
}

// TestCrashChild is the child of TestCrashPoints; alone, it does nothing.
func TestCrashChild(t *testing.T) {
	point := os.Getenv(crashPointEnv)
	if point == "" {
		t.Skip("the child half of TestCrashPoints")
	}
	opts := Options{crash: func(p string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never return into the rest of the call
		}
	}}
	c, err := Open(context.Background(), os.Getenv(crashDirEnv), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range crashCases {
		if tc.point == point {
			_, err := tc.call(context.Background(), c, os.Getenv(crashDiskEnv))
			t.Fatalf("%s was not reached (the call returned %v)", point, err)
		}
	}
	t.Fatalf("unknown crash point %q", point)
}

func noDisk(*testing.T, *Cloud) string { return "" }

func detachedDisk(t *testing.T, c *Cloud) string {
	return create(t, c, "pvc-crash", 64*mib).ID
}

func attachedCrashDisk(t *testing.T, c *Cloud) string {
	id := detachedDisk(t, c)
	if _, err := c.AttachDisk(context.Background(), id, "node-a"); err != nil {
		t.Fatal(err)
	}
	return id
}

// rootAttachedDisk is attachedCrashDisk, for a call that binds a loop
// device.
func rootAttachedDisk(t *testing.T, c *Cloud) string {
	testutil.RequireRoot(t)
	return attachedCrashDisk(t, c)
}

// bindDevice binds the disk's image to a loop device (the first open of a
// disk attached to the node); it starts no operation.
func bindDevice(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	_, err := devicePath(ctx, c.Host("node-a"), disk)
	return cloud.Operation{}, err
}

// oneDeviceLeft: the kill left the disk's image bound to a device, for the
// repeated call to find rather than bind another.
func oneDeviceLeft(t *testing.T, disk string) {
	if n := devicesOfImage(t, disk); n != 1 {
		t.Fatalf("killed once the device was bound, but %d devices back disk %s: the test proves nothing", n, disk)
	}
}

func oneDevice(t *testing.T, _ *Cloud, disk string) {
	if n := devicesOfImage(t, disk); n != 1 {
		t.Fatalf("after the crash and the retry: %d devices back disk %s, want one", n, disk)
	}
}

// devicesOfImage counts the loop devices bound to disk's image (disk ids
// are random: no other test's image has its name).
func devicesOfImage(t *testing.T, disk string) int {
	t.Helper()
	devs, err := loopdev.List()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range devs {
		if filepath.Base(d.BackingFile) == disk+imageSuffix {
			n++
		}
	}
	return n
}

func createCrashDisk(ctx context.Context, c *Cloud, _ string) (cloud.Operation, error) {
	return c.CreateDisk(ctx, cloud.DiskSpec{Name: "pvc-crash", SizeBytes: 64 * mib})
}

func deleteDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.DeleteDisk(ctx, disk)
}

func resizeDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.ResizeDisk(ctx, disk, 128*mib)
}

func attachDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.AttachDisk(ctx, disk, "node-a")
}

func detachDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.DetachDisk(ctx, disk, "node-a")
}

func listed(t *testing.T, c *Cloud) []cloud.Disk {
	t.Helper()
	page, err := c.ListDisks(context.Background(), cloud.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return page.Disks
}

func oneWholeDisk(t *testing.T, c *Cloud, _ string) {
	disks := listed(t, c)
	if len(disks) != 1 || disks[0].Name != "pvc-crash" || disks[0].SizeBytes != 64*mib {
		t.Fatalf("after the crash and the retry: %+v, want one 64 MiB disk", disks)
	}
	// Its image is made by its first attach.
	if _, err := os.Lstat(c.s.imagePath(diskID(disks[0].ID))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image of a disk never attached: %v, want none", err)
	}
}

func noDisks(t *testing.T, c *Cloud, disk string) {
	if disks := listed(t, c); len(disks) != 0 {
		t.Fatalf("after the crash and the retry: %+v, want none", disks)
	}
	if _, err := os.Stat(c.s.imagePath(diskID(disk))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image of the deleted disk: %v", err)
	}
}

func grownDisk(t *testing.T, c *Cloud, disk string) {
	d, err := c.GetDisk(context.Background(), disk)
	if err != nil || d.SizeBytes != 128*mib {
		t.Fatalf("after the crash and the retry: %+v, %v; want 128 MiB", d, err)
	}
}

func attachedDisk(t *testing.T, c *Cloud, disk string) {
	d, err := c.GetDisk(context.Background(), disk)
	if err != nil || d.AttachedTo != "node-a" {
		t.Fatalf("after the crash and the retry: %+v, %v; want attached to node-a", d, err)
	}
	fi, err := os.Lstat(c.s.imagePath(diskID(disk)))
	if err != nil || fi.Size() != d.SizeBytes {
		t.Fatalf("image of the attached disk: %v, %v; want %d bytes", fi, err, d.SizeBytes)
	}
}

func detachedCheck(t *testing.T, c *Cloud, disk string) {
	d, err := c.GetDisk(context.Background(), disk)
	if err != nil || d.AttachedTo != "" {
		t.Fatalf("after the crash and the retry: %+v, %v; want detached", d, err)
	}
}
