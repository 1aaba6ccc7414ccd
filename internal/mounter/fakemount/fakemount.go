// Package fakemount is an in-memory mounter.Mounter for csid's fake backend
// mode: load tests and drills of the engine without root, loop devices or
// mkfs. It is a behavioural fake, not a mock: it keeps the contract of
// package mounter (the mountertest suite runs against it and against the
// real one), remembers which devices hold which filesystem at which size,
// and which targets are mounted from what.
//
// Targets are real: FormatAndMount and BindMount create the target
// directory, BindMountDevice the target file, and Unmount removes them, so
// a caller's "the target is gone" checks hold; and they are looked at as
// the real mounter looks at them (mounter.Lookup): a symbolic link in a
// path, a target with content or of the wrong kind, a missing parent
// directory, a real mount the fake did not make, are refused alike.
// Devices are not: any device
// path is accepted (the fake provider's /dev/csid-fake/...) and nothing is
// ever opened there. What a caller writes into a mounted target is a plain
// file in a plain directory: Stats counts it, and Unmount deletes it with
// the target, as if it had lived on the device (the fake does not keep data
// across mounts).
//
// A Mounter is safe for concurrent use.
package fakemount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/csid-dev/csid/internal/mounter"
)

// DefaultDeviceSize is the size of a device nobody set a size for.
const DefaultDeviceSize = 1 << 30

// Plausible numbers for Stats: the space a fresh filesystem uses, and how
// many bytes of filesystem per inode.
const (
	overheadFraction = 64 // 1/64 of the filesystem
	bytesPerInode    = 16 << 10
	freshInodes      = 11
)

type kind int

const (
	kindFS     kind = iota // a filesystem of a device
	kindBind               // a directory bind-mounted
	kindDevice             // a block device bind-mounted on a file
)

type device struct {
	size     int64
	fsType   string // "" while blank
	fsBytes  int64  // the size of the filesystem
	probeErr error
}

type mount struct {
	kind     kind
	device   string // the device behind the mount, "" for a bind of a plain directory
	source   string // what was mounted: the device, or the bound directory
	fsType   string
	readOnly bool
	options  []string
	seq      int
}

// Mounter is the fake.
type Mounter struct {
	mu      sync.Mutex
	devices map[string]*device
	mounts  map[string]*mount
	seq     int
}

var _ mounter.Mounter = (*Mounter)(nil)

// New returns a Mounter with no devices formatted and nothing mounted.
func New() *Mounter {
	return &Mounter{devices: map[string]*device{}, mounts: map[string]*mount{}}
}

// dev returns the record of a device, creating a blank one; the caller
// holds m.mu.
func (m *Mounter) dev(path string) *device {
	d, ok := m.devices[path]
	if !ok {
		d = &device{size: DefaultDeviceSize}
		m.devices[path] = d
	}
	return d
}

// SetDeviceSize sets the size of a device, as a disk that grew (or the
// first size it has).
func (m *Mounter) SetDeviceSize(device string, size int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dev(device).size = size
}

// FailProbe makes every probe of device fail with ErrProbeFailed (wrapping
// err) until called again with a nil err.
func (m *Mounter) FailProbe(device string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dev(device).probeErr = err
}

// probe is Filesystem under the lock.
func (m *Mounter) probe(device string) (*device, error) {
	d := m.dev(device)
	if d.probeErr != nil {
		return nil, fmt.Errorf("probe %s: %v: %w", device, d.probeErr, mounter.ErrProbeFailed)
	}
	return d, nil
}

var supported = []string{"ext4", "ext3", "xfs"}

func isExt(fsType string) bool { return fsType == "ext4" || fsType == "ext3" }

// kindOf is the mounter's name of a fake mount's kind.
var kindOf = map[kind]mounter.MountKind{kindFS: mounter.FilesystemMount, kindBind: mounter.DirBind, kindDevice: mounter.DeviceBind}

// holds reports whether mt is a mount of source as kind k.
func (mt *mount) holds(k mounter.MountKind, source string) bool {
	return kindOf[mt.kind] == k && mt.source == source
}

