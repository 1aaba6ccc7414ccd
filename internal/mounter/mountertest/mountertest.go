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
	"strings"
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
		{"SymlinksAreNeverFollowed", testSymlinks},
		{"AnotherMountIsLeftAlone", testAnotherMount},
		{"ContentIsNeverMountedOver", testContent},
		{"UndoRemovesOnlyWhatWasMade", testPlanUndo},
		{"RecordComesBeforeTheMount", testRecord},
		{"DeviceUsesByDevice", testDeviceUses},
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

// errOf is FormatAndMount's error, for a test that asks nothing else of it.
func errOf(_ bool, err error) error { return err }

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		must(t, os.MkdirAll(d, 0o750))
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
	// Formatted by the first call only (the second finds it mounted), and
	// the fresh filesystem fills its device: nothing to grow.
	for i, want := range []bool{true, false} {
		formatted, err := m.FormatAndMount(ctx, dev, target, "", nil, nil) // "" is ext4
		if err != nil || formatted != want {
			t.Fatalf("FormatAndMount %d of a blank device = %v, %v; want formatted %v", i+1, formatted, err, want)
		}
	}
	mounted(t, m, target, true)
	if grown, err := m.GrowFilesystem(ctx, dev, target); err != nil || grown {
		t.Fatalf("GrowFilesystem right after the format = %v, %v; want nothing grown", grown, err)
	}
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
	if _, err := m.FormatAndMount(ctx, e.Device(t, 64*mib), target, "ext4", nil, nil); !errors.Is(err, mounter.ErrBusy) {
		t.Fatalf("FormatAndMount of another device on the target: %v, want ErrBusy", err)
	}
	for range 2 {
		must(t, m.Unmount(ctx, target))
	}
	gone(t, target)
	mounted(t, m, target, false)
	// Formatted: mounted again as it is.
	if formatted, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); err != nil || formatted {
		t.Fatalf("FormatAndMount of a formatted device = %v, %v; want mounted, not formatted", formatted, err)
	}
	must(t, m.Unmount(ctx, target))
}

func testFormatMismatch(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 300*mib)
	target := filepath.Join(e.Dir, "staging")
	must(t, errOf(m.FormatAndMount(ctx, dev, target, "xfs", nil, nil)))
	must(t, m.Unmount(ctx, target))
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); !errors.Is(err, mounter.ErrFormatMismatch) {
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
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); !errors.Is(err, mounter.ErrProbeFailed) {
		t.Fatalf("FormatAndMount: %v, want ErrProbeFailed", err)
	}
	mounted(t, m, target, false)
	gone(t, target)
}

func testReadOnlyBlank(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	target := filepath.Join(e.Dir, "staging")
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", []string{"ro"}, nil); err == nil {
		t.Fatal("a blank device was formatted for a read-only mount")
	}
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "" {
		t.Fatalf("the device after a refused read-only mount: %q, %v; want blank", fsType, err)
	}
	mounted(t, m, target, false)
}

// testRecord: FormatAndMount hands what it will make to record before it
// makes anything, and makes nothing when record fails or panics.
func testRecord(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	target := filepath.Join(e.Dir, "staging")
	want := mounter.Made{Kind: mounter.FilesystemMount, Source: dev, Created: true, Mounted: true}
	var records []mounter.Made
	refused := errors.New("the record could not be written")
	record := func(err error) func(mounter.Made) error {
		return func(made mounter.Made) error {
			records = append(records, made)
			if _, serr := os.Lstat(target); !errors.Is(serr, fs.ErrNotExist) {
				t.Errorf("%s exists while its record is written: %v", target, serr)
			}
			return err
		}
	}
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, record(refused)); !errors.Is(err, refused) {
		t.Fatalf("FormatAndMount whose record fails: %v, want the record's error", err)
	}
	gone(t, target)
	mounted(t, m, target, false)
	func() {
		defer func() {
			if p := recover(); p != "record panicked" {
				t.Fatalf("FormatAndMount whose record panics: recovered %v, want the record's panic", p)
			}
		}()
		_, _ = m.FormatAndMount(ctx, dev, target, "ext4", nil, func(mounter.Made) error { panic("record panicked") })
	}()
	gone(t, target)
	must(t, errOf(m.FormatAndMount(ctx, dev, target, "ext4", nil, record(nil))))
	mounted(t, m, target, true)
	must(t, errOf(m.FormatAndMount(ctx, dev, target, "ext4", nil, record(nil)))) // mounted already: nothing to record
	if len(records) != 2 || records[0] != want || records[1] != want {
		t.Fatalf("recorded %+v, want %+v twice (the failed record, then the mount's)", records, want)
	}
	must(t, m.Unmount(ctx, target))
}

