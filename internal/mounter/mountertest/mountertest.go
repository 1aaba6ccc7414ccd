// Package mountertest is the contract of mounter.Mounter as a test suite,
// run against the real mounter (root, loop devices) and the in-memory fake,
// so that the engine's tests on the fake say something about the real one.
package mountertest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/testutil"
)

// Env is a mounter under test and the devices it works on.
type Env struct {
	Mounter mounter.Mounter
	// Dir is a directory for targets; the env cleans it up.
	Dir string
	// Device returns a blank block device of size bytes.
	Device func(t *testing.T, size int64) string
	// Unreadable returns a device whose probe fails.
	Unreadable func(t *testing.T) string
	// Regrow returns the device of the disk behind device after the disk
	// grew to size while detached; device is not mounted.
	Regrow func(t *testing.T, device string, size int64) string
}

const mib = int64(1) << 20

// sizes are device sizes each filesystem accepts (xfs wants 300 MiB).
var sizes = map[string]int64{"ext4": 64 * mib, "xfs": 300 * mib}

// Run runs the contract against the environments newEnv makes, one per
// case. needsRoot marks the cases root-only.
func Run(t *testing.T, needsRoot bool, newEnv func(t *testing.T) Env) {
	cases := []struct {
		name string
		fn   func(t *testing.T, e Env)
	}{
		{"FormatMountUnmount", testFormatMountUnmount},
		{"OtherFilesystemIsRefused", testFormatMismatch},
		{"FailedProbeFormatsNothing", testProbeFailure},
		{"BlankIsNotFormattedReadOnly", testReadOnlyBlank},
		{"Publish", testPublish},
		{"RawBlock", testRawBlock},
		{"GrowAfterOfflineResize", testGrow},
		{"NotMounted", testNotMounted},
		{"InvalidPaths", testInvalidPaths},
		{"UnmountKeepsContentItDidNotMount", testUnmountForeign},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if needsRoot {
				testutil.RequireRoot(t)
			}
			t.Parallel()
			tc.fn(t, newEnv(t))
		})
	}
}

var ctx = context.Background()

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func gone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still exists: %v", path, err)
	}
}

func mounted(t *testing.T, m mounter.Mounter, path string, want bool) {
	t.Helper()
	got, err := m.IsMounted(ctx, path)
	if err != nil || got != want {
		t.Fatalf("IsMounted(%s) = %v, %v; want %v", path, got, err, want)
	}
}

func testFormatMountUnmount(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	target := filepath.Join(e.Dir, "staging")
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "" {
		t.Fatalf("Filesystem of a blank device = %q, %v", fsType, err)
	}
	for range 2 {
		must(t, m.FormatAndMount(ctx, dev, target, "", nil)) // "" is ext4
	}
	mounted(t, m, target, true)
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "ext4" {
		t.Fatalf("Filesystem after FormatAndMount = %q, %v", fsType, err)
	}
	if got, err := m.DeviceOf(ctx, target); err != nil || got != dev {
		t.Fatalf("DeviceOf = %q, %v; want %s", got, err, dev)
	}
	list, err := m.List(ctx)
	must(t, err)
	if !slices.ContainsFunc(list, func(mp mounter.MountPoint) bool { return mp.Path == target && mp.Device == dev && mp.Type == "ext4" }) {
		t.Fatalf("List has no ext4 on %s at %s: %+v", dev, target, list)
	}
	st, err := m.Stats(ctx, target)
	must(t, err)
	if st.Block || st.TotalBytes <= 0 || st.TotalBytes > 64*mib || st.AvailableBytes > st.TotalBytes || st.UsedInodes+st.FreeInodes != st.TotalInodes {
		t.Fatalf("implausible stats %+v", st)
	}
	must(t, os.WriteFile(filepath.Join(target, "blob"), make([]byte, 4*mib), 0o600))
	if st2, err := m.Stats(ctx, target); err != nil || st2.UsedBytes < st.UsedBytes+3*mib || st2.UsedInodes != st.UsedInodes+1 {
		t.Fatalf("stats after writing a 4 MiB file: %+v, %v (before: %+v)", st2, err, st)
	}
	// Another device on the mounted target: ErrBusy.
	if err := m.FormatAndMount(ctx, e.Device(t, 64*mib), target, "ext4", nil); !errors.Is(err, mounter.ErrBusy) {
		t.Fatalf("FormatAndMount of another device on the target: %v, want ErrBusy", err)
	}
	for range 2 {
		must(t, m.Unmount(ctx, target))
	}
	gone(t, target)
	mounted(t, m, target, false)
	// Formatted: mounted again as it is.
	must(t, m.FormatAndMount(ctx, dev, target, "ext4", nil))
	must(t, m.Unmount(ctx, target))
}

