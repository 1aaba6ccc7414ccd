package metrics

import (
	"fmt"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is what the gauges are read from: the engine's Counts.
type Source interface {
	Counts() (ops.Counts, error)
}

// Watch registers the collector of the store's gauges. now is the clock the
// age of the oldest resize is measured with (nil: time.Now); it must be the
// clock the engine stamps resizes with.
func (m *Metrics) Watch(src Source, now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	if err := m.reg.Register(&gauges{src: src, now: now}); err != nil {
		return fmt.Errorf("register the store's gauges: %w", err)
	}
	return nil
}

var (
	volumesDesc = prometheus.NewDesc("csid_volumes",
		"Volumes in the state file, by lifecycle state (ABSENT: being created).", []string{"state"}, nil)
	snapshotsDesc = prometheus.NewDesc("csid_snapshots",
		"Snapshots in the state file, by lifecycle state (ABSENT: being cut; READY).", []string{"state"}, nil)
	activeDesc = prometheus.NewDesc("csid_ops_active",
		"Operations accepted and not finished (queued, running, backing off or compensating), by event: the queue's depth.", []string{"event"}, nil)
	resizeDepthDesc = prometheus.NewDesc("csid_resize_queue_depth",
		"Deferred offline resizes, by status: queued (waiting for the volume to be detached) or running.", []string{"status"}, nil)
	resizeAgeDesc = prometheus.NewDesc("csid_resize_queue_oldest_age_seconds",
		"Time since the oldest entry of the resize queue was first queued; 0 when the queue is empty.", nil, nil)
	storeSizeDesc = prometheus.NewDesc("csid_store_size_bytes",
		"Size of the state file.", nil, nil)

	gaugeDescs = []*prometheus.Desc{volumesDesc, snapshotsDesc, activeDesc, resizeDepthDesc, resizeAgeDesc, storeSizeDesc}
)

// gauges reads the store's gauges on each scrape, in one read transaction
// (ops.Engine.Counts): O(volumes + snapshots) per scrape, decoding only
// each volume's state, and each snapshot's record.
type gauges struct {
	src Source
	now func() time.Time
}

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range gaugeDescs {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s, err := g.src.Counts()
	if err != nil {
		err = fmt.Errorf("read the state file for metrics: %w", err)
		for _, d := range gaugeDescs {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	// Every state, event and status is reported, zeros included, so that a
	// series never disappears when its count drops to zero.
	for _, st := range fsm.States {
		ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(s.Volumes[st]), string(st))
	}
	for _, st := range fsm.SnapshotStates {
		ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, float64(s.Snapshots[st]), string(st))
	}
	for _, e := range fsm.AllOpEvents() {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(s.Active[e]), string(e))
	}
	for _, st := range []store.ResizeStatus{store.ResizeQueued, store.ResizeRunning} {
		ch <- prometheus.MustNewConstMetric(resizeDepthDesc, prometheus.GaugeValue, float64(s.Resizes[st]), string(st))
	}
	age := 0.0
	if !s.OldestResize.IsZero() {
		age = max(g.now().Sub(s.OldestResize).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(resizeAgeDesc, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(storeSizeDesc, prometheus.GaugeValue, float64(s.StoreBytes))
}
