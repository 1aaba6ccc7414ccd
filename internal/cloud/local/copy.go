package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/loopdev"
)

// Copying a disk's image, for a snapshot or a clone, at one point in time:
//
//   - the copy is a reflink (FICLONE) where the state directory's file
//     system has them (xfs made with reflink, the default of mkfs.xfs since
//     5.1; btrfs): one system call that shares the image's extents, taken
//     under the image's inode lock, so it is the image at one instant
//     whatever writes to it; else a sparse copy (SEEK_DATA and SEEK_HOLE,
//     copy_file_range of the data alone: the holes are never read and stay
//     holes);
//   - a disk whose image no loop device on this machine is bound to has
//     no writer (binding one takes the disk's lock, which the copy holds):
//     either way of copying is its content at one point in time;
//   - a disk whose loop device holds a filesystem mounted where this
//     process sees it (/proc/self/mountinfo, by device number) is copied
//     with that filesystem frozen (freeze.go): the copy is a clean
//     filesystem, which fsck accepts as it is;
//   - a disk whose loop device is in use otherwise (a raw block volume, or
//     a filesystem mounted in a mount namespace this process cannot see) is
//     copied only by a reflink, which is crash-consistent (what a power
//     cut would have left: a journalled filesystem recovers it when it is
//     mounted); without reflinks it is ErrNotSupported.

// copyPlan is how a disk's image is copied.
type copyPlan struct {
	// reflink clones the image's extents (else: a sparse copy).
	reflink bool
	// freeze are the filesystems to freeze for the copy.
	freeze []frozenMount
}

// copyPoints are the crash points of a copy: once frozen, and once part of
// the image is copied.
type copyPoints struct{ frozen, copying string }

// planCopy finds how to copy disk id's image consistently, or fails with
// ErrNotSupported. The caller holds the disk's lock.
func (c *Cloud) planCopy(id diskID, size int64) (copyPlan, error) {
	plan := copyPlan{reflink: c.reflink}
	devs, _, err := c.devicesOf(id)
	if err != nil {
		return copyPlan{}, err
	}
	var unseen []string
	for _, dev := range devs {
		mounts, err := mountsOf(unix.Mkdev(loopdev.Major, uint32(dev.Number)))
		if err != nil {
			return copyPlan{}, fmt.Errorf("%v: %w", err, cloud.ErrTransient)
		}
		if len(mounts) == 0 {
			unseen = append(unseen, dev.Path)
		}
		plan.freeze = append(plan.freeze, mounts...)
	}
	if len(unseen) > 0 && !c.reflink {
		return copyPlan{}, fmt.Errorf("disk %s is in use through %v with no filesystem mounted where csid can freeze it (a raw block volume, or a mount in another namespace), and the state directory's file system has no reflinks (xfs, btrfs) to copy it at one instant: %w", id, unseen, cloud.ErrNotSupported)
	}
	if !plan.reflink {
		// A sparse copy needs room for the image's data.
		if err := c.roomFor(c.s.imagePath(id), size); err != nil {
			return copyPlan{}, err
		}
	}
	return plan, nil
}

// roomFor fails with ErrLimitReached when the state directory has less
// free space than the data of the first size bytes of the image at path
// takes.
func (c *Cloud) roomFor(path string, size int64) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); errors.Is(err, unix.ENOENT) {
		return nil // a disk never attached: zeros, nothing to copy
	} else if err != nil {
		return ioFailure("stat image", err)
	}
	used := min(st.Blocks*512, size)
	free, err := c.s.freeBytes()
	if err != nil {
		return ioFailure("free space", err)
	}
	if used > free {
		return fmt.Errorf("%s has %d bytes free, a copy of %s needs %d: %w", c.s.dir, free, path, used, cloud.ErrLimitReached)
	}
	return nil
}

