package app_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/fsm"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

// startObserved runs an all-in-one csid on the fake backend with its
// metrics endpoint on a loopback port; it returns the CSI client and the
// endpoint's base URL.
func startObserved(t *testing.T, f *fake.Cloud) (apptest.Client, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in := apptest.Start(t, app.Options{Cloud: "fake", Fake: f, MetricsListener: lis, Log: zerolog.Nop()})
	return apptest.Dial(t, in.Socket), "http://" + lis.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// scrape reads /metrics in the text format.
func scrape(t *testing.T, base string) families {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

type families map[string]*dto.MetricFamily

// series returns the metric of family name whose labels are exactly
// labels ("k=v" pairs), failing the test if there is none.
func (f families) series(t *testing.T, name string, labels ...string) *dto.Metric {
	t.Helper()
	fam := f[name]
	if fam == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range fam.GetMetric() {
		var got []string
		for _, l := range m.GetLabel() {
			got = append(got, l.GetName()+"="+l.GetValue())
		}
		if slices.Equal(got, sorted(labels)) {
			return m
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

func sorted(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }

// value is a gauge's or counter's value.
func (f families) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	m := f.series(t, name, labels...)
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.GetCounter().GetValue()
}

// counts maps each series of a histogram or counter family to its sample
// count or value, keyed by the values of the labels named, in that order,
// joined with "/". nonZero leaves out the series at zero.
func (f families) counts(name string, nonZero bool, labels ...string) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range f[name].GetMetric() {
		var key []string
		for _, want := range labels {
			for _, l := range m.GetLabel() {
				if l.GetName() == want {
					key = append(key, l.GetValue())
				}
			}
		}
		n := m.GetHistogram().GetSampleCount()
		if m.Counter != nil {
			n = uint64(m.GetCounter().GetValue())
		}
		if n > 0 || !nonZero {
			out[strings.Join(key, "/")] = n
		}
	}
	return out
}

// TestMetricsAfterLifecycle drives one volume through its whole lifecycle
// over CSI, with a retried attach, a failed attach, and an expansion
// deferred while attached, and reads /metrics at three points: the RPC
// histogram has exactly the calls made, by method and code; the op
// counters and durations match the transitions; the gauges (volumes by
// state, ops in flight, resize queue depth and age, state file size) match
// the store; the commit histograms saw the commits.
func TestMetricsAfterLifecycle(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	c, base := startObserved(t, f)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	const mib = int64(1) << 20
	dir := apptest.ShortTempDir(t)
	stage, target := filepath.Join(dir, "stage"), filepath.Join(dir, "target")
	if err := os.Mkdir(stage, 0o750); err != nil {
		t.Fatal(err)
	}

	if code, body := get(t, base+"/readyz"); code != http.StatusOK || !strings.Contains(body, "[+]engine ok\n[+]store ok\n[+]backend ok\n") {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	checkSeriesFromTheStart(t, scrape(t, base))

	id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "observed", CapacityRange: capRange(64 * mib), VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	_, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "no-such-node", VolumeCapability: vc})
	wantCode(t, err, codes.NotFound)
	f.FailCalls(cloud.OpAttach, 1, fmt.Errorf("injected: %w", cloud.ErrTransient))
	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: vc, PublishContext: pub.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, StagingTargetPath: stage, VolumeCapability: vc})).Must(t)
	expand := &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: capRange(128 * mib)}
	_, err = c.ControllerExpandVolume(ctx, expand)
	wantCode(t, err, codes.FailedPrecondition, "queued")

	m := scrape(t, base)
	if got := m.value(t, "csid_resize_queue_depth", "status=queued"); got != 1 {
		t.Errorf("resize queue depth (queued) after a deferred expand: %v, want 1", got)
	}
	if got := m.value(t, "csid_resize_queue_oldest_age_seconds"); got <= 0 || got > 60 {
		t.Errorf("age of the queued resize: %v s", got)
	}
	wantStates(t, m, fsm.Published)

	apptest.R(c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})).Must(t)
	apptest.R(c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})).Must(t)
	if e := apptest.R(c.ControllerExpandVolume(ctx, expand)).Must(t); e.CapacityBytes != 128*mib { // waits for the resize the unpublish started
		t.Fatalf("expand after the unpublish: %+v", e)
	}

	m = scrape(t, base)
	for _, status := range []string{"queued", "running"} {
		if got := m.value(t, "csid_resize_queue_depth", "status="+status); got != 0 {
			t.Errorf("resize queue depth (%s) after the unpublish: %v, want 0", status, got)
		}
	}
	if got := m.value(t, "csid_resize_queue_oldest_age_seconds"); got != 0 {
		t.Errorf("age of the oldest resize with none queued: %v", got)
	}
	wantStates(t, m, fsm.Created)

	apptest.R(c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})).Must(t)
	m = scrape(t, base)
	wantStates(t, m, "")

	// The RPC histogram: every call made, by method and code, and nothing else.
	wantRPCs := map[string]uint64{
		"CreateVolume/OK": 1, "ControllerPublishVolume/NotFound": 1, "ControllerPublishVolume/OK": 1,
		"NodeStageVolume/OK": 1, "NodePublishVolume/OK": 1, "ControllerExpandVolume/FailedPrecondition": 1,
		"NodeUnpublishVolume/OK": 1, "NodeUnstageVolume/OK": 1, "ControllerUnpublishVolume/OK": 1,
		"ControllerExpandVolume/OK": 1, "DeleteVolume/OK": 1,
	}
	if got := m.counts("csid_rpcs_total", true, "method", "code"); !maps.Equal(got, wantRPCs) {
		t.Errorf("csid_rpcs_total by method/code:\n got %v\nwant %v", got, wantRPCs)
	}
	byMethod := map[string]uint64{}
	for k, n := range wantRPCs {
		byMethod[strings.Split(k, "/")[0]] += n
	}
	if got := m.counts("csid_rpc_duration_seconds", true, "method"); !maps.Equal(got, byMethod) {
		t.Errorf("csid_rpc_duration_seconds counts by method:\n got %v\nwant %v", got, byMethod)
	}
	// Ops: one per transition, the failed attach as failed, the retried
	// attach as one retry; durations counted once per finished op. The
	// deferred expansion is two expand ops: the expand [deferred] that
	// records the queued target on the disk, then the resize.
	wantOps := map[fsm.Event][2]float64{ // succeeded, failed
		fsm.Create: {1, 0}, fsm.ControllerPublish: {1, 1}, fsm.NodeStage: {1, 0}, fsm.NodePublish: {1, 0},
		fsm.NodeUnpublish: {1, 0}, fsm.NodeUnstage: {1, 0}, fsm.ControllerUnpublish: {1, 0},
		fsm.Expand: {2, 0}, fsm.Delete: {1, 0}, fsm.NodeExpand: {0, 0},
	}
	durations := m.counts("csid_op_duration_seconds", false, "event")
	for _, e := range fsm.AllOpEvents() {
		w := wantOps[e]
		if got := m.value(t, "csid_ops_total", "event="+string(e), "outcome=succeeded"); got != w[0] {
			t.Errorf("csid_ops_total{event=%s,outcome=succeeded} = %v, want %v", e, got, w[0])
		}
		if got := m.value(t, "csid_ops_total", "event="+string(e), "outcome=failed"); got != w[1] {
			t.Errorf("csid_ops_total{event=%s,outcome=failed} = %v, want %v", e, got, w[1])
		}
		if got := durations[string(e)]; float64(got) != w[0]+w[1] {
			t.Errorf("csid_op_duration_seconds{event=%s} count %d, want %v", e, got, w[0]+w[1])
		}
		wantRetries := 0.0
		if e == fsm.ControllerPublish {
			wantRetries = 1
		}
		if got := m.value(t, "csid_op_retries_total", "event="+string(e)); got != wantRetries {
			t.Errorf("csid_op_retries_total{event=%s} = %v, want %v", e, got, wantRetries)
		}
		if got := m.value(t, "csid_ops_active", "event="+string(e)); got != 0 {
			t.Errorf("csid_ops_active{event=%s} = %v with nothing in flight", e, got)
		}
	}
	// Commits: each of the 10 ops wrote its acceptance and its outcome
	// (the resize's acceptance shares the unpublish's commit) and the
	// deferred expand wrote the queue entry: at least 20 writes, in at most
	// as many commits.
	commits := m.series(t, "csid_store_commit_duration_seconds").GetHistogram()
	batches := m.series(t, "csid_store_commit_batch_size").GetHistogram()
	if commits.GetSampleCount() == 0 || commits.GetSampleCount() != batches.GetSampleCount() ||
		batches.GetSampleSum() < 20 || float64(batches.GetSampleCount()) > batches.GetSampleSum() || commits.GetSampleSum() <= 0 {
		t.Errorf("commits: %d taking %vs; batches: %d holding %v writes", commits.GetSampleCount(), commits.GetSampleSum(),
			batches.GetSampleCount(), batches.GetSampleSum())
	}
	if got := m.value(t, "csid_store_size_bytes"); got < 4096 {
		t.Errorf("csid_store_size_bytes = %v", got)
	}
	if got := m.value(t, "csid_build_info", "mode=all", "version="); got != 1 {
		t.Errorf("csid_build_info = %v", got)
	}
	checkDocumented(t, m)
}