func testFormatMismatch(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 300*mib)
	target := filepath.Join(e.Dir, "staging")
	must(t, m.FormatAndMount(ctx, dev, target, "xfs", nil))
	must(t, m.Unmount(ctx, target))
	if err := m.FormatAndMount(ctx, dev, target, "ext4", nil); !errors.Is(err, mounter.ErrFormatMismatch) {
		t.Fatalf("FormatAndMount of an xfs device as ext4: %v, want ErrFormatMismatch", err)
	}
	mounted(t, m, target, false)
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "xfs" {
		t.Fatalf("the refused mount changed the device: %q, %v", fsType, err)
	}
}

func testProbeFailure(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Unreadable(t)
	target := filepath.Join(e.Dir, "staging")
	if _, err := m.Filesystem(ctx, dev); !errors.Is(err, mounter.ErrProbeFailed) {
		t.Fatalf("Filesystem: %v, want ErrProbeFailed", err)
	}
	if err := m.FormatAndMount(ctx, dev, target, "ext4", nil); !errors.Is(err, mounter.ErrProbeFailed) {
		t.Fatalf("FormatAndMount: %v, want ErrProbeFailed", err)
	}
	mounted(t, m, target, false)
	gone(t, target)
}

func testReadOnlyBlank(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	target := filepath.Join(e.Dir, "staging")
	if err := m.FormatAndMount(ctx, dev, target, "ext4", []string{"ro"}); err == nil {
		t.Fatal("a blank device was formatted for a read-only mount")
	}
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "" {
		t.Fatalf("the device after a refused read-only mount: %q, %v; want blank", fsType, err)
	}
	mounted(t, m, target, false)
}

func testPublish(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	must(t, m.FormatAndMount(ctx, dev, staging, "ext4", nil))
	rw, ro := filepath.Join(e.Dir, "pods", "a", "mount"), filepath.Join(e.Dir, "pods", "b", "mount")
	for range 2 {
		must(t, m.BindMount(ctx, staging, rw, false))
		must(t, m.BindMount(ctx, staging, ro, true))
	}
	for _, p := range []string{rw, ro} {
		mounted(t, m, p, true)
		if got, err := m.DeviceOf(ctx, p); err != nil || got != dev {
			t.Fatalf("DeviceOf(%s) = %q, %v; want %s", p, got, err, dev)
		}
	}
	if err := m.BindMount(ctx, e.Dir, rw, false); !errors.Is(err, mounter.ErrBusy) {
		t.Fatalf("BindMount of another source: %v, want ErrBusy", err)
	}
	if err := m.BindMount(ctx, filepath.Join(e.Dir, "missing"), filepath.Join(e.Dir, "c"), false); err == nil {
		t.Fatal("BindMount of a missing source succeeded")
	}
	for _, p := range []string{rw, ro} {
		for range 2 {
			must(t, m.Unmount(ctx, p))
		}
		gone(t, p)
	}
	mounted(t, m, staging, true)
	must(t, m.Unmount(ctx, staging))
}

func testRawBlock(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 16*mib)
	target := filepath.Join(e.Dir, "pods", "a", "volumeDevices", "disk")
	for range 2 {
		must(t, m.BindMountDevice(ctx, dev, target, false))
	}
	mounted(t, m, target, true)
	if fi, err := os.Lstat(target); err != nil || fi.IsDir() {
		t.Fatalf("target %v, %v: want a file", fi, err)
	}
	if got, err := m.DeviceOf(ctx, target); err != nil || got != dev {
		t.Fatalf("DeviceOf = %q, %v; want %s", got, err, dev)
	}
	if st, err := m.Stats(ctx, target); err != nil || !st.Block || st.TotalBytes != 16*mib {
		t.Fatalf("Stats = %+v, %v; want a 16 MiB block device", st, err)
	}
	if err := m.BindMountDevice(ctx, e.Device(t, 16*mib), target, false); !errors.Is(err, mounter.ErrBusy) {
		t.Fatalf("BindMountDevice of another device: %v, want ErrBusy", err)
	}
	ro := filepath.Join(e.Dir, "pods", "b", "volumeDevices", "disk")
	must(t, m.BindMountDevice(ctx, dev, ro, true))
	for _, p := range []string{target, ro} {
		must(t, m.Unmount(ctx, p))
		gone(t, p)
	}
}