func testPublish(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	must(t, errOf(m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)))
	rw, ro := filepath.Join(e.Dir, "pods", "a", "mount"), filepath.Join(e.Dir, "pods", "b", "mount")
	mkdirs(t, filepath.Dir(rw), filepath.Dir(ro))
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
	mkdirs(t, filepath.Dir(target))
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
	mkdirs(t, filepath.Dir(ro))
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
		must(t, errOf(m.FormatAndMount(ctx, dev, target, fsType, nil, nil)))
		before, err := m.Stats(ctx, target)
		must(t, err)
		must(t, m.Unmount(ctx, target))

		dev = e.Regrow(t, dev, 2*size)
		if got, err := m.DeviceSize(ctx, dev); err != nil || got != 2*size {
			t.Fatalf("%s: DeviceSize after the resize = %d, %v; want %d", fsType, got, err, 2*size)
		}
		// Staging again, as the engine does: mount, then grow.
		must(t, errOf(m.FormatAndMount(ctx, dev, target, fsType, nil, nil)))
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
			"FormatAndMount":  errOf(m.FormatAndMount(ctx, bad, good, "ext4", nil, nil)),
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
		_, errs["Plan"] = m.Plan(ctx, mounter.DirBind, good, bad)
		errs["Undo"] = m.Undo(ctx, bad, mounter.Made{Kind: mounter.DirBind, Source: good, Created: true, Mounted: true})
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

// unchanged fails the test if before and after (testutil.Trees) differ.
func unchanged(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	if d := testutil.Changes(before, after); len(d) > 0 {
		t.Errorf("%s changed what was there:\n%s", what, strings.Join(d, "\n"))
	}
}

// testSymlinks: a link as the target, as an element of the target's
// parent, or as a bind mount's source is refused with ErrSymlink by every
// method, and nothing is mounted or changed where the link points. Undo,
// what a failed node call runs, is asked to undo the most it could (the
// staging mount, and a target it created): followed, the link to the
// staging path would lose it its mount, the others their empty directory
// or file.
func testSymlinks(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	must(t, errOf(m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)))
	defer func() { must(t, m.Unmount(ctx, staging)) }()
	elsewhere := filepath.Join(e.Dir, "elsewhere")
	mkdirs(t, filepath.Join(elsewhere, "empty"))
	must(t, os.WriteFile(filepath.Join(elsewhere, "file"), nil, 0o600))
	must(t, os.WriteFile(filepath.Join(elsewhere, "keep"), []byte("data"), 0o600))
	must(t, os.Symlink(filepath.Join(elsewhere, "empty"), filepath.Join(e.Dir, "link-to-dir")))
	must(t, os.Symlink(filepath.Join(elsewhere, "file"), filepath.Join(e.Dir, "link-to-file")))
	must(t, os.Symlink(elsewhere, filepath.Join(e.Dir, "link-parent")))
	must(t, os.Symlink(staging, filepath.Join(e.Dir, "link-to-staging")))
	before := testutil.Tree(t, e.Dir)
	for _, link := range []string{"link-to-dir", "link-to-file", "link-parent/empty", "link-parent/new", "link-to-staging"} {
		p := filepath.Join(e.Dir, link)
		errs := map[string]error{
			"FormatAndMount":  errOf(m.FormatAndMount(ctx, dev, p, "ext4", nil, nil)),
			"BindMount":       m.BindMount(ctx, staging, p, false),
			"BindMount from":  m.BindMount(ctx, p, filepath.Join(e.Dir, "target"), false),
			"BindMountDevice": m.BindMountDevice(ctx, dev, p, false),
			"Unmount":         m.Unmount(ctx, p),
			"Undo":            m.Undo(ctx, p, mounter.Made{Kind: mounter.FilesystemMount, Source: dev, Created: true, Mounted: true}),
		}
		_, errs["Plan"] = m.Plan(ctx, mounter.DirBind, staging, p)
		_, errs["IsMounted"] = m.IsMounted(ctx, p)
		for name, err := range errs {
			if !errors.Is(err, mounter.ErrSymlink) {
				t.Errorf("%s(%s): %v, want ErrSymlink", name, link, err)
			}
		}
	}
	unchanged(t, "calls on symbolic links", before, testutil.Tree(t, e.Dir))
	mounted(t, m, filepath.Join(elsewhere, "empty"), false)
	mounted(t, m, staging, true)
}

