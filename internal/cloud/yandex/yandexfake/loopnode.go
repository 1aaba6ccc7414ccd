package yandexfake

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/loopdev"
)

// releaseTimeout bounds how long a detach waits for the openers of a loop
// device to close it; after it the device is left to go when they do, as a
// disk unplugged under a guest.
const releaseTimeout = 5 * time.Second

// nodeHook is what the fake tells a simulated node when an operation on
// its instance completes. Methods run outside f.mu.
type nodeHook interface {
	attach(ctx context.Context, diskID, deviceName string, size int64) error
	detach(ctx context.Context, diskID string) error
	resize(diskID string) error
	close() error
}

// LoopNode simulates the guest of an instance with loop devices: a disk
// attached to the instance is the loop device of its image file, linked
// from ByIDDir as virtio-<device name>, as a virtio disk appears in
// /dev/disk/by-id. It needs root (loop devices).
type LoopNode struct {
	f          *Fake
	instanceID string
	dir        string

	mu      sync.Mutex
	devices map[string]binding // by disk id
	forced  []string
	closed  bool
}

type binding struct {
	path string // /dev/loopN
	file loopdev.FileID
	link string
}

// NewLoopNode makes dir/images and dir/by-id and simulates instance
// instanceID (added with AddInstance, with no disk attached yet) from now
// on: attaching a disk to it makes (or takes over) the image
// dir/images/<disk id>, binds it to a loop device and links
// dir/by-id/virtio-<device name> to the device; detaching undoes both and
// keeps the image. Close (or Fake.Close) releases what is still bound.
func NewLoopNode(f *Fake, instanceID, dir string) (*LoopNode, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"images", "by-id"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("yandexfake: loop node: %w", err)
		}
	}
	n := &LoopNode{f: f, instanceID: instanceID, dir: dir, devices: map[string]binding{}}
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.instances[instanceID]
	switch {
	case !ok:
		return nil, fmt.Errorf("yandexfake: loop node: no instance %s (AddInstance first)", instanceID)
	case len(in.disks) > 0:
		return nil, fmt.Errorf("yandexfake: loop node: instance %s already has disks attached", instanceID)
	case f.nodes[instanceID] != nil:
		return nil, fmt.Errorf("yandexfake: loop node: instance %s is simulated already", instanceID)
	}
	f.nodes[instanceID] = n
	return n, nil
}

// ByIDDir is the node's /dev/disk/by-id.
func (n *LoopNode) ByIDDir() string { return filepath.Join(n.dir, "by-id") }

// ImagePath is where the image of a disk is while the disk is attached to
// this node (and after, until it is attached elsewhere or deleted).
func (n *LoopNode) ImagePath(diskID string) string { return filepath.Join(n.dir, "images", diskID) }

// Devices returns the loop device of each disk attached, by disk id.
func (n *LoopNode) Devices() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]string, len(n.devices))
	for id, b := range n.devices {
		out[id] = b.path
	}
	return out
}

// Forced returns the disks detached while their device was still in use
// (mounted or open): their loop device goes away when its last user lets
// go, as an unplugged disk would.
func (n *LoopNode) Forced() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.forced...)
}

func (n *LoopNode) attach(ctx context.Context, diskID, deviceName string, size int64) error {
	img := n.ImagePath(diskID)
	n.f.mu.Lock()
	old := n.f.images[diskID]
	n.f.images[diskID] = img
	n.f.mu.Unlock()
	if old != "" && old != img {
		if err := os.Rename(old, img); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("move the image of %s here: %w", diskID, err)
		}
	}
	file, fi, err := openImage(img, size, os.O_CREATE)
	if err != nil {
		return err
	}
	defer file.Close()
	id, err := loopdev.IDOf(fi)
	if err != nil {
		return err
	}
	dev, err := loopdev.Attach(ctx, file, loopdev.Options{})
	if err != nil {
		return err
	}
	link := filepath.Join(n.ByIDDir(), "virtio-"+deviceName)
	if err := removeLink(link); err != nil {
		return err
	}
	if err := os.Symlink(dev.Path, link); err != nil {
		return err
	}
	n.mu.Lock()
	n.devices[diskID] = binding{path: dev.Path, file: id, link: link}
	n.mu.Unlock()
	return nil
}