func testGrow(t *testing.T, e Env) {
	for _, fsType := range []string{"ext4", "xfs"} {
		m := e.Mounter
		size := sizes[fsType]
		dev := e.Device(t, size)
		target := filepath.Join(e.Dir, "staging-"+fsType)
		must(t, m.FormatAndMount(ctx, dev, target, fsType, nil))
		before, err := m.Stats(ctx, target)
		must(t, err)
		must(t, m.Unmount(ctx, target))

		dev = e.Regrow(t, dev, 2*size)
		if got, err := m.DeviceSize(ctx, dev); err != nil || got != 2*size {
			t.Fatalf("%s: DeviceSize after the resize = %d, %v; want %d", fsType, got, err, 2*size)
		}
		// Staging again, as the engine does: mount, then grow.
		must(t, m.FormatAndMount(ctx, dev, target, fsType, nil))
		if _, err := m.GrowFilesystem(ctx, dev, target); err != nil {
			t.Fatalf("%s: GrowFilesystem: %v", fsType, err)
		}
		after, err := m.Stats(ctx, target)
		must(t, err)
		if after.TotalBytes < before.TotalBytes+size*9/10 {
			t.Fatalf("%s: the filesystem went from %d to %d bytes on a device grown by %d", fsType, before.TotalBytes, after.TotalBytes, size)
		}
		if grew, err := m.GrowFilesystem(ctx, dev, target); err != nil || grew {
			t.Fatalf("%s: second GrowFilesystem = %v, %v; want false", fsType, grew, err)
		}
		must(t, m.Unmount(ctx, target))
	}
}

func testNotMounted(t *testing.T, e Env) {
	m := e.Mounter
	dir := filepath.Join(e.Dir, "plain")
	must(t, os.Mkdir(dir, 0o750))
	mounted(t, m, dir, false)
	mounted(t, m, filepath.Join(e.Dir, "missing"), false)
	if _, err := m.Stats(ctx, dir); !errors.Is(err, mounter.ErrNotMounted) {
		t.Errorf("Stats: %v, want ErrNotMounted", err)
	}
	if _, err := m.DeviceOf(ctx, dir); !errors.Is(err, mounter.ErrNotMounted) {
		t.Errorf("DeviceOf: %v, want ErrNotMounted", err)
	}
	if _, err := m.GrowFilesystem(ctx, e.Device(t, 16*mib), dir); !errors.Is(err, mounter.ErrNotMounted) {
		t.Errorf("GrowFilesystem: %v, want ErrNotMounted", err)
	}
	must(t, m.Unmount(ctx, filepath.Join(e.Dir, "missing")))
}

func testInvalidPaths(t *testing.T, e Env) {
	m := e.Mounter
	good := filepath.Join(e.Dir, "good")
	for _, bad := range []string{"", "relative", filepath.Join(e.Dir, "x") + "/../good"} {
		errs := map[string]error{
			"FormatAndMount":  m.FormatAndMount(ctx, bad, good, "ext4", nil),
			"BindMount":       m.BindMount(ctx, good, bad, false),
			"BindMountDevice": m.BindMountDevice(ctx, bad, good, false),
			"Unmount":         m.Unmount(ctx, bad),
		}
		_, errs["IsMounted"] = m.IsMounted(ctx, bad)
		_, errs["DeviceOf"] = m.DeviceOf(ctx, bad)
		_, errs["Filesystem"] = m.Filesystem(ctx, bad)
		_, errs["DeviceSize"] = m.DeviceSize(ctx, bad)
		_, errs["GrowFilesystem"] = m.GrowFilesystem(ctx, good, bad)
		_, errs["Stats"] = m.Stats(ctx, bad)
		for name, err := range errs {
			if !errors.Is(err, mounter.ErrInvalidPath) {
				t.Errorf("%s(%q): %v, want ErrInvalidPath", name, bad, err)
			}
		}
	}
	gone(t, good)
}

func testUnmountForeign(t *testing.T, e Env) {
	dir := filepath.Join(e.Dir, "data")
	must(t, os.Mkdir(dir, 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600))
	if err := e.Mounter.Unmount(ctx, dir); err == nil {
		t.Fatal("Unmount of a directory with content that was never mounted succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Fatalf("Unmount touched content it did not mount: %v", err)
	}
}
