package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

// Freezing. A snapshot or a clone of a disk whose image a loop device on
// this machine is writing to is copied with the filesystem on that device
// frozen (FIFREEZE: the filesystem writes out everything it holds and
// blocks new writes until FITHAW), when it is mounted where this process
// sees it; see planCopy. A filesystem left frozen blocks every writer on
// it, so:
//
//   - a freeze is recorded durably (frozen/<disk id>.json) before it is
//     made, and the record removed only once every filesystem it names is
//     thawed;
//   - the thaw is deferred as soon as the first filesystem is frozen, so
//     that every return and every panic of the copy runs it; it thaws
//     through the descriptor that froze, which holds the filesystem
//     however its mounts change meanwhile;
//   - a record left by a process killed while frozen is thawed by Open
//     and before every snapshot and clone. The snapshot holds its disk's
//     lock while frozen, and the kernel drops the lock of a killed
//     process: a record whose disk lock is free is one nobody is copying
//     under any more.
//
// The kernel does not say who froze a filesystem: a record whose
// filesystem was frozen again by someone else after csid was killed
// before it could freeze (a window of one system call) would have that
// freeze thawed. A filesystem that is already frozen when csid would
// freeze it (EBUSY) is not csid's: the copy is refused, and it is left
// frozen.
const frozenDir = "frozen"

// Filesystem freeze ioctls (linux/fs.h): _IOWR('X', 119, int) and
// _IOWR('X', 120, int). x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// freezeRecord names the filesystems a snapshot or a clone of a disk
// freezes.
type freezeRecord struct {
	Version int           `json:"version"`
	DiskID  string        `json:"diskID"`
	Mounts  []frozenMount `json:"mounts"`
	Since   time.Time     `json:"since"`
}

// frozenMount is a filesystem to freeze: a mount point of it, as the
// freezing process sees it, and its device number, which the mount point
// must still show when it is opened.
type frozenMount struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
}

func (s *state) frozen() string              { return filepath.Join(s.dir, frozenDir) }
func (s *state) frozenPath(id diskID) string { return filepath.Join(s.frozen(), string(id)+recSuffix) }

// mountsOf finds the mounts of the block device dev in this process's
// mount namespace: one mount point per filesystem is enough to freeze it.
func mountsOf(dev uint64) ([]frozenMount, error) {
	major, minor := int(unix.Major(dev)), int(unix.Minor(dev))
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Major != major || m.Minor != minor, false
	})
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	if len(infos) == 0 {
		return nil, nil
	}
	return []frozenMount{{Path: infos[0].Mountpoint, Dev: dev}}, nil
}

// openMount opens the mount point m.Path without following a symbolic link
// anywhere in it, and checks that it is the root or a directory of the
// filesystem on m.Dev. A mount point that is gone or holds another
// filesystem now is os.ErrNotExist.
func openMount(m frozenMount) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, m.Path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("mount point %s: %v: %w", m.Path, err, os.ErrNotExist)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: m.Path, Err: err}
	}
	f := os.NewFile(uintptr(fd), m.Path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Dev != m.Dev {
		f.Close()
		return nil, fmt.Errorf("%s holds the filesystem of device %d:%d, not %d:%d: %w", m.Path,
			unix.Major(st.Dev), unix.Minor(st.Dev), unix.Major(m.Dev), unix.Minor(m.Dev), os.ErrNotExist)
	}
	return f, nil
}

// whileFrozen runs fn with the filesystems of mounts frozen; see above.
// With no mounts it just runs fn. point is hit once they are frozen.
func (c *Cloud) whileFrozen(id diskID, mounts []frozenMount, point string, fn func() error) (err error) {
	if len(mounts) == 0 {
		return fn()
	}
	if err := c.s.writeFreeze(freezeRecord{Version: recordVersion, DiskID: string(id), Mounts: mounts, Since: c.opts.now().UTC()}); err != nil {
		return fmt.Errorf("record the freeze: %w", err)
	}
	var frozen []*os.File
	defer func() {
		err = errors.Join(err, c.thawFrozen(id, frozen))
	}()
	for _, m := range mounts {
		f, err := openMount(m)
		if err != nil {
			return fmt.Errorf("freeze the filesystem of disk %s: %w", id, err)
		}
		if err := unix.IoctlSetInt(int(f.Fd()), ioctlFIFREEZE, 0); err != nil {
			f.Close()
			switch {
			case errors.Is(err, unix.EBUSY):
				return fmt.Errorf("the filesystem of disk %s at %s is frozen by someone else: %w", id, m.Path, cloud.ErrTransient)
			case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP):
				// Retrying will not help: csid lacks CAP_SYS_ADMIN, or the
				// filesystem cannot be frozen.
				return fmt.Errorf("freeze the filesystem of disk %s at %s: %v: %w", id, m.Path, err, cloud.ErrNotSupported)
			}
			return fmt.Errorf("freeze the filesystem of disk %s at %s: %w", id, m.Path, err)
		}
		frozen = append(frozen, f)
	}
	c.s.hit(point)
	return fn()
}

