package mounter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/moby/sys/mountinfo"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
)

// Linux is the Mounter of the machine csid runs on; it needs root.
//
// Filesystems are mounted by mount(8) through k8s.io/mount-utils, which
// parses the options ("noatime", "nouuid", ...) as users expect. Bind
// mounts and unmounts are made with mount(2), umount(2) and
// mount_setattr(2) directly: the same result as mount(8) (a test compares
// the mount tables) at a fraction of the cost (docs/benchmarks.md), and the
// read-only step changes the read-only flag alone. Mounted filesystems
// grow online (resize2fs, xfs_growfs); an unmounted ext3/ext4 grows with
// e2fsck and resize2fs before FormatAndMount mounts it, where online growth
// is not allowed. Host programs run to completion, never killed (runner.go).
// The mount table is read from /proc/self/mountinfo with
// github.com/moby/sys/mountinfo, which unescapes paths with spaces.
//
// A Linux is safe for concurrent use; callers serialise the calls that
// concern one device or one target (csid's engine runs one operation per
// volume at a time).
type Linux struct {
	// mount is made on first use: making one execs umount(8) to probe its
	// behaviour, which only mount-utils' own unmount needs, and a Linux
	// that never mounts a filesystem (List, Unmount, binds) should not pay.
	mount func() mountutils.Interface
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
	m := &Linux{
		mount:     sync.OnceValue(func() mountutils.Interface { return mountutils.NewWithoutSystemd("") }),
		onlineExt: capable(unix.CAP_SYS_RESOURCE),
	}
	m.run = run
	if run == nil {
		m.run = m.tools.run
	}
	return m
}

// Running lists the host programs (mkfs, e2fsck, resize2fs, xfs_growfs,
// blkid) the mounter is running now, longest-running first. Shutdown
// waits for them: csid never kills one.
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

// FormatAndMount formats device if a successful probe finds it blank and
// mounts it at target; see Mounter. A blank device is not formatted for a
// read-only mount ("ro" among the options): that is an error. A format is
// logged to ctx's zerolog logger, if it has one.
//
// An ext3/ext4 filesystem smaller than its device (the disk grew while
// detached) is grown before it is mounted read-write, offline (e2fsck -f
// -p, then resize2fs on the unmounted device), unless this process may grow
// it online after the mount (CAP_SYS_RESOURCE, which some container
// runtimes drop): then GrowFilesystem does, as it does for xfs. An offline
// growth is recorded before it starts, and one that was interrupted is
// repaired before the filesystem is mounted again, read-only or not (see
// grow.go). The caller's context ending while a host tool runs lets the
// tool finish; FormatAndMount then stops before its next step.
func (m *Linux) FormatAndMount(ctx context.Context, device, target, fsType string, options []string) error {
	if err := ValidatePaths(device, target); err != nil {
		return err
	}
	if fsType == "" {
		fsType = "ext4"
	}
	if _, ok := mkfsArgs[fsType]; !ok {
		return fmt.Errorf("filesystem %q: csid formats ext4, ext3 and xfs", fsType)
	}
	mounted, err := m.IsMounted(ctx, target)
	if err != nil {
		return err
	}
	if mounted {
		same, err := mountedFrom(device, target)
		if err != nil {
			return err
		}
		if !same {
			return fmt.Errorf("%s is mounted, not from %s: %w", target, device, ErrBusy)
		}
		return nil
	}
	existing, err := m.Filesystem(ctx, device)
	if err != nil {
		return err
	}
	switch existing {
	case "":
		if slices.Contains(options, "ro") {
			return fmt.Errorf("%s is blank and the mount is read-only: csid formats only for read-write mounts", device)
		}
		zerolog.Ctx(ctx).Info().Str("device", device).Str("fs", fsType).Msg("formatting a blank device")
		args := append(slices.Clone(mkfsArgs[fsType]), device)
		if _, err := m.run(ctx, "mkfs."+fsType, args...); err != nil {
			return fmt.Errorf("format %s as %s: %w", device, fsType, err)
		}
		crash.Point(crash.MounterAfterFormat)
	case fsType:
		if isExt(fsType) {
			if _, err := m.growExtBeforeMount(ctx, device, !slices.Contains(options, "ro")); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s holds %s, asked to mount %s: %w", device, existing, fsType, ErrFormatMismatch)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mount %s at %s: %w", device, target, err)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return err
	}
	if err := m.mount().Mount(device, target, fsType, options); err != nil {
		return fmt.Errorf("mount %s at %s: %w", device, target, err)
	}
	return nil
}

