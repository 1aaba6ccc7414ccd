package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/bench"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// lifecycleRPCs are the RPCs of one lifecycle unit, in order.
var lifecycleRPCs = []string{"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume",
	"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume", "DeleteVolume"}

// benchConfig is a small run against an in-process csid.
func benchConfig(t *testing.T, in *apptest.Instance) bench.Config {
	return bench.Config{Endpoint: in.Socket, Concurrency: []int{1, 2}, Count: 4, Existing: 10, Rounds: 2,
		FloorSamples: 5, MkfsFloorSamples: 2, FloorDir: in.Dir, JournalDir: t.TempDir(), SizeBytes: 64 << 20}
}

// TestBenchAgainstFake runs every phase of the bench library against csid
// on the fake backend and checks that the report is complete (every
// measurement of every round, every RPC of the lifecycle, the floor, the
// summary and both kinds of ratio) and that the run left nothing: the
// report says so, ListVolumes is empty and the journal is gone.
func TestBenchAgainstFake(t *testing.T) {
	in, c := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	cfg := benchConfig(t, in)
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkComplete(t, rep, cfg)
	checkClean(t, rep, c, cfg.JournalDir)
}

// TestBenchAgainstLocal is the same on the local backend (root: loop
// devices, mkfs and mounts), at one concurrency and one round; afterwards
// no loop device or mount of the state dir is left.
func TestBenchAgainstLocal(t *testing.T) {
	testutil.RequireRoot(t)
	in := apptest.Start(t, app.Options{Cloud: "local", Log: zerolog.Nop()})
	c := apptest.Dial(t, in.Socket)
	cfg := benchConfig(t, in)
	cfg.Concurrency, cfg.Count, cfg.Existing, cfg.Rounds = []int{2}, 2, 3, 1
	cfg.StagingDir, cfg.TargetDir = filepath.Join(in.Dir, "staging"), filepath.Join(in.Dir, "target")
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkComplete(t, rep, cfg)
	checkClean(t, rep, c, cfg.JournalDir)
	in.Stop(t)
	checkNothingLeft(t, "bench", in.Dir)
}

// checkComplete checks that a report has every measurement a config asks
// for (all phases, mount volumes), without errors. As root, the floors
// include mkfs+mount.
func checkComplete(t *testing.T, rep *bench.Report, cfg bench.Config) {
	t.Helper()
	if !rep.OK() || rep.Errors.Count != 0 {
		t.Fatalf("run not clean: %+v %+v", rep.Errors, rep.Cleanup)
	}
	mkfs := 0 // mkfs+mount floors per round
	if os.Geteuid() == 0 {
		mkfs = 1
	}
	measured := rep.Floor.MkfsMount != nil
	if measured != (mkfs == 1) || measured != (rep.Floor.MkfsMountAbsent == "") {
		t.Errorf("mkfs+mount floor measured %v (root: %v), absent because %q", measured, mkfs == 1, rep.Floor.MkfsMountAbsent)
	}
	perRound := 1 + mkfs + len(cfg.Concurrency)*6 // floors; probe, create, delete, lifecycle, scale twice
	if len(rep.Results) != cfg.Rounds*perRound {
		t.Fatalf("%d results, want %d", len(rep.Results), cfg.Rounds*perRound)
	}
	for _, r := range rep.Results {
		want := cfg.Count
		switch {
		case r.Phase == "floor" && r.Unit == "mkfs+mount":
			want = cfg.MkfsFloorSamples
		case r.Phase == "floor":
			want = cfg.FloorSamples
		}
		if r.Count != want || r.Errors != 0 || r.OpsPerSecond <= 0 || len(r.RPCs) == 0 {
			t.Errorf("result %+v: want %d units without errors", r, want)
		}
		var methods []string
		for _, st := range r.RPCs {
			methods = append(methods, st.Method)
			if st.Count != want || st.P50 <= 0 || st.P50 > st.P90 || st.P90 > st.P99 || st.P99 > st.Max {
				t.Errorf("%s round %d c=%d: %+v", r.Phase, r.Round, r.Concurrency, st)
			}
		}
		if r.Phase == "lifecycle" && !slices.Equal(methods, lifecycleRPCs) {
			t.Errorf("lifecycle RPCs %v, want %v", methods, lifecycleRPCs)
		}
		if r.Unit == "mkfs+mount" && !slices.Equal(methods, []string{"mkfs+mount", "mkfs", "mount"}) {
			t.Errorf("mkfs+mount floor RPCs %v", methods)
		}
		if r.Phase == "scale" && r.Existing != 0 && r.Existing != cfg.Existing {
			t.Errorf("scale measured with %d existing volumes, want %d", r.Existing, cfg.Existing)
		}
	}
	if want := 1 + mkfs + len(cfg.Concurrency)*6; len(rep.Summary) != want {
		t.Errorf("%d summary entries, want %d", len(rep.Summary), want)
	}
	if rep.Floor.Probe.P50 <= 0 || rep.Floor.BoltUpdate.P50 <= 0 || rep.Floor.Dir != cfg.FloorDir {
		t.Errorf("floor: %+v", rep.Floor)
	}
	kinds := map[string]int{}
	for _, q := range rep.Ratios {
		kinds[q.Kind]++
		if len(q.PerRound) != cfg.Rounds || q.Value <= 0 {
			t.Errorf("ratio %+v: want one per round", q)
		}
	}
	wantConc := 0
	if len(cfg.Concurrency) > 1 {
		wantConc = 6 // probe, create, delete, lifecycle, scale with and without existing volumes
	}
	if kinds["concurrency"] != wantConc || kinds["existing"] != len(cfg.Concurrency) || kinds["floor"] != mkfs*len(cfg.Concurrency) {
		t.Errorf("ratios by kind %v, want %d concurrency, %d existing and %d floor", kinds, wantConc, len(cfg.Concurrency), mkfs*len(cfg.Concurrency))
	}
}

