package store

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// ErrUnavailable is wrapped by Health's answer and by the error of an Update
// whose transaction could not be made durable: the state file cannot take
// writes now (its file system is full, the file was made immutable, an I/O
// error, the file was removed). It is transient: csid goes on once the cause
// is gone.
var ErrUnavailable = errors.New("the state file cannot be written")

// Sources of faults (see Health).
const (
	// faultCommit: the last commit failed; cleared by the next one that
	// succeeds (a probe commit retries on its own while nobody writes).
	faultCommit = "commit"
)

// health is the set of conditions that keep a store from taking writes,
// by source.
type health struct {
	mu     sync.Mutex
	faults map[string]error
	// probing is set while a probe goroutine retries a commit.
	probing bool
	// ok is closed while there is no fault; a fault replaces it with an
	// open channel (see Healthy).
	ok chan struct{}
	// closed stops the probe; probes waits for it.
	closed chan struct{}
	probes sync.WaitGroup
}

// Health returns nil when the store can take writes, or an error wrapping
// ErrUnavailable that names the file and every reason it cannot. Readiness
// reports it, and the engine refuses new work with it.
func (s *Store) Health() error {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	if len(s.health.faults) == 0 {
		return nil
	}
	sources := make([]string, 0, len(s.health.faults))
	for src := range s.health.faults {
		sources = append(sources, src)
	}
	sort.Strings(sources)
	reasons := make([]string, 0, len(sources))
	for _, src := range sources {
		reasons = append(reasons, fmt.Sprintf("%s: %v", src, s.health.faults[src]))
	}
	return fmt.Errorf("state file %s: %w (%s)", s.path, ErrUnavailable, strings.Join(reasons, "; "))
}

// Healthy returns a channel that is closed once Health is nil: at once
// when it is nil now. Whoever waits for the store to take writes again (a
// worker whose commit failed) waits on it.
func (s *Store) Healthy() <-chan struct{} {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.ok
}

func (h *health) init() {
	h.ok = make(chan struct{})
	close(h.ok)
	h.closed = make(chan struct{})
}

// setFaultLocked records a condition that keeps the store from taking
// writes; s.health.mu held.
func (s *Store) setFaultLocked(source string, err error) {
	if s.health.faults == nil {
		s.health.faults = map[string]error{}
	}
	if len(s.health.faults) == 0 {
		s.health.ok = make(chan struct{})
	}
	s.health.faults[source] = err
}

// clearFault forgets a condition once it no longer holds.
func (s *Store) clearFault(source string) {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	if _, ok := s.health.faults[source]; !ok {
		return
	}
	delete(s.health.faults, source)
	if len(s.health.faults) == 0 {
		close(s.health.ok)
	}
}

// commitFailed records that a commit could not be made durable, and starts
// a probe that commits a tiny write with backoff until one succeeds: then
// the fault clears, whether or not anybody else writes meanwhile.
func (s *Store) commitFailed(err error) {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	s.setFaultLocked(faultCommit, err)
	select {
	case <-s.health.closed:
		return
	default:
	}
	if !s.health.probing {
		s.health.probing = true
		s.health.probes.Add(1)
		go s.probe()
	}
}

// committed clears a commit fault.
func (s *Store) committed() { s.clearFault(faultCommit) }

// probeBackoff bounds the probe's waits.
const (
	probeFirst = 50 * time.Millisecond
	probeMax   = 2 * time.Second
)

var keyProbe = []byte("probe")

// probe commits a write to the meta bucket until the commit fault is gone
// (its own commit or another succeeded) or the store closes. It stops only
// after seeing, under the lock, that no fault is left: a commit that fails
// meanwhile finds it still probing, or starts a new probe.
func (s *Store) probe() {
	defer s.health.probes.Done()
	wait := probeFirst
	for {
		select {
		case <-s.health.closed:
		case <-time.After(wait):
			// Through the committer, like every write: its hooks keep
			// their order, and its success clears the fault.
			err := s.Update(func(tx *Tx) error {
				return tx.tx.Bucket(bucketMeta).Put(keyProbe, u64(uint64(time.Now().UnixNano())))
			})
			if err != nil && !errors.Is(err, ErrClosed) {
				wait = min(2*wait, probeMax)
				continue
			}
		}
		s.health.mu.Lock()
		_, faulty := s.health.faults[faultCommit]
		closed := false
		select {
		case <-s.health.closed:
			closed = true
		default:
		}
		if !faulty || closed {
			s.health.probing = false
			s.health.mu.Unlock()
			return
		}
		s.health.mu.Unlock()
		wait = probeFirst
	}
}
