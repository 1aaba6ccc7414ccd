package ops

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Clock is the engine's view of time, injected so tests need no sleeps.
type Clock interface {
	Now() time.Time
	// After delivers the time once d has passed.
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// After is time.After.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff is the retry policy for transient executor errors: capped,
// jittered exponential backoff, for at most MaxAttempts attempts.
type Backoff struct {
	// Base is the delay after the first failure (default 200ms).
	Base time.Duration
	// Cap bounds any single delay (default 30s).
	Cap time.Duration
	// MaxAttempts is the number of attempts before the op fails with its
	// last error (default 8). Ops of the resize queue start over, later.
	MaxAttempts int
	// Jitter is the fraction of each delay that is randomised: a delay d
	// becomes d*(1-Jitter) + rand*d*Jitter, in (0, 1] (default 0.5). Seed
	// makes it deterministic.
	Jitter float64

	mu  sync.Mutex
	rng *rand.Rand
}

func (b *Backoff) defaults() {
	if b.Base <= 0 {
		b.Base = 200 * time.Millisecond
	}
	if b.Cap <= 0 {
		b.Cap = 30 * time.Second
	}
	if b.MaxAttempts <= 0 {
		b.MaxAttempts = 8
	}
	if b.Jitter <= 0 || b.Jitter > 1 {
		b.Jitter = 0.5
	}
}

// Seed makes the jitter deterministic (tests).
func (b *Backoff) Seed(seed uint64) {
	b.mu.Lock()
	b.rng = rand.New(rand.NewPCG(seed, seed))
	b.mu.Unlock()
}

// Delay returns the wait after the given failed attempt (1-based).
func (b *Backoff) Delay(attempt int) time.Duration {
	d := b.Base
	for i := 1; i < attempt && d < b.Cap; i++ {
		d *= 2
	}
	if d > b.Cap {
		d = b.Cap
	}
	b.mu.Lock()
	r := rand.Float64()
	if b.rng != nil {
		r = b.rng.Float64()
	}
	b.mu.Unlock()
	fixed := time.Duration(float64(d) * (1 - b.Jitter))
	return fixed + time.Duration(r*float64(d)*b.Jitter)
}