// thawFrozen thaws the filesystems this process froze, through the
// descriptors that froze them, and then removes the disk's freeze record.
// A filesystem that does not thaw keeps the record, for the next Open or
// snapshot to try again.
func (c *Cloud) thawFrozen(id diskID, frozen []*os.File) error {
	var errs []error
	for _, f := range frozen {
		if err := thaw(f); err != nil {
			errs = append(errs, fmt.Errorf("thaw the filesystem of disk %s at %s: %w", id, f.Name(), err))
		}
		f.Close()
	}
	if len(errs) == 0 {
		errs = append(errs, c.s.dropFreeze(id))
	}
	return errors.Join(errs...)
}

// thaw thaws the filesystem of the open f; one that is not frozen is
// success.
func thaw(f *os.File) error {
	err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0)
	if errors.Is(err, unix.EINVAL) {
		return nil // not frozen
	}
	return err
}

// thawAbandoned thaws what every freeze record of a killed process names;
// see thawRecorded. A record whose disk's lock is held belongs to a copy in
// progress, and is left to it.
func (c *Cloud) thawAbandoned() error {
	entries, err := os.ReadDir(c.s.frozen())
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), recSuffix)
		id, idOK := parseDiskID(name)
		if !ok || !idOK {
			continue
		}
		unlock, got, err := c.s.locks.tryLock(diskKey(id))
		if err != nil || !got {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, c.thawRecorded(id))
		unlock()
	}
	return errors.Join(errs...)
}

// thawRecorded thaws the filesystems the freeze record of disk id names,
// if there is one, and removes it: a process froze them and was killed.
// The caller holds the disk's lock. A mount point that is gone, or holds
// another filesystem now, has nothing of the record's to thaw.
func (c *Cloud) thawRecorded(id diskID) error {
	rec, ok, err := c.s.readFreeze(id)
	if err != nil || !ok {
		return err
	}
	for _, m := range rec.Mounts {
		f, err := openMount(m)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = thaw(f)
			f.Close()
		}
		if err != nil {
			return fmt.Errorf("thaw the filesystem of disk %s at %s, frozen by a snapshot that did not finish: %w", id, m.Path, err)
		}
	}
	return c.s.dropFreeze(id)
}

// writeFreeze records a freeze durably, before it is made.
func (s *state) writeFreeze(rec freezeRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := createFile(s.frozen(), rec.DiskID+recSuffix, writeBytes(raw), true); err != nil {
		return err
	}
	return s.syncDir(s.frozen())
}

// readFreeze reads the freeze record of disk id, if there is one.
func (s *state) readFreeze(id diskID) (freezeRecord, bool, error) {
	raw, err := readRegular(s.frozenPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return freezeRecord{}, false, nil
	}
	if err != nil {
		return freezeRecord{}, false, err
	}
	var rec freezeRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return freezeRecord{}, false, fmt.Errorf("freeze record %s: %w", s.frozenPath(id), err)
	}
	if rec.Version != recordVersion || rec.DiskID != string(id) {
		return freezeRecord{}, false, fmt.Errorf("freeze record %s: version %d for %q, want version %d for %s", s.frozenPath(id), rec.Version, rec.DiskID, recordVersion, id)
	}
	return rec, true, nil
}

// dropFreeze removes the freeze record of disk id, durably: a record that
// came back after a power loss would thaw a filesystem frozen since by
// someone else.
func (s *state) dropFreeze(id diskID) error {
	if err := os.Remove(s.frozenPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return s.syncDir(s.frozen())
}
