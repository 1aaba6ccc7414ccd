package store

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrReadOnly is returned by Update on a store opened with OpenReadOnly.
var ErrReadOnly = errors.New("store is open read-only")

// ErrPanic is wrapped by the error of an Update whose fn panicked. The
// panic fails that call alone: its transaction share is rolled back and the
// committer goes on with the others.
var ErrPanic = errors.New("panic in a state file transaction")

type call struct {
	fn   func(*Tx) error
	done chan error
}

// Update runs fn in a read-write transaction and returns once that
// transaction is durably committed (or has failed).
//
// Concurrent callers share transactions (group commit with a leader): a
// caller that finds no commit in progress becomes the leader and commits,
// on its own goroutine, every call waiting at that moment, its own
// included; callers that arrive during that commit wait, and a goroutine
// the leader starts after its commit commits them together, batch after
// batch, until none waits. A caller alone is committed at once, without
// waiting for company and without handing off to another goroutine; N
// callers arriving together pay for one fsync. Only when the previous
// commit was shared (others are active, and some are about to write) does
// a leader gather first: it yields the processor, then waits until as
// many callers are queued as shared that commit, or Options.GatherWindow
// has passed. Under load that is fewer commits (each two fdatasyncs, the
// most CPU a write costs on a virtual disk) for at most the window's
// latency. A writer that comes alone right after a shared commit waits out
// the window once (the commit after it is not shared); at concurrency 1 no
// commit is shared, and nobody waits.
//
// The contract is that of bbolt's Batch: fn may run more than once (when
// another fn in its transaction fails, the others are run again without
// it), so fn must touch nothing but tx and must reset any result it
// publishes through its closure. Work to do after the commit goes into
// tx.OnCommit hooks, which run in commit order before any later write
// transaction starts (a View may see the commit before they have run). An error from fn fails only its own call; so does a
// panic in fn, which Update returns as an error wrapping ErrPanic.
//
// A transaction that cannot be made durable (the file system is full, the
// file is immutable, an I/O error) fails every call in it with an error
// wrapping ErrUnavailable, and Health reports the fault until a later
// commit succeeds; the store retries a probe commit on its own meanwhile.
// Once the file watch has found the file removed, replaced or cut short,
// every call fails so, without touching the file.
func (s *Store) Update(fn func(tx *Tx) error) error {
	if s.readOnly {
		return ErrReadOnly
	}
	c := &call{fn: fn, done: make(chan error, 1)}
	s.cmu.Lock()
	if s.cclosed {
		s.cmu.Unlock()
		return ErrClosed
	}
	s.queue = append(s.queue, c)
	if s.leading {
		s.cmu.Unlock()
		select {
		case s.grew <- struct{}{}: // a gathering leader looks again
		default:
		}
		return <-c.done
	}
	s.leading = true
	s.cmu.Unlock()
	s.lead(true)
	return <-c.done
}

// lead commits queued calls, one batch per transaction. Called with
// s.leading set. A caller leading for itself commits one batch (which holds
// its own call) and, if more calls queued up meanwhile, passes the lead to a
// goroutine that drains them, so no caller waits for strangers' commits.
func (s *Store) lead(caller bool) {
	for {
		if s.lastBatch.Load() > 1 {
			// The last commit was shared: others are active, and some are
			// about to enqueue. Let them run first, and commit them too.
			runtime.Gosched()
			s.gather()
		}
		s.cmu.Lock()
		n := min(len(s.queue), s.opts.MaxBatch)
		if n == 0 {
			s.leading = false
			s.idle.Broadcast()
			s.cmu.Unlock()
			return
		}
		batch := make([]*call, n)
		copy(batch, s.queue)
		s.queue = append(s.queue[:0], s.queue[n:]...)
		s.cmu.Unlock()

		s.commit(batch)

		if caller {
			s.cmu.Lock()
			more := len(s.queue) > 0
			if !more {
				s.leading = false
				s.idle.Broadcast()
			}
			s.cmu.Unlock()
			if more {
				go s.lead(false)
			}
			return
		}
	}
}

// gather waits until as many calls are queued as the last commit served,
// or Options.GatherWindow has passed (see Update). With none queued (a
// goroutine draining the queue finds it empty) it returns at once and the
// lead ends; so it does once the store closes.
func (s *Store) gather() {
	want := int(s.lastBatch.Load())
	var window *time.Timer
	for {
		s.cmu.Lock()
		n, closing := len(s.queue), s.cclosed
		s.cmu.Unlock()
		// Nobody queued: the lead ends, and the next caller gathers.
		if n == 0 || n >= want || closing {
			return
		}
		if window == nil {
			window = time.NewTimer(s.opts.GatherWindow)
			defer window.Stop()
		}
		select {
		case <-s.grew:
		case <-window.C:
			return
		}
	}
}

// commit runs a batch in one transaction. If one call fails (or panics),
// it alone gets the error and the rest are committed again without it.
func (s *Store) commit(batch []*call) {
	start := time.Now()
	if err := s.fileFault(); err != nil {
		// The path no longer leads to the open file, or it was cut short:
		// nothing more is written to it (see fileWatch).
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		for _, c := range batch {
			c.done <- err
		}
		return
	}
	failed := -1
	err := s.boltTx(true, func(btx *bolt.Tx) error {
		// The first hook: the store's own bookkeeping is done before any
		// caller's hook answers a waiter, who may then look at it.
		btx.OnCommit(func() {
			s.committed()
			s.lastBatch.Store(int64(len(batch)))
			if s.opts.Observe != nil {
				s.opts.Observe(len(batch), time.Since(start))
			}
		})
		for i, c := range batch {
			if err := runCall(c, &Tx{tx: btx, s: s}); err != nil {
				failed = i
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, c := range batch {
			c.done <- nil
		}
		return
	}
	if failed < 0 { // the commit itself failed: nobody's writes are durable
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			err = ErrClosed
		} else {
			s.commitFailed(err)
			err = fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		for _, c := range batch {
			c.done <- err
		}
		return
	}
	batch[failed].done <- err
	rest := make([]*call, 0, len(batch)-1)
	rest = append(rest, batch[:failed]...)
	rest = append(rest, batch[failed+1:]...)
	if len(rest) > 0 {
		s.commit(rest)
	}
}

// runCall runs one caller's fn, turning a panic into its error.
func runCall(c *call, tx *Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, r, debug.Stack())
		}
	}()
	return c.fn(tx)
}

// drainCommits refuses new calls and waits until no commit is in progress
// and none is queued.
func (s *Store) drainCommits() {
	s.cmu.Lock()
	s.cclosed = true
	for s.leading || len(s.queue) > 0 {
		s.idle.Wait()
	}
	s.cmu.Unlock()
}
