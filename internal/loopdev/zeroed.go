package loopdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Zeroed reports whether the open loop device f reads as zeros in its first
// size bytes because its backing file holds no data in the range the device
// maps there: the file system's own map of the file says so (SEEK_DATA finds
// none), so no byte of it needs reading. false means "not known this way"
// (f is not a whole loop device, its backing file is on a file system whose
// map csid does not rely on, or it has data in the range), never "not
// zero": the caller reads the device then.
//
// Before it asks, Zeroed writes the device's own dirty pages back to the
// backing file (sync_file_range: no flush to stable storage, which the
// answer does not need), so data written through the device's page cache
// and not yet written back counts as data. A write-back error is returned:
// the device holds data that could not reach its file.
//
// It relies only on file systems whose SEEK_DATA reports data that is still
// in the page cache (mapsDirtyPages): a loop device bound without direct
// I/O writes its backing file through that cache. A hole, by definition,
// reads as zeros; a file system may report a hole as data, never data as a
// hole.
func Zeroed(f *os.File, size int64) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || major != Major {
		return false, nil
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		return false, nil // a partition of a loop device: it maps part of the range
	}
	b, err := BindingOf(f)
	if err != nil || b.Encrypted {
		// Unbound (ENXIO): nothing to ask. Encrypted: a hole reads as
		// whatever it decrypts to.
		return false, nil
	}
	backing := openBacking(sys, b.File)
	if backing == nil {
		return false, nil
	}
	defer backing.Close()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(backing.Fd()), &fs); err != nil || !mapsDirtyPages[int64(fs.Type)] {
		return false, nil
	}
	if err := unix.SyncFileRange(int(f.Fd()), 0, 0,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER); err != nil {
		return false, fmt.Errorf("%s: write back its pages: %w", f.Name(), err)
	}
	data, err := unix.Seek(int(backing.Fd()), b.Offset, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return true, nil // no data from the offset to the end of the file
	case err != nil:
		return false, nil // SEEK_DATA not supported here
	}
	return data >= b.Offset+size, nil
}

// mapsDirtyPages lists the file systems (statfs magic numbers) whose
// SEEK_DATA counts data still in the page cache, not yet allocated on disk,
// and that csid's tests hold to it (TestZeroedReadsTheBackingFilesMap).
// Zeroed believes no other file system's map.
var mapsDirtyPages = map[int64]bool{
	unix.EXT4_SUPER_MAGIC: true, // ext2, ext3 and ext4 share it
	unix.XFS_SUPER_MAGIC:  true,
	unix.TMPFS_MAGIC:      true,
}

// openBacking opens the backing file of the loop device whose sysfs
// directory is sys, and returns it only when it is the file id (the
// binding's): the path sysfs reports may name another file by now (one
// renamed or mounted over it). nil: not found there.
func openBacking(sys string, id FileID) *os.File {
	path, deleted, err := backingFile(sys)
	if err != nil || deleted || !filepath.IsAbs(path) {
		return nil
	}
	// Read-only, never a link, never blocking on a FIFO put in its place.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != id.Dev || st.Ino != id.Ino {
		unix.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), path)
}