// checkSeriesFromTheStart: before any call, every labelled series exists
// at zero, so that rate() and alerts see a zero rather than nothing.
func checkSeriesFromTheStart(t *testing.T, m families) {
	t.Helper()
	rpcs := m.counts("csid_rpcs_total", false, "method", "code")
	durations := m.counts("csid_rpc_duration_seconds", false, "method")
	for _, method := range []string{"Probe", "CreateVolume", "ControllerPublishVolume", "ControllerExpandVolume", "NodeStageVolume", "NodePublishVolume", "NodeGetVolumeStats"} {
		if _, ok := durations[method]; !ok {
			t.Errorf("csid_rpc_duration_seconds{method=%s} is missing before the first call", method)
		}
		for _, c := range []codes.Code{codes.OK, codes.Aborted, codes.FailedPrecondition, codes.Internal, codes.DataLoss} {
			if n, ok := rpcs[method+"/"+c.String()]; !ok || n != 0 {
				t.Errorf("csid_rpcs_total{method=%s,code=%s} = %d, %v before the first call; want 0, present", method, c, n, ok)
			}
		}
	}
	for _, family := range []string{"csid_op_duration_seconds", "csid_op_retries_total", "csid_op_waits_total", "csid_ops_active"} {
		got := m.counts(family, false, "event")
		for _, e := range fsm.AllOpEvents() {
			if _, ok := got[string(e)]; !ok {
				t.Errorf("%s{event=%s} is missing before the first op", family, e)
			}
		}
	}
	for _, st := range fsm.SnapshotStates {
		if got := m.value(t, "csid_snapshots", "state="+string(st)); got != 0 {
			t.Errorf("csid_snapshots{state=%s} = %v before the first snapshot", st, got)
		}
	}
}

