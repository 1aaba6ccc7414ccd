package local

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

// The state directory:
//
//	format              "csid-local 1": the layout version
//	lock                flock(2) target serialising every writer
//	nodes.json          registered nodes
//	disks/<id>.img      disk image, a sparse file
//	disks/<id>.json     disk record; the disk exists iff this file does
//	disks/.tmp-*        writes in progress; removed at Open
//	ops/<op-id>.json    operation records
const (
	formatFile  = "format"
	formatMagic = "csid-local 1\n"
	lockFile    = "lock"
	nodesFile   = "nodes.json"
	disksDir    = "disks"
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
	dir   string // absolute, symlinks resolved
	disks string
	ops   string
	lockF *os.File
	// sem serialises the goroutines of this process; the flock on lockF
	// serialises processes (a flock is per open file, so it would also
	// serialise goroutines, but by blocking threads in the kernel).
	sem chan struct{}
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
	for _, d := range []string{s.disks, s.ops} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("local cloud: %w", err)
		}
	}
	s.lockF, err = os.OpenFile(filepath.Join(abs, lockFile), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	return s, nil
}

// newState is the state directory at abs (absolute, symlinks resolved). It
// opens and creates nothing.
func newState(abs string) *state {
	return &state{dir: abs, disks: filepath.Join(abs, disksDir), ops: filepath.Join(abs, opsDir), sem: make(chan struct{}, 1)}
}

func (s *state) close() error {
	return s.lockF.Close()
}

func (s *state) hit(point string) {
	if s.crash != nil {
		s.crash(point)
	}
}

