package ops

import (
	"sync"
	"sync/atomic"
	"time"
)

// spawner runs functions on goroutines it keeps for a while afterwards,
// for the next function. An op's goroutine grows its stack to tens of KiB
// (JSON, bbolt, the cloud call), and a new goroutine for each op grows it
// again, copying it at each step: under load that copying was 5% of
// csid's CPU (docs/benchmarks.md, "Seventh pass"). A kept goroutine has
// grown its stack already. One that has waited keepIdle for work, or
// finds stop closed, ends.
type spawner struct {
	work     chan func()
	stop     <-chan struct{}
	keepIdle time.Duration

	mu   sync.Mutex
	idle int // kept goroutines waiting for work that no spawn has claimed

	// Tests: the goroutines started; parked and ended, when set, are told
	// each time a kept goroutine waits for work, and when one ends.
	started       atomic.Int64
	parked, ended chan<- struct{}
}

func newSpawner(stop <-chan struct{}, keepIdle time.Duration) *spawner {
	return &spawner{work: make(chan func()), stop: stop, keepIdle: keepIdle}
}

// spawn runs fn on a kept goroutine that waits for work, or on a new one.
func (s *spawner) spawn(fn func()) {
	s.mu.Lock()
	if s.idle > 0 {
		s.idle-- // claimed: that goroutine receives fn, whatever else it sees
		s.mu.Unlock()
		s.work <- fn
		return
	}
	s.mu.Unlock()
	s.started.Add(1)
	go s.keep(fn)
}

// keep runs fn, then the functions spawn hands it, until it has waited
// keepIdle for one or stop is closed.
func (s *spawner) keep(fn func()) {
	if s.ended != nil {
		defer func() { s.ended <- struct{}{} }()
	}
	idle := time.NewTimer(s.keepIdle)
	defer idle.Stop()
	for {
		fn()
		idle.Reset(s.keepIdle)
		s.mu.Lock()
		s.idle++
		s.mu.Unlock()
		if s.parked != nil {
			s.parked <- struct{}{}
		}
		select {
		case fn = <-s.work:
			continue
		case <-idle.C:
		case <-s.stop:
		}
		s.mu.Lock()
		if s.idle == 0 {
			// A spawn claimed a waiting goroutine and is on its way: as
			// many of them wait as claims are, so one of them must take
			// it. This one does.
			s.mu.Unlock()
			fn = <-s.work
			continue
		}
		s.idle--
		s.mu.Unlock()
		return
	}
}
