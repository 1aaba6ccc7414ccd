package local

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

// The journal: creates and deletes commit as a group.
//
// A create or a delete first appends its intent (the new disk's record;
// the deleted disk's id and name) to its process's journal and waits until
// the intent is durable: one fdatasync of the journal serves every intent
// appended before it began (a dirSyncer round), so eight concurrent calls
// share a flush of the device rather than make four each. Then it makes its
// changes to the record, the name index and the spares without any fsync:
// other processes see them at once, through the page cache, and the
// kernel writes them back in its time. The call returns after its intent
// is durable and its changes are made.
//
// A crash of the machine may then lose changes the kernel had not written
// back, or write back some and not others, in any order (on a file system
// without a journal, e2fsck repairs what is left at the next boot). So the
// first Open after a boot replays every journal a process of an earlier
// boot left (the boot id is in each journal's first line): each disk a
// journal names is made as its last intent says, from the intent alone:
// a created disk gets its record (unless a whole record of it is in place:
// a later change, which is fsynced, may have replaced it) and its name
// entry; a deleted disk loses its record, name entry and image. A process
// checkpoints its journal once it holds journalIntents intents, or after
// journalIdle without one: it starts another, waits until every change of
// the old one is made, makes them all durable (syncfs) and removes it.
// A journal whose process was killed in this boot (no process holds its
// lock) is made durable and removed by the next Open: its changes are in
// the page cache, and a change a kill cut short is one Open collects
// anyway (gc.go).
//
// An intent is a line of JSON. A journal is made whole first (its first
// line, then zeros up to journalBytes, fsynced with its directory entry),
// and intents overwrite its zeros: an fdatasync then writes a block of
// data and flushes the device, and no inode.
const (
	journalDir     = "journal"
	journalSuffix  = ".wal"
	journalBytes   = 1 << 20
	journalMagic   = "csid-journal 1"
	journalIntents = 1024
	journalIdle    = 2 * time.Second
	// gatherMax is how long a commit waits, at most, for the calls on
	// their way to the journal (see gather).
	gatherMax = 200 * time.Microsecond
)

// Intent kinds.
const (
	intentCreate = "create"
	intentDelete = "delete"
	// intentAbort cancels the intent of the same operation: its changes
	// failed and the call returned the failure.
	intentAbort = "abort"
)

// intent is a journal line.
type intent struct {
	Op   opID        `json:"op"` // orders intents across journals
	Kind string      `json:"kind"`
	ID   diskID      `json:"id,omitempty"`
	Name string      `json:"name,omitempty"` // the name's hash
	Disk *cloud.Disk `json:"disk,omitempty"` // a create's record
}

// journalHeader is a journal's first line.
type journalHeader struct {
	Magic string `json:"journal"`
	Boot  string `json:"boot"`
}

// journal is this process's journal.
type journal struct {
	dir  string
	boot string
	// syncfs makes every change on the state directory's file system
	// durable (a checkpoint).
	syncfs func() error
	// idle is how long without an intent before a checkpoint; limit, how
	// many intents a journal file takes (journalIntents; tests fewer).
	idle  time.Duration
	limit int

	// arriving counts the calls on their way to an intent (arrive); left
	// wakes a gathering commit when one of them leaves.
	arriving atomic.Int64
	left     chan struct{}

	mu     sync.Mutex
	cur    *generation // nil until the next intent
	timer  *time.Timer // the idle checkpoint
	closed bool
	ckpts  sync.WaitGroup
	ckErr  error // the latest checkpoint's failure, for Close
}

// generation is one journal file.
type generation struct {
	path     string
	fd       int
	off      int64
	n        int
	commits  *dirSyncer // fdatasync rounds of fd
	inflight sync.WaitGroup
}

// arrive counts a call that may log an intent soon (a create or a delete,
// from its start), until leave is called (idempotent; log calls it once
// the intent is appended).
func (j *journal) arrive() (leave func()) {
	j.arriving.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			j.arriving.Add(-1)
			select {
			case j.left <- struct{}{}:
			default:
			}
		})
	}
}

