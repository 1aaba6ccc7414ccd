// Package loopdev binds files to Linux loop devices, finds the device bound
// to a file again, and releases it. It talks to the kernel directly (the
// loop ioctls and sysfs), not through losetup: there is no output to parse,
// errors keep their errno (EBUSY when another process takes the same free
// device, so Attach can retry), and Release can hold an exclusive open of the
// device while it clears it, so a mount cannot slip in between the "is it in
// use?" check and the release.
//
// A file is identified by its device and inode number, never by its path:
// the path the kernel reports for a backing file depends on the mount
// namespace of the reader, and a copy of a file at another path is another
// file.
//
// Attaching and releasing need root (CAP_SYS_ADMIN and access to /dev/loop*);
// List only reads sysfs.
package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/devuse"
)

// ErrBusy: the device is in use (mounted, or opened exclusively), so it is
// not released.
var ErrBusy = errors.New("loop device is in use")

// Loop flags (include/uapi/linux/loop.h); x/sys/unix does not define them.
const (
	flagReadOnly  = 1
	flagAutoClear = 4
	flagDirectIO  = 16
)

// sectorSize is the logical block size of a loop device bound without
// direct I/O, and the one Attach asks for with it (see Options.DirectIO).
const sectorSize = 512

// Major is the block major number of loop devices.
const Major = 7

// sysBlock is where the kernel lists block devices.
const sysBlock = "/sys/block"

// procPartitions is where the kernel lists the block devices that have a
// size: of the loop devices, the bound ones.
const procPartitions = "/proc/partitions"

// Device is a loop device bound to a file.
type Device struct {
	// Path is the device node, /dev/loopN.
	Path string
	// Number is N.
	Number int
	// BackingFile is the path of the backing file as the kernel reports it
	// to this process, without the " (deleted)" suffix.
	BackingFile string
	// Deleted is true when the backing file has been unlinked.
	Deleted bool
	// AutoClear is true when the device is being released: it goes away
	// as soon as its last opener closes it.
	AutoClear bool
	// SizeBytes is the size of the device.
	SizeBytes int64
	// ReadOnly is true for a read-only binding.
	ReadOnly bool
	// DirectIO is true when the device reads and writes its backing file
	// with direct I/O, bypassing the page cache.
	DirectIO bool
}

// FileID identifies a file by the device and inode number it lives on.
type FileID struct {
	Dev uint64
	Ino uint64
}

// IDOf returns the identity of a file from its FileInfo.
func IDOf(fi os.FileInfo) (FileID, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileID{}, fmt.Errorf("%s: no device and inode number", fi.Name())
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, nil
}

// List returns every bound loop device on the machine, in device-number
// order. It reads sysfs only, so it needs no privilege; a device released
// while List runs is left out.
func List() ([]Device, error) {
	return listIn(sysBlock, nil)
}

// listIn lists the bound loop devices under root whose backing file path
// keep accepts (nil keeps all): the other sysfs attributes are read only
// for those.
func listIn(root string, keep func(backing string) bool) ([]Device, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var numbers []int
	for _, e := range entries {
		if n, ok := loopNumber(e.Name()); ok {
			numbers = append(numbers, n)
		}
	}
	return readAll(root, numbers, keep)
}

// readAll reads the sysfs attributes of loop devices by number (see
// listIn), in number order.
func readAll(root string, numbers []int, keep func(backing string) bool) ([]Device, error) {
	var out []Device
	for _, n := range numbers {
		d, bound, err := readSys(root, n, keep)
		if err != nil {
			return nil, err
		}
		if bound {
			out = append(out, d)
		}
	}
	// Listings sort by name ("loop10" before "loop2"); sort by number.
	slices.SortFunc(out, func(a, b Device) int { return a.Number - b.Number })
	return out, nil
}