// BindMount bind-mounts the directory source at target; see Mounter. A
// target already bound to source is brought to the asked read-only state
// (a crash between the bind and the read-only step leaves it read-write).
func (m *Linux) BindMount(ctx context.Context, source, target string, readOnly bool) error {
	if err := ValidatePaths(source, target); err != nil {
		return err
	}
	src, err := os.Stat(source)
	if err != nil {
		return err
	}
	if !src.IsDir() {
		return fmt.Errorf("bind mount source %s is not a directory", source)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return err
	}
	return m.bind(ctx, source, target, readOnly, func(tgt os.FileInfo) bool { return os.SameFile(src, tgt) })
}

// BindMountDevice bind-mounts the block device at target, a file it
// creates; see Mounter.
//
// A read-only bind mount keeps the mount from being written through, but
// not the device: Linux lets a device node on a read-only mount be opened
// for writing. Read-only raw block volumes need the device itself read-only.
func (m *Linux) BindMountDevice(ctx context.Context, device, target string, readOnly bool) error {
	if err := ValidatePaths(device, target); err != nil {
		return err
	}
	dev, err := os.Stat(device)
	if err != nil {
		return err
	}
	if !isBlock(dev) {
		return fmt.Errorf("%s is not a block device", device)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	if fi, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY|unix.O_CLOEXEC, 0o640)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if f != nil {
			f.Close()
		}
	} else if err != nil {
		return err
	} else if fi.IsDir() {
		return fmt.Errorf("target %s of a block device is a directory", target)
	}
	return m.bind(ctx, device, target, readOnly, func(tgt os.FileInfo) bool {
		return isBlock(tgt) && rdev(tgt) == rdev(dev)
	})
}

// bind makes target a bind mount of source, or checks with same that it is
// one already, and sets its read-only flag.
func (m *Linux) bind(ctx context.Context, source, target string, readOnly bool, same func(target os.FileInfo) bool) error {
	mounted, err := m.IsMounted(ctx, target)
	if err != nil {
		return err
	}
	if mounted {
		tgt, err := os.Stat(target)
		if err != nil {
			return err
		}
		if !same(tgt) {
			return fmt.Errorf("%s is mounted, not from %s: %w", target, source, ErrBusy)
		}
		return setReadOnly(target, readOnly)
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", source, target, err)
	}
	if err := setReadOnly(target, readOnly); err != nil {
		// Never leave a writable mount where a read-only one was asked.
		_ = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		return err
	}
	return nil
}

// setReadOnly sets or clears the read-only flag of the mount at target and
// nothing else.
func setReadOnly(target string, readOnly bool) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", target, err)
	}
	if (st.Flags&unix.ST_RDONLY != 0) == readOnly {
		return nil
	}
	attr := unix.MountAttr{}
	if readOnly {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	} else {
		attr.Attr_clr = unix.MOUNT_ATTR_RDONLY
	}
	err := unix.MountSetattr(unix.AT_FDCWD, target, 0, &attr)
	if errors.Is(err, unix.ENOSYS) {
		err = remountReadOnly(target, &st, readOnly)
	}
	if err != nil {
		return fmt.Errorf("make %s read-only=%v: %w", target, readOnly, err)
	}
	return nil
}

// remountReadOnly is setReadOnly before Linux 5.12 (no mount_setattr): a
// bind remount sets every per-mount flag, so it restates those the mount
// has (st is its statfs), as mount(8) does.
func remountReadOnly(target string, st *unix.Statfs_t, readOnly bool) error {
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND)
	for stFlag, msFlag := range map[int64]uintptr{
		unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
		unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if int64(st.Flags)&stFlag != 0 {
			flags |= msFlag
		}
	}
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	return unix.Mount("", target, "", flags, "")
}

