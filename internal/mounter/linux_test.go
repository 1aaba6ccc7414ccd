package mounter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
)

// recorder wraps a runner and records the programs it runs (and their
// command lines); fail, when set, answers instead of the real program for
// the names it returns true for; after, when set, is called after each
// program ran.
type recorder struct {
	mu    sync.Mutex
	ran   []string
	cmds  []string
	fail  func(name string) error
	after func(name string)
}

func (r *recorder) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.mu.Lock()
	r.ran = append(r.ran, name)
	r.cmds = append(r.cmds, strings.Join(append([]string{name}, args...), " "))
	fail, after := r.fail, r.after
	r.mu.Unlock()
	if fail != nil {
		if err := fail(name); err != nil {
			return nil, err
		}
	}
	out, err := execRun(ctx, name, args...)
	if after != nil {
		after(name)
	}
	return out, err
}

// ranCommand reports whether a command line starting with prefix ran.
func (r *recorder) ranCommand(prefix string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.cmds, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran, r.cmds = nil, nil
}

func (r *recorder) ranProgram(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.ran, name)
}

func (r *recorder) formatted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.ran, func(n string) bool { return strings.HasPrefix(n, "mkfs") })
}

// exitErr is an injected exit status.
type exitErr int

func (e exitErr) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitErr) ExitCode() int { return int(e) }

// fsSizes are device sizes each filesystem accepts (xfs wants 300 MiB).
var fsSizes = map[string]int64{"ext4": 64 * mib, "xfs": 300 * mib}

func TestFormatAndMountKeepsData(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			t.Parallel()
			sb := newSandbox(t)
			rec := &recorder{}
			m := newLinux(rec.run)
			var logged bytes.Buffer
			ctx := zerolog.New(&logged).WithContext(context.Background())
			dev := sb.device(fsSizes[fsType])
			target := sb.path("staging")

			if got, err := m.Filesystem(ctx, dev); err != nil || got != "" {
				t.Fatalf("Filesystem of a blank device = %q, %v", got, err)
			}
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, []string{"noatime"}, nil); err != nil {
				t.Fatal(err)
			}
			if !rec.formatted() {
				t.Fatal("a blank device was mounted without mkfs")
			}
			if !strings.Contains(logged.String(), "formatting a blank device") || !strings.Contains(logged.String(), dev) {
				t.Fatalf("the format was not logged to the context's logger: %q", logged.String())
			}
			logged.Reset()
			e := mountEntry(t, target)
			if e.FSType != fsType || !hasOption(e.Options, "noatime") {
				t.Fatalf("mount table: %+v, want %s with noatime", e, fsType)
			}
			if got, err := m.DeviceOf(ctx, target); err != nil || got != dev {
				t.Fatalf("DeviceOf = %q, %v; want %s", got, err, dev)
			}
			// Mounted already: success, nothing done.
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatalf("FormatAndMount of a mounted target: %v", err)
			}
			marker := filepath.Join(target, "marker")
			if err := os.WriteFile(marker, []byte("keep me"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := m.Unmount(ctx, target); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Unmount left the target: %v", err)
			}

			// Formatted already: mounted as it is, never formatted again.
			rec = &recorder{}
			m = newLinux(rec.run)
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			if rec.formatted() || logged.Len() > 0 {
				t.Fatalf("a formatted device was formatted again (or logged as such: %q)", logged.String())
			}
			if got, err := os.ReadFile(marker); err != nil || string(got) != "keep me" {
				t.Fatalf("marker after the second FormatAndMount: %q, %v", got, err)
			}

			// Another device on the mounted target: ErrBusy.
			other := sb.device(fsSizes[fsType])
			if _, err := m.FormatAndMount(ctx, other, target, fsType, nil, nil); !errors.Is(err, ErrBusy) {
				t.Fatalf("FormatAndMount of another device on the target: %v, want ErrBusy", err)
			}
			if err := m.Unmount(ctx, target); err != nil {
				t.Fatal(err)
			}
			// The other filesystem than the one on the device: refused.
			wrong := map[string]string{"ext4": "xfs", "xfs": "ext4"}[fsType]
			if _, err := m.FormatAndMount(ctx, dev, target, wrong, nil, nil); !errors.Is(err, ErrFormatMismatch) {
				t.Fatalf("FormatAndMount as %s: %v, want ErrFormatMismatch", wrong, err)
			}
			if mounted, _ := m.IsMounted(ctx, target); mounted || rec.formatted() {
				t.Fatalf("a mismatched device was mounted (%v) or formatted (%v)", mounted, rec.formatted())
			}
		})
	}
}

func TestBlankDeviceIsNotFormattedForReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	rec := &recorder{}
	m := newLinux(rec.run)
	dev := sb.device(16 * mib)
	if _, err := m.FormatAndMount(context.Background(), dev, sb.path("t"), "ext4", []string{"ro"}, nil); err == nil || rec.formatted() {
		t.Fatalf("read-only FormatAndMount of a blank device: %v, formatted %v; want a refusal", err, rec.formatted())
	}
}

// The hazard, measured: blkid -p exits 2 for a device it cannot read just
// as for a blank one. The probe must say ErrProbeFailed for every device it
// cannot read, and FormatAndMount must then never run mkfs.
func TestProbeFailureNeverFormats(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	ctx := context.Background()

	// A block device node whose driver does not exist: it opens with
	// ENXIO, and no other test can be handed it meanwhile.
	noDriver := sb.path("no-driver")
	major := unusedBlockMajor(t)
	if err := unix.Mknod(noDriver, unix.S_IFBLK|0o600, int(unix.Mkdev(major, 0))); err != nil {
		t.Fatal(err)
	}
	dir := sb.path("a-directory")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := sb.path("a-file")
	if err := os.WriteFile(file, make([]byte, mib), 0o600); err != nil {
		t.Fatal(err)
	}
	// Not all zeros where blkid looks, but no signature: blkid decides.
	probed := sb.device(16 * mib)
	writeDevice(t, probed, 100*kib, []byte{0xff})
	before := deviceSum(t, probed)

	for _, unreadable := range []string{sb.path("missing"), noDriver} {
		if _, err := execRun(ctx, "blkid", "-p", unreadable); exitCode(err) != 2 {
			t.Fatalf("blkid -p %s: %v; the premise is that it exits 2", unreadable, err)
		}
	}

	cases := []struct {
		name   string
		device string
		fail   func(name string) error
	}{
		{"missing device", sb.path("missing"), nil},
		{"device without a driver", noDriver, nil},
		{"directory", dir, nil},
		{"regular file", file, nil},
		{"blkid fails", probed, func(n string) error {
			if n == "blkid" {
				return exitErr(4)
			}
			return nil
		}},
		{"blkid missing", probed, func(n string) error {
			if n == "blkid" {
				return &execError{cmd: "blkid", err: errors.New(`exec: "blkid": executable file not found in $PATH`)}
			}
			return nil
		}},
	}
	for _, tc := range cases {
		rec := &recorder{fail: tc.fail}
		m := newLinux(rec.run)
		if _, err := m.Filesystem(ctx, tc.device); !errors.Is(err, ErrProbeFailed) {
			t.Errorf("%s: Filesystem = %v, want ErrProbeFailed", tc.name, err)
		}
		target := sb.path("target-" + strings.ReplaceAll(tc.name, " ", "-"))
		if _, err := m.FormatAndMount(ctx, tc.device, target, "ext4", nil, nil); !errors.Is(err, ErrProbeFailed) {
			t.Errorf("%s: FormatAndMount = %v, want ErrProbeFailed", tc.name, err)
		}
		if rec.formatted() {
			t.Errorf("%s: mkfs ran after a failed probe", tc.name)
		}
	}
	// The device the failing blkid could not see is as it was.
	if deviceSum(t, probed) != before {
		t.Fatal("the device behind the failed probe was written to")
	}
}

// unusedBlockMajor picks a block major number reserved for local use that
// no driver on this machine has registered.
func unusedBlockMajor(t *testing.T) uint32 {
	t.Helper()
	raw, err := os.ReadFile("/proc/devices")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(raw), "Block devices:")
	used := map[string]bool{}
	for _, line := range strings.Split(block, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			used[f[0]] = true
		}
	}
	for major := uint32(240); major <= 254; major++ {
		if !used[fmt.Sprint(major)] {
			return major
		}
	}
	t.Skip("every local-use block major is taken on this machine")
	return 0
}

