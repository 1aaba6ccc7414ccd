package store

import (
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ErrReadOnly is returned by Update on a store opened with OpenReadOnly.
var ErrReadOnly = errors.New("store is open read-only")

type call struct {
	fn   func(*Tx) error
	done chan error
}

// Update runs fn in a read-write transaction and returns once that
// transaction is durably committed (or has failed).
//
// Concurrent callers share transactions: the committer takes every call
// waiting when it becomes free and runs them one after another in one
// transaction, so N callers pay for one fsync. A caller alone is committed
// at once, without waiting for company.
//
// The contract is that of bbolt's Batch: fn may run more than once (when
// another fn in its transaction fails, the others are run again without
// it), so fn must touch nothing but tx and must reset any result it
// publishes through its closure. Work to do after the commit goes into
// tx.OnCommit hooks, which run in commit order before any later
// transaction starts. An error from fn fails only its own call.
func (s *Store) Update(fn func(tx *Tx) error) error {
	if s.readOnly {
		return ErrReadOnly
	}
	c := &call{fn: fn, done: make(chan error, 1)}
	s.gateMu.RLock()
	if s.gateClosed {
		s.gateMu.RUnlock()
		return ErrClosed
	}
	s.calls <- c
	s.gateMu.RUnlock()
	return <-c.done
}

// commitLoop is the single writer. It runs until Close has closed the calls
// channel and every queued call has been served.
func (s *Store) commitLoop() {
	defer s.committer.Done()
	go func() {
		<-s.closing
		s.gateMu.Lock()
		s.gateClosed = true
		close(s.calls)
		s.gateMu.Unlock()
	}()
	batch := make([]*call, 0, s.opts.MaxBatch)
	for c := range s.calls {
		batch = append(batch[:0], c)
	fill:
		for len(batch) < s.opts.MaxBatch {
			select {
			case c, ok := <-s.calls:
				if !ok {
					break fill
				}
				batch = append(batch, c)
			default:
				break fill
			}
		}
		s.commit(batch)
	}
}

// commit runs a batch in one transaction. If one call fails, it alone gets
// the error and the rest are committed again without it.
func (s *Store) commit(batch []*call) {
	start := time.Now()
	failed := -1
	err := s.db.Update(func(btx *bolt.Tx) error {
		for i, c := range batch {
			if err := c.fn(&Tx{tx: btx, s: s}); err != nil {
				failed = i
				return err
			}
		}
		return nil
	})
	if err == nil {
		if s.opts.Observe != nil {
			s.opts.Observe(len(batch), time.Since(start))
		}
		for _, c := range batch {
			c.done <- nil
		}
		return
	}
	if failed < 0 { // the commit itself failed: nobody's writes are durable
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