// Unmount unmounts target (every mount stacked on it) and removes it; see
// Mounter. A directory left with content after the unmount is not removed:
// that is an error, never a recursive delete.
func (m *Linux) Unmount(ctx context.Context, target string) error {
	if err := ValidatePath(target); err != nil {
		return err
	}
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	// Unmount until target is no mount point: mounts may be stacked on it.
	// EINVAL is the kernel saying it is none; so it says for a symbolic
	// link to a mount point, which csid does not follow.
	const maxStacked = 16
	for i := 0; ; i++ {
		mounted, err := m.IsMounted(ctx, target)
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		err = unmountRetrying(ctx, target)
		if errors.Is(err, unix.EINVAL) {
			break
		}
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w (%v)", target, ErrInUse, err)
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		if i == maxStacked {
			return fmt.Errorf("unmount %s: still mounted after %d unmounts", target, maxStacked)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s after unmounting it: %w", target, err)
	}
	return nil
}

// unmountRetrying unmounts target, retrying EBUSY for up to about a second:
// a mount is busy for an instant while anything holds a file in it, and
// such holders come and go on their own — a forked child holds a copy of
// its parent's open files until it execs, udev probes devices, a process is
// exiting. A holder that stays makes it return EBUSY.
func unmountRetrying(ctx context.Context, target string) error {
	wait := 5 * time.Millisecond
	for i := 0; ; i++ {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		if !errors.Is(err, unix.EBUSY) || i == 8 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// IsMounted reports whether path is a mount point; see Mounter.
func (m *Linux) IsMounted(ctx context.Context, path string) (bool, error) {
	if err := ValidatePath(path); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	mounted, err := mountinfo.Mounted(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("is %s mounted: %w", path, err)
	}
	return mounted, nil
}

// DeviceOf returns the device mounted at path; see Mounter. For a block
// device bind-mounted on a file it is that device; for a filesystem (also
// seen through a bind mount) the device holding it, as /dev/<name>; for a
// filesystem without a device (tmpfs, ...) the source the mount table shows.
func (m *Linux) DeviceOf(ctx context.Context, path string) (string, error) {
	mounted, err := m.IsMounted(ctx, path)
	if err != nil {
		return "", err
	}
	if !mounted {
		return "", fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	dev := stDev(fi)
	if isBlock(fi) {
		dev = rdev(fi)
	}
	if name, ok := blockDeviceName(dev); ok {
		return "/dev/" + name, nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(real))
	if err != nil {
		return "", err
	}
	if len(mounts) == 0 {
		return "", fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	return mounts[len(mounts)-1].Source, nil // the last is the top of the stack
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
func (m *Linux) GrowFilesystem(ctx context.Context, device, path string) (bool, error) {
	if err := ValidatePaths(device, path); err != nil {
		return false, err
	}
	mounted, err := m.IsMounted(ctx, path)
	if err != nil {
		return false, err
	}
	if !mounted {
		return false, fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	same, err := mountedFrom(device, path)
	if err != nil {
		return false, err
	}
	if !same {
		return false, fmt.Errorf("%s is not mounted from %s: %w", path, device, ErrBusy)
	}
	var before unix.Statfs_t
	if err := unix.Statfs(path, &before); err != nil {
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
		grow = []string{"xfs_growfs", "-d", path}
	default:
		return false, fmt.Errorf("grow the filesystem at %s: csid grows ext3, ext4 and xfs, not filesystem type %#x", path, before.Type)
	}
	if _, err := m.run(ctx, grow[0], grow[1:]...); err != nil {
		return false, fmt.Errorf("grow the filesystem of %s at %s: %w", device, path, err)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(path, &after); err != nil {
		return false, err
	}
	return after.Blocks*uint64(after.Bsize) > before.Blocks*uint64(before.Bsize), nil
}

// Stats reports the usage of the filesystem mounted at path, or the size of
// the block device mounted there; see Mounter. A path that is not a mount
// point is ErrNotMounted (statfs would report the file system around it).
func (m *Linux) Stats(ctx context.Context, path string) (Stats, error) {
	mounted, err := m.IsMounted(ctx, path)
	if err != nil {
		return Stats{}, err
	}
	if !mounted {
		return Stats{}, fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return Stats{}, err
	}
	if isBlock(fi) {
		size, err := m.DeviceSize(ctx, path)
		if err != nil {
			return Stats{}, err
		}
		return Stats{TotalBytes: size, Block: true}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
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

// mountedFrom reports whether the filesystem mounted at target lives on
// device (compared by device number, whatever the path names it).
func mountedFrom(device, target string) (bool, error) {
	dev, err := os.Stat(device)
	if err != nil {
		return false, err
	}
	if !isBlock(dev) {
		return false, fmt.Errorf("%s is not a block device", device)
	}
	tgt, err := os.Stat(target)
	if err != nil {
		return false, err
	}
	return stDev(tgt) == rdev(dev), nil
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

func stDev(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Dev
	}
	return 0
}