// plan is Plan under the lock.
func (m *Mounter) plan(k mounter.MountKind, source, target string) (mounter.Made, error) {
	made := mounter.Made{Kind: k, Source: source}
	if mt, ok := m.mounts[target]; ok {
		if mt.holds(k, source) {
			return made, nil
		}
		return mounter.Made{}, fmt.Errorf("%s is a mount point of %s, not of %s: %w", target, mt.source, source, mounter.ErrBusy)
	}
	info, err := mounter.Lookup(target)
	if errors.Is(err, fs.ErrNotExist) {
		return mounter.Made{}, fmt.Errorf("the parent directory of %s does not exist: %w", target, mounter.ErrPathConflict)
	}
	switch {
	case err != nil:
		return mounter.Made{}, err
	case info.MountPoint:
		return mounter.Made{}, fmt.Errorf("%s is a mount point of %s, not of %s: %w", target, info.Mounted, source, mounter.ErrBusy)
	case !info.Exists:
		made.Created, made.Mounted = true, true
		return made, nil
	}
	if err := info.Conflict(target, k); err != nil {
		return mounter.Made{}, err
	}
	made.Mounted = true
	return made, nil
}

// create makes the target a plan says to create: a directory, or the file
// of a device.
func create(made mounter.Made, target string) error {
	if !made.Created {
		return nil
	}
	if made.Kind != mounter.DeviceBind {
		return os.Mkdir(target, 0o750)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// Plan says what a mount would make at target; see mounter.Mounter.
func (m *Mounter) Plan(ctx context.Context, k mounter.MountKind, source, target string) (mounter.Made, error) {
	if err := mounter.ValidatePaths(source, target); err != nil {
		return mounter.Made{}, err
	}
	if k == mounter.DirBind {
		if err := checkSource(source); err != nil {
			return mounter.Made{}, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.plan(k, source, target)
}

// Undo removes what a mount made at target, and only that; see
// mounter.Mounter.
func (m *Mounter) Undo(ctx context.Context, target string, made mounter.Made) error {
	if made.Nothing() {
		return nil
	}
	if err := mounter.ValidatePath(target); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if mt, ok := m.mounts[target]; ok {
		if !made.Mounted || !mt.holds(made.Kind, made.Source) {
			return nil
		}
		if err := m.forget(target); err != nil {
			return err
		}
	}
	info, err := mounter.Lookup(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !info.Exists, info.MountPoint, !made.Created:
		return nil
	}
	return remove(target, info)
}

// forget drops the fake mount at target and what was written into it (it
// lived on the device); the target itself stays. The caller holds m.mu.
func (m *Mounter) forget(target string) error {
	delete(m.mounts, target)
	entries, err := os.ReadDir(target)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(target, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// remove removes a target that is an empty directory or an empty file, as
// the real mounter does; anything else is ErrPathConflict.
func remove(target string, info mounter.PathInfo) error {
	if !info.Empty || (!info.Dir && !info.Regular) {
		return fmt.Errorf("%s is not an empty directory or file; it is left in place: %w", target, mounter.ErrPathConflict)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// checkSource checks the source of a bind mount as the real mounter does:
// an existing directory, reached without a symbolic link.
func checkSource(source string) error {
	info, err := mounter.Lookup(source)
	switch {
	case err != nil:
		return fmt.Errorf("bind mount source: %w", err)
	case !info.Exists:
		return fmt.Errorf("bind mount source %s: %w", source, fs.ErrNotExist)
	case !info.Dir:
		return fmt.Errorf("bind mount source %s is not a directory", source)
	}
	return nil
}

// FormatAndMount formats a blank device and mounts it; see mounter.Mounter.
// Like the real one, it grows an ext3/ext4 filesystem smaller than its
// device before a read-write mount. record runs after the format, with the
// fake's lock held: it must not call the fake.
func (m *Mounter) FormatAndMount(ctx context.Context, device, target, fsType string, options []string, record func(mounter.Made) error) (formatted bool, err error) {
	if err := mounter.ValidatePaths(device, target); err != nil {
		return false, err
	}
	if fsType == "" {
		fsType = "ext4"
	}
	if !slices.Contains(supported, fsType) {
		return false, fmt.Errorf("filesystem %q: csid formats %v", fsType, supported)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	made, err := m.plan(mounter.FilesystemMount, device, target)
	if err != nil || !made.Mounted {
		return false, err
	}
	d, err := m.probe(device)
	if err != nil {
		return false, err
	}
	readOnly := slices.Contains(options, "ro")
	switch d.fsType {
	case "":
		if readOnly {
			return false, fmt.Errorf("%s is blank and the mount is read-only: csid formats only for read-write mounts", device)
		}
		d.fsType, d.fsBytes = fsType, d.size
		formatted = true
	case fsType:
		if isExt(fsType) && !readOnly && d.fsBytes < d.size {
			d.fsBytes = d.size
		}
	default:
		return false, fmt.Errorf("%s holds %s, asked to mount %s: %w", device, d.fsType, fsType, mounter.ErrFormatMismatch)
	}
	if record != nil {
		if err := record(made); err != nil {
			return false, err
		}
	}
	if err := create(made, target); err != nil {
		return false, err
	}
	m.add(target, &mount{kind: kindFS, device: device, source: device, fsType: fsType, readOnly: readOnly, options: slices.Clone(options)})
	return formatted, nil
}

// add records a mount; the caller holds m.mu.
func (m *Mounter) add(target string, mt *mount) {
	m.seq++
	mt.seq = m.seq
	m.mounts[target] = mt
}

// BindMount bind-mounts a directory; see mounter.Mounter. The source must
// exist (it is checked on the real file system); the target is created.
func (m *Mounter) BindMount(ctx context.Context, source, target string, readOnly bool) error {
	if err := mounter.ValidatePaths(source, target); err != nil {
		return err
	}
	if err := checkSource(source); err != nil {
		return err
	}
	return m.bind(mounter.DirBind, source, target, readOnly)
}

// BindMountDevice bind-mounts a block device on a file; see
// mounter.Mounter. The target file is created; the device is not opened.
func (m *Mounter) BindMountDevice(ctx context.Context, device, target string, readOnly bool) error {
	if err := mounter.ValidatePaths(device, target); err != nil {
		return err
	}
	return m.bind(mounter.DeviceBind, device, target, readOnly)
}

// bind is BindMount and BindMountDevice once the source is checked.
func (m *Mounter) bind(k mounter.MountKind, source, target string, readOnly bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	made, err := m.plan(k, source, target)
	if err != nil {
		return err
	}
	if !made.Mounted {
		m.mounts[target].readOnly = readOnly
		return nil
	}
	if err := create(made, target); err != nil {
		return err
	}
	mt := &mount{kind: kindBind, source: source, readOnly: readOnly}
	if k == mounter.DeviceBind {
		m.dev(source)
		mt.kind, mt.device = kindDevice, source
	} else if src, ok := m.mounts[source]; ok {
		mt.device, mt.fsType = src.device, src.fsType
		mt.readOnly = readOnly || src.readOnly
	}
	m.add(target, mt)
	return nil
}

// Unmount forgets the mount at target and removes the target; see
// mounter.Mounter. A target the fake mounted goes with what was written
// into it; any other target is removed only if empty, as the real one does.
func (m *Mounter) Unmount(ctx context.Context, target string) error {
	if err := mounter.ValidatePath(target); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mounts[target]; ok {
		if err := m.forget(target); err != nil {
			return err
		}
	}
	info, err := mounter.Lookup(target)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, mounter.ErrPathConflict):
		return nil
	case err != nil:
		return err
	case !info.Exists:
		return nil
	}
	if err := remove(target, info); err != nil {
		return fmt.Errorf("remove %s after unmounting it: %w", target, err)
	}
	return nil
}

// IsMounted reports whether the fake mounted something at path (or
// anything else is mounted there); a symbolic link in path is
// mounter.ErrSymlink, as for the real one.
func (m *Mounter) IsMounted(ctx context.Context, path string) (bool, error) {
	if err := mounter.ValidatePath(path); err != nil {
		return false, err
	}
	m.mu.Lock()
	_, ok := m.mounts[path]
	m.mu.Unlock()
	if ok {
		return true, nil
	}
	info, err := mounter.Lookup(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, mounter.ErrPathConflict) {
		return false, nil
	}
	return info.MountPoint, err
}

// DeviceOf returns the device behind the mount at path; see
// mounter.Mounter. A bind of a directory that is no mount reports "none".
func (m *Mounter) DeviceOf(ctx context.Context, path string) (string, error) {
	if err := mounter.ValidatePath(path); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, ok := m.mounts[path]
	if !ok {
		return "", fmt.Errorf("%s: %w", path, mounter.ErrNotMounted)
	}
	if mt.device == "" {
		return "none", nil
	}
	return mt.device, nil
}

// Filesystem reports the filesystem the fake formatted on device, "" when
// blank; an injected probe failure is ErrProbeFailed.
func (m *Mounter) Filesystem(ctx context.Context, device string) (string, error) {
	if err := mounter.ValidatePath(device); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, err := m.probe(device)
	if err != nil {
		return "", err
	}
	return d.fsType, nil
}

// DeviceSize returns the size of a device (DefaultDeviceSize unless set).
func (m *Mounter) DeviceSize(ctx context.Context, device string) (int64, error) {
	if err := mounter.ValidatePath(device); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dev(device).size, nil
}

// GrowFilesystem grows the filesystem of device mounted at path to the
// device's size; see mounter.Mounter.
func (m *Mounter) GrowFilesystem(ctx context.Context, device, path string) (bool, error) {
	if err := mounter.ValidatePaths(device, path); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, ok := m.mounts[path]
	if !ok {
		return false, fmt.Errorf("%s: %w", path, mounter.ErrNotMounted)
	}
	if mt.device != device || mt.kind == kindDevice {
		return false, fmt.Errorf("%s is not mounted from %s: %w", path, device, mounter.ErrBusy)
	}
	d, err := m.probe(device)
	if err != nil {
		return false, err
	}
	if mt.readOnly || d.fsBytes >= d.size {
		return false, nil
	}
	d.fsBytes = d.size
	return true, nil
}

// Stats reports plausible usage of the mount at path: the filesystem's size,
// a fixed overhead plus what was written into the target, and inodes in
// proportion; a block device reports its size.
func (m *Mounter) Stats(ctx context.Context, path string) (mounter.Stats, error) {
	if err := mounter.ValidatePath(path); err != nil {
		return mounter.Stats{}, err
	}
	m.mu.Lock()
	mt, ok := m.mounts[path]
	var d device
	if ok && mt.device != "" {
		d = *m.dev(mt.device)
	}
	m.mu.Unlock()
	if !ok {
		return mounter.Stats{}, fmt.Errorf("%s: %w", path, mounter.ErrNotMounted)
	}
	if mt.kind == kindDevice {
		return mounter.Stats{TotalBytes: d.size, Block: true}, nil
	}
	total := d.fsBytes
	if mt.device == "" {
		total = DefaultDeviceSize
	}
	written, files, err := usage(path)
	if err != nil {
		return mounter.Stats{}, err
	}
	used := min(total/overheadFraction+written, total)
	inodes := max(total/bytesPerInode, freshInodes+files)
	return mounter.Stats{
		TotalBytes:     total,
		UsedBytes:      used,
		AvailableBytes: total - used,
		TotalInodes:    inodes,
		UsedInodes:     freshInodes + files,
		FreeInodes:     inodes - freshInodes - files,
	}, nil
}

// usage sums the sizes and counts the entries under dir.
func usage(dir string) (bytes, entries int64, err error) {
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		entries++
		if e.Type().IsRegular() {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			bytes += fi.Size()
		}
		return nil
	})
	return bytes, entries, err
}

// DeviceUses lists where the fake has mounted device's filesystem (or a
// bind of it) and bound device itself, in the order it mounted them; see
// mounter.Mounter.
func (m *Mounter) DeviceUses(ctx context.Context, device string) ([]mounter.DeviceUse, error) {
	if err := mounter.ValidatePath(device); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []mounter.DeviceUse
	for target, mt := range m.mounts {
		switch {
		case mt.device != device:
		case mt.kind == kindDevice:
			out = append(out, mounter.DeviceUse{Kind: mounter.DeviceBind, Path: target})
		default:
			out = append(out, mounter.DeviceUse{Kind: mounter.FilesystemMount, Path: target})
		}
	}
	slices.SortFunc(out, func(a, b mounter.DeviceUse) int { return m.mounts[a.Path].seq - m.mounts[b.Path].seq })
	return out, nil
}

// List returns what the fake has mounted, in the order it was mounted.
func (m *Mounter) List(ctx context.Context) ([]mounter.MountPoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]mounter.MountPoint, 0, len(m.mounts))
	for target, mt := range m.mounts {
		opts := []string{"rw"}
		if mt.readOnly {
			opts[0] = "ro"
		}
		opts = append(opts, mt.options...)
		device := mt.device
		if device == "" {
			device = "none"
		}
		root := "/"
		if mt.kind == kindBind {
			root = mt.source
		}
		out = append(out, mounter.MountPoint{Device: device, Path: target, Type: mt.fsType, Root: root, Options: opts})
	}
	slices.SortFunc(out, func(a, b mounter.MountPoint) int { return m.mounts[a.Path].seq - m.mounts[b.Path].seq })
	return out, nil
}
