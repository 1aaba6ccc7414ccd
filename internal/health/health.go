// Package health serves csid's readiness (/readyz) and liveness (/healthz)
// over HTTP, beside the metrics.
//
// Readiness is the answer to "should this csid get work": every check
// passes (operations recovered, state file open, backend reachable).
// Liveness is only "the process serves HTTP": a csid recovering a long
// queue, or cut off from its cloud, is not ready but must not be
// restarted for it (that would only start the recovery again).
package health

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Check is one readiness condition.
type Check struct {
	// Name appears in /readyz's answer ("engine", "store", "backend").
	Name string
	// Run returns nil when the condition holds. It must honour ctx.
	Run func(ctx context.Context) error
}

// Timeout bounds one Run of a check in Ready.
const Timeout = 2 * time.Second

// Ready serves /readyz: 200 and one "[+]name ok" line per check when every
// check passes; 503 and a "[-]name failed: reason" line for each one that
// does not. Checks run one after another, each within Timeout.
func Ready(checks ...Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		failed := false
		for _, c := range checks {
			ctx, cancel := context.WithTimeout(r.Context(), Timeout)
			err := c.Run(ctx)
			cancel()
			if err != nil {
				failed = true
				fmt.Fprintf(&b, "[-]%s failed: %v\n", c.Name, err)
			} else {
				fmt.Fprintf(&b, "[+]%s ok\n", c.Name)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if failed {
			w.WriteHeader(http.StatusServiceUnavailable)
			b.WriteString("readyz check failed\n")
		} else {
			b.WriteString("ok\n")
		}
		_, _ = w.Write([]byte(b.String()))
	})
}

// Live serves /healthz: 200 "ok" as long as the process answers HTTP.
func Live() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("ok\n"))
	})
}

// Cached wraps a check that calls something remote (the cloud), so that a
// storm of probes or scrapes cannot hammer it: a result, success or
// failure, is reused for ttl; callers that arrive while the check runs wait
// for that run instead of starting their own; a run is bounded by timeout
// and is not cut short by one impatient caller (its ctx only bounds that
// caller's wait). now is the clock (nil: time.Now).
func Cached(run func(ctx context.Context) error, ttl, timeout time.Duration, now func() time.Time) func(ctx context.Context) error {
	if now == nil {
		now = time.Now
	}
	c := &cached{run: run, ttl: ttl, timeout: timeout, now: now}
	return c.check
}

type cached struct {
	run          func(ctx context.Context) error
	ttl, timeout time.Duration
	now          func() time.Time

	mu      sync.Mutex
	at      time.Time // when the last result was obtained; zero: none yet
	err     error
	running chan struct{} // closed when the run in progress ends; nil: none
}

func (c *cached) check(ctx context.Context) error {
	c.mu.Lock()
	if !c.at.IsZero() && c.now().Sub(c.at) < c.ttl {
		err := c.err
		c.mu.Unlock()
		return err
	}
	done := c.running
	if done == nil {
		done = make(chan struct{})
		c.running = done
		go c.refresh(done)
	}
	c.mu.Unlock()
	select {
	case <-done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("still checking: %w", ctx.Err())
	}
}

// refresh runs the check once and publishes its result.
func (c *cached) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	err := c.run(ctx)
	cancel()
	c.mu.Lock()
	c.err, c.at, c.running = err, c.now(), nil
	c.mu.Unlock()
	close(done)
}