// checkClean checks that a run deleted everything it created: the report,
// the driver's ListVolumes, and the journal directory agree.
func checkClean(t *testing.T, rep *bench.Report, c apptest.Client, journalDir string) {
	t.Helper()
	cl := rep.Cleanup
	if cl.Created == 0 || cl.Created != cl.Deleted || len(cl.Leftover) != 0 || !cl.Verified {
		t.Errorf("cleanup %+v", cl)
	}
	list, err := c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Entries) != 0 {
		t.Errorf("%d volumes left after the run: %v", len(list.Entries), list.Entries)
	}
	if entries, _ := os.ReadDir(journalDir); len(entries) != 0 {
		t.Errorf("journals left: %v", entries)
	}
}

// TestBenchCleansUpWhenInterrupted: a run stopped in the middle (Ctrl-C:
// its context ends while creates are in flight) still deletes everything
// it created, including volumes whose create was in flight when it
// stopped.
func TestBenchCleansUpWhenInterrupted(t *testing.T) {
	in, c := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), map[cloud.OpKind]time.Duration{cloud.OpCreate: 20 * time.Millisecond})
	cfg := benchConfig(t, in)
	cfg.Phases, cfg.Concurrency, cfg.Count, cfg.Rounds = []bench.Phase{bench.PhaseCreate, bench.PhaseLifecycle}, []int{4}, 1000, 1
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Interrupted || rep.OK() {
		t.Fatalf("an interrupted run: interrupted %v, OK %v", rep.Interrupted, rep.OK())
	}
	checkClean(t, rep, c, cfg.JournalDir)
}

// TestBenchRecoversKilledRun: the journal of a run that was killed (no
// process holds it) names a volume it created and one whose create was in
// flight; the next run against the same endpoint deletes both (the second
// found by creating it again by name) and removes the journal. The
// journal of a run still alive (it holds the lock) and that of another
// endpoint are left alone.
func TestBenchRecoversKilledRun(t *testing.T) {
	in, c := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	ctx := context.Background()
	dir := t.TempDir()
	// The killed run spelled the endpoint unix:///path; this one /path.
	header := fmt.Sprintf(`{"endpoint":%q,"node_id":"node-1","topology":{"topology.csid.dev/zone":"fake"},"size_bytes":%d,"access_type":"mount","fs_type":"ext4","pid":1}`,
		"unix://"+in.Socket, 64<<20)
	vc := apptest.MountCap("ext4")
	topo := &csi.Topology{Segments: map[string]string{"topology.csid.dev/zone": "fake"}}
	made := apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "killed-a", CapacityRange: capRange(64 << 20),
		VolumeCapabilities:        []*csi.VolumeCapability{vc},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topo}, Preferred: []*csi.Topology{topo}}})).Must(t)
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := write("dead.journal", header, `{"begin":"killed-a"}`, fmt.Sprintf(`{"created":"killed-a","id":%q}`, made.Volume.VolumeId),
		`{"begin":"killed-b"}`)
	other := write("other.journal", strings.Replace(header, in.Socket, "/elsewhere.sock", 1), `{"begin":"x"}`)
	alive := write("alive.journal", header, `{"begin":"alive-a"}`)
	f, err := os.Open(alive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	cfg := benchConfig(t, in)
	cfg.JournalDir, cfg.CleanupOnly = dir, true
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cleanup.Recovered != 2 {
		t.Errorf("recovered %d volumes of the killed run, want 2", rep.Cleanup.Recovered)
	}
	list := apptest.R(c.ListVolumes(ctx, &csi.ListVolumesRequest{})).Must(t)
	if len(list.Entries) != 0 {
		t.Errorf("volumes left: %v", list.Entries)
	}
	for p, want := range map[string]bool{dead: false, other: true, alive: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("journal %s exists: %v, want %v", filepath.Base(p), err == nil, want)
		}
	}
}