// gather lets the calls on their way to the journal append their intents
// before a commit begins, so that it serves them too, for at most
// gatherMax: a commit delay, as databases make one while other
// transactions are in flight. It waits for nothing when no other call is
// under way, as at concurrency 1, and it sleeps while it waits (each call
// that leaves wakes it), leaving the processor to the calls it waits for.
func (j *journal) gather() {
	if j.arriving.Load() == 0 {
		return
	}
	window := time.NewTimer(gatherMax)
	defer window.Stop()
	for j.arriving.Load() > 0 {
		select {
		case <-j.left:
		case <-window.C:
			return
		}
	}
}

// log appends in to the journal and returns once it is durable, with the
// function to call once its changes are made (or have failed: then after
// j.abort). It calls leave (of arrive) once in is appended.
func (j *journal) log(in intent, leave func()) (done func(), err error) {
	defer leave()
	line, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	line = append(line, '\n')
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil, errors.New("journal closed")
	}
	if j.cur == nil || j.cur.off+int64(len(line)) > journalBytes || j.cur.n >= j.limit {
		if err := j.rotate(); err != nil {
			j.mu.Unlock()
			return nil, err
		}
	}
	g := j.cur
	if err := writeAt(g.fd, line, g.off); err != nil {
		j.mu.Unlock()
		return nil, fmt.Errorf("append to %s: %w", g.path, err)
	}
	g.off += int64(len(line))
	g.n++
	g.inflight.Add(1)
	leave()
	if j.timer == nil {
		j.timer = time.AfterFunc(j.idle, j.checkpointIdle)
	} else {
		j.timer.Reset(j.idle)
	}
	j.mu.Unlock()
	if err := g.commits.sync(); err != nil {
		g.inflight.Done()
		return nil, fmt.Errorf("journal %s: %w", g.path, err)
	}
	return g.inflight.Done, nil
}

// abort appends the cancellation of operation op's intent, whose changes
// failed. Not waited for: lost in a crash, the intent is replayed, and the
// repeated call finds what it made.
func (j *journal) abort(op opID) {
	line, _ := json.Marshal(intent{Op: op, Kind: intentAbort})
	line = append(line, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if g := j.cur; g != nil && g.off+int64(len(line)) <= journalBytes {
		if writeAt(g.fd, line, g.off) == nil {
			g.off += int64(len(line))
		}
	}
}

// rotate starts a new journal file and checkpoints the current one in the
// background. The caller holds j.mu.
func (j *journal) rotate() error {
	g, err := j.create()
	if err != nil {
		return err
	}
	if old := j.cur; old != nil {
		j.ckpts.Add(1)
		go func() {
			defer j.ckpts.Done()
			j.checkpoint(old)
		}()
	}
	j.cur = g
	return nil
}

// create makes a journal file whole: its first line, zeros to
// journalBytes, fsynced, and its name durable; locked while this process
// holds it open.
func (j *journal) create() (*generation, error) {
	path := filepath.Join(j.dir, string(newOpID(time.Now()))+journalSuffix)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: path, Err: err}
	}
	head, _ := json.Marshal(journalHeader{Magic: journalMagic, Boot: j.boot})
	buf := make([]byte, journalBytes)
	n := copy(buf, append(head, '\n'))
	err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		err = writeAt(fd, buf, 0)
	}
	if err == nil {
		err = fsyncFD(fd)
	}
	if err == nil {
		err = syncDir(j.dir)
	}
	if err != nil {
		_ = unix.Close(fd)
		_ = os.Remove(path)
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	g := &generation{path: path, fd: fd, off: int64(n)}
	g.commits = newDirSyncer(path)
	g.commits.fsync = func() error { return fdatasyncFD(fd) }
	g.commits.gather = j.gather
	return g, nil
}

// checkpointIdle checkpoints the current journal after journalIdle
// without an intent.
func (j *journal) checkpointIdle() {
	j.mu.Lock()
	g := j.cur
	if g == nil || j.closed {
		j.mu.Unlock()
		return
	}
	j.cur = nil
	j.ckpts.Add(1) // close waits for it
	j.mu.Unlock()
	defer j.ckpts.Done()
	j.checkpoint(g)
}