func TestBindMountPublishes(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	m := New()
	ctx := context.Background()
	dev := sb.device(32 * mib)
	staging := sb.path("staging")
	if _, err := m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	rw, ro := sb.path("pods", "a", "mount"), sb.path("pods", "b", "mount")
	mkdirs(t, filepath.Dir(rw), filepath.Dir(ro))
	for range 2 { // the second time: already mounted, success
		if err := m.BindMount(ctx, staging, rw, false); err != nil {
			t.Fatal(err)
		}
		if err := m.BindMount(ctx, staging, ro, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rw, "f"), []byte("x"), 0o600); err != nil {
		t.Fatalf("write through the read-write publish: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(ro, "f")); err != nil || string(got) != "x" {
		t.Fatalf("read through the read-only publish: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "g"), []byte("x"), 0o600); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write through the read-only publish: %v, want EROFS", err)
	}
	if e := mountEntry(t, ro); !hasOption(e.Options, "ro") {
		t.Fatalf("mount table for the read-only publish: %+v", e)
	}
	for _, target := range []string{rw, ro} {
		if got, err := m.DeviceOf(ctx, target); err != nil || got != dev {
			t.Fatalf("DeviceOf(%s) = %q, %v; want %s", target, got, err, dev)
		}
	}

	// A crash between the bind and the read-only step leaves a writable
	// mount; the repeated call makes it read-only.
	crashed := sb.path("pods", "c", "mount")
	if err := os.MkdirAll(crashed, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(staging, crashed, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := m.BindMount(ctx, staging, crashed, true); err != nil {
		t.Fatal(err)
	}
	if e := mountEntry(t, crashed); !hasOption(e.Options, "ro") {
		t.Fatalf("the repeated read-only bind left %+v", e)
	}

	// Another source on a mounted target: ErrBusy.
	if err := m.BindMount(ctx, sb.dir, rw, false); !errors.Is(err, ErrBusy) {
		t.Fatalf("BindMount of another source: %v, want ErrBusy", err)
	}
	for _, target := range []string{rw, ro, crashed} {
		for range 2 { // the second time: gone, success
			if err := m.Unmount(ctx, target); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Unmount left %s: %v", target, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(staging, "f")); err != nil || string(got) != "x" {
		t.Fatalf("staging after the unpublishes: %q, %v", got, err)
	}
}

func TestBindMountDeviceForRawBlock(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	m := New()
	ctx := context.Background()
	dev := sb.device(16 * mib)
	target := sb.path("pods", "a", "volumeDevices", "disk")
	roTarget := sb.path("pods", "b", "volumeDevices", "disk")
	mkdirs(t, filepath.Dir(target), filepath.Dir(roTarget))
	for range 2 {
		if err := m.BindMountDevice(ctx, dev, target, false); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(target)
	if err != nil || !isBlock(fi) {
		t.Fatalf("target %v, %v: want the block device", fi, err)
	}
	if got, err := m.DeviceOf(ctx, target); err != nil || got != dev {
		t.Fatalf("DeviceOf = %q, %v; want %s", got, err, dev)
	}
	st, err := m.Stats(ctx, target)
	if err != nil || !st.Block || st.TotalBytes != 16*mib {
		t.Fatalf("Stats = %+v, %v; want a 16 MiB block device", st, err)
	}
	if err := m.BindMountDevice(ctx, sb.device(16*mib), target, false); !errors.Is(err, ErrBusy) {
		t.Fatalf("BindMountDevice of another device: %v, want ErrBusy", err)
	}
	if err := m.BindMountDevice(ctx, dev, roTarget, true); err != nil {
		t.Fatal(err)
	}
	if e := mountEntry(t, roTarget); !hasOption(e.Options, "ro") {
		t.Fatalf("mount table for the read-only device: %+v", e)
	}
	for _, p := range []string{target, roTarget} {
		if err := m.Unmount(ctx, p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Unmount left %s: %v", p, err)
		}
	}
	if err := m.BindMountDevice(ctx, sb.dir, target, false); err == nil {
		t.Fatal("BindMountDevice of a directory succeeded")
	}
}

// The offline expansion, on the mounter's side: the device comes back
// larger, and staging it again (FormatAndMount, then GrowFilesystem as the
// engine does) leaves a filesystem that fills it. ext4 grows before the
// mount (in a process that may not grow it online), xfs after; the record
// of the ext4 growth is gone once it is done.
func TestGrowFilesystemOffline(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			t.Parallel()
			sb := newSandbox(t)
			rec := &recorder{}
			m := newLinux(rec.run)
			m.grow, m.onlineExt = growRecords{dir: sb.path("grow")}, false
			ctx := context.Background()
			size := fsSizes[fsType]
			dev := sb.device(size)
			target := sb.path("staging")
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			if grew, err := m.GrowFilesystem(ctx, dev, target); err != nil || grew {
				t.Fatalf("GrowFilesystem of a full-size filesystem = %v, %v; want false", grew, err)
			}
			before, err := m.Stats(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Unmount(ctx, target); err != nil {
				t.Fatal(err)
			}
			dev = sb.regrow(dev, 2*size)
			if got, err := m.DeviceSize(ctx, dev); err != nil || got != 2*size {
				t.Fatalf("DeviceSize = %d, %v; want %d", got, err, 2*size)
			}

			rec.reset()
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			if rec.formatted() {
				t.Fatal("the grown device was formatted")
			}
			grewOffline := rec.ranProgram("resize2fs")
			grew, err := m.GrowFilesystem(ctx, dev, target)
			if err != nil {
				t.Fatal(err)
			}
			if fsType == "ext4" && (!grewOffline || grew) {
				t.Fatalf("ext4: grown before the mount %v, by GrowFilesystem %v; want before the mount only", grewOffline, grew)
			}
			if fsType == "xfs" && !grew {
				t.Fatal("xfs: GrowFilesystem did not grow it")
			}
			after, err := m.Stats(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			if after.TotalBytes < before.TotalBytes+size*9/10 {
				t.Fatalf("filesystem grew from %d to %d bytes on a device grown by %d", before.TotalBytes, after.TotalBytes, size)
			}
			if grew, err := m.GrowFilesystem(ctx, dev, target); err != nil || grew {
				t.Fatalf("second GrowFilesystem = %v, %v; want false", grew, err)
			}
			if _, err := m.GrowFilesystem(ctx, dev, sb.dir); !errors.Is(err, ErrNotMounted) {
				t.Fatalf("GrowFilesystem of a path that is not mounted: %v, want ErrNotMounted", err)
			}
			// Mounting it once more finds nothing to grow.
			if err := m.Unmount(ctx, target); err != nil {
				t.Fatal(err)
			}
			rec.reset()
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			if rec.ranProgram("e2fsck") {
				t.Fatal("a full-size ext4 was checked again")
			}
			if left, _ := os.ReadDir(sb.path("grow")); len(left) > 0 {
				t.Fatalf("growth records left: %v", left)
			}
		})
	}
}

// Growth while mounted (a provider that grows attached disks): xfs always;
// ext4 where the process has CAP_SYS_RESOURCE, else an error that says so.
func TestGrowFilesystemOnline(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			t.Parallel()
			sb := newSandbox(t)
			m := New()
			ctx := context.Background()
			size := fsSizes[fsType]
			dev := sb.device(size)
			target := sb.path("staging")
			if _, err := m.FormatAndMount(ctx, dev, target, fsType, nil, nil); err != nil {
				t.Fatal(err)
			}
			before, err := m.Stats(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			sb.growInPlace(dev, 2*size)
			grew, err := m.GrowFilesystem(ctx, dev, target)
			if fsType == "ext4" && !capable(unix.CAP_SYS_RESOURCE) {
				if err == nil || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
					t.Fatalf("online ext4 growth without CAP_SYS_RESOURCE: %v, %v; want an error naming it", grew, err)
				}
				t.Log("no CAP_SYS_RESOURCE here: online ext4 growth is refused, as the error says")
				return
			}
			if err != nil || !grew {
				t.Fatalf("GrowFilesystem = %v, %v; want true", grew, err)
			}
			after, err := m.Stats(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			if after.TotalBytes < before.TotalBytes+size*9/10 {
				t.Fatalf("filesystem grew from %d to %d bytes on a device grown by %d", before.TotalBytes, after.TotalBytes, size)
			}
		})
	}
}

func TestStatsAndList(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	m := New()
	ctx := context.Background()
	dev := sb.device(64 * mib)
	target := sb.path("with space", "staging") // the mount table escapes spaces
	mkdirs(t, filepath.Dir(target))
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	st, err := m.Stats(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if st.Block || st.TotalBytes <= 0 || st.TotalBytes > 64*mib || st.AvailableBytes > st.TotalBytes ||
		st.UsedBytes < 0 || st.TotalInodes <= 0 || st.FreeInodes > st.TotalInodes || st.UsedInodes != st.TotalInodes-st.FreeInodes {
		t.Fatalf("implausible stats %+v", st)
	}
	if err := os.WriteFile(filepath.Join(target, "blob"), make([]byte, 8*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	st2, err := m.Stats(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if st2.UsedBytes < st.UsedBytes+7*mib || st2.UsedInodes != st.UsedInodes+1 {
		t.Fatalf("after writing 8 MiB in one file: %+v, before %+v", st2, st)
	}
	mounts, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := slices.ContainsFunc(mounts, func(mp MountPoint) bool {
		return mp.Path == target && mp.Device == dev && mp.Type == "ext4" && mp.Root == "/" && slices.Contains(mp.Options, "rw")
	})
	if !found {
		t.Fatalf("List has no entry for %s on %s", target, dev)
	}
	if _, err := m.Stats(ctx, sb.dir); !errors.Is(err, ErrNotMounted) {
		t.Fatalf("Stats of a directory that is not a mount point: %v, want ErrNotMounted", err)
	}
	if _, err := m.DeviceOf(ctx, sb.dir); !errors.Is(err, ErrNotMounted) {
		t.Fatalf("DeviceOf of a directory that is not a mount point: %v, want ErrNotMounted", err)
	}
	if mounted, err := m.IsMounted(ctx, sb.path("missing")); err != nil || mounted {
		t.Fatalf("IsMounted of a missing path = %v, %v; want false, nil", mounted, err)
	}
}

// Unmount never deletes data: a target that is not a mount point and holds
// files stays, and that is an error.
func TestUnmountNeverDeletesContent(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := New().Unmount(context.Background(), target); err == nil {
		t.Fatal("Unmount of a directory with content succeeded")
	}
	if _, err := os.Stat(filepath.Join(target, "data")); err != nil {
		t.Fatalf("Unmount touched the content: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := New().Unmount(context.Background(), empty); err != nil {
		t.Fatalf("Unmount of an empty directory that is not mounted: %v", err)
	}
	if _, err := os.Lstat(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Unmount left %s: %v", empty, err)
	}
}

// Mounts stacked on one target all go. A symbolic link to a mount point is
// refused (ErrSymlink): the link stays, and so does the mount behind it
// (csid does not follow it, nor report done while it is mounted).
func TestUnmountStackedAndSymlinked(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	m := New()
	ctx := context.Background()
	staging := sb.path("staging")
	if _, err := m.FormatAndMount(ctx, sb.device(16*mib), staging, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	target := sb.path("target")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := unix.Mount(staging, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Unmount of three stacked mounts left the target: %v", err)
	}
	link := sb.path("link")
	if err := os.Symlink(staging, link); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(ctx, link); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Unmount of a link to a mount point: %v, want ErrSymlink", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("Unmount changed the link: %v, %v", fi, err)
	}
	if mounted, err := m.IsMounted(ctx, staging); err != nil || !mounted {
		t.Fatalf("the mount behind the link: mounted=%v, %v; want still mounted", mounted, err)
	}
}

// TestUnmountOfATargetInUse: while a file is open inside the mount, Unmount
// retries briefly, then reports ErrInUse (the engine retries that as
// transient) and leaves the mount; once the holder is gone, it succeeds.
func TestUnmountOfATargetInUse(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	m := New()
	ctx := context.Background()
	dev := sb.device(64 * mib)
	target := sb.path("staging")
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Create(filepath.Join(target, "held-open"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Unmount(ctx, target)
	if !errors.Is(err, ErrInUse) {
		holder.Close()
		t.Fatalf("Unmount of a target with an open file: %v, want ErrInUse", err)
	}
	if ok, _ := m.IsMounted(ctx, target); !ok {
		t.Fatal("a failed Unmount left the target unmounted")
	}
	holder.Close()
	if err := m.Unmount(ctx, target); err != nil {
		t.Fatalf("Unmount once the holder closed: %v", err)
	}
}

func mkdirs(t testing.TB, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
}