// TestBenchReportJSON holds the JSON report's field names and shape to a
// golden file, with every measured number set to 0 and the run's own
// strings (endpoint, prefix, times, directories) replaced. Run with
// -update to rewrite it after a deliberate change (and bump bench.Schema
// if a field was renamed or removed). The golden file is a run as root,
// with the mkfs+mount floor; without root, that floor's parts are left out
// of both sides.
func TestBenchReportJSON(t *testing.T) {
	in, _ := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	cfg := benchConfig(t, in)
	cfg.Count, cfg.Existing, cfg.FloorSamples = 2, 2, 2
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	floor := doc["floor"].(map[string]any)
	floor["fs_type"] = "<fs_type>" // the floor directory's file system: the machine's
	normalise("", doc)
	golden := filepath.Join("testdata", "bench-report.golden.json")
	if *update {
		testutil.RequireRoot(t)
		if err := os.WriteFile(golden, encodeGolden(t, doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	var wantDoc map[string]any
	if err := json.Unmarshal(raw, &wantDoc); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		withoutMkfsFloor(doc)
		withoutMkfsFloor(wantDoc)
	}
	got, want := encodeGolden(t, doc), encodeGolden(t, wantDoc)
	if !bytes.Equal(got, want) {
		t.Errorf("the JSON report differs from %s (go test -run TestBenchReportJSON -update ./internal/app to accept):\n%s", golden, got)
	}
}

// encodeGolden encodes a report as the golden file holds it.
func encodeGolden(t *testing.T, doc map[string]any) []byte {
	t.Helper()
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// withoutMkfsFloor removes from a JSON report what only a run as root has
// (the mkfs+mount floor: its figures, results, summary entry and ratios),
// and the reason a run without root gives for its absence.
func withoutMkfsFloor(doc map[string]any) {
	floor := doc["floor"].(map[string]any)
	delete(floor, "mkfs_mount")
	delete(floor, "mkfs_mount_absent")
	drop := func(key string, gone func(map[string]any) bool) {
		var kept []any
		for _, e := range doc[key].([]any) {
			if !gone(e.(map[string]any)) {
				kept = append(kept, e)
			}
		}
		doc[key] = kept
	}
	mkfs := func(e map[string]any) bool { return e["unit"] == "mkfs+mount" }
	drop("results", mkfs)
	drop("summary", mkfs)
	drop("ratios", func(e map[string]any) bool { return e["kind"] == "floor" })
}

// normalise zeroes measured numbers and replaces run-specific strings.
func normalise(key string, v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalise(k, e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalise(key, e)
		}
		return x
	case float64:
		switch key {
		case "count", "errors", "concurrency", "existing", "round", "rounds", "created", "deleted", "recovered",
			"size_bytes", "volumes_before", "timeout_seconds", "pid":
			return x
		}
		return 0
	case string:
		switch key {
		case "endpoint", "started_at", "prefix", "dir":
			return "<" + key + ">"
		}
	}
	return v
}

// checkEndpointRatio holds an "endpoint" ratio to the measurements it
// compares: each round's value is the endpoint's rate over the baseline's
// at its phase, concurrency and existing volumes. Where the endpoint's
// creates are slowCreate slower (create, scale) it is under 1 in every
// round: a baseline create (and, in scale, its delete) would have to take
// longer than slowCreate to hide that. 40 ms was not enough on a loaded
// 2-core machine under -race; a stall of the baseline flipped a round.
// (How far under 1 depends on the load.)
func checkEndpointRatio(t *testing.T, q bench.Ratio, results []bench.Result) {
	t.Helper()
	rate := func(round int, baseline bool) float64 {
		at := q.Numerator
		if baseline {
			at = q.Denominator
		}
		for _, r := range results {
			if r.Phase == q.Phase && r.Round == round && r.Baseline == baseline &&
				r.Concurrency == at.Concurrency && r.Existing == at.Existing {
				return r.OpsPerSecond
			}
		}
		t.Errorf("endpoint ratio %+v: no measurement in round %d (baseline %v)", q, round, baseline)
		return math.NaN()
	}
	for i, got := range q.PerRound {
		want := rate(i+1, false) / rate(i+1, true)
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("endpoint ratio %+v, round %d: %v, want the endpoint's rate over the baseline's, %v", q, i+1, got, want)
		}
		if slow := q.Phase == "create" || q.Phase == "scale"; slow && got >= 1 {
			t.Errorf("endpoint ratio %+v, round %d: %v; creates %v slower on the endpoint, want under 1", q, i+1, got, slowCreate)
		}
	}
}

// slowCreate is how much slower CreateVolume is on the endpoint under test
// in TestBenchAgainstBaseline.
const slowCreate = 200 * time.Millisecond

// TestBenchAgainstBaseline runs every phase against two csids on the fake
// backend in one run, the one under test with CreateVolume made slowCreate
// slower: each measurement is made on both (marked apart in the report),
// the report names the baseline, the ratios of each endpoint's own shape
// are there for both, and the "endpoint" ratios (the endpoint's rate over
// the baseline's, per phase, concurrency and existing volumes, one per
// round) show the slower creates. Both drivers are left empty, and both
// journals removed.
func TestBenchAgainstBaseline(t *testing.T) {
	in, c := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), map[cloud.OpKind]time.Duration{cloud.OpCreate: slowCreate})
	base, bc := startFake(t, fake.New(fake.Options{Zones: []string{"fake"}}), nil)
	cfg := benchConfig(t, in)
	cfg.Baseline, cfg.MkfsFloorSamples = base.Socket, -1
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("run not clean: %+v %+v", rep.Errors, rep.Cleanup)
	}
	if rep.Baseline == nil || rep.Baseline.Endpoint != base.Socket || rep.Target.Endpoint != in.Socket {
		t.Fatalf("target %+v, baseline %+v", rep.Target, rep.Baseline)
	}
	perRound := 1 + 2*len(cfg.Concurrency)*6 // the floor; probe, create, delete, lifecycle, scale twice, on each endpoint
	if len(rep.Results) != cfg.Rounds*perRound {
		t.Fatalf("%d results, want %d", len(rep.Results), cfg.Rounds*perRound)
	}
	measured := map[bool]int{}
	for _, r := range rep.Results {
		if r.Phase != "floor" {
			measured[r.Baseline]++
		}
		if r.Count != cfg.Count && r.Phase != "floor" || r.Errors != 0 || r.OpsPerSecond <= 0 {
			t.Errorf("result %+v", r)
		}
	}
	if measured[false] != measured[true] {
		t.Errorf("measurements of the endpoint and the baseline: %v", measured)
	}
	kinds := map[string]int{}
	for _, q := range rep.Ratios {
		kinds[fmt.Sprint(q.Kind, q.Baseline)]++
		if len(q.PerRound) != cfg.Rounds || q.Value <= 0 {
			t.Errorf("ratio %+v: want one per round", q)
		}
		if q.Kind == "endpoint" {
			checkEndpointRatio(t, q, rep.Results)
		}
	}
	want := map[string]int{"concurrencyfalse": 6, "concurrencytrue": 6, "existingfalse": 2, "existingtrue": 2, "endpointfalse": 12}
	if !maps.Equal(kinds, want) {
		t.Errorf("ratios by kind %v, want %v", kinds, want)
	}
	checkClean(t, rep, c, cfg.JournalDir)
	if list := apptest.R(bc.ListVolumes(context.Background(), &csi.ListVolumesRequest{})).Must(t); len(list.Entries) != 0 {
		t.Errorf("%d volumes left on the baseline", len(list.Entries))
	}
}