func loopNumber(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "loop")
	if !ok || rest == "" {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// readSys reads /sys/block/loopN. bound is false when the device has no
// backing file (or vanished meanwhile), or one keep (when not nil) refuses.
func readSys(root string, n int, keep func(backing string) bool) (d Device, bound bool, err error) {
	dir := filepath.Join(root, "loop"+strconv.Itoa(n))
	backing, deleted, err := backingFile(dir)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
		// Not bound: the "loop" directory exists only while bound, and
		// reads ENODEV while the device is being released.
		return Device{}, false, nil
	}
	if err != nil {
		return Device{}, false, fmt.Errorf("loop%d: %w", n, err)
	}
	d = Device{Path: "/dev/loop" + strconv.Itoa(n), Number: n, BackingFile: backing, Deleted: deleted}
	if keep != nil && !keep(d.BackingFile) {
		return Device{}, false, nil
	}
	d.AutoClear = readSysInt(filepath.Join(dir, "loop", "autoclear")) == 1
	d.ReadOnly = readSysInt(filepath.Join(dir, "ro")) == 1
	d.DirectIO = readSysInt(filepath.Join(dir, "loop", "dio")) == 1
	d.SizeBytes = readSysInt(filepath.Join(dir, "size")) * 512
	return d, true, nil
}

// backingFile reads the path of a bound loop device's backing file from
// its sysfs directory dir, as the kernel reports it to this process, and
// whether the file has been unlinked (the " (deleted)" suffix, removed).
func backingFile(dir string) (path string, deleted bool, err error) {
	raw, err := os.ReadFile(filepath.Join(dir, "loop", "backing_file"))
	if err != nil {
		return "", false, err
	}
	path, deleted = strings.CutSuffix(strings.TrimSuffix(string(raw), "\n"), " (deleted)")
	return path, deleted, nil
}

// readSysInt reads a sysfs integer; a missing or odd file reads as 0.
func readSysInt(path string) int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// Backing returns the identity of the file bound to the device at path
// (LOOP_GET_STATUS64). An unbound device is an error wrapping unix.ENXIO.
func Backing(path string) (FileID, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return FileID{}, err
	}
	defer f.Close()
	return backingOf(f)
}

func backingOf(f *os.File) (FileID, error) {
	b, err := BindingOf(f)
	return b.File, err
}

// Binding is what an open loop device is bound to, as the kernel says.
type Binding struct {
	// File is the identity of the backing file.
	File FileID
	// Offset is where in the file the device starts.
	Offset int64
	// AutoClear: the device is being released; it goes as soon as its
	// last opener closes it.
	AutoClear bool
	// ReadOnly: the binding is read-only.
	ReadOnly bool
	// Encrypted: the binding transforms what it reads (the kernel's old
	// loop encryption), so the device is not the file's bytes.
	Encrypted bool
}

// BindingOf reports what the open loop device f is bound to
// (LOOP_GET_STATUS64 on the descriptor). An unbound device is an error
// wrapping unix.ENXIO. While f stays open the binding cannot change: the
// kernel refuses to bind a device that is bound, and a release asked for
// meanwhile (LOOP_CLR_FD) only marks it AutoClear until the last opener
// closes it.
func BindingOf(f *os.File) (Binding, error) {
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return Binding{}, fmt.Errorf("%s: LOOP_GET_STATUS64: %w", f.Name(), err)
	}
	return Binding{File: FileID{Dev: info.Device, Ino: info.Inode}, Offset: int64(info.Offset),
		AutoClear: info.Flags&flagAutoClear != 0, ReadOnly: info.Flags&flagReadOnly != 0, Encrypted: info.Encrypt_type != 0}, nil
}

// Number returns N of a loop device's path, /dev/loopN; ok is false for
// any other path.
func Number(path string) (int, bool) {
	name, ok := strings.CutPrefix(path, "/dev/")
	if !ok || strings.Contains(name, "/") {
		return 0, false
	}
	return loopNumber(name)
}

