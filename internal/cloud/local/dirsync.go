package local

import (
	"sync"
)

// dirSyncer shares a directory's fsyncs among the operations that need
// one at the same time. A caller needs an fsync that starts after its
// change to the directory; while one runs, callers queue for the next,
// and that one fsync serves them all: at concurrency 8 a create or delete
// then pays a fraction of a flush of the device instead of one each.
type dirSyncer struct {
	dir   string
	fsync func(dir string) error // syncDir; tests count the rounds

	mu      sync.Mutex
	cond    *sync.Cond
	started uint64 // rounds begun
	done    uint64 // rounds finished
	running bool
	errs    map[uint64]error // of finished rounds still awaited
	waiting map[uint64]int
}

func newDirSyncer(dir string) *dirSyncer {
	d := &dirSyncer{dir: dir, fsync: syncDir, errs: map[uint64]error{}, waiting: map[uint64]int{}}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// sync returns once an fsync of the directory that began after the call
// has finished, with its error.
func (d *dirSyncer) sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	// The round that serves this caller: the next one to start.
	want := d.started + 1
	d.waiting[want]++
	for d.done < want {
		if !d.running && d.started < want {
			d.running = true
			d.started = want
			d.mu.Unlock()
			err := d.fsync(d.dir)
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
