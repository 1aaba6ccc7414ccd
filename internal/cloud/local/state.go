package local

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
)

// The state directory (layout 2):
//
//	format                  "csid-local 2": the layout version
//	lock                    the lock file (see locks.go)
//	nodes.json              registered nodes
//	disks/<id>.img          disk image, a sparse file, made by the disk's
//	                        first attach (a disk never attached is zeros)
//	disks/<id>.json         disk record; the disk exists iff this file does
//	names/<name hash>       the name index: a hard link to the first record
//	                        of the disk of that name (index.go)
//	attached/<node hash>/<id>
//	                        the attachment index: an empty file per disk
//	                        attached to the node
//	ops/<op-id>.log         operation logs (oplog.go)
//	journal/<op-id>.wal     the journals of creates and deletes (journal.go)
//	snapshots/, snapnames/, frozen/
//	                        snapshots, their name index, and freezes in
//	                        progress (snapshot.go)
//	spare/<random>          spare record files, rewritten for new records
//	                        (spare.go)
//	.tmp-<name>-*           a new <name> or its replacement in progress, in
//	                        its directory (newfile.go)
//
// Layout 1 had no indexes: every create read every record to find a name.
// Open migrates it (see migrate).
const (
	formatFile  = "format"
	formatMagic = "csid-local 2\n"
	format1     = "csid-local 1\n"
	lockFile    = "lock"
	nodesFile   = "nodes.json"
	disksDir    = "disks"
	namesDir    = "names"
	attachedDir = "attached"
	// journalDir: see journal.go.
	opsDir      = "ops"
	tmpPrefix   = ".tmp-"
	imageSuffix = ".img"
	recSuffix   = ".json"
)

// recordVersion is the version of the JSON records.
const recordVersion = 1

// diskID is a disk id that has been validated: the only kind of id that is
// ever joined into a path.
type diskID string

// opID is a validated operation id.
type opID string

var (
	diskIDPattern = regexp.MustCompile(`^disk-[0-9a-f]{16}$`)
	opIDPattern   = regexp.MustCompile(`^op-[0-9a-f]{24}$`)
)

// parseDiskID validates s as a disk id of this backend: "disk-" and 16
// lower-case hex digits. Anything else (empty, relative, "..", "/", overlong)
// fails, before it can reach a path.
func parseDiskID(s string) (diskID, bool) {
	if !diskIDPattern.MatchString(s) {
		return "", false
	}
	return diskID(s), true
}

func parseOpID(s string) (opID, bool) {
	if !opIDPattern.MatchString(s) {
		return "", false
	}
	return opID(s), true
}

func newDiskID() diskID {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return diskID(fmt.Sprintf("disk-%016x", binary.BigEndian.Uint64(b[:])))
}

// newOpID makes an operation id that sorts by creation time: the time in
// nanoseconds, then 32 random bits.
func newOpID(now time.Time) opID {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return opID(fmt.Sprintf("op-%016x%08x", uint64(now.UnixNano()), binary.BigEndian.Uint32(b[:])))
}

// opTime is the creation time encoded in an operation id.
func opTime(id opID) time.Time {
	var ns uint64
	_, _ = fmt.Sscanf(string(id)[3:19], "%016x", &ns)
	return time.Unix(0, int64(ns))
}

// state is the state directory, shared by every process that opens it.
type state struct {
	dir      string // absolute, symlinks resolved
	disks    string
	names    string
	attached string
	ops      string
	journal  string
	boot     string // this boot's id (journal.go)
	spares   *spares
	lockF    *os.File
	locks    *locks
	oplog    *opLog // nil when only reading (Inspector)
	jrnl     *journal
	// orderedMeta: the file system makes metadata changes durable in
	// the order they were made (see syncEarlier).
	orderedMeta bool

	syncersMu sync.Mutex
	syncers   map[string]*dirSyncer // by directory
	// crash, when set (tests only), is called at named points of the
	// mutating paths.
	crash func(point string)
}

