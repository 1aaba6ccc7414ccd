package local

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

// Operation records live in logs: ops/<op id>.log, named after their
// first operation, one JSON record a line, appended by one process (each
// process appends to its own, and starts another after opsPerLog
// records). An append is one write(2) with O_APPEND and no fsync: an
// operation of this backend has finished when its call returns
// (cloud.Operation.Done), so no caller needs its record after a crash of
// the machine; one lost then reads as forgotten, as a pruned one does. A
// line cut short by a kill belongs to an operation whose call never
// returned, and is passed over. Appending allocates no inode, which on
// this backend's file systems is what a new file costs most.
//
// WaitOperation finds an operation of this process in memory, and any
// other by reading the logs that can hold it. Layout 1 kept a file per
// operation (ops/<op id>.json); those are still read and pruned.
const (
	logSuffix = ".log"
	// defaultOpsPerLog is how many records a log takes before its process
	// starts another.
	defaultOpsPerLog = 1024
)

// opLog is this process's log and the records it holds.
type opLog struct {
	dir    string
	perLog int

	// maxIdle: a log not appended to for this long is not appended to
	// again (another process may prune it as old): the next record
	// starts another.
	maxIdle time.Duration

	mu     sync.Mutex
	f      *os.File
	n      int
	last   time.Time         // of the last append
	recent map[opID]opRecord // this log's records
	older  map[opID]opRecord // the previous log's
}

func newOpLog(dir string, perLog int) *opLog {
	if perLog <= 0 {
		perLog = defaultOpsPerLog
	}
	return &opLog{dir: dir, perLog: perLog, maxIdle: time.Hour}
}

// append writes rec to the log.
func (l *opLog) append(rec opRecord) error {
	rec.Version = recordVersion
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	id := opID(rec.Op.ID)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.f == nil || l.n >= l.perLog || now.Sub(l.last) > l.maxIdle {
		if err := l.rotate(id); err != nil {
			return err
		}
	}
	l.last = now
	if _, err := l.f.Write(line); err != nil {
		return fmt.Errorf("append to %s: %w", l.f.Name(), err)
	}
	l.n++
	l.recent[id] = rec
	return nil
}

// rotate starts a log named after the operation first, for this process
// alone (O_EXCL). The caller holds l.mu.
func (l *opLog) rotate(first opID) error {
	f, err := os.OpenFile(filepath.Join(l.dir, string(first)+logSuffix), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if l.f != nil {
		_ = l.f.Close()
	}
	l.f, l.n = f, 0
	l.older, l.recent = l.recent, map[opID]opRecord{}
	return nil
}

// current is the name of this process's log ("" before the first record).
func (l *opLog) current() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return ""
	}
	return filepath.Base(l.f.Name())
}

func (l *opLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// cached finds a record of this process's two latest logs.
func (l *opLog) cached(id opID) (opRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, ok := l.recent[id]; ok {
		return rec, true
	}
	rec, ok := l.older[id]
	return rec, ok
}

// readOp finds the record of operation id: in memory, in the logs that
// can hold it (those begun no later than the operation), or in a record
// file of layout 1.
func (s *state) readOp(id opID) (opRecord, error) {
	if s.oplog != nil {
		if rec, ok := s.oplog.cached(id); ok {
			return rec, nil
		}
	}
	logs, err := listIDs(s.ops, logSuffix, parseOpID)
	if err != nil {
		return opRecord{}, err
	}
	for i := len(logs) - 1; i >= 0; i-- {
		if logs[i] > id {
			continue
		}
		rec, ok, err := findInLog(filepath.Join(s.ops, string(logs[i])+logSuffix), id)
		if err != nil || ok {
			return rec, err
		}
	}
	return s.readOpFile(id)
}

// findInLog scans one log for operation id. A line that does not parse (a
// kill cut it short) is passed over.
func findInLog(path string, id opID) (opRecord, bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return opRecord{}, false, nil // pruned meanwhile
	}
	if err != nil {
		return opRecord{}, false, err
	}
	defer f.Close()
	needle := []byte(`"id":"` + string(id) + `"`)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), needle) {
			continue
		}
		var rec opRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Op.ID != string(id) {
			continue
		}
		if rec.Version != recordVersion {
			return opRecord{}, false, fmt.Errorf("operation log %s: version %d for %s", path, rec.Version, id)
		}
		return rec, true, nil
	}
	return opRecord{}, false, sc.Err()
}

// readOpFile reads a record file of layout 1.
func (s *state) readOpFile(id opID) (opRecord, error) {
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

// pruneOps forgets finished operations: a log goes once it was last
// appended to longer than maxAge ago (its modification time) and is not
// one of the newest logs that, full, hold keep records; a record file of
// layout 1, once older than maxAge. It reads no log: it runs every few
// dozen operations. It takes no lock: two processes pruning at once both
// remove what is old, and a log still being appended to is never old (its
// process starts another after an hour without appending, well within
// the retention).
func (s *state) pruneOps(now time.Time, keep int, maxAge time.Duration) error {
	logs, err := listIDs(s.ops, logSuffix, parseOpID)
	if err != nil {
		return err
	}
	perLog := defaultOpsPerLog
	if s.oplog != nil {
		perLog = s.oplog.perLog
	}
	current := ""
	if s.oplog != nil {
		current = s.oplog.current()
	}
	newest := (keep + perLog - 1) / perLog
	for i := len(logs) - 1 - newest; i >= 0; i-- {
		path := filepath.Join(s.ops, string(logs[i])+logSuffix)
		if filepath.Base(path) == current {
			continue
		}
		fi, err := os.Lstat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if now.Sub(s.lastAppend(logs[i], fi)) < maxAge {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	files, err := recordIDs(s.ops, parseOpID)
	if err != nil {
		return err
	}
	for _, id := range files {
		if now.Sub(opTime(id)) < maxAge {
			break // sorted by time: the rest are younger
		}
		if err := os.Remove(s.opPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// lastAppend is when a log was last appended to: its modification time,
// but never before its first operation (a clock set back, or a test's).
func (s *state) lastAppend(first opID, fi os.FileInfo) time.Time {
	if t := opTime(first); fi.ModTime().Before(t) {
		return t
	}
	return fi.ModTime()
}
