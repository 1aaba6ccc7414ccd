package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Schema names the JSON layout of a Report. Fields may be added under the
// same schema; a field renamed or removed changes it. docs/benchmarks.md
// describes every field.
const Schema = "csid.bench/v1"

// Report is the outcome of a run. Durations are in seconds; rates in units
// per second.
type Report struct {
	Schema string `json:"schema"`
	// Target is the driver measured.
	Target Target `json:"target"`
	// Baseline is the driver it was compared with in the same run
	// (Config.Baseline); absent without one.
	Baseline *Target `json:"baseline,omitempty"`
	// Config is what the run was asked to do.
	Config    ReportConfig `json:"config"`
	StartedAt time.Time    `json:"started_at"`
	// ElapsedSeconds covers the measurements, not the cleanup.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Interrupted: the run was stopped (Ctrl-C) before it finished.
	Interrupted bool `json:"interrupted"`
	// Floor is the floor's medians over the rounds.
	Floor Floor `json:"floor"`
	// Results holds every measurement, in the order they were made.
	Results []Result `json:"results"`
	// Summary holds one entry per phase, concurrency and number of
	// existing volumes: the medians over the rounds (Round is 0).
	Summary []Result `json:"summary"`
	// Ratios compare measurements of the same run, round by round.
	Ratios  []Ratio      `json:"ratios"`
	Errors  ErrorSummary `json:"errors"`
	Cleanup Cleanup      `json:"cleanup"`
}

// Target describes the driver.
type Target struct {
	Endpoint string `json:"endpoint"`
	// Driver and Version are GetPluginInfo's name and vendor_version.
	Driver  string `json:"driver"`
	Version string `json:"version"`
	// NodeID is the node volumes were published to.
	NodeID string `json:"node_id"`
	// Capabilities are those the bench looks at, as CSI names them.
	Capabilities []string `json:"capabilities"`
	// VolumesBefore is how many volumes ListVolumes reported before the run
	// (0 without LIST_VOLUMES).
	VolumesBefore int `json:"volumes_before"`
}