// lock takes the state lock: first among this process's goroutines, then
// among processes. It gives up when ctx ends.
func (s *state) lock(ctx context.Context) (unlock func(), err error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	delay := 100 * time.Microsecond
	for {
		err := unix.Flock(int(s.lockF.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			<-s.sem
			return nil, fmt.Errorf("lock %s: %w", s.lockF.Name(), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			<-s.sem
			return nil, fmt.Errorf("waiting for the lock on %s: %w", s.dir, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 10*time.Millisecond)
	}
	return func() {
		_ = unix.Flock(int(s.lockF.Fd()), unix.LOCK_UN)
		<-s.sem
	}, nil
}

// checkFormat writes the format marker of a new state directory, or checks
// that of an existing one. The caller holds the lock.
func (s *state) checkFormat() error {
	err := readFormat(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return writeFileAtomic(s.dir, formatFile, []byte(formatMagic))
	}
	return err
}

// readFormat checks the format marker of the state directory dir. A
// missing marker is an error wrapping os.ErrNotExist; another layout
// version is an error naming it.
func readFormat(dir string) error {
	path := filepath.Join(dir, formatFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if string(raw) != formatMagic {
		return fmt.Errorf("%s: %q is not a state directory layout this csid understands (%q)", path, strings.TrimSpace(string(raw)), strings.TrimSpace(formatMagic))
	}
	return nil
}

func (s *state) imagePath(id diskID) string  { return filepath.Join(s.disks, string(id)+imageSuffix) }
func (s *state) recordPath(id diskID) string { return filepath.Join(s.disks, string(id)+recSuffix) }
func (s *state) opPath(id opID) string       { return filepath.Join(s.ops, string(id)+recSuffix) }

// collectGarbage removes what a crash can leave behind: temporary files, and
// images without a record (a create that never finished, or a delete that
// removed the record and not yet the image). The caller holds the lock, so
// no create or delete is in progress.
func (s *state) collectGarbage() error {
	for _, dir := range []string{s.dir, s.disks, s.ops} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		names := make(map[string]bool, len(entries))
		for _, e := range entries {
			names[e.Name()] = true
		}
		for _, e := range entries {
			name := e.Name()
			orphan := strings.HasPrefix(name, tmpPrefix)
			if dir == s.disks && strings.HasSuffix(name, imageSuffix) {
				if id, ok := parseDiskID(strings.TrimSuffix(name, imageSuffix)); ok {
					orphan = !names[string(id)+recSuffix]
				}
			}
			if orphan {
				if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			}
		}
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

type diskRecord struct {
	Version int        `json:"version"`
	Disk    cloud.Disk `json:"disk"`
}

// readDisk reads a disk record; a missing one is ErrNotFound.
func (s *state) readDisk(id diskID) (cloud.Disk, error) {
	raw, err := os.ReadFile(s.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return cloud.Disk{}, fmt.Errorf("disk %s: %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return cloud.Disk{}, fmt.Errorf("disk %s: %w", id, err)
	}
	var rec diskRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return cloud.Disk{}, fmt.Errorf("disk record %s: %w", s.recordPath(id), err)
	}
	if rec.Version != recordVersion || rec.Disk.ID != string(id) {
		return cloud.Disk{}, fmt.Errorf("disk record %s: version %d for %q, want version %d for %s", s.recordPath(id), rec.Version, rec.Disk.ID, recordVersion, id)
	}
	return rec.Disk, nil
}

// writeDisk replaces a disk record atomically and durably.
func (s *state) writeDisk(d cloud.Disk) error {
	raw, err := json.Marshal(diskRecord{Version: recordVersion, Disk: d})
	if err != nil {
		return err
	}
	return writeFileAtomic(s.disks, d.ID+recSuffix, raw)
}

// diskIDs lists the ids of the disks that exist (have a record), sorted.
func (s *state) diskIDs() ([]diskID, error) {
	return recordIDs(s.disks, parseDiskID)
}

// recordIDs lists, sorted, the ids of the records (<id>.json) in dir that
// parse as ids; other files are passed over.
func recordIDs[ID ~string](dir string, parse func(string) (ID, bool)) ([]ID, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []ID
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), recSuffix)
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

func (s *state) writeOp(rec opRecord) error {
	rec.Version = recordVersion
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.ops, rec.Op.ID+recSuffix, raw)
}

func (s *state) readOp(id opID) (opRecord, error) {
	raw, err := os.ReadFile(s.opPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return opRecord{}, fmt.Errorf("operation %s (finished operations are kept for a while, then forgotten): %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return opRecord{}, err
	}
	var rec opRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return opRecord{}, fmt.Errorf("operation record %s: %w", s.opPath(id), err)
	}
	if rec.Version != recordVersion || rec.Op.ID != string(id) {
		return opRecord{}, fmt.Errorf("operation record %s: version %d for %q", s.opPath(id), rec.Version, rec.Op.ID)
	}
	return rec, nil
}

// pruneOps forgets finished operations that are both older than maxAge and
// not among the newest keep. Ids sort by creation time, so no record needs
// to be read. The caller holds the lock.
func (s *state) pruneOps(now time.Time, keep int, maxAge time.Duration) error {
	ids, err := recordIDs(s.ops, parseOpID)
	if err != nil {
		return err
	}
	if len(ids) <= keep {
		return nil
	}
	removed := false
	for _, id := range ids[:len(ids)-keep] {
		if now.Sub(opTime(id)) < maxAge {
			break // sorted by time: the rest are younger
		}
		if err := os.Remove(s.opPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		removed = true
	}
	if removed {
		return syncDir(s.ops)
	}
	return nil
}

// freeBytes is the space left for disk images.
func (s *state) freeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.disks, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", s.disks, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// writeFileAtomic replaces dir/name with data; see replaceFile.
func writeFileAtomic(dir, name string, data []byte) error {
	return replaceFile(dir, name, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	}, nil)
}

// replaceFile replaces dir/name with the file fill writes, such that a crash
// leaves either the old file or the new one, never a mix: fill a temporary
// file, fsync it, rename it over the old one, fsync the directory. synced,
// when not nil, is called between the fsync and the rename (a crash point).
func replaceFile(dir, name string, fill func(*os.File) error, synced func()) error {
	tmp, err := os.CreateTemp(dir, tmpPrefix+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename this finds nothing
	if err := fill(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if synced != nil {
		synced()
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
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
