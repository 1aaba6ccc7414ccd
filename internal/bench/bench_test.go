package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestMeasureInterleavesLanes: a measurement on two endpoints at two
// concurrencies runs its slices alternately, lane by lane, the order
// reversed from one slice to the next, so a drift of the machine's load
// hits every lane alike; each lane runs every unit once; the results come
// by concurrency, the endpoint under test before the baseline.
func TestMeasureInterleavesLanes(t *testing.T) {
	r := &runner{cfg: Config{Count: 4, Slices: 2}}
	target, baseline := &endpoint{addr: "a"}, &endpoint{addr: "b", baseline: true}
	r.eps = []*endpoint{target, baseline}
	lanes := r.lanes([]int{1, 2})
	var mu sync.Mutex
	var got []string // lane/slice, in the order they ran
	res := r.measure(context.Background(), Result{Phase: "probe", Count: 4}, lanes, func(_ context.Context, s *samples, ln lane, i int) error {
		mu.Lock()
		defer mu.Unlock()
		// Count 4 in 2 slices: units 0 and 1, then 2 and 3.
		if key := fmt.Sprintf("%s%d/%d", ln.ep.addr, ln.conc, i/2); len(got) == 0 || got[len(got)-1] != key {
			got = append(got, key)
		}
		s.add("Probe", 1, false)
		return nil
	})
	want := []string{"a1/0", "a2/0", "b1/0", "b2/0", "b2/1", "b1/1", "a2/1", "a1/1"}
	if !slices.Equal(got, want) {
		t.Errorf("slices ran %v, want %v", got, want)
	}
	var order []string
	for _, x := range res {
		order = append(order, fmt.Sprintf("c%d baseline=%v count=%d", x.Concurrency, x.Baseline, x.Count))
	}
	wantOrder := []string{"c1 baseline=false count=4", "c1 baseline=true count=4", "c2 baseline=false count=4", "c2 baseline=true count=4"}
	if !slices.Equal(order, wantOrder) {
		t.Errorf("results %v, want %v", order, wantOrder)
	}
}