// checkpoint waits until every change of g is made, makes them durable
// and removes g. A failed checkpoint leaves g for the replay after a
// crash, or for the next Open.
func (j *journal) checkpoint(g *generation) {
	g.inflight.Wait()
	g.commits.close()
	err := j.syncfs()
	if err == nil {
		// Not made durable: a journal that comes back is replayed again,
		// which finds everything made.
		err = os.Remove(g.path)
	}
	err = errors.Join(err, unix.Close(g.fd))
	if err != nil {
		j.mu.Lock()
		j.ckErr = err
		j.mu.Unlock()
	}
}

// close checkpoints the journal and stops it.
func (j *journal) close() error {
	j.mu.Lock()
	j.closed = true
	if j.timer != nil {
		j.timer.Stop()
	}
	g := j.cur
	j.cur = nil
	j.mu.Unlock()
	if g != nil {
		j.checkpoint(g)
	}
	j.ckpts.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ckErr
}

// bootID is this boot's id.
func bootID() (string, error) {
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// journalFile is a journal another process left, or one of this process.
type journalFile struct {
	path string
	boot string
}

// foreign reports whether f is of a boot other than boot. A file without
// its first line (its process was killed, or the machine crashed, while
// making it) holds no intent: it is left to settleJournals.
func (f journalFile) foreign(boot string) bool { return f.boot != "" && f.boot != boot }

// journals lists the journal files and their boots; a file without a
// whole first line (a create a crash cut short) has boot "".
func (s *state) journals() ([]journalFile, error) {
	paths, err := s.journalPaths()
	if err != nil {
		return nil, err
	}
	var files []journalFile
	for _, path := range paths {
		boot, err := readJournalBoot(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // checkpointed meanwhile
		}
		if err != nil {
			return nil, err
		}
		files = append(files, journalFile{path: path, boot: boot})
	}
	return files, nil
}

// journalPaths lists the journal files, without reading them.
func (s *state) journalPaths() ([]string, error) {
	entries, err := os.ReadDir(s.journal)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), journalSuffix) && e.Type().IsRegular() {
			paths = append(paths, filepath.Join(s.journal, e.Name()))
		}
	}
	return paths, nil
}

func readJournalBoot(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil {
		return "", nil
	}
	var h journalHeader
	if json.Unmarshal(line, &h) != nil || h.Magic != journalMagic {
		return "", nil
	}
	return h.Boot, nil
}

// mustReplay reports whether a journal of another boot is left: the
// first Open of this boot replays it, holding the layout lock exclusively.
func (s *state) mustReplay() (bool, error) {
	files, err := s.journals()
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(files, func(f journalFile) bool { return f.foreign(s.boot) }), nil
}

