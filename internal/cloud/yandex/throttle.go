package yandex

import (
	"context"
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
)

// Rate-limit and backoff defaults. Yandex Compute's documented API limits
// are per cloud and per method, in the tens of requests per second; csid
// stays well under them, so that a cluster's worth of volume churn is
// smoothed rather than refused.
const (
	DefaultRateLimit   = 10 // calls per second
	DefaultBurst       = 20
	DefaultMaxAttempts = 8
	backoffBase        = 200 * time.Millisecond
	backoffMax         = 10 * time.Second
)

// throttle is the client's one place for pacing calls: every unary call
// of the compute and operation connections (the compute calls, the
// operation polls) first waits for the rate limiter, and a call the API
// refused for load (ResourceExhausted that is not a quota, Unavailable) is
// retried after a jittered exponential backoff, each retry again through
// the limiter, at most maxAttempts times in all. An IAM token exchange is
// no call of its own here (its connection has no interceptor): it runs
// inside a try of the call that needs the token, as the try's per-call
// credentials, so it is paced and retried with that call, at most one
// exchange per try, maxAttempts per call. Endpoint discovery, once at
// start-up, is paced and retried as a compute call is. gRPC's built-in retries are
// disabled on every connection, so these are the only retries.
type throttle struct {
	limiter     *rate.Limiter
	maxAttempts int
	base, max   time.Duration
	// sleep waits d or until ctx ends (tests may shorten it).
	sleep func(ctx context.Context, d time.Duration) error
}

func newThrottle(perSecond float64, burst, maxAttempts int) *throttle {
	if perSecond <= 0 {
		perSecond = DefaultRateLimit
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	if maxAttempts <= 0 {
		maxAttempts = DefaultMaxAttempts
	}
	return &throttle{limiter: rate.NewLimiter(rate.Limit(perSecond), burst), maxAttempts: maxAttempts,
		base: backoffBase, max: backoffMax, sleep: sleepCtx}
}

func (t *throttle) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	for attempt := 0; ; attempt++ {
		if err := t.limiter.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !throttled(err) || attempt+1 >= t.maxAttempts {
			return err
		}
		if serr := t.sleep(ctx, t.backoff(attempt)); serr != nil {
			return err
		}
	}
}

// backoff is the pause after the attempt-th refusal: a random point in the
// upper half of an exponential ceiling (base*2^attempt, at most max), so
// that many clients refused together do not come back together.
func (t *throttle) backoff(attempt int) time.Duration {
	ceil := t.max
	if attempt < 30 {
		if c := t.base << attempt; c < t.max {
			ceil = c
		}
	}
	return ceil/2 + rand.N(ceil/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}
