package mounter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/devuse"
	"github.com/moby/sys/mountinfo"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
)

// Linux is the Mounter of the machine csid runs on; it needs root.
//
// The paths it is handed are opened without following a symbolic link
// anywhere in them (openat2 with RESOLVE_NO_SYMLINKS; see entry), and every
// step acts through the descriptors so opened, not through the path again:
// a directory swapped for a link after the check cannot redirect a mount,
// an unmount or a removal. Filesystems are mounted by mount(8), which
// parses the options ("noatime", "nouuid", ...) as users expect, on the
// target's descriptor (/proc/self/fd/3, with --no-canonicalize so mount(8)
// does not turn it back into a path); the arguments are built by
// k8s.io/mount-utils. Bind mounts and unmounts are made with mount(2),
// umount(2) and mount_setattr(2) directly: the same result as mount(8) (a
// test compares the mount tables) at a fraction of the cost
// (docs/benchmarks.md), and the read-only step changes the read-only flag
// alone. Mounted filesystems grow online (resize2fs, xfs_growfs); an
// unmounted ext3/ext4 grows with e2fsck and resize2fs before FormatAndMount
// mounts it, where online growth is not allowed. Host programs run to
// completion, never killed (runner.go). The mount table is read from
// /proc/self/mountinfo with github.com/moby/sys/mountinfo, which unescapes
// paths with spaces.
//
// A Linux is safe for concurrent use; callers serialise the calls that
// concern one device or one target (csid's engine runs one operation per
// volume at a time).
type Linux struct {
	run   runner
	tools tools
	grow  growRecords
	// onlineExt says this process may grow a mounted ext4
	// (CAP_SYS_RESOURCE); else ext grows offline, before the mount.
	onlineExt bool
}

var _ Mounter = (*Linux)(nil)

// New returns the Mounter of this machine, for reading the host (mounts,
// devices, usage) and unmounting. It keeps no state, so it refuses to grow
// an ext filesystem offline: use NewWithState for that.
func New() *Linux {
	return NewWithState("")
}

// NewWithState returns the Mounter of this machine that keeps the records
// of offline growths in progress in dir (created when first needed), where
// they outlive csid: the mounter repairs a filesystem whose growth was
// interrupted before it mounts it again.
func NewWithState(dir string) *Linux {
	m := newLinux(nil)
	m.grow = growRecords{dir: dir}
	return m
}

// newLinux returns a Linux that runs host programs with run (nil: its own
// tools, never killed; see tools).
func newLinux(run runner) *Linux {
	m := &Linux{onlineExt: capable(unix.CAP_SYS_RESOURCE)}
	m.run = run
	if run == nil {
		m.run = m.tools.run
	}
	return m
}

// Running lists the host programs (mkfs, e2fsck, resize2fs, xfs_growfs,
// blkid, mount) the mounter is running now, longest-running first.
// Shutdown waits for them: csid never kills one.
func (m *Linux) Running() []Tool { return m.tools.list() }

// execRun runs a host program as the mounter does, outside any Linux.
func execRun(ctx context.Context, name string, args ...string) ([]byte, error) {
	var t tools
	return t.run(ctx, name, args...)
}

// mkfsArgs are the arguments of mkfs.<type> per supported filesystem.
// Neither forces: the device has been proven blank, and should mkfs find a
// signature the probe missed, mkfs.xfs refuses rather than overwrite it.
var mkfsArgs = map[string][]string{
	"ext4": {"-q", "-m", "0"}, // no blocks reserved for root on a volume
	"ext3": {"-q", "-m", "0"},
	"xfs":  {"-q"},
}

// FormatCommand returns the program and arguments FormatAndMount formats a
// blank device with as fsType; ok is false for a filesystem csid does not
// format. csid bench runs the same command for its mkfs+mount floor.
func FormatCommand(fsType, device string) (name string, args []string, ok bool) {
	opts, ok := mkfsArgs[fsType]
	if !ok {
		return "", nil, false
	}
	return "mkfs." + fsType, append(slices.Clone(opts), device), true
}

// MountCommand returns the arguments of mount(8) that FormatAndMount mounts
// device's fsType filesystem at target with (target is /proc/self/fd/3
// there: the directory it opened). csid bench runs the same command for its
// mkfs+mount floor.
func MountCommand(device, target, fsType string, options []string) []string {
	args, _ := mountutils.MakeMountArgsSensitiveWithMountFlags(device, target, fsType, options, nil, []string{"--no-canonicalize"})
	return args
}

