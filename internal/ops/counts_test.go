package ops

import (
	"fmt"
	"testing"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
)

// TestCounts: Counts counts volumes by state, the ops in flight by event
// and the resize queue, as the store holds them.
func TestCounts(t *testing.T) {
	h := newHarness(t)
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = h.must(createReq(fmt.Sprintf("snap-%d", i), gib)).Volume.ID
	}
	h.must(publishReq(ids[0], "node-1"))
	_, err := h.submit(expandReq(ids[0], 2*gib))
	wantCode(t, err, codes.FailedPrecondition)
	s, err := h.eng.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if s.Volumes[fsm.Created] != 2 || s.Volumes[fsm.NodeReady] != 1 || len(s.Volumes) != 2 {
		t.Errorf("volumes by state: %v", s.Volumes)
	}
	if len(s.Active) != 0 {
		t.Errorf("ops in flight with none running: %v", s.Active)
	}
	if s.Resizes[store.ResizeQueued] != 1 || len(s.Resizes) != 1 || s.OldestResize.IsZero() {
		t.Errorf("resize queue: %v, oldest %v", s.Resizes, s.OldestResize)
	}
	if s.StoreBytes <= 0 {
		t.Errorf("store size %d", s.StoreBytes)
	}
}

// BenchmarkCounts is the cost of one metrics scrape's read of the store,
// with 10,000 volumes.
//
//	go test -run '^$' -bench Counts ./internal/ops
func BenchmarkCounts(b *testing.B) {
	eng := newBenchEngine(b, 10000, 0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := eng.Counts()
		if err != nil || s.Volumes[fsm.Created] != 10000 {
			b.Fatal(s.Volumes, err)
		}
	}
}