// testAnotherMount: a target mounted from something else is refused with
// ErrBusy, naming what is there; Undo of a mount that is not the one it
// made leaves it mounted.
func testAnotherMount(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	must(t, errOf(m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)))
	other := filepath.Join(e.Dir, "other")
	mkdirs(t, other)
	target := filepath.Join(e.Dir, "target")
	must(t, m.BindMount(ctx, other, target, false))
	must(t, os.WriteFile(filepath.Join(target, "theirs"), []byte("x"), 0o600))
	errs := map[string]error{
		"FormatAndMount":  errOf(m.FormatAndMount(ctx, e.Device(t, 64*mib), target, "ext4", nil, nil)),
		"BindMount":       m.BindMount(ctx, staging, target, false),
		"BindMountDevice": m.BindMountDevice(ctx, dev, target, false),
	}
	_, errs["Plan"] = m.Plan(ctx, mounter.DirBind, staging, target)
	for name, err := range errs {
		if !errors.Is(err, mounter.ErrBusy) {
			t.Errorf("%s onto another mount: %v, want ErrBusy", name, err)
		}
	}
	for _, kind := range []mounter.MountKind{mounter.DirBind, mounter.FilesystemMount} {
		src := staging
		if kind == mounter.FilesystemMount {
			src = dev
		}
		must(t, m.Undo(ctx, target, mounter.Made{Kind: kind, Source: src, Created: true, Mounted: true}))
		mounted(t, m, target, true)
	}
	if _, err := os.Stat(filepath.Join(target, "theirs")); err != nil {
		t.Fatalf("the other mount lost its content: %v", err)
	}
	must(t, m.Unmount(ctx, target))
	must(t, m.Unmount(ctx, staging))
}

// testContent: a mount is never made over content or on the wrong kind of
// file, nor where the target's parent is missing (csid creates targets,
// never their parents); each is ErrPathConflict and changes nothing.
func testContent(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	must(t, errOf(m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)))
	defer func() { must(t, m.Unmount(ctx, staging)) }()
	full := filepath.Join(e.Dir, "full")
	mkdirs(t, full, filepath.Join(e.Dir, "emptydir"))
	must(t, os.WriteFile(filepath.Join(full, "data"), []byte("keep"), 0o600))
	must(t, os.WriteFile(filepath.Join(e.Dir, "file"), []byte("keep"), 0o600))
	must(t, os.WriteFile(filepath.Join(e.Dir, "emptyfile"), nil, 0o600))
	before := testutil.Tree(t, e.Dir)
	cases := []struct {
		name string
		kind mounter.MountKind
		path string
	}{
		{"filesystem on a directory with content", mounter.FilesystemMount, full},
		{"filesystem on a file", mounter.FilesystemMount, filepath.Join(e.Dir, "emptyfile")},
		{"bind on a directory with content", mounter.DirBind, full},
		{"bind on a file", mounter.DirBind, filepath.Join(e.Dir, "file")},
		{"device on a directory", mounter.DeviceBind, filepath.Join(e.Dir, "emptydir")},
		{"device on a file with content", mounter.DeviceBind, filepath.Join(e.Dir, "file")},
		{"filesystem without a parent", mounter.FilesystemMount, filepath.Join(e.Dir, "no", "staging")},
		{"bind without a parent", mounter.DirBind, filepath.Join(e.Dir, "no", "target")},
		{"device without a parent", mounter.DeviceBind, filepath.Join(e.Dir, "no", "disk")},
	}
	for _, c := range cases {
		src := dev
		var err error
		switch c.kind {
		case mounter.FilesystemMount:
			_, err = m.FormatAndMount(ctx, dev, c.path, "ext4", nil, nil)
		case mounter.DirBind:
			src, err = staging, m.BindMount(ctx, staging, c.path, false)
		case mounter.DeviceBind:
			err = m.BindMountDevice(ctx, dev, c.path, false)
		}
		if !errors.Is(err, mounter.ErrPathConflict) {
			t.Errorf("%s: %v, want ErrPathConflict", c.name, err)
		}
		if _, err := m.Plan(ctx, c.kind, src, c.path); !errors.Is(err, mounter.ErrPathConflict) {
			t.Errorf("Plan of %s: %v, want ErrPathConflict", c.name, err)
		}
		mounted(t, m, c.path, false)
	}
	unchanged(t, "refused mounts", before, testutil.Tree(t, e.Dir))
}

