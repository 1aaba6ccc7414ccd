package local

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// dirSyncer shares a directory's fsyncs among the operations that need
// one at the same time. A caller needs an fsync that starts after its
// change to the directory; while one runs, callers queue for the next,
// and that one fsync serves them all: at concurrency 8 a create or delete
// then pays a fraction of a flush of the device instead of one each. The
// directory stays open between rounds (an open costs six system calls
// through package os, as many as the rest of a delete).
type dirSyncer struct {
	dir   string
	fsync func() error // d.syncOpen; tests count the rounds
	// gather, when set, is called by a round before it begins, for the
	// callers about to join it (journal.go).
	gather func()
	fd     int // the directory, open for the rounds; -1 when not; only the running round uses it

	mu      sync.Mutex
	cond    *sync.Cond
	started uint64 // rounds begun
	done    uint64 // rounds finished
	running bool
	errs    map[uint64]error // of finished rounds still awaited
	waiting map[uint64]int
}

func newDirSyncer(dir string) *dirSyncer {
	d := &dirSyncer{dir: dir, fd: -1, errs: map[uint64]error{}, waiting: map[uint64]int{}}
	d.fsync = d.syncOpen
	d.cond = sync.NewCond(&d.mu)
	return d
}

// syncOpen fsyncs the directory through the descriptor it keeps open,
// opening it first if needed. After a failure the descriptor is closed, so
// that the next round starts from a fresh open. Only the running round
// calls it.
func (d *dirSyncer) syncOpen() error {
	if d.fd < 0 {
		fd, err := openNoEINTR(d.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if err != nil {
			return fmt.Errorf("open %s: %w", d.dir, err)
		}
		d.fd = fd
	}
	if err := fsyncFD(d.fd); err != nil {
		d.closeFD()
		return fmt.Errorf("fsync %s: %w", d.dir, err)
	}
	return nil
}

// close releases the directory's descriptor, once the running round (if
// any) has finished with it.
func (d *dirSyncer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.running {
		d.cond.Wait()
	}
	d.closeFD()
}

func (d *dirSyncer) closeFD() {
	if d.fd >= 0 {
		_ = unix.Close(d.fd)
		d.fd = -1
	}
}

// fsyncFD fsyncs the open file fd, again when a signal interrupts it.
func fsyncFD(fd int) error {
	_, err := uninterrupted(func() (struct{}, error) { return struct{}{}, unix.Fsync(fd) })
	return err
}

// fdatasyncFD is fsyncFD's fdatasync.
func fdatasyncFD(fd int) error {
	_, err := uninterrupted(func() (struct{}, error) { return struct{}{}, unix.Fdatasync(fd) })
	return err
}

// uninterrupted makes call again for as long as a signal interrupts it.
func uninterrupted[T any](call func() (T, error)) (T, error) {
	for {
		if v, err := call(); !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}

// sync returns once an fsync of the directory that began after the call
// has finished, with its error.
func (d *dirSyncer) sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.started + 1 // the next round to begin
	d.waiting[want]++
	for d.done < want {
		// Rounds begin one at a time, and want was at most the next to
		// begin when it was taken: the next to begin now is want.
		if !d.running && d.started < want {
			d.running = true
			if d.gather != nil {
				// Callers arriving meanwhile join this round: it
				// has not begun.
				d.mu.Unlock()
				d.gather()
				d.mu.Lock()
			}
			d.started = want
			d.mu.Unlock()
			err := d.fsync()
			d.mu.Lock()
			d.running = false
			d.done = want
			d.errs[want] = err
			d.cond.Broadcast()
			break
		}
		d.cond.Wait()
	}
	err := d.errs[want]
	if d.waiting[want]--; d.waiting[want] == 0 {
		delete(d.waiting, want)
		delete(d.errs, want)
	}
	return err
}
