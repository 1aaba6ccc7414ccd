package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
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

// TestFloorBetweenIsSpreadEvenly: the mkfs+mount floor's samples follow n
// of a lifecycle's units, evenly spaced, the last unit among them; with
// more samples asked for than units, one follows every unit.
func TestFloorBetweenIsSpreadEvenly(t *testing.T) {
	for _, tc := range []struct{ n, count int }{{10, 48}, {24, 48}, {48, 48}, {3, 4}, {1, 7}} {
		b := &floorBetween{r: &runner{cfg: Config{MkfsFloorSamples: tc.n, Count: tc.count}}}
		var after []int
		for i := range tc.count {
			if b.due(i) {
				after = append(after, i)
			}
		}
		if len(after) != tc.n || after[len(after)-1] != tc.count-1 {
			t.Errorf("%d samples over %d units follow units %v", tc.n, tc.count, after)
			continue
		}
		for k := 1; k < len(after); k++ {
			if gap := after[k] - after[k-1]; gap < tc.count/tc.n || gap > (tc.count+tc.n-1)/tc.n {
				t.Errorf("%d samples over %d units: gap %d between units %d and %d", tc.n, tc.count, gap, after[k-1], after[k])
			}
		}
	}
}

// TestLeftOutTimeIsNotTimed: what a unit leaves out is not in the
// measurement's elapsed time.
func TestLeftOutTimeIsNotTimed(t *testing.T) {
	s := newSamples()
	s.leaveOut(3 * time.Second)
	s.leaveOut(2 * time.Second)
	if got := s.timed(12 * time.Second); got != 7*time.Second {
		t.Fatalf("timed = %v, want 7s", got)
	}
}