// ReportConfig is the run's configuration.
type ReportConfig struct {
	Phases      []string `json:"phases"`
	Concurrency []int    `json:"concurrency"`
	Count       int      `json:"count"`
	Existing    int      `json:"existing"`
	Rounds      int      `json:"rounds"`
	// Slices is how many slices each measurement was cut into, run
	// alternately at each concurrency.
	Slices     int    `json:"slices"`
	SizeBytes  int64  `json:"size_bytes"`
	AccessType string `json:"access_type"`
	FsType     string `json:"fs_type"`
	// Prefix starts the name of every volume of the run.
	Prefix         string  `json:"prefix"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
}

// Floor is what no CSI call can beat, measured in the same run: Probe's
// round trip on the same endpoint, one bare bbolt commit in Dir, and a bare
// mkfs + mount of a volume's size (what NodeStageVolume of a new volume
// must do at least).
type Floor struct {
	Dir string `json:"dir"`
	// FSType is Dir's file system ("ext4", "tmpfs", ...).
	FSType     string   `json:"fs_type"`
	Probe      RPCStats `json:"probe"`
	BoltUpdate RPCStats `json:"bbolt_update"`
	// MkfsMount is the mkfs+mount floor (Config.MkfsFloorSamples): absent
	// when it was not measured, and MkfsMountAbsent says why.
	MkfsMount       *RPCStats `json:"mkfs_mount,omitempty"`
	MkfsMountAbsent string    `json:"mkfs_mount_absent,omitempty"`
}

// Result is one measurement: Count units of a phase on Concurrency
// workers, with Existing volumes of the run around (the scale phase).
type Result struct {
	Phase string `json:"phase"`
	// Round is the round (1-based) of a measurement; 0 in the summary.
	Round int `json:"round,omitempty"`
	// Rounds is how many measurements a summary entry is the median of.
	Rounds      int `json:"rounds,omitempty"`
	Concurrency int `json:"concurrency"`
	Existing    int `json:"existing"`
	// Baseline marks a measurement of the baseline (Config.Baseline).
	Baseline bool `json:"baseline,omitempty"`
	// Unit is what Count and OpsPerSecond count: an RPC name for probe,
	// create and delete, "lifecycle", "create+delete" for scale,
	// "Probe+bbolt.Update" and "mkfs+mount" for the floors.
	Unit   string `json:"unit"`
	Count  int    `json:"count"`
	Errors int    `json:"errors"`
	// ElapsedSeconds is the measurement's wall time; OpsPerSecond the
	// units that succeeded over it.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	OpsPerSecond   float64 `json:"ops_per_second"`
	// RPCs has each RPC's figures, in the order of the lifecycle.
	RPCs []RPCStats `json:"rpcs"`
}

// Ratio is a ratio of two measurements, taken round by round (each pair
// measured close together) and summarised by the median.
type Ratio struct {
	// Kind is what is compared. Of OpsPerSecond: "concurrency" (a phase at
	// its highest concurrency over its lowest), "existing" (scale with
	// Existing volumes over none, at one concurrency), "endpoint" (the
	// endpoint's rate over the baseline's, at the same phase, concurrency
	// and existing volumes). Of latency: "floor" (the p50 of Method in the
	// lifecycle at a concurrency over the p50 of the mkfs+mount floor;
	// lower is better, 1 is the floor itself).
	Kind  string `json:"kind"`
	Phase string `json:"phase"`
	// Method is the RPC whose latency a "floor" ratio takes.
	Method string `json:"method,omitempty"`
	// Baseline: a "concurrency" or "existing" ratio of the baseline's
	// measurements.
	Baseline    bool      `json:"baseline,omitempty"`
	Numerator   Point     `json:"numerator"`
	Denominator Point     `json:"denominator"`
	Value       float64   `json:"value"`
	PerRound    []float64 `json:"per_round"`
}

// Point selects the measurements of a phase a ratio compares.
type Point struct {
	Concurrency int `json:"concurrency"`
	Existing    int `json:"existing"`
}

// ErrorSummary counts failed units and keeps the first messages.
type ErrorSummary struct {
	Count int      `json:"count"`
	First []string `json:"first"`
}

// Cleanup says what the run created and whether it is all gone.
type Cleanup struct {
	// Created counts the volumes the run created; Deleted those it deleted.
	Created int `json:"created"`
	Deleted int `json:"deleted"`
	// Recovered counts volumes of earlier, killed runs cleaned up first.
	Recovered int `json:"recovered"`
	// Verified: ListVolumes was asked afterwards (LIST_VOLUMES), and
	// Leftover lists the run's volumes it still reported.
	Verified bool     `json:"verified"`
	Leftover []string `json:"leftover"`
}

// OK reports whether the run was complete and clean: no failed unit, no
// interruption, nothing left behind.
func (r *Report) OK() bool {
	return r.Errors.Count == 0 && !r.Interrupted && len(r.Cleanup.Leftover) == 0 && r.Cleanup.Created == r.Cleanup.Deleted
}

// summarise fills in the summary, the floor, the ratios and the errors.
func (r *runner) summarise() {
	rep := r.report
	r.mu.Lock()
	rep.Errors = ErrorSummary{Count: r.nerrs, First: slices.Clone(r.errs)}
	r.mu.Unlock()
	if rep.Errors.First == nil {
		rep.Errors.First = []string{}
	}
	if rep.Cleanup.Leftover == nil {
		rep.Cleanup.Leftover = []string{}
	}
	rep.Summary, rep.Ratios = summary(rep.Results), ratios(rep.Results)
	for _, s := range rep.Summary {
		if s.Phase != string(PhaseFloor) {
			continue
		}
		for _, st := range s.RPCs {
			switch st.Method {
			case "Probe":
				rep.Floor.Probe = st
			case "bbolt.Update":
				rep.Floor.BoltUpdate = st
			case methodMkfsMount:
				rep.Floor.MkfsMount = &st
			}
		}
	}
}

type resultKey struct {
	phase, unit    string
	conc, existing int
	baseline       bool
	phaseOrder     int
}

func keyOf(r Result) resultKey {
	order := slices.Index(Phases, Phase(r.Phase)) // the floors are -1: first
	return resultKey{phase: r.Phase, unit: r.Unit, conc: r.Concurrency, existing: r.Existing, baseline: r.Baseline, phaseOrder: order}
}

func (a resultKey) compare(b resultKey) int {
	return cmp.Or(cmp.Compare(a.phaseOrder, b.phaseOrder), cmp.Compare(a.conc, b.conc), cmp.Compare(a.existing, b.existing),
		cmp.Compare(boolInt(a.baseline), boolInt(b.baseline)), cmp.Compare(a.unit, b.unit))
}

// summary takes, for each phase, concurrency, number of existing volumes
// and endpoint (and each floor), the medians over the rounds.
func summary(results []Result) []Result {
	groups := map[resultKey][]Result{}
	var keys []resultKey
	for _, r := range results {
		k := keyOf(r)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	slices.SortFunc(keys, resultKey.compare)
	out := make([]Result, 0, len(keys))
	for _, k := range keys {
		g := groups[k]
		s := Result{Phase: k.phase, Rounds: len(g), Concurrency: k.conc, Existing: k.existing, Baseline: k.baseline, Unit: k.unit,
			ElapsedSeconds: medianOf(g, func(r Result) float64 { return r.ElapsedSeconds }),
			OpsPerSecond:   medianOf(g, func(r Result) float64 { return r.OpsPerSecond })}
		var methods []string
		by := map[string][]RPCStats{}
		for _, r := range g {
			s.Count += r.Count
			s.Errors += r.Errors
			for _, st := range r.RPCs {
				if _, ok := by[st.Method]; !ok {
					methods = append(methods, st.Method)
				}
				by[st.Method] = append(by[st.Method], st)
			}
		}
		s.RPCs = []RPCStats{}
		for _, m := range methods {
			sts := by[m]
			agg := RPCStats{Method: m}
			var rate, p50, p90, p99, mean []float64
			for _, st := range sts {
				agg.Count += st.Count
				agg.Errors += st.Errors
				agg.Max = max(agg.Max, st.Max)
				if st.Count > st.Errors { // latencies exist only for successes
					rate, p50, p90, p99, mean = append(rate, st.OpsPerSecond), append(p50, st.P50), append(p90, st.P90),
						append(p99, st.P99), append(mean, st.Mean)
				}
			}
			agg.OpsPerSecond, agg.P50, agg.P90, agg.P99, agg.Mean = median(rate), median(p50), median(p90), median(p99), median(mean)
			s.RPCs = append(s.RPCs, agg)
		}
		out = append(out, s)
	}
	return out
}

func medianOf(g []Result, f func(Result) float64) float64 {
	x := make([]float64, len(g))
	for i, r := range g {
		x[i] = f(r)
	}
	return median(x)
}

// ratios compares, round by round: each phase at its highest concurrency
// against its lowest (at each number of existing volumes), the scale phase
// with existing volumes against none (at each concurrency), both for each
// endpoint; the endpoint's rates against the baseline's; and the
// lifecycle's NodeStageVolume p50 against the mkfs+mount floor's.
func ratios(results []Result) []Ratio {
	rs := newRoundSeries(results)
	var out []Ratio
	for _, baseline := range []bool{false, true} {
		out = append(out, rs.shapeRatios(baseline)...)
	}
	out = append(out, rs.endpointRatios()...)
	out = append(out, rs.floorRatios()...)
	if out == nil {
		out = []Ratio{}
	}
	return out
}

// at is a measurement's place in a run.
type at struct {
	phase          string
	conc, existing int
	baseline       bool
	round          int
}

// roundSeries indexes a run's results by their place, for ratios.
type roundSeries struct {
	rate      map[at]float64
	stageP50  map[at]float64 // lifecycle NodeStageVolume p50
	floorP50  map[int]float64
	concs     map[bool]map[string][]int // by baseline, phase
	existings map[bool]map[string][]int
	rounds    int
}

func newRoundSeries(results []Result) *roundSeries {
	rs := &roundSeries{rate: map[at]float64{}, stageP50: map[at]float64{}, floorP50: map[int]float64{},
		concs: map[bool]map[string][]int{false: {}, true: {}}, existings: map[bool]map[string][]int{false: {}, true: {}}}
	for _, r := range results {
		rs.rounds = max(rs.rounds, r.Round)
		if r.Phase == string(PhaseFloor) {
			if st, ok := rpcOf(r, methodMkfsMount); ok && st.Count > st.Errors {
				rs.floorP50[r.Round] = st.P50
			}
			continue
		}
		k := at{r.Phase, r.Concurrency, r.Existing, r.Baseline, r.Round}
		rs.rate[k] = r.OpsPerSecond
		if st, ok := rpcOf(r, "NodeStageVolume"); ok && r.Phase == string(PhaseLifecycle) && st.Count > st.Errors {
			rs.stageP50[k] = st.P50
		}
		c, e := rs.concs[r.Baseline], rs.existings[r.Baseline]
		if !slices.Contains(c[r.Phase], r.Concurrency) {
			c[r.Phase] = append(c[r.Phase], r.Concurrency)
		}
		if !slices.Contains(e[r.Phase], r.Existing) {
			e[r.Phase] = append(e[r.Phase], r.Existing)
		}
	}
	for _, m := range []map[bool]map[string][]int{rs.concs, rs.existings} {
		for _, byPhase := range m {
			for _, x := range byPhase {
				slices.Sort(x)
			}
		}
	}
	return rs
}

// rpcOf finds a method's figures in a result.
func rpcOf(r Result, method string) (RPCStats, bool) {
	for _, st := range r.RPCs {
		if st.Method == method {
			return st, true
		}
	}
	return RPCStats{}, false
}

// ratio takes num(round) / den(round) in each round that has both, and
// their median; ok is false when no round has both.
func (rs *roundSeries) ratio(q Ratio, num, den func(round int) (float64, bool)) (Ratio, bool) {
	q.PerRound = []float64{}
	for round := 1; round <= rs.rounds; round++ {
		n, okN := num(round)
		d, okD := den(round)
		if okN && okD && d > 0 {
			q.PerRound = append(q.PerRound, n/d)
		}
	}
	q.Value = median(q.PerRound)
	return q, len(q.PerRound) > 0
}

// rateAt reads the rate of a phase at a point of one endpoint, by round.
func (rs *roundSeries) rateAt(phase string, p Point, baseline bool) func(int) (float64, bool) {
	return func(round int) (float64, bool) {
		v, ok := rs.rate[at{phase, p.Concurrency, p.Existing, baseline, round}]
		return v, ok
	}
}

// shapeRatios are the "concurrency" and "existing" ratios of one endpoint.
func (rs *roundSeries) shapeRatios(baseline bool) []Ratio {
	var out []Ratio
	for _, p := range Phases {
		phase := string(p)
		cs, es := rs.concs[baseline][phase], rs.existings[baseline][phase]
		if len(cs) >= 2 {
			for _, e := range es {
				num, den := Point{cs[len(cs)-1], e}, Point{cs[0], e}
				q := Ratio{Kind: "concurrency", Phase: phase, Baseline: baseline, Numerator: num, Denominator: den}
				if q, ok := rs.ratio(q, rs.rateAt(phase, num, baseline), rs.rateAt(phase, den, baseline)); ok {
					out = append(out, q)
				}
			}
		}
		if p == PhaseScale && len(es) >= 2 {
			for _, c := range cs {
				num, den := Point{c, es[len(es)-1]}, Point{c, es[0]}
				q := Ratio{Kind: "existing", Phase: phase, Baseline: baseline, Numerator: num, Denominator: den}
				if q, ok := rs.ratio(q, rs.rateAt(phase, num, baseline), rs.rateAt(phase, den, baseline)); ok {
					out = append(out, q)
				}
			}
		}
	}
	return out
}

// endpointRatios are the endpoint's rates over the baseline's, at every
// phase, concurrency and number of existing volumes both were measured at.
// The scale phase's existing volumes are matched by the number asked for:
// a fill in which a few creates failed is still the same measurement.
func (rs *roundSeries) endpointRatios() []Ratio {
	var out []Ratio
	for _, p := range Phases {
		phase := string(p)
		es := rs.existings[false][phase]
		for _, c := range rs.concs[false][phase] {
			if !slices.Contains(rs.concs[true][phase], c) {
				continue
			}
			for i, e := range es {
				be := rs.existings[true][phase]
				if i >= len(be) {
					continue
				}
				num, den := Point{c, e}, Point{c, be[i]}
				q := Ratio{Kind: "endpoint", Phase: phase, Numerator: num, Denominator: den}
				if q, ok := rs.ratio(q, rs.rateAt(phase, num, false), rs.rateAt(phase, den, true)); ok {
					out = append(out, q)
				}
			}
		}
	}
	return out
}

// floorRatios are the lifecycle's NodeStageVolume p50 over the mkfs+mount
// floor's p50, at each concurrency of the endpoint under test.
func (rs *roundSeries) floorRatios() []Ratio {
	var out []Ratio
	phase := string(PhaseLifecycle)
	for _, c := range rs.concs[false][phase] {
		num := Point{Concurrency: c}
		q := Ratio{Kind: "floor", Phase: phase, Method: "NodeStageVolume", Numerator: num, Denominator: Point{Concurrency: 1}}
		stage := func(round int) (float64, bool) {
			v, ok := rs.stageP50[at{phase, c, 0, false, round}]
			return v, ok
		}
		floor := func(round int) (float64, bool) {
			v, ok := rs.floorP50[round]
			return v, ok
		}
		if q, ok := rs.ratio(q, stage, floor); ok {
			out = append(out, q)
		}
	}
	return out
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the summary for people: the floors, a row per RPC of
// each measurement (medians over the rounds), the ratios and the cleanup.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	r.writeHeader(&b)
	if err := r.writeSummary(&b); err != nil {
		return err
	}
	r.writeRatios(&b)
	r.writeCleanup(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHeader writes what was measured, and the floors.
func (r *Report) writeHeader(b *strings.Builder) {
	t := r.Target
	fmt.Fprintf(b, "csid bench: %s %s at %s, node %q; %d round(s), %d units per measurement, %s %s volumes of %d bytes\n",
		t.Driver, t.Version, t.Endpoint, t.NodeID, r.Config.Rounds, r.Config.Count, r.Config.AccessType, r.Config.FsType, r.Config.SizeBytes)
	if bl := r.Baseline; bl != nil {
		fmt.Fprintf(b, "baseline, measured in the same run: %s %s at %s, node %q\n", bl.Driver, bl.Version, bl.Endpoint, bl.NodeID)
	}
	fl := r.Floor
	fmt.Fprintf(b, "floor (concurrency 1, same run): Probe p50 %s p99 %s; bbolt.Update p50 %s p99 %s (in %s, %s)\n",
		ms(fl.Probe.P50), ms(fl.Probe.P99), ms(fl.BoltUpdate.P50), ms(fl.BoltUpdate.P99), fl.Dir, fl.FSType)
	switch {
	case fl.MkfsMount != nil:
		fmt.Fprintf(b, "floor of a stage (concurrency 1, same run, before each lifecycle): mkfs.%s + mount of %d bytes p50 %s p99 %s",
			r.Config.FsType, r.Config.SizeBytes, ms(fl.MkfsMount.P50), ms(fl.MkfsMount.P99))
		if mkfs, mount, ok := r.floorParts(); ok {
			fmt.Fprintf(b, " (mkfs p50 %s, mount p50 %s)", ms(mkfs), ms(mount))
		}
		b.WriteString("\n")
	case fl.MkfsMountAbsent != "":
		fmt.Fprintf(b, "floor of a stage (mkfs + mount): not measured: %s\n", fl.MkfsMountAbsent)
	}
	b.WriteString("\n")
}

// floorParts returns the summary's p50s of the mkfs+mount floor's parts.
func (r *Report) floorParts() (mkfs, mount float64, ok bool) {
	for _, s := range r.Summary {
		if s.Phase == string(PhaseFloor) && s.Unit == methodMkfsMount {
			a, okA := rpcOf(s, methodMkfs)
			b, okB := rpcOf(s, methodMount)
			return a.P50, b.P50, okA && okB
		}
	}
	return 0, 0, false
}

// writeSummary writes a row per RPC of each measurement; with a baseline,
// a first column says which endpoint it is.
func (r *Report) writeSummary(b *strings.Builder) error {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	col := func(s Result) string {
		switch {
		case r.Baseline == nil:
			return ""
		case s.Baseline:
			return "baseline\t"
		default:
			return "target\t"
		}
	}
	head := "phase\tconc\texisting\trpc\tcount\terrors\tops/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\t"
	if r.Baseline != nil {
		head = "endpoint\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, s := range r.Summary {
		if s.Phase == string(PhaseFloor) {
			continue
		}
		if len(s.RPCs) != 1 || s.RPCs[0].Method != s.Unit {
			fmt.Fprintf(tw, "%s%s\t%d\t%d\t%s\t%d\t%d\t%.1f\t\t\t\t\t\n", col(s), s.Phase, s.Concurrency, s.Existing, "("+s.Unit+")",
				s.Count, s.Errors, s.OpsPerSecond)
		}
		for _, st := range s.RPCs {
			fmt.Fprintf(tw, "%s%s\t%d\t%d\t%s\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t\n", col(s), s.Phase, s.Concurrency, s.Existing, st.Method,
				st.Count, st.Errors, st.OpsPerSecond, ms(st.P50), ms(st.P90), ms(st.P99), ms(st.Max))
		}
	}
	return tw.Flush()
}

// writeRatios writes the ratios of rates, then those of latency over the
// floor.
func (r *Report) writeRatios(b *strings.Builder) {
	var rates, floors []Ratio
	for _, q := range r.Ratios {
		if q.Kind == "floor" {
			floors = append(floors, q)
		} else {
			rates = append(rates, q)
		}
	}
	if len(rates) > 0 {
		b.WriteString("\nratios of ops/s, median of the rounds' ratios:\n")
		for _, q := range rates {
			writeRatio(b, q)
		}
	}
	if len(floors) > 0 {
		b.WriteString("\nlatency over the floor (lower is better), median of the rounds' ratios:\n")
		for _, q := range floors {
			writeRatio(b, q)
		}
	}
}

// writeRatio writes one ratio's line.
func writeRatio(b *strings.Builder, q Ratio) {
	of := ""
	if q.Baseline {
		of = " of the baseline"
	}
	var what string
	switch q.Kind {
	case "concurrency":
		what = fmt.Sprintf("%s%s at concurrency %d / %d (%d existing)", q.Phase, of, q.Numerator.Concurrency, q.Denominator.Concurrency, q.Numerator.Existing)
	case "existing":
		what = fmt.Sprintf("%s%s with %d existing volumes / %d (concurrency %d)", q.Phase, of, q.Numerator.Existing, q.Denominator.Existing, q.Numerator.Concurrency)
	case "endpoint":
		what = fmt.Sprintf("%s at concurrency %d (%d existing), target / baseline", q.Phase, q.Numerator.Concurrency, q.Numerator.Existing)
	case "floor":
		what = fmt.Sprintf("%s %s p50 at concurrency %d / mkfs+mount floor p50", q.Phase, q.Method, q.Numerator.Concurrency)
	}
	per := make([]string, len(q.PerRound))
	for i, x := range q.PerRound {
		per[i] = fmt.Sprintf("%.2f", x)
	}
	fmt.Fprintf(b, "  %s: %.2fx  [%s]\n", what, q.Value, strings.Join(per, " "))
}

// writeCleanup writes what the run left, whether it was cut short, and the
// first errors.
func (r *Report) writeCleanup(b *strings.Builder) {
	c := r.Cleanup
	fmt.Fprintf(b, "\ncleanup: %d created, %d deleted", c.Created, c.Deleted)
	if c.Recovered > 0 {
		fmt.Fprintf(b, ", %d of killed runs", c.Recovered)
	}
	switch {
	case !c.Verified:
		b.WriteString(" (ListVolumes not asked)\n")
	case len(c.Leftover) == 0:
		b.WriteString("; ListVolumes shows none left\n")
	default:
		fmt.Fprintf(b, "; LEFT BEHIND: %s\n", strings.Join(c.Leftover, " "))
	}
	if r.Interrupted {
		b.WriteString("interrupted: the figures cover what ran\n")
	}
	if r.Errors.Count > 0 {
		fmt.Fprintf(b, "%d units failed; the first errors:\n", r.Errors.Count)
		for _, e := range r.Errors.First {
			fmt.Fprintf(b, "  %s\n", e)
		}
	}
}

// ms formats seconds as milliseconds.
func ms(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s < 0.01:
		return fmt.Sprintf("%.3f", s*1000)
	default:
		return fmt.Sprintf("%.2f", s*1000)
	}
}