// TestSnapshotMetrics: csid_snapshots counts the snapshots by state, and
// the op counters count snapshot_create and snapshot_delete by outcome,
// each series at zero from the start.
func TestSnapshotMetrics(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	c, base := startObserved(t, f)
	ctx := context.Background()
	checkSeriesFromTheStart(t, scrape(t, base))
	id := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "observed", CapacityRange: capRange(64 << 20),
		VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})).Must(t).Volume.VolumeId
	f.FailCalls(cloud.OpSnapshot, 1, fmt.Errorf("injected: %w", cloud.ErrLimitReached))
	_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: id})
	wantCode(t, err, codes.ResourceExhausted)
	snap := apptest.R(c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: id})).Must(t).Snapshot
	m := scrape(t, base)
	for want, n := range map[[2]string]float64{{"snapshot_create", "succeeded"}: 1, {"snapshot_create", "failed"}: 1, {"snapshot_delete", "succeeded"}: 0} {
		if got := m.value(t, "csid_ops_total", "event="+want[0], "outcome="+want[1]); got != n {
			t.Errorf("csid_ops_total{event=%s,outcome=%s} = %v, want %v", want[0], want[1], got, n)
		}
	}
	if got := m.value(t, "csid_snapshots", "state=READY"); got != 1 {
		t.Errorf("csid_snapshots{state=READY} = %v after one snapshot", got)
	}
	apptest.R(c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})).Must(t)
	m = scrape(t, base)
	if got := m.value(t, "csid_snapshots", "state=READY"); got != 0 {
		t.Errorf("csid_snapshots{state=READY} = %v after the delete", got)
	}
	if got := m.value(t, "csid_ops_total", "event=snapshot_delete", "outcome=succeeded"); got != 1 {
		t.Errorf("csid_ops_total{event=snapshot_delete,outcome=succeeded} = %v", got)
	}
	checkDocumented(t, m)
}

// wantStates checks csid_volumes: one volume in state want ("" for none),
// zero in every other state.
func wantStates(t *testing.T, m families, want fsm.State) {
	t.Helper()
	for _, st := range fsm.States {
		n := 0.0
		if st == want {
			n = 1
		}
		if got := m.value(t, "csid_volumes", "state="+string(st)); got != n {
			t.Errorf("csid_volumes{state=%s} = %v, want %v", st, got, n)
		}
	}
}

// checkDocumented holds docs/operations.md to the metrics: every csid_
// family served is documented there with its type, and nothing else is.
func checkDocumented(t *testing.T, m families) {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	for _, row := range regexp.MustCompile("(?m)^\\| `(csid_[a-z_]+)` \\| (counter|gauge|histogram) \\|").FindAllStringSubmatch(string(raw), -1) {
		documented[row[1]] = row[2]
	}
	for name, fam := range m {
		if !strings.HasPrefix(name, "csid_") {
			continue
		}
		typ := strings.ToLower(fam.GetType().String())
		if documented[name] != typ {
			t.Errorf("docs/operations.md: %s (a %s) is documented as %q", name, typ, documented[name])
		}
		delete(documented, name)
	}
	for name := range documented {
		t.Errorf("docs/operations.md documents %s, which csid does not serve", name)
	}
}

// TestReadyzReportsBackend: /readyz fails, naming the backend, when the
// cloud does not answer the node's lookup.
func TestReadyzReportsBackend(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	f.FailCalls(fake.KindGetNode, 1, fmt.Errorf("injected outage: %w", cloud.ErrTransient))
	_, base := startObserved(t, f)
	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "[+]engine ok") ||
		!strings.Contains(body, "[-]backend failed: ") || !strings.Contains(body, "injected outage") {
		t.Fatalf("/readyz with the backend down: %d\n%s", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with the backend down: %d, want 200 (liveness does not depend on the cloud)", code)
	}
}