// testPlanUndo: Plan says what a mount will make; Undo removes that and
// nothing else: a target that existed stays, content written since stays
// (and is an error), and an Undo repeated after it is done succeeds.
func testPlanUndo(t *testing.T, e Env) {
	m := e.Mounter
	dev := e.Device(t, 64*mib)
	staging := filepath.Join(e.Dir, "staging")
	made, err := m.Plan(ctx, mounter.FilesystemMount, dev, staging)
	must(t, err)
	if want := (mounter.Made{Kind: mounter.FilesystemMount, Source: dev, Created: true, Mounted: true}); made != want {
		t.Fatalf("Plan of a new staging = %+v, want %+v", made, want)
	}
	must(t, errOf(m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)))
	if again, err := m.Plan(ctx, mounter.FilesystemMount, dev, staging); err != nil || !again.Nothing() {
		t.Fatalf("Plan once mounted = %+v, %v; want nothing to make", again, err)
	}
	// A target that existed (empty): Undo unmounts, and leaves the directory.
	existing := filepath.Join(e.Dir, "existing")
	mkdirs(t, existing)
	made, err = m.Plan(ctx, mounter.DirBind, staging, existing)
	must(t, err)
	if made.Created || !made.Mounted {
		t.Fatalf("Plan of an existing empty target = %+v, want mounted, not created", made)
	}
	must(t, m.BindMount(ctx, staging, existing, false))
	for range 2 {
		must(t, m.Undo(ctx, existing, made))
	}
	mounted(t, m, existing, false)
	if fi, err := os.Stat(existing); err != nil || !fi.IsDir() {
		t.Fatalf("Undo removed a target it did not create: %v, %v", fi, err)
	}
	// A raw block target it created goes with its mount.
	disk := filepath.Join(e.Dir, "disk")
	made, err = m.Plan(ctx, mounter.DeviceBind, dev, disk)
	must(t, err)
	must(t, m.BindMountDevice(ctx, dev, disk, false))
	must(t, m.Undo(ctx, disk, made))
	gone(t, disk)
	// A raw block target that existed (an empty file): Undo unmounts, and
	// leaves the file.
	file := filepath.Join(e.Dir, "file")
	must(t, os.WriteFile(file, nil, 0o600))
	made, err = m.Plan(ctx, mounter.DeviceBind, dev, file)
	must(t, err)
	if made.Created || !made.Mounted {
		t.Fatalf("Plan of an existing empty file = %+v, want mounted, not created", made)
	}
	must(t, m.BindMountDevice(ctx, dev, file, false))
	must(t, m.Undo(ctx, file, made))
	mounted(t, m, file, false)
	if fi, err := os.Lstat(file); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("Undo removed a file it did not create: %v, %v", fi, err)
	}
	// A directory it created, into which someone wrote: stays, an error.
	created := filepath.Join(e.Dir, "created")
	made = mounter.Made{Kind: mounter.DirBind, Source: staging, Created: true, Mounted: true}
	mkdirs(t, created)
	must(t, os.WriteFile(filepath.Join(created, "later"), []byte("x"), 0o600))
	if err := m.Undo(ctx, created, made); !errors.Is(err, mounter.ErrPathConflict) {
		t.Fatalf("Undo of a created directory with content: %v, want ErrPathConflict", err)
	}
	if _, err := os.Stat(filepath.Join(created, "later")); err != nil {
		t.Fatalf("Undo removed content: %v", err)
	}
	// The staging it made: unmounted and removed.
	made = mounter.Made{Kind: mounter.FilesystemMount, Source: dev, Created: true, Mounted: true}
	must(t, m.Undo(ctx, staging, made))
	gone(t, staging)
}

// uses fails unless DeviceUses(dev) lists exactly want, in order.
func uses(t *testing.T, m mounter.Mounter, dev string, want ...mounter.DeviceUse) {
	t.Helper()
	got, err := m.DeviceUses(ctx, dev)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("DeviceUses(%s) = %+v, %v; want %+v", dev, got, err, want)
	}
}

func testDeviceUses(t *testing.T, e Env) {
	m := e.Mounter
	fs, raw := e.Device(t, 64*mib), e.Device(t, 16*mib)
	uses(t, m, fs)
	staging := filepath.Join(e.Dir, "staging")
	pod := filepath.Join(e.Dir, "pods", "a", "mount")
	target := filepath.Join(e.Dir, "pods", "b", "volumeDevices", "disk")
	mkdirs(t, filepath.Dir(pod), filepath.Dir(target))
	must(t, errOf(m.FormatAndMount(ctx, fs, staging, "ext4", nil, nil)))
	must(t, m.BindMount(ctx, staging, pod, false))
	must(t, m.BindMountDevice(ctx, raw, target, false))
	// A filesystem's bind mounts are its mounts too; a device's node bound
	// on a file is another kind of use; each device has its own.
	uses(t, m, fs, mounter.DeviceUse{Kind: mounter.FilesystemMount, Path: staging}, mounter.DeviceUse{Kind: mounter.FilesystemMount, Path: pod})
	uses(t, m, raw, mounter.DeviceUse{Kind: mounter.DeviceBind, Path: target})
	for _, p := range []string{pod, staging, target} {
		must(t, m.Unmount(ctx, p))
	}
	uses(t, m, fs)
	uses(t, m, raw)
}