// FormatAndMount formats device if a successful probe finds it blank and
// mounts it at target; see Mounter. A blank device is not formatted for a
// read-only mount ("ro" among the options): that is an error. A format is
// logged to ctx's zerolog logger, if it has one. The target is checked
// before the device is touched: a target csid may not mount on leaves the
// device as it was.
//
// An ext3/ext4 filesystem smaller than its device (the disk grew while
// detached) is grown before it is mounted read-write, offline (e2fsck -f
// -p, then resize2fs on the unmounted device), unless this process may grow
// it online after the mount (CAP_SYS_RESOURCE, which some container
// runtimes drop): then GrowFilesystem does, as it does for xfs. An offline
// growth is recorded before it starts, and one that was interrupted is
// repaired before the filesystem is mounted again, read-only or not (see
// grow.go). The caller's context ending while a host tool runs lets the
// tool finish; FormatAndMount then stops before its next step. record, if
// any, runs beside the device's preparation (whileRecording).
func (m *Linux) FormatAndMount(ctx context.Context, device, target, fsType string, options []string, record func(Made) error) (formatted bool, err error) {
	if err := ValidatePaths(device, target); err != nil {
		return false, err
	}
	if fsType == "" {
		fsType = "ext4"
	}
	if _, ok := mkfsArgs[fsType]; !ok {
		return false, fmt.Errorf("filesystem %q: csid formats ext4, ext3 and xfs", fsType)
	}
	src, err := openSource(FilesystemMount, device)
	if err != nil {
		// What is not a readable block device holds nothing csid could
		// tell apart from data.
		return false, fmt.Errorf("%w: %w", ErrProbeFailed, err)
	}
	defer src.Close()
	e, made, err := planAt(src, target)
	if err != nil {
		return false, err
	}
	defer e.Close()
	if !made.Mounted {
		return false, nil
	}
	if err := whileRecording(made, record, func() (err error) {
		formatted, err = m.prepareDevice(ctx, device, fsType, options)
		return err
	}); err != nil {
		return false, err
	}
	if err := mountAt(e, made, func(t *os.File) error { return m.mountFilesystem(ctx, device, t, fsType, options) }); err != nil {
		return false, err
	}
	return formatted, nil
}

// whileRecording runs prepare (the device's probe and format) while record
// (nil: none) records made, and returns when both are done: prepare's
// error first, then record's. A panic in record is raised again here, on
// the caller's goroutine, where the caller's recovery sees it as before.
func whileRecording(made Made, record func(Made) error, prepare func() error) error {
	if record == nil {
		return prepare()
	}
	type outcome struct {
		err      error
		panicked any
	}
	recorded := make(chan outcome, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				recorded <- outcome{panicked: p}
			}
		}()
		recorded <- outcome{err: record(made)}
	}()
	err := prepare()
	r := <-recorded
	if r.panicked != nil {
		panic(r.panicked)
	}
	if err != nil {
		return err
	}
	return r.err
}

// prepareDevice formats device with fsType if a successful probe finds it
// blank (formatted), or grows its ext3/ext4 filesystem to the device;
// another filesystem is ErrFormatMismatch.
func (m *Linux) prepareDevice(ctx context.Context, device, fsType string, options []string) (formatted bool, err error) {
	existing, err := m.Filesystem(ctx, device)
	if err != nil {
		return false, err
	}
	switch existing {
	case "":
		if slices.Contains(options, "ro") {
			return false, fmt.Errorf("%s is blank and the mount is read-only: csid formats only for read-write mounts", device)
		}
		zerolog.Ctx(ctx).Info().Str("device", device).Str("fs", fsType).Msg("formatting a blank device")
		name, args, _ := FormatCommand(fsType, device) // FormatAndMount checked fsType
		if _, err := m.run(ctx, name, args...); err != nil {
			return false, fmt.Errorf("format %s as %s: %w", device, fsType, err)
		}
		crash.Point(crash.MounterAfterFormat)
		formatted = true
	case fsType:
		if isExt(fsType) {
			if _, err := m.growExtBeforeMount(ctx, device, !slices.Contains(options, "ro")); err != nil {
				return false, err
			}
		}
	default:
		return false, fmt.Errorf("%s holds %s, asked to mount %s: %w", device, existing, fsType, ErrFormatMismatch)
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("mount %s: %w", device, err)
	}
	return formatted, nil
}

