package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func TestQuantileAndMedian(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	st := summarise("X", ds, 3, time.Second)
	if st.Count != 103 || st.Errors != 3 || st.P50 != 0.050 || st.P90 != 0.090 || st.P99 != 0.099 || st.Max != 0.1 || st.OpsPerSecond != 100 {
		t.Fatalf("%+v", st)
	}
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3: %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median of 4: %v", m)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"64Mi": 64 << 20, "1Gi": 1 << 30, "500M": 500e6, "4096": 4096, "2Ki": 2048} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1Mi", "1.5Gi", "Mi", "1Pi", "99999999999Ti"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

// results of two rounds: scale at concurrency 1 and 8, with 0 and 100
// existing volumes, in the alternating order Run makes them.
func twoRounds() []Result {
	res := func(round, conc, existing int, rate float64) Result {
		return Result{Phase: "scale", Round: round, Concurrency: conc, Existing: existing, Unit: "create+delete", Count: 10,
			OpsPerSecond: rate, RPCs: []RPCStats{{Method: "CreateVolume", Count: 10, P50: 1 / rate, P90: 2 / rate, P99: 3 / rate, Max: 4 / rate}}}
	}
	return []Result{
		{Phase: "floor", Round: 1, Concurrency: 1, RPCs: []RPCStats{{Method: "Probe", Count: 5, P50: 0.0001}, {Method: "bbolt.Update", Count: 5, P50: 0.0003}}},
		res(1, 1, 0, 100), res(1, 1, 100, 90), res(1, 8, 0, 400), res(1, 8, 100, 380),
		{Phase: "floor", Round: 2, Concurrency: 1, RPCs: []RPCStats{{Method: "Probe", Count: 5, P50: 0.0003}, {Method: "bbolt.Update", Count: 5, P50: 0.0005}}},
		res(2, 8, 100, 200), res(2, 8, 0, 200), res(2, 1, 100, 50), res(2, 1, 0, 50),
	}
}

// TestRatiosRoundByRound: a ratio is taken within each round and the
// median of those is reported: a round that is slow throughout (round 2
// here, at half the speed) does not skew it.
func TestRatiosRoundByRound(t *testing.T) {
	qs := ratios(twoRounds())
	got := map[string]Ratio{}
	for _, q := range qs {
		got[q.Kind+" "+strings.Repeat("x", q.Numerator.Existing/100)+string(rune('0'+q.Numerator.Concurrency))] = q
	}
	if q := got["concurrency 8"]; q.Value != 4 || len(q.PerRound) != 2 {
		t.Errorf("concurrency 8/1 with none existing: %+v", q)
	}
	if q := got["concurrency x8"]; q.Value != (380.0/90+4)/2 {
		t.Errorf("concurrency 8/1 with 100 existing: %+v", q)
	}
	if q := got["existing x1"]; q.Value != (0.9+1)/2 || q.Denominator.Existing != 0 {
		t.Errorf("existing at concurrency 1: %+v", q)
	}
	if len(qs) != 4 {
		t.Errorf("%d ratios: %+v", len(qs), qs)
	}
}

// TestSummaryAndOutputs: the summary takes medians over the rounds; the
// table, the JSON and the SVG render it (the SVG is well-formed XML).
func TestSummaryAndOutputs(t *testing.T) {
	rep := &Report{Schema: Schema, Results: twoRounds(), Config: ReportConfig{Rounds: 2, Count: 10}}
	rep.Summary, rep.Ratios = summary(rep.Results), ratios(rep.Results)
	if len(rep.Summary) != 5 || rep.Summary[0].Phase != "floor" || rep.Summary[1].Concurrency != 1 || rep.Summary[1].Existing != 0 {
		t.Fatalf("summary order: %+v", rep.Summary)
	}
	if s := rep.Summary[1]; s.OpsPerSecond != 75 || s.Count != 20 || s.Rounds != 2 || s.RPCs[0].P50 != (0.01+0.02)/2 {
		t.Errorf("scale c=1 existing=0: %+v", s)
	}
	var table, svg, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scale     8       100  (create+delete)", "scale with 100 existing volumes / 0 (concurrency 8): 0.97x  [0.95 1.00]"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
	for _, absent := range []string{"baseline", "endpoint", "floor of a stage", "latency over the floor"} {
		if strings.Contains(table.String(), absent) {
			t.Errorf("a run of one endpoint without the mkfs+mount floor shows %q:\n%s", absent, table.String())
		}
	}
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
	}
	if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"schema": "csid.bench/v1"`) {
		t.Fatalf("%v\n%s", err, js.String())
	}
}

// TestRatiosOfBaselineAndFloor: with a baseline, each endpoint has its own
// concurrency ratios and the "endpoint" ratios divide the endpoint's rate by
// the baseline's at the same point, round by round; the "floor" ratio
// divides the lifecycle's NodeStageVolume p50 by the round's mkfs+mount
// floor p50. The table shows the endpoint column and both kinds.
func TestRatiosOfBaselineAndFloor(t *testing.T) {
	life := func(round, conc int, baseline bool, rate, stage float64) Result {
		return Result{Phase: "lifecycle", Round: round, Concurrency: conc, Baseline: baseline, Unit: "lifecycle", Count: 10,
			OpsPerSecond: rate, RPCs: []RPCStats{{Method: "CreateVolume", Count: 10, P50: 0.001}, {Method: "NodeStageVolume", Count: 10, P50: stage}}}
	}
	floor := func(round int, p50 float64) Result {
		return Result{Phase: "floor", Round: round, Concurrency: 1, Unit: "mkfs+mount", Count: 3,
			RPCs: []RPCStats{{Method: "mkfs+mount", Count: 3, P50: p50}, {Method: "mkfs", Count: 3, P50: p50 * 0.75}, {Method: "mount", Count: 3, P50: p50 / 4}}}
	}
	results := []Result{
		floor(1, 0.010), life(1, 1, false, 20, 0.012), life(1, 1, true, 100, 0.001), life(1, 8, false, 40, 0.030), life(1, 8, true, 400, 0.002),
		floor(2, 0.020), life(2, 8, true, 200, 0.002), life(2, 8, false, 10, 0.050), life(2, 1, true, 50, 0.001), life(2, 1, false, 10, 0.030),
	}
	got := map[string]Ratio{}
	for _, q := range ratios(results) {
		got[fmt.Sprintf("%s %v %d", q.Kind, q.Baseline, q.Numerator.Concurrency)] = q
	}
	for key, want := range map[string]float64{
		"concurrency false 8": (2 + 1) / 2.0, "concurrency true 8": 4,
		"endpoint false 1": (0.2 + 0.2) / 2, "endpoint false 8": (0.1 + 0.05) / 2,
		"floor false 1": (1.2 + 1.5) / 2, "floor false 8": (3 + 2.5) / 2,
	} {
		q, ok := got[key]
		if !ok || math.Abs(q.Value-want) > 1e-9 || len(q.PerRound) != 2 {
			t.Errorf("%s: %+v, want %v", key, q, want)
		}
		delete(got, key)
	}
	if len(got) != 0 {
		t.Errorf("other ratios: %+v", got)
	}
	rep := &Report{Schema: Schema, Results: results, Config: ReportConfig{Rounds: 2, Count: 10, FsType: "ext4", SizeBytes: 64 << 20},
		Baseline: &Target{Endpoint: "/b.sock", Driver: "other"}}
	rep.Summary, rep.Ratios = summary(rep.Results), ratios(rep.Results)
	rep.Floor.MkfsMount = &rep.Summary[0].RPCs[0]
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"baseline, measured in the same run: other  at /b.sock",
		"mkfs.ext4 + mount of 67108864 bytes p50 15.00 p99 - (mkfs p50 11.25, mount p50 3.750)",
		"endpoint      phase  conc",
		"  baseline  lifecycle     8",
		"lifecycle at concurrency 8 (0 existing), target / baseline: 0.08x  [0.10 0.05]",
		"lifecycle of the baseline at concurrency 8 / 1 (0 existing): 4.00x  [4.00 4.00]",
		"lifecycle NodeStageVolume p50 at concurrency 1 / mkfs+mount floor p50: 1.35x  [1.20 1.50]",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
}
