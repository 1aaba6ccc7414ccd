package store

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// faultFile: the state file was removed, replaced or cut short under the
// running csid (see watch).
const faultFile = "file"

// ErrFileLost is wrapped by the fault the file watch reports: the path no
// longer leads to the file csid has open, or the file was cut short.
var ErrFileLost = errors.New("the state file changed under csid")

// fileWatch compares the file csid has open with what its path names, and
// the open file's size with the size it had: the file removed (or renamed
// away), replaced by another one, or cut short is noticed within an
// interval (Options.WatchInterval, 1s). Not before every commit: the two
// stats cost a commit with fsync far more than their own microsecond (a
// Submit took 20% longer), and the commits of that interval are no loss:
// they are in the open file, which csid state backup saves.
//
// What it finds is a fault of the store (Health) until the path leads to
// the open file again: csid takes no writes meanwhile, so that what the
// open file holds (which `csid state backup` can still write out) is all
// there is. A file cut short stays a fault for good: the pages past the cut
// are gone, and reading them would fault.
type fileWatch struct {
	f    *os.File // the file bbolt has open
	dev  uint64
	ino  uint64
	mu   sync.Mutex
	size int64 // the largest size seen
	cut  error // set once the file was found cut short
}

func newFileWatch(f *os.File) (*fileWatch, error) {
	st, err := fstat(f)
	if err != nil {
		return nil, err
	}
	return &fileWatch{f: f, dev: uint64(st.Dev), ino: st.Ino, size: st.Size}, nil
}

func fstat(f *os.File) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// check returns what is wrong with the file (nil when nothing is), saying
// what to do.
func (w *fileWatch) check(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cut != nil {
		return w.cut
	}
	st, err := fstat(w.f)
	if err != nil {
		return fmt.Errorf("stat the open state file %s: %v: %w", path, err, ErrFileLost)
	}
	if st.Size < w.size {
		w.cut = fmt.Errorf("state file %s was cut to %d bytes while csid ran (it held %d): %w; the records past the cut are gone. "+
			"csid takes no writes and cannot read them: stop csid, restore the file from a backup (or move it aside and start csid with "+
			"--rebuild-from-cloud); docs/operations.md, \"The state file changed under csid\"", path, st.Size, w.size, ErrFileLost)
		return w.cut
	}
	w.size = st.Size
	save := fmt.Sprintf("csid keeps its records in the file it has open, and takes no writes: save them with `csid state backup --to %s.saved` "+
		"(it reads this csid through its admin socket), stop csid, put the copy at %s, and start csid; docs/operations.md, \"The state file changed under csid\"",
		path, path)
	var pst syscall.Stat_t
	switch err := syscall.Lstat(path, &pst); {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("state file %s was removed while csid ran: %w; %s", path, ErrFileLost, save)
	case err != nil:
		return fmt.Errorf("stat state file %s: %v: %w", path, err, ErrFileLost)
	case uint64(pst.Dev) != w.dev || pst.Ino != w.ino:
		return fmt.Errorf("state file %s was replaced while csid ran: another file has its name, and csid has the old one open: %w; %s", path, ErrFileLost, save)
	}
	return nil
}

// checkFile runs the file watch once and records its finding as the
// store's file fault (or clears it). It returns the finding.
func (s *Store) checkFile() error {
	if s.watch == nil {
		return nil
	}
	err := s.watch.check(s.path)
	if err == nil {
		s.clearFault(faultFile)
		return nil
	}
	s.health.mu.Lock()
	prev := s.health.faults[faultFile]
	s.setFaultLocked(faultFile, err)
	s.health.mu.Unlock()
	if (prev == nil || prev.Error() != err.Error()) && s.opts.OnFileFault != nil {
		s.opts.OnFileFault(err)
	}
	return err
}

// watchFile checks the file every WatchInterval until the store closes.
func (s *Store) watchFile() {
	defer s.health.probes.Done()
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.health.closed:
			return
		case <-t.C:
			_ = s.checkFile()
		}
	}
}

// fileFault returns the file watch's last finding, if any.
func (s *Store) fileFault() error {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.faults[faultFile]
}

// fileCut returns the file watch's finding that the file was cut short:
// reading its pages would fault.
func (s *Store) fileCut() error {
	if s.watch == nil {
		return nil
	}
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	return s.watch.cut
}