func openState(dir string) (*state, error) {
	if dir == "" {
		return nil, fmt.Errorf("local cloud: empty state directory: %w", cloud.ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	s := newState(abs)
	if err := s.makeDirs(); err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	s.lockF, err = os.OpenFile(filepath.Join(abs, lockFile), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	s.locks = newLocks(s.lockF)
	s.oplog = newOpLog(s.ops, 0)
	if s.boot, err = bootID(); err != nil {
		s.lockF.Close()
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	s.jrnl = &journal{dir: s.journal, boot: s.boot, syncfs: s.syncfs, idle: journalIdle, limit: journalIntents, left: make(chan struct{}, 1)}
	if s.orderedMeta, err = ordersMetadata(s.disks); err != nil {
		s.lockF.Close()
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	return s, nil
}

// makeDirs makes the state directory's subdirectories (mkdirsDurable).
func (s *state) makeDirs() error {
	return s.mkdirsDurable(s.disks, s.names, s.attached, s.ops, s.journal, s.spares.dir)
}

// mkdirsDurable makes the missing ones of dirs, subdirectories of the
// state directory, durably: a new directory's own entries ("." and "..")
// and its entry in the state directory are fsynced, and the state
// directory's in its parent, so that a crash of the machine cannot take a
// directory away from under the files made in it.
func (s *state) mkdirsDurable(dirs ...string) error {
	made := false
	for _, d := range dirs {
		err := os.Mkdir(d, 0o700)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err == nil {
			err = syncDir(d)
		}
		if err != nil {
			return err
		}
		made = true
	}
	if !made {
		return nil
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(s.dir))
}

// newState is the state directory at abs (absolute, symlinks resolved). It
// opens and creates nothing.
func newState(abs string) *state {
	s := &state{
		dir:      abs,
		disks:    filepath.Join(abs, disksDir),
		names:    filepath.Join(abs, namesDir),
		attached: filepath.Join(abs, attachedDir),
		ops:      filepath.Join(abs, opsDir),
		journal:  filepath.Join(abs, journalDir),
	}
	s.spares = &spares{dir: filepath.Join(abs, spareDir)}
	return s
}

// close releases the directory: closing the lock file drops the layout
// lock and every key lock with it.
func (s *state) close() error {
	var err error
	if s.jrnl != nil {
		err = s.jrnl.close()
	}
	if s.oplog != nil {
		err = errors.Join(err, s.oplog.close())
	}
	s.syncersMu.Lock()
	for _, d := range s.syncers {
		d.close()
	}
	s.syncers = nil
	s.syncersMu.Unlock()
	return errors.Join(err, s.lockF.Close())
}

// hit marks a crash point of the backend's own steps: the drills' (package
// crash) and the unit crash test's.
func (s *state) hit(point string) {
	crash.Point(point)
	if s.crash != nil {
		s.crash(point)
	}
}

// lock takes the key locks of keys, in order; see locks.lock.
func (s *state) lock(ctx context.Context, keys ...string) (unlock func(), err error) {
	return s.locks.lock(ctx, keys...)
}

// flock takes the layout lock (unix.LOCK_SH or unix.LOCK_EX), polling so
// that it gives up when ctx ends; nonblocking tries once.
func (s *state) flock(ctx context.Context, how int, nonblocking bool) (bool, error) {
	delay := 100 * time.Microsecond
	for {
		err := unix.Flock(int(s.lockF.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return false, fmt.Errorf("lock %s: %w", s.lockF.Name(), err)
		}
		if nonblocking && errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("waiting for the lock on %s (a csid of another layout version holds it): %w", s.dir, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
}

// open takes the layout lock shared for the life of the process, after
// making the directory one of this layout: a new directory gets its
// format marker, one of layout 1 is migrated. Both happen under the lock
// taken exclusively, which no process of this layout can be holding
// shared then (it would have written the marker), except another one
// opening at the same moment: so the marker is read again under the
// shared lock before each try.
func (s *state) open(ctx context.Context) error {
	for {
		if _, err := s.flock(ctx, unix.LOCK_SH, false); err != nil {
			return err
		}
		err := readFormat(s.dir)
		if err == nil {
			replay, err := s.mustReplay()
			if err != nil || !replay {
				return err
			}
		} else if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, errFormat1) {
			return err
		}
		if err := unix.Flock(int(s.lockF.Fd()), unix.LOCK_UN); err != nil {
			return err
		}
		got, err := s.flock(ctx, unix.LOCK_EX, true)
		if err != nil {
			return err
		}
		if !got {
			// Another process holds it: one of layout 1 changing
			// something, or one of this layout opening. Look again.
			if err := sleep(ctx, time.Millisecond); err != nil {
				return err
			}
			continue
		}
		err = s.upgrade()
		if err := unix.Flock(int(s.lockF.Fd()), unix.LOCK_UN); err != nil {
			return err
		}
		if err != nil {
			return err
		}
	}
}

// upgrade writes the format marker of a new directory, or migrates one of
// layout 1, and replays the journals of an earlier boot (journal.go). The
// caller holds the layout lock exclusively.
func (s *state) upgrade() error {
	err := readFormat(s.dir)
	switch {
	case err == nil:
		return s.replayJournals()
	case errors.Is(err, errFormat1):
		if err := s.migrate(); err != nil {
			return fmt.Errorf("migrate from layout 1: %w", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return writeFileAtomic(s.dir, formatFile, []byte(formatMagic))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errFormat1: the directory is of layout 1, which Open migrates.
var errFormat1 = errors.New("state directory of layout 1")

// readFormat checks the format marker of the state directory dir. A
// missing marker is an error wrapping os.ErrNotExist; layout 1 is
// errFormat1; another layout version is an error naming it.
func readFormat(dir string) error {
	path := filepath.Join(dir, formatFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	switch string(raw) {
	case formatMagic:
		return nil
	case format1:
		return fmt.Errorf("%s: %w", path, errFormat1)
	}
	return fmt.Errorf("%s: %q is not a state directory layout this csid understands (%q)", path, strings.TrimSpace(string(raw)), strings.TrimSpace(formatMagic))
}

func (s *state) imagePath(id diskID) string  { return filepath.Join(s.disks, string(id)+imageSuffix) }
func (s *state) recordPath(id diskID) string { return filepath.Join(s.disks, string(id)+recSuffix) }
func (s *state) opPath(id opID) string       { return filepath.Join(s.ops, string(id)+recSuffix) }

type diskRecord struct {
	Version int        `json:"version"`
	Disk    cloud.Disk `json:"disk"`
}

// readDisk reads a disk record; a missing one is ErrNotFound.
func (s *state) readDisk(id diskID) (cloud.Disk, error) {
	d, _, err := s.readDiskStat(id)
	return d, err
}

// readDiskStat is readDisk, and the status of the record file it read.
func (s *state) readDiskStat(id diskID) (cloud.Disk, unix.Stat_t, error) {
	raw, st, err := readRegularStat(s.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return cloud.Disk{}, st, fmt.Errorf("disk %s: %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return cloud.Disk{}, st, fmt.Errorf("disk %s: %w", id, err)
	}
	var rec diskRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return cloud.Disk{}, st, fmt.Errorf("disk record %s: %w", s.recordPath(id), err)
	}
	if rec.Version != recordVersion || rec.Disk.ID != string(id) {
		return cloud.Disk{}, st, fmt.Errorf("disk record %s: version %d for %q, want version %d for %s", s.recordPath(id), rec.Version, rec.Disk.ID, recordVersion, id)
	}
	return rec.Disk, st, nil
}

// recordFile writes the record of disk d into a file under a temporary
// name in the disks directory (tempPath), and returns that name: a spare
// rewritten in place, or, when there is none to take, a new file
// (spare.go); durable: fdatasynced (a spare), fsynced (a new file).
func (s *state) recordFile(d cloud.Disk, durable bool) (string, error) {
	raw, err := json.Marshal(diskRecord{Version: recordVersion, Disk: d})
	if err != nil {
		return "", err
	}
	tmp := tempPath(s.disks, d.ID+recSuffix)
	fd, size, err := s.spares.take(tmp)
	if err != nil {
		return "", err
	}
	reused := fd >= 0
	if !reused {
		if fd, err = unix.Open(tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err != nil {
			return "", &os.PathError{Op: "open", Path: tmp, Err: err}
		}
	}
	err = writeAt(fd, raw, 0)
	if err == nil && size > int64(len(raw)) {
		err = unix.Ftruncate(fd, int64(len(raw)))
	}
	// Not durable: a journaled create's (journal.go).
	if err == nil && durable {
		if reused {
			// The spare's inode and blocks are on the device: its new
			// content and size are all there is to make durable.
			err = fdatasyncFD(fd)
		} else {
			err = fsyncFD(fd)
		}
	}
	if err = errors.Join(err, unix.Close(fd)); err != nil {
		_ = os.Remove(tmp)
		return "", &os.PathError{Op: "write", Path: tmp, Err: err}
	}
	return tmp, nil
}

// writeAt writes b at offset off of the open file fd.
func writeAt(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := uninterrupted(func() (int, error) { return unix.Pwrite(fd, b, off) })
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// readExisting reads the record of a disk a change is about: a missing one
// is ErrNotFound, an unreadable one an ioFailure.
func (s *state) readExisting(id diskID) (cloud.Disk, error) {
	d, err := s.readDisk(id)
	if err != nil && !errors.Is(err, cloud.ErrNotFound) {
		return cloud.Disk{}, ioFailure("read disk", err)
	}
	return d, err
}

// writeDisk replaces a disk record atomically and durably: the new record
// is written whole (recordFile) and renamed over the old one, which
// becomes a spare once no longer in place (unless it is the disk's name
// entry too). The caller holds the disk's lock.
func (s *state) writeDisk(d cloud.Disk) error {
	tmp, err := s.recordFile(d, true)
	if err != nil {
		return err
	}
	path := s.recordPath(diskID(d.ID))
	// Keep the old record's inode under a temporary name, to be retired
	// once replaced.
	old := tempPath(s.disks, d.ID+recSuffix)
	if err := os.Link(path, old); err != nil {
		old = ""
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		if old != "" {
			_ = os.Remove(old)
		}
		return err
	}
	if err := s.syncDir(s.disks); err != nil {
		return err // the old record's name may come back: it is no spare
	}
	if old != "" {
		s.spares.retire(old)
	}
	return nil
}

// diskIDs lists the ids of the disks that exist (have a record), sorted.
func (s *state) diskIDs() ([]diskID, error) {
	return recordIDs(s.disks, parseDiskID)
}

// recordIDs lists, sorted, the ids of the records (<id>.json) in dir that
// parse as ids; other files are passed over.
func recordIDs[ID ~string](dir string, parse func(string) (ID, bool)) ([]ID, error) {
	return listIDs(dir, recSuffix, parse)
}

// listIDs lists, sorted, the ids of the files <id><suffix> in dir that
// parse as ids; other files are passed over.
func listIDs[ID ~string](dir, suffix string, parse func(string) (ID, bool)) ([]ID, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []ID
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok {
			continue
		}
		if id, ok := parse(name); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // ReadDir sorts by file name, and ids have a fixed width; to be explicit
	return ids, nil
}

// allDisks reads every disk record. A record deleted meanwhile is skipped.
func (s *state) allDisks() ([]cloud.Disk, error) {
	ids, err := s.diskIDs()
	if err != nil {
		return nil, err
	}
	disks := make([]cloud.Disk, 0, len(ids))
	for _, id := range ids {
		d, err := s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		disks = append(disks, d)
	}
	return disks, nil
}

type nodesRecord struct {
	Version int                   `json:"version"`
	Nodes   map[string]cloud.Node `json:"nodes"`
}

func (s *state) readNodes() (map[string]cloud.Node, error) {
	raw, err := os.ReadFile(filepath.Join(s.dir, nodesFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]cloud.Node{}, nil
	}
	if err != nil {
		return nil, err
	}
	var rec nodesRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(s.dir, nodesFile), err)
	}
	if rec.Version != recordVersion {
		return nil, fmt.Errorf("%s: version %d, want %d", filepath.Join(s.dir, nodesFile), rec.Version, recordVersion)
	}
	if rec.Nodes == nil {
		rec.Nodes = map[string]cloud.Node{}
	}
	return rec.Nodes, nil
}

func (s *state) writeNodes(nodes map[string]cloud.Node) error {
	raw, err := json.Marshal(nodesRecord{Version: recordVersion, Nodes: nodes})
	if err != nil {
		return err
	}
	return writeFileAtomic(s.dir, nodesFile, raw)
}

// opRecord is a finished operation as WaitOperation replays it.
type opRecord struct {
	Version  int             `json:"version"`
	Op       cloud.Operation `json:"op"`
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished"`
	// Disk is the disk as the operation left it (nil after a delete).
	Disk  *cloud.Disk  `json:"disk,omitempty"`
	Error *recordedErr `json:"error,omitempty"`
}

// recordedErr is an operation's error as stored: its message, and a code
// naming the typed error it wraps, so that errors.Is works after a restart.
type recordedErr struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

var errorCodes = []struct {
	code string
	err  error
}{
	{"not_found", cloud.ErrNotFound},
	{"already_exists", cloud.ErrAlreadyExists},
	{"attached", cloud.ErrAttached},
	{"limit_reached", cloud.ErrLimitReached},
	{"invalid", cloud.ErrInvalid},
	{"transient", cloud.ErrTransient},
	{"not_supported", cloud.ErrNotSupported},
}

func recordErr(err error) *recordedErr {
	if err == nil {
		return nil
	}
	r := &recordedErr{Message: err.Error()}
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			r.Code = c.code
			break
		}
	}
	return r
}

// replayedError is a recorded error brought back: the same message, and
// errors.Is still finds the typed error.
type replayedError struct {
	msg  string
	kind error
}

func (e *replayedError) Error() string { return e.msg }
func (e *replayedError) Unwrap() error { return e.kind }

func (r *recordedErr) replay() error {
	for _, c := range errorCodes {
		if r.Code == c.code {
			return &replayedError{msg: r.Message, kind: c.err}
		}
	}
	return errors.New(r.Message)
}

// writeOp stores an operation record in this process's log (oplog.go).
func (s *state) writeOp(rec opRecord) error {
	return s.oplog.append(rec)
}

// freeBytes is the space left for disk images.
func (s *state) freeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.disks, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", s.disks, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// writeFileAtomic replaces dir/name with data, durably: replaceFile
// (newfile.go), then an fsync of dir.
func writeFileAtomic(dir, name string, data []byte) error {
	if err := replaceFile(dir, name, data); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncEarlier makes the entries of dir durable before any later change is:
// an fsync of dir, except on a file system that orders its metadata.
//
// xfs and a journalled ext4 journal every metadata change (a name created, linked,
// renamed or removed, a file's size) in the order it was made, commit the
// journal in that order, and make every earlier change durable with an
// fsync of any file or directory. There a change that must be durable
// before a later one (a name entry before its disk's record) needs no
// fsync of its own: the later one's fsync, which comes before the call
// returns, makes both durable, and a crash before it leaves the earlier one
// or neither. Everywhere else each step is fsynced.
func (s *state) syncEarlier(dir string) error {
	if s.orderedMeta {
		return nil
	}
	return s.syncDir(dir)
}

// syncDir makes the entries of dir durable, sharing the fsync with the
// other operations that need one of dir at the same time (dirSyncer).
func (s *state) syncDir(dir string) error {
	return s.syncer(dir).sync()
}

// syncer is the dirSyncer of dir.
func (s *state) syncer(dir string) *dirSyncer {
	s.syncersMu.Lock()
	defer s.syncersMu.Unlock()
	d := s.syncers[dir]
	if d == nil {
		if s.syncers == nil {
			s.syncers = map[string]*dirSyncer{}
		}
		d = newDirSyncer(dir)
		s.syncers[dir] = d
	}
	return d
}

// ordersMetadata reports whether the file system of dir is one that
// orders its metadata changes, being journalled: xfs, and ext3 or ext4
// with a journal (the kernel lists it under /proc/fs/jbd2). ext2, an ext4
// made without a journal (mkfs.ext4 -O ^has_journal, as some cloud images
// are), tmpfs and anything else get an fsync for every step. See
// syncEarlier.
func ordersMetadata(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	mounts, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if uint32(m.Major) != unix.Major(st.Dev) || uint32(m.Minor) != unix.Minor(st.Dev) {
			continue
		}
		switch m.FsType {
		case "xfs":
			return true, nil
		case "ext3", "ext4":
			return hasJournal(st.Dev)
		}
		return false, nil
	}
	return false, nil
}

// hasJournal reports whether the ext3/ext4 file system on device dev has a
// journal: jbd2 names its journals /proc/fs/jbd2/<device>-<inode>.
func hasJournal(dev uint64) (bool, error) {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return false, nil // no block device behind it: assume the worst
	}
	journals, err := os.ReadDir("/proc/fs/jbd2")
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	prefix := filepath.Base(link) + "-"
	for _, j := range journals {
		if strings.HasPrefix(j.Name(), prefix) {
			return true, nil
		}
	}
	return false, nil
}

// syncDir makes the directory entries of dir durable (renames, creations,
// removals).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