// mountFilesystem mounts device's filesystem on the directory target with
// mount(8), which gets target as its descriptor 3 and mounts on
// /proc/self/fd/3 as it is (--no-canonicalize); like every host tool, it
// runs to completion. The options are not repeated in the error: the CSI
// spec lets mount flags be sensitive.
func (m *Linux) mountFilesystem(ctx context.Context, device string, target *os.File, fsType string, options []string) error {
	args := MountCommand(device, "/proc/self/fd/3", fsType, options)
	if _, err := m.tools.runWith(ctx, []*os.File{target}, "mount", args...); err != nil {
		var xe *execError
		if errors.As(err, &xe) {
			err = fmt.Errorf("%w: %s", xe.err, xe.stderr)
		}
		return fmt.Errorf("mount %s (%s) at %s: %w", device, fsType, target.Name(), err)
	}
	return nil
}

// IsMounted reports whether path is a mount point; see Mounter. A link in
// path is ErrSymlink.
func (m *Linux) IsMounted(ctx context.Context, path string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	e, l, err := look(path)
	if err != nil || e == nil {
		return false, err
	}
	defer e.Close()
	return l.mountPoint, nil
}

// look opens path's entry and looks at it. A path that cannot exist (no
// parent directory, or an element that is no directory) is (nil, no leaf,
// nil).
func look(path string) (*entry, leaf, error) {
	e, l, err := openLeaf(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrPathConflict) {
		return nil, leaf{}, nil
	}
	return e, l, err
}

// lookMounted is look for a path that must be a mount point: anything
// else is ErrNotMounted.
func lookMounted(ctx context.Context, path string) (*entry, leaf, error) {
	if err := ctx.Err(); err != nil {
		return nil, leaf{}, err
	}
	e, l, err := look(path)
	if err != nil {
		return nil, leaf{}, err
	}
	if e == nil || !l.mountPoint {
		if e != nil {
			e.Close()
		}
		return nil, leaf{}, fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	return e, l, nil
}

// DeviceOf returns the device mounted at path; see Mounter. For a block
// device bind-mounted on a file it is that device; for a filesystem (also
// seen through a bind mount) the device holding it, as /dev/<name>; for a
// filesystem without a device (tmpfs, ...) the source the mount table shows.
func (m *Linux) DeviceOf(ctx context.Context, path string) (string, error) {
	e, l, err := lookMounted(ctx, path)
	if err != nil {
		return "", err
	}
	defer e.Close()
	dev := l.dev
	if l.isBlock() {
		dev = l.rdev
	}
	if name, ok := blockDeviceName(dev); ok {
		return "/dev/" + name, nil
	}
	if mi := e.mountInfo(l); mi != nil {
		return mi.Source, nil
	}
	return "", fmt.Errorf("%s: the mount table does not show what is mounted", path)
}

// blockDeviceName names the block device with number dev from sysfs.
func blockDeviceName(dev uint64) (string, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok && name != "" {
			return name, true
		}
	}
	return "", false
}

// DeviceSize returns the size of a block device; see Mounter.
func (m *Linux) DeviceSize(ctx context.Context, device string) (int64, error) {
	if err := ValidatePath(device); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !isBlock(fi) {
		return 0, fmt.Errorf("%s is not a block device", device)
	}
	return f.Seek(0, io.SeekEnd)
}