// copyDisk copies the first n bytes of disk id's image, as plan says, into
// a new unnamed file in dir of size bytes (zeros beyond n), fsynced; see
// copyFile. A disk without an image (one never attached: its image is
// made by its first attach) holds zeros: its copy is a file of holes. The
// caller holds the disk's lock.
func (c *Cloud) copyDisk(ctx context.Context, id diskID, n, size int64, plan copyPlan, dir string, points copyPoints) (*os.File, int64, error) {
	src, err := os.OpenFile(c.s.imagePath(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return zeros(dir, size)
	}
	if err != nil {
		return nil, 0, err
	}
	defer src.Close()
	return c.copyFile(ctx, id, src, n, size, plan, dir, points)
}

// copyFile copies the first n bytes of src, the image of disk id (or of a
// snapshot of it), as plan says, into a new unnamed file in dir of size
// bytes (zeros beyond n), fsynced, and returns it (for the caller to link
// and close) and the bytes it occupies.
func (c *Cloud) copyFile(ctx context.Context, id diskID, src *os.File, n, size int64, plan copyPlan, dir string, points copyPoints) (*os.File, int64, error) {
	dst, err := openUnnamed(dir)
	if err != nil {
		return nil, 0, err
	}
	copied := false
	defer func() {
		if !copied {
			dst.Close() // unnamed: it goes with its descriptor, also on a panic
		}
	}()
	err = c.whileFrozen(id, plan.freeze, points.frozen, func() error {
		return copyImage(ctx, dst, src, n, size, plan.reflink, func() { c.s.hit(points.copying) })
	})
	if err == nil {
		err = dst.Sync()
	}
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(int(dst.Fd()), &st)
	}
	if err != nil {
		return nil, 0, err
	}
	copied = true
	return dst, min(st.Blocks*512, size), nil
}

// zeros makes a new unnamed file in dir of size bytes, all holes,
// fsynced.
func zeros(dir string, size int64) (*os.File, int64, error) {
	f, err := openUnnamed(dir)
	if err != nil {
		return nil, 0, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, 0, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, 0, nil
}

// copyImage makes dst the first n bytes of src, then zeros to size bytes
// (n <= size): a reflink of it, or a sparse copy. copying is called once
// part of it is copied.
func copyImage(ctx context.Context, dst, src *os.File, n, size int64, reflink bool, copying func()) error {
	if reflink {
		if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
			return fmt.Errorf("clone %s (FICLONE): %w", src.Name(), err)
		}
		copying()
		if err := dst.Truncate(n); err != nil { // what lies beyond the disk's size is not the disk's
			return err
		}
		return dst.Truncate(size)
	}
	return sparseCopy(ctx, dst, src, n, size, copying)
}

// sparseCopy copies the data of the first n bytes of src to the same
// offsets of dst, made size bytes long first: the holes of src are never
// read, and stay holes in dst.
func sparseCopy(ctx context.Context, dst, src *os.File, n, size int64, copying func()) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	end := min(n, fi.Size())
	var once sync.Once
	for off := int64(0); off < end; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= end) {
			return nil // holes to the end
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src.Name(), err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src.Name(), err)
		}
		hole = min(hole, end)
		if err := copyRange(ctx, dst, src, data, hole-data); err != nil {
			return err
		}
		once.Do(copying)
		off = hole
	}
	return nil
}

// copyChunk bounds one copy_file_range, so that a cancelled context stops
// a long copy soon.
const copyChunk = 64 << 20

// copyRange copies n bytes at off of src to off of dst, in the kernel
// (copy_file_range), or through a buffer where the kernel cannot.
func copyRange(ctx context.Context, dst, src *os.File, off, n int64) error {
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		roff, woff := off, off
		k, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(n, copyChunk)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL):
			return copyBuffered(ctx, dst, src, off, n)
		case err != nil:
			return fmt.Errorf("copy %s: %w", src.Name(), err)
		case k == 0:
			return fmt.Errorf("copy %s: %w at %d", src.Name(), io.ErrUnexpectedEOF, off)
		}
		// Start writing the copied bytes out now, so that the device
		// writes while the next ones are copied and the final fsync
		// waits for less.
		_ = unix.SyncFileRange(int(dst.Fd()), off, int64(k), unix.SYNC_FILE_RANGE_WRITE)
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

func copyBuffered(ctx context.Context, dst, src *os.File, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		k, err := src.ReadAt(buf[:min(n, int64(len(buf)))], off)
		if k > 0 {
			if _, werr := dst.WriteAt(buf[:k], off); werr != nil {
				return werr
			}
		}
		if err != nil && !(errors.Is(err, io.EOF) && k > 0) {
			return fmt.Errorf("copy %s: %w", src.Name(), err)
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

// reflinks reports whether a file in from can be cloned (FICLONE) into a
// file in to: their file system supports reflinks (xfs with reflink,
// btrfs). It clones an empty unnamed file into another (file systems
// without reflinks refuse before they look at the length), so that it
// needs no free space.
func reflinks(from, to string) (bool, error) {
	src, err := openUnnamed(from)
	if err != nil {
		return false, err
	}
	defer src.Close()
	dst, err := openUnnamed(to)
	if err != nil {
		return false, err
	}
	defer dst.Close()
	err = unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
		return false, nil
	default:
		return false, fmt.Errorf("try a reflink in %s: %w", to, err)
	}
}