// openImage opens a disk's image (never through a symbolic link), making
// it with flag os.O_CREATE, and grows it to size when it is smaller.
func openImage(path string, size int64, flag int) (*os.File, os.FileInfo, error) {
	file, err := os.OpenFile(path, os.O_RDWR|flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	fi, err := file.Stat()
	if err == nil && fi.Size() < size {
		if err = file.Truncate(size); err == nil {
			fi, err = file.Stat()
		}
	}
	if err != nil {
		file.Close()
		return nil, nil, err
	}
	return file, fi, nil
}

// removeLink removes a symbolic link; anything else at path is an error.
func removeLink(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("%s is not a symbolic link", path)
	}
	return os.Remove(path)
}

func (n *LoopNode) detach(ctx context.Context, diskID string) error {
	n.mu.Lock()
	b, ok := n.devices[diskID]
	delete(n.devices, diskID)
	n.mu.Unlock()
	if !ok {
		return nil
	}
	if err := removeLink(b.link); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	err := loopdev.Release(ctx, b.path, b.file)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, loopdev.ErrBusy):
		if err := clearFD(b.path); err != nil {
			return err
		}
	case ctx.Err() == nil:
		return err
	}
	n.mu.Lock()
	n.forced = append(n.forced, diskID)
	n.mu.Unlock()
	return nil
}

// clearFD asks the kernel to release a loop device still in use: it goes
// when its last user closes it (LOOP_CLR_FD sets autoclear).
func clearFD(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("%s: LOOP_CLR_FD: %w", path, err)
	}
	return nil
}

// resize makes the loop device of a disk take its grown image's size.
func (n *LoopNode) resize(diskID string) error {
	n.mu.Lock()
	b, ok := n.devices[diskID]
	n.mu.Unlock()
	if !ok {
		return nil
	}
	f, err := os.OpenFile(b.path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("%s: LOOP_SET_CAPACITY: %w", b.path, err)
	}
	return nil
}

// Close releases the loop devices of the disks still attached (their links
// go, their images stay) and stops simulating the instance.
func (n *LoopNode) Close() error {
	n.f.mu.Lock()
	if n.f.nodes[n.instanceID] == n {
		delete(n.f.nodes, n.instanceID)
	}
	n.f.mu.Unlock()
	return n.close()
}

func (n *LoopNode) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	ids := slices.Collect(maps.Keys(n.devices))
	n.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, n.detach(context.Background(), id))
	}
	return errors.Join(errs...)
}

// ImagePath returns the image file of a disk, on whichever loop node it
// is (the disk's content, for tests that read it as a detached disk). A
// disk never attached to a loop node has none: an error wrapping
// fs.ErrNotExist.
func (f *Fake) ImagePath(diskID string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.images[diskID]; ok {
		return p, nil
	}
	return "", fmt.Errorf("disk %s has no image on a loop node: %w", diskID, fs.ErrNotExist)
}

// imageDeleted returns the effect of deleting a disk on its image: the
// image is removed. Callers hold f.mu.
func (f *Fake) imageDeleted(diskID string) []effect {
	path := f.images[diskID]
	delete(f.images, diskID)
	if path == "" {
		return nil
	}
	return []effect{func(context.Context) error {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}}
}

// imageGrown returns the effect of growing a disk on its image: the image
// grows to size, and when the disk is attached to a simulated instance
// its loop device takes the new size.
func (f *Fake) imageGrown(diskID string, size int64, attachedTo string) []effect {
	return []effect{func(context.Context) error {
		f.mu.Lock()
		path := f.images[diskID]
		node := f.nodes[attachedTo]
		f.mu.Unlock()
		if path == "" {
			return nil
		}
		file, _, err := openImage(path, size, 0)
		if err != nil {
			return err
		}
		file.Close()
		if node != nil {
			return node.resize(diskID)
		}
		return nil
	}}
}