// GrowFilesystem grows the filesystem of device mounted at path to fill the
// device; see Mounter. ext3/ext4 are grown by resize2fs only when the
// device is larger than the filesystem; xfs_growfs is asked every time (it
// does nothing when there is nothing to do). It reports whether the
// filesystem's size grew. A filesystem mounted read-only cannot grow online:
// (false, nil). path not mounted is ErrNotMounted; mounted from another
// device, ErrBusy.
//
// xfs_growfs takes the mount point by name: path is checked, without
// following a link, to be a mount point of device's filesystem just
// before, and a mount point cannot be renamed or replaced while mounted.
func (m *Linux) GrowFilesystem(ctx context.Context, device, path string) (bool, error) {
	if err := ValidatePaths(device, path); err != nil {
		return false, err
	}
	src, err := openSource(FilesystemMount, device)
	if err != nil {
		return false, err
	}
	defer src.Close()
	e, l, err := lookMounted(ctx, path)
	if err != nil {
		return false, err
	}
	defer e.Close()
	if !src.holds(l) {
		return false, fmt.Errorf("%s is not mounted from %s (%s): %w", path, device, e.mounted(l), ErrBusy)
	}
	root, err := e.open(unix.O_PATH)
	if err != nil {
		return false, err
	}
	defer root.Close()
	var before unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &before); err != nil {
		return false, err
	}
	if before.Flags&unix.ST_RDONLY != 0 {
		return false, nil
	}
	// The filesystem at path is device's (checked above), so statfs names
	// its type; no probe of the device. The kernel grows it, journalled:
	// resize2fs and xfs_growfs only ask.
	var grow []string
	switch before.Type {
	case unix.EXT4_SUPER_MAGIC: // ext2, ext3 and ext4
		// ext4 keeps its superblock in the device's page cache, so it
		// reads current even while mounted: skip resize2fs when there is
		// nothing to do, and say clearly when it cannot be done here.
		if short, err := m.extShort(ctx, device); err != nil || !short {
			return false, err
		}
		if !m.onlineExt {
			return false, fmt.Errorf("grow the filesystem of %s at %s: online growth of ext4 needs CAP_SYS_RESOURCE, which this process lacks; unmount it and mount it again (FormatAndMount grows it offline)", device, path)
		}
		grow = []string{"resize2fs", device}
	case unix.XFS_SUPER_MAGIC:
		grow = []string{"xfs_growfs", "-d", e.path}
	default:
		return false, fmt.Errorf("grow the filesystem at %s: csid grows ext3, ext4 and xfs, not filesystem type %#x", path, before.Type)
	}
	if _, err := m.run(ctx, grow[0], grow[1:]...); err != nil {
		return false, fmt.Errorf("grow the filesystem of %s at %s: %w", device, path, err)
	}
	var after unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &after); err != nil {
		return false, err
	}
	return after.Blocks*uint64(after.Bsize) > before.Blocks*uint64(before.Bsize), nil
}

// Stats reports the usage of the filesystem mounted at path, or the size of
// the block device mounted there; see Mounter. A path that is not a mount
// point is ErrNotMounted (statfs would report the file system around it).
func (m *Linux) Stats(ctx context.Context, path string) (Stats, error) {
	e, l, err := lookMounted(ctx, path)
	if err != nil {
		return Stats{}, err
	}
	defer e.Close()
	if l.isBlock() {
		f, err := e.open(unix.O_RDONLY)
		if err != nil {
			return Stats{}, err
		}
		defer f.Close()
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			return Stats{}, err
		}
		return Stats{TotalBytes: size, Block: true}, nil
	}
	root, err := e.open(unix.O_PATH)
	if err != nil {
		return Stats{}, err
	}
	defer root.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &st); err != nil {
		return Stats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bsize := int64(st.Bsize)
	return Stats{
		TotalBytes:     int64(st.Blocks) * bsize,
		AvailableBytes: int64(st.Bavail) * bsize,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bsize,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
	}, nil
}

// List returns the mount table of this process's mount namespace; see
// Mounter.
func (m *Linux) List(ctx context.Context) ([]MountPoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	out := make([]MountPoint, 0, len(infos))
	for _, in := range infos {
		out = append(out, MountPoint{
			Device:  in.Source,
			Path:    in.Mountpoint,
			Type:    in.FSType,
			Root:    in.Root,
			Options: strings.Split(in.Options, ","),
		})
	}
	return out, nil
}

// DeviceUses lists where device is in use in this process's mount table,
// by its device number; see Mounter. A device node bound on a file is
// found on devtmpfs and tmpfs only (internal/devuse).
func (m *Linux) DeviceUses(ctx context.Context, device string) ([]DeviceUse, error) {
	if err := ValidatePath(device); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(device)
	if err != nil {
		return nil, err
	}
	if !isBlock(fi) {
		return nil, fmt.Errorf("%s is not a block device", device)
	}
	uses, err := devuse.Of(rdev(fi))
	if err != nil {
		return nil, err
	}
	out := make([]DeviceUse, 0, len(uses))
	for _, u := range uses {
		kind := FilesystemMount
		if u.Kind == devuse.Node {
			kind = DeviceBind
		}
		out = append(out, DeviceUse{Kind: kind, Path: u.Path})
	}
	return out, nil
}

// capable reports whether this process has capability c in its effective
// set.
func capable(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

func isBlock(fi os.FileInfo) bool {
	return fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}

func rdev(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Rdev
	}
	return 0
}
