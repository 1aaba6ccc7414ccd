package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

type source struct {
	s   ops.Counts
	err error
}

func (s *source) Counts() (ops.Counts, error) { return s.s, s.err }

// TestGaugesFromSnapshot: the gauges report the snapshot, every label value
// included, and the age of the oldest resize on the given clock.
func TestGaugesFromSnapshot(t *testing.T) {
	now := time.Unix(10000, 0)
	src := &source{s: ops.Counts{
		Volumes:      map[fsm.State]int{fsm.Created: 3, fsm.Published: 2},
		Snapshots:    map[fsm.State]int{fsm.Ready: 4},
		Active:       map[fsm.Event]int{fsm.Create: 1, fsm.SnapshotCreate: 1},
		Resizes:      map[store.ResizeStatus]int{store.ResizeQueued: 2},
		OldestResize: now.Add(-90 * time.Second),
		StoreBytes:   1 << 20,
	}}
	m := New(Options{Version: "v1", Mode: "all", Log: zerolog.Nop()})
	if err := m.Watch(src, func() time.Time { return now }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP csid_resize_queue_oldest_age_seconds Time since the oldest entry of the resize queue was first queued; 0 when the queue is empty.
# TYPE csid_resize_queue_oldest_age_seconds gauge
csid_resize_queue_oldest_age_seconds 90
# HELP csid_store_size_bytes Size of the state file.
# TYPE csid_store_size_bytes gauge
csid_store_size_bytes 1.048576e+06
# HELP csid_snapshots Snapshots in the state file, by lifecycle state (ABSENT: being cut; READY).
# TYPE csid_snapshots gauge
csid_snapshots{state="ABSENT"} 0
csid_snapshots{state="READY"} 4
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "csid_resize_queue_oldest_age_seconds", "csid_store_size_bytes",
		"csid_snapshots"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(&gauges{src: src, now: time.Now}, "csid_volumes"); n != len(fsm.States) {
		t.Errorf("csid_volumes has %d series, want one per state (%d)", n, len(fsm.States))
	}
	if n := testutil.CollectAndCount(&gauges{src: src, now: time.Now}, "csid_ops_active"); n != len(fsm.AllOpEvents()) {
		t.Errorf("csid_ops_active has %d series, want one per event, the snapshots' included (%d)", n, len(fsm.AllOpEvents()))
	}
}

// TestScrapeSurvivesStoreError: a store that cannot be read leaves its
// gauges out, and the rest of the scrape is still served.
func TestScrapeSurvivesStoreError(t *testing.T) {
	m := New(Options{Log: zerolog.Nop()})
	if err := m.Watch(&source{err: errors.New("disk on fire")}, nil); err != nil {
		t.Fatal(err)
	}
	m.RPCFinished("/csi.v1.Controller/CreateVolume", codes.OK, time.Millisecond)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 || !strings.Contains(string(body), `csid_rpcs_total{code="OK",method="CreateVolume"} 1`) ||
		strings.Contains(string(body), "csid_volumes{") {
		t.Fatalf("%d\n%s", rec.Code, body)
	}
}