// Find returns the bound loop devices of non-zero size whose backing file
// is id. candidate, when not nil, first filters the sysfs listing cheaply
// by the backing file's path (for example by its base name), so that only
// plausible devices have their other attributes read and are opened.
// Devices being released (AutoClear) are included; callers decide.
//
// It looks only at the loop devices /proc/partitions lists, which are the
// bound ones of non-zero size (one read, where the sysfs listing costs a
// read per loop device on the machine, bound or not: most are not); a
// device of no size holds no byte of any file. Where /proc/partitions
// cannot be read, every loop device in sysfs is looked at.
func Find(id FileID, candidate func(backing string) bool) ([]Device, error) {
	all, err := listSized(procPartitions, sysBlock, candidate)
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, d := range all {
		got, err := Backing(d.Path)
		if errors.Is(err, unix.ENXIO) || errors.Is(err, os.ErrNotExist) {
			continue // released since List
		}
		if err != nil {
			return nil, err
		}
		if got == id {
			out = append(out, d)
		}
	}
	return out, nil
}

// listSized lists the bound loop devices of non-zero size, by the
// partitions list at partitions (see Find), reading their attributes
// under root; when the list cannot be read, it lists every loop device
// under root.
func listSized(partitions, root string, keep func(backing string) bool) ([]Device, error) {
	raw, err := os.ReadFile(partitions)
	if err != nil {
		return listIn(root, keep)
	}
	var numbers []int
	for _, line := range strings.Split(string(raw), "\n") {
		// major minor #blocks name
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != strconv.Itoa(Major) || f[2] == "0" {
			continue
		}
		if n, ok := loopNumber(f[3]); ok {
			numbers = append(numbers, n)
		}
	}
	return readAll(root, numbers, keep)
}

// Options shape a binding.
type Options struct {
	// SizeLimit caps the device at this many bytes of the file; 0 means
	// the whole file.
	SizeLimit int64
	// ReadOnly binds the device read-only; the file may then be open
	// read-only.
	ReadOnly bool
	// DirectIO binds the device with direct I/O (LO_FLAGS_DIRECT_IO) where
	// the backing file allows it, and buffered where it does not (the
	// kernel decides; Device.DirectIO says which it got). With direct
	// I/O the device reads and writes the file bypassing the page cache:
	// the data of a filesystem on the device is cached once, by that
	// filesystem, not a second time as pages of the backing file. The
	// device keeps 512-byte sectors either way: where the file's file
	// system needs larger direct I/O (a disk of 4 KiB sectors), the
	// device is buffered rather than of another geometry, under which a
	// filesystem made on it before (xfs of 512-byte sectors) would not
	// mount.
	DirectIO bool
}

// maxAttachRaces bounds the retries when other processes keep taking the
// free device Attach was offered.
const maxAttachRaces = 64

// Attach binds file to a free loop device and returns it. The device stays
// bound after file is closed and after this process exits, until Release.
// Attach does not look for an existing binding of the file: callers that
// must never bind a file twice look it up with Find first, under their own
// lock.
func Attach(ctx context.Context, file *os.File, opts Options) (Device, error) {
	if opts.SizeLimit < 0 {
		return Device{}, fmt.Errorf("attach %s: negative size limit", file.Name())
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, fmt.Errorf("attach %s: %w", file.Name(), err)
	}
	defer ctl.Close()
	for range maxAttachRaces {
		if err := ctx.Err(); err != nil {
			return Device{}, err
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return Device{}, fmt.Errorf("attach %s: LOOP_CTL_GET_FREE: %w", file.Name(), err)
		}
		d, err := bind(file, n, opts)
		if errors.Is(err, unix.EBUSY) {
			continue // another process bound loopN first; ask again
		}
		if err != nil {
			return Device{}, fmt.Errorf("attach %s: %w", file.Name(), err)
		}
		return d, nil
	}
	return Device{}, fmt.Errorf("attach %s: lost the race for a free loop device %d times", file.Name(), maxAttachRaces)
}

