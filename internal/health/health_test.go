package health

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// TestCachedReusesResults: within the TTL a result (success or failure) is
// reused; after it, the check runs again.
func TestCachedReusesResults(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	var calls atomic.Int32
	var fail atomic.Bool
	check := Cached(func(context.Context) error {
		calls.Add(1)
		if fail.Load() {
			return errors.New("down")
		}
		return nil
	}, 5*time.Second, time.Second, clk.Now)
	ctx := context.Background()
	for range 10 {
		if err := check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("10 checks within the TTL made %d calls, want 1", calls.Load())
	}
	fail.Store(true)
	clk.advance(4 * time.Second)
	if err := check(ctx); err != nil || calls.Load() != 1 {
		t.Fatalf("within the TTL: %v after %d calls", err, calls.Load())
	}
	clk.advance(time.Second)
	if err := check(ctx); err == nil || calls.Load() != 2 {
		t.Fatalf("after the TTL: %v after %d calls, want the new failure", err, calls.Load())
	}
	if err := check(ctx); err == nil || calls.Load() != 2 {
		t.Fatalf("a failure is cached too: %v after %d calls", err, calls.Load())
	}
}

// TestCachedSharesARun: callers arriving while a check runs wait for it
// rather than starting their own; a caller whose context ends stops
// waiting without cancelling the run.
func TestCachedSharesARun(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	check := Cached(func(ctx context.Context) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, time.Minute, 10*time.Second, nil)

	impatient, cancel := context.WithCancel(context.Background())
	cancel()
	if err := check(impatient); !errors.Is(err, context.Canceled) {
		t.Fatalf("an impatient caller: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- check(context.Background()) }()
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("21 concurrent callers made %d calls, want 1", calls.Load())
	}
}

// TestReadyAnswers: 200 with a line per check when all pass; 503 naming
// the failed check otherwise. Liveness is always 200.
func TestReadyAnswers(t *testing.T) {
	var down atomic.Bool
	h := Ready(
		Check{Name: "engine", Run: func(context.Context) error { return nil }},
		Check{Name: "backend", Run: func(context.Context) error {
			if down.Load() {
				return errors.New("no route to cloud")
			}
			return nil
		}},
	)
	serve := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := serve(h); code != 200 || body != "[+]engine ok\n[+]backend ok\nok\n" {
		t.Fatalf("all ready: %d %q", code, body)
	}
	down.Store(true)
	if code, body := serve(h); code != 503 || !strings.Contains(body, "[+]engine ok\n[-]backend failed: no route to cloud\n") {
		t.Fatalf("backend down: %d %q", code, body)
	}
	if code, body := serve(Live()); code != 200 || body != "ok\n" {
		t.Fatalf("liveness: %d %q", code, body)
	}
}