// replayJournals redoes the intents of every journal of another boot,
// makes what it changed durable and removes those journals. The caller
// holds the layout lock exclusively.
func (s *state) replayJournals() error {
	files, err := s.journals()
	if err != nil {
		return err
	}
	var intents []intent
	var done []string
	for _, f := range files {
		if !f.foreign(s.boot) {
			continue
		}
		in, err := readIntents(f.path)
		if err != nil {
			return err
		}
		intents = append(intents, in...)
		done = append(done, f.path)
	}
	if len(done) == 0 {
		return nil
	}
	if err := s.redo(intents); err != nil {
		return fmt.Errorf("replay the journals of an earlier boot: %w", err)
	}
	for _, path := range done {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return syncDir(s.journal)
}

// readIntents reads a journal's intents, in order. A line that does not
// parse (the crash cut its write short: its call never returned) ends
// them.
func readIntents(path string) ([]intent, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := bytes.Split(raw, []byte{'\n'})
	var out []intent
	for _, line := range lines[1:] {
		var in intent
		if len(line) == 0 || line[0] == 0 || json.Unmarshal(line, &in) != nil {
			break
		}
		out = append(out, in)
	}
	return out, nil
}

// redo makes each disk the intents name as its last intent says.
// Operations on one disk are ordered by its lock; their ids order them
// across journals (the time of the call).
func (s *state) redo(intents []intent) error {
	aborted := map[opID]bool{}
	for _, in := range intents {
		if in.Kind == intentAbort {
			aborted[in.Op] = true
		}
	}
	slices.SortStableFunc(intents, func(a, b intent) int { return cmp.Compare(a.Op, b.Op) })
	last := map[diskID]intent{}
	var order []diskID
	for _, in := range intents {
		if in.Kind == intentAbort || aborted[in.Op] {
			continue
		}
		if _, ok := parseDiskID(string(in.ID)); !ok {
			return fmt.Errorf("intent %s names disk %q", in.Op, in.ID)
		}
		if _, seen := last[in.ID]; !seen {
			order = append(order, in.ID)
		}
		last[in.ID] = in
	}
	for _, id := range order {
		in := last[id]
		var err error
		switch in.Kind {
		case intentCreate:
			err = s.redoCreate(in)
		case intentDelete:
			err = s.redoDelete(in)
		default:
			err = fmt.Errorf("intent %s of kind %q", in.Op, in.Kind)
		}
		if err != nil {
			return err
		}
	}
	if err := syncDir(s.disks); err != nil {
		return err
	}
	return syncDir(s.names)
}

// redoCreate makes disk in.Disk exist: its record, unless a whole record
// of it is in place, and its name entry.
func (s *state) redoCreate(in intent) error {
	if in.Disk == nil || in.Disk.ID != string(in.ID) {
		return fmt.Errorf("create intent %s without its disk", in.Op)
	}
	d := *in.Disk
	if _, err := s.readDisk(in.ID); err != nil {
		raw, err := json.Marshal(diskRecord{Version: recordVersion, Disk: d})
		if err != nil {
			return err
		}
		if err := replaceFile(s.disks, string(in.ID)+recSuffix, raw); err != nil {
			return err
		}
	}
	hash := nameHash(d.Name)
	if got, ok, err := s.named(hash); err == nil && ok && got == in.ID {
		return nil
	} else if err == nil && ok {
		if other, err := s.readDisk(got); err == nil && other.Name == d.Name {
			// Another disk has the name (a create after a kill, in a
			// process that did not replay this journal): it keeps it;
			// csid check shows this one.
			return nil
		}
	}
	if err := os.Remove(s.namePath(hash)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Link(s.recordPath(in.ID), s.namePath(hash))
}

// redoDelete makes disk in.ID gone: its record, its image, and its name
// entry unless that names another disk now.
func (s *state) redoDelete(in intent) error {
	for _, path := range []string{s.recordPath(in.ID), s.imagePath(in.ID)} {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if in.Name == "" {
		return nil
	}
	got, ok, err := s.named(in.Name)
	if err == nil && ok && got != in.ID {
		if _, err := s.readDisk(got); err == nil {
			return nil // the name's new disk
		}
	}
	if err := os.Remove(s.namePath(in.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// settleJournals makes durable, and removes, the journals of processes of
// this boot that are gone (no process holds their lock): a kill, not a
// crash of the machine, ended them, and what they changed is in the page
// cache.
func (s *state) settleJournals() error {
	// Whose a journal is, its lock says; its first line is not read.
	paths, err := s.journalPaths()
	if err != nil {
		return err
	}
	synced := false
	for _, path := range paths {
		fd, err := openNoEINTR(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "open", Path: path, Err: err}
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
			_ = unix.Close(fd) // its process is alive
			continue
		}
		if !synced {
			if err := s.syncfs(); err != nil {
				_ = unix.Close(fd)
				return err
			}
			synced = true
		}
		err = os.Remove(path)
		_ = unix.Close(fd)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// syncfs makes every change on the state directory's file system durable.
func (s *state) syncfs() error {
	if err := unix.Syncfs(int(s.lockF.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", s.dir, err)
	}
	return nil
}
