package bench

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// RPCStats are one RPC's figures in one measurement: how many calls, how
// many failed, and the latency of the successful ones. Latencies are in
// seconds.
type RPCStats struct {
	// Method is the RPC's name ("CreateVolume"), or "bbolt.Update" for the
	// store floor.
	Method string `json:"method"`
	// Count is the calls made, Errors those that failed.
	Count  int `json:"count"`
	Errors int `json:"errors"`
	// OpsPerSecond is successful calls over the measurement's elapsed time.
	OpsPerSecond float64 `json:"ops_per_second"`
	P50          float64 `json:"p50_seconds"`
	P90          float64 `json:"p90_seconds"`
	P99          float64 `json:"p99_seconds"`
	Mean         float64 `json:"mean_seconds"`
	Max          float64 `json:"max_seconds"`
}

// samples collects the latencies of one measurement, by method, from
// concurrent workers.
type samples struct {
	mu     sync.Mutex
	order  []string // methods in the order first seen
	ok     map[string][]time.Duration
	errors map[string]int
	// untimed is time a unit spent on something else than what is
	// measured (the mkfs+mount floor's samples between lifecycles): the
	// measurement's elapsed time leaves it out.
	untimed time.Duration
}

// leaveOut adds d to the time the measurement leaves out.
func (s *samples) leaveOut(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untimed += d
}

// timed is elapsed without what leaveOut left out.
func (s *samples) timed(elapsed time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return elapsed - s.untimed
}

func newSamples() *samples {
	return &samples{ok: map[string][]time.Duration{}, errors: map[string]int{}}
}

func (s *samples) add(method string, d time.Duration, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.ok[method]; !seen {
		s.order = append(s.order, method)
		s.ok[method] = nil
	}
	if failed {
		s.errors[method]++
		return
	}
	s.ok[method] = append(s.ok[method], d)
}

// stats computes each method's figures over elapsed, in the order the
// methods were first called.
func (s *samples) stats(elapsed time.Duration) []RPCStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RPCStats, 0, len(s.order))
	for _, m := range s.order {
		out = append(out, summarise(m, s.ok[m], s.errors[m], elapsed))
	}
	return out
}

func summarise(method string, ds []time.Duration, errs int, elapsed time.Duration) RPCStats {
	st := RPCStats{Method: method, Count: len(ds) + errs, Errors: errs}
	if len(ds) == 0 {
		return st
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	if elapsed > 0 {
		st.OpsPerSecond = float64(len(ds)) / elapsed.Seconds()
	}
	st.P50, st.P90, st.P99 = quantile(sorted, 0.50), quantile(sorted, 0.90), quantile(sorted, 0.99)
	st.Mean = (sum / time.Duration(len(sorted))).Seconds()
	st.Max = sorted[len(sorted)-1].Seconds()
	return st
}

// quantile is the nearest-rank quantile of sorted durations, in seconds.
func quantile(sorted []time.Duration, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))].Seconds()
}

// median of values (the mean of the two middle ones for an even count); 0
// for none.
func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