func bind(file *os.File, n int, opts Options) (Device, error) {
	path := "/dev/loop" + strconv.Itoa(n)
	if err := ensureNode(path, n); err != nil {
		return Device{}, err
	}
	mode := os.O_RDWR
	var flags, blockSize uint32
	if opts.ReadOnly {
		mode = os.O_RDONLY
		flags |= flagReadOnly
	}
	if opts.DirectIO {
		flags |= flagDirectIO
		blockSize = sectorSize
	}
	dev, err := os.OpenFile(path, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, err
	}
	defer dev.Close()
	cfg := unix.LoopConfig{
		Fd:   uint32(file.Fd()),
		Size: blockSize,
		Info: unix.LoopInfo64{
			Sizelimit: uint64(opts.SizeLimit),
			Flags:     flags,
		},
	}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file.Name())
	err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
		// Kernels before 5.8 lack LOOP_CONFIGURE.
		err = setFD(dev, file, &cfg.Info, opts.DirectIO)
	}
	runtime.KeepAlive(file)
	if err != nil {
		return Device{}, err
	}
	d, bound, err := readSys(sysBlock, n, nil)
	if err != nil {
		return Device{}, err
	}
	if !bound {
		return Device{}, fmt.Errorf("%s: bound but sysfs shows no backing file", path)
	}
	return d, nil
}

// setFD binds file to dev the way of kernels before LOOP_CONFIGURE; the
// device has 512-byte sectors. Direct I/O is asked for afterwards, and a
// refusal leaves the device buffered.
func setFD(dev, file *os.File, info *unix.LoopInfo64, directIO bool) error {
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(file.Fd())); err != nil {
		return fmt.Errorf("LOOP_SET_FD: %w", err)
	}
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), info); err != nil {
		_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("LOOP_SET_STATUS64: %w", err)
	}
	if directIO {
		_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_DIRECT_IO, 1)
	}
	return nil
}

// ensureNode creates /dev/loopN when /dev is not a devtmpfs that the kernel
// populates itself (some container runtimes).
func ensureNode(path string, n int) error {
	_, err := os.Stat(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	err = unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(Major, uint32(n))))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// Release unbinds the device at path if it is still bound to the file id,
// and waits until the kernel has let it go (or ctx ends). A device that is
// mounted or otherwise opened exclusively, or whose node is bind-mounted
// on a file (a raw block volume's target: such a bind does not hold the
// device open, and would show the next file bound to the device), is
// ErrBusy and stays bound. A device already released, or bound to another
// file since, is success: it is not this file's any more.
//
// The exclusive open held across the checks and the release keeps a mount,
// or the bind of an opener that opens exclusively, from slipping in
// between. Openers that are not exclusive (a process reading the device,
// udev probing it) delay the release until they close; Release waits for
// that.
func Release(ctx context.Context, path string, id FileID) error {
	n, ok := loopNumber(filepath.Base(path))
	if !ok {
		return fmt.Errorf("release %s: not a loop device", path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("release %s: %w (mounted or held open)", path, ErrBusy)
	}
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release %s: %w", path, err)
	}
	got, err := backingOf(f)
	if errors.Is(err, unix.ENXIO) || (err == nil && got != id) {
		f.Close()
		return nil
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("release %s: %w", path, err)
	}
	if err := notBound(f); err != nil {
		f.Close()
		return fmt.Errorf("release %s: %w", path, err)
	}
	// What sysfs says while the device is ours, to recognise it below
	// without opening the device again (an opener delays the release).
	before, bound, err := readSys(sysBlock, n, nil)
	if err != nil || !bound {
		f.Close()
		return err
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	f.Close() // the kernel finishes the release when the last opener closes
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("release %s: LOOP_CLR_FD: %w", path, err)
	}
	return waitReleased(ctx, n, before.BackingFile)
}

// notBound returns ErrBusy when the node of the open device f is
// bind-mounted anywhere in the mount table (or, although the exclusive
// open rules it out, a filesystem on it is mounted).
func notBound(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	uses, err := devuse.Of(uint64(st.Rdev))
	if err != nil {
		return err
	}
	if len(uses) > 0 {
		return fmt.Errorf("%w: %s", ErrBusy, uses[0])
	}
	return nil
}

// waitReleased polls sysfs until loopN is unbound or bound to another file.
func waitReleased(ctx context.Context, n int, backing string) error {
	delay := time.Millisecond
	for {
		d, bound, err := readSys(sysBlock, n, nil)
		if err != nil {
			return err
		}
		if !bound || d.BackingFile != backing {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("release %s: still held open by another process: %w", d.Path, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}
