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
// more samples asked for than units, one follows every unit (the config's
// defaults take them down to the count).
func TestFloorBetweenIsSpreadEvenly(t *testing.T) {
	for _, tc := range []struct{ n, count int }{{10, 48}, {24, 48}, {48, 48}, {50, 48}, {3, 4}, {1, 7}} {
		cfg := Config{Endpoint: "unix:///csi.sock", Count: tc.count, MkfsFloorSamples: tc.n}
		if err := cfg.defaults(); err != nil {
			t.Fatal(err)
		}
		want := min(tc.n, tc.count)
		if cfg.MkfsFloorSamples != want { // also the back-to-back floor's count
			t.Errorf("%d samples asked for over %d units: the config has %d, want %d", tc.n, tc.count, cfg.MkfsFloorSamples, want)
		}
		b := (&runner{cfg: cfg}).newFloorBetween(1, nil)
		var after []int
		for i := range tc.count {
			if b.due(i) {
				after = append(after, i)
			}
		}
		if len(after) != want || after[len(after)-1] != tc.count-1 {
			t.Errorf("%d samples asked for over %d units follow units %v, want %d of them", tc.n, tc.count, after, want)
			continue
		}
		for k := 1; k < len(after); k++ {
			if gap := after[k] - after[k-1]; gap < tc.count/want || gap > (tc.count+want-1)/want {
				t.Errorf("%d samples over %d units: gap %d between units %d and %d", want, tc.count, gap, after[k-1], after[k])
			}
		}
	}
}

// TestLeftOutTimeIsNotTimed: a measurement's elapsed time (and so its
// throughput) leaves out what its units leave out (the mkfs+mount floor's
// samples between lifecycles), and keeps the rest of their time.
func TestLeftOutTimeIsNotTimed(t *testing.T) {
	const units, work, out = 3, 2 * time.Millisecond, 100 * time.Millisecond
	r := &runner{cfg: Config{Count: units}, eps: []*endpoint{{addr: "a"}}}
	start := time.Now()
	res := r.measure(context.Background(), Result{Phase: "lifecycle", Count: units}, r.lanes([]int{1}), func(_ context.Context, s *samples, _ lane, _ int) error {
		time.Sleep(work)
		time.Sleep(out)
		s.leaveOut(out)
		return nil
	})
	wall := time.Since(start)
	if len(res) != 1 || res[0].Count != units || res[0].Errors != 0 {
		t.Fatalf("results %+v", res)
	}
	// The measurement ran within wall, its units one after the other, each
	// at least work+out long: its elapsed time, less what was left out, is
	// at least their work and at most wall less what was left out, however
	// slow the machine.
	got := res[0].ElapsedSeconds
	if lo, hi := (units * work).Seconds(), (wall - units*out).Seconds(); got < lo || got > hi {
		t.Errorf("elapsed %.3fs, want within [%.3fs, %.3fs] (wall %v, %v left out)", got, lo, hi, wall, units*out)
	}
	if left := (units * out).Seconds(); got >= left {
		t.Errorf("elapsed %.3fs: not below the %.3fs left out", got, left)
	}
}
