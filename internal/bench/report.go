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
// round trip on the same endpoint, and one bare bbolt commit in Dir.
type Floor struct {
	Dir string `json:"dir"`
	// FSType is Dir's file system ("ext4", "tmpfs", ...).
	FSType     string   `json:"fs_type"`
	Probe      RPCStats `json:"probe"`
	BoltUpdate RPCStats `json:"bbolt_update"`
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
	// Unit is what Count and OpsPerSecond count: an RPC name for probe,
	// create and delete, "lifecycle", "create+delete" for scale,
	// "Probe+bbolt.Update" for the floor.
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

// Ratio is a ratio of two measurements' OpsPerSecond, taken round by round
// (each pair measured close together) and summarised by the median.
type Ratio struct {
	// Kind is "concurrency" (a phase at its highest concurrency over its
	// lowest) or "existing" (scale with Existing volumes over none, at one
	// concurrency).
	Kind        string    `json:"kind"`
	Phase       string    `json:"phase"`
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
			}
		}
	}
}

type resultKey struct {
	phase          string
	conc, existing int
	phaseOrder     int
}

func keyOf(r Result) resultKey {
	order := slices.Index(Phases, Phase(r.Phase)) // the floor is -1: first
	return resultKey{phase: r.Phase, conc: r.Concurrency, existing: r.Existing, phaseOrder: order}
}

func (a resultKey) compare(b resultKey) int {
	return cmp.Or(cmp.Compare(a.phaseOrder, b.phaseOrder), cmp.Compare(a.conc, b.conc), cmp.Compare(a.existing, b.existing))
}

// summary takes, for each phase, concurrency and number of existing
// volumes, the medians over the rounds.
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
		s := Result{Phase: k.phase, Rounds: len(g), Concurrency: k.conc, Existing: k.existing, Unit: g[0].Unit,
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
// against its lowest (at each number of existing volumes), and the scale
// phase with existing volumes against none (at each concurrency).
func ratios(results []Result) []Ratio {
	type at struct {
		phase          string
		conc, existing int
		round          int
	}
	rate := map[at]float64{}
	concs, existings := map[string][]int{}, map[string][]int{}
	rounds := 0
	for _, r := range results {
		if r.Phase == string(PhaseFloor) {
			continue
		}
		rate[at{r.Phase, r.Concurrency, r.Existing, r.Round}] = r.OpsPerSecond
		if !slices.Contains(concs[r.Phase], r.Concurrency) {
			concs[r.Phase] = append(concs[r.Phase], r.Concurrency)
		}
		if !slices.Contains(existings[r.Phase], r.Existing) {
			existings[r.Phase] = append(existings[r.Phase], r.Existing)
		}
		rounds = max(rounds, r.Round)
	}
	ratio := func(kind, phase string, num, den Point) (Ratio, bool) {
		q := Ratio{Kind: kind, Phase: phase, Numerator: num, Denominator: den, PerRound: []float64{}}
		for round := 1; round <= rounds; round++ {
			n, okN := rate[at{phase, num.Concurrency, num.Existing, round}]
			d, okD := rate[at{phase, den.Concurrency, den.Existing, round}]
			if okN && okD && d > 0 {
				q.PerRound = append(q.PerRound, n/d)
			}
		}
		q.Value = median(q.PerRound)
		return q, len(q.PerRound) > 0
	}
	var out []Ratio
	for _, p := range Phases {
		cs, es := concs[string(p)], existings[string(p)]
		slices.Sort(cs)
		slices.Sort(es)
		if len(cs) >= 2 {
			for _, e := range es {
				if q, ok := ratio("concurrency", string(p), Point{cs[len(cs)-1], e}, Point{cs[0], e}); ok {
					out = append(out, q)
				}
			}
		}
		if p == PhaseScale && len(es) >= 2 {
			for _, c := range cs {
				if q, ok := ratio("existing", string(p), Point{c, es[len(es)-1]}, Point{c, es[0]}); ok {
					out = append(out, q)
				}
			}
		}
	}
	if out == nil {
		out = []Ratio{}
	}
	return out
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the summary for people: the floor, a row per RPC of
// each measurement (medians over the rounds), the ratios and the cleanup.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	t := r.Target
	fmt.Fprintf(&b, "csid bench: %s %s at %s, node %q; %d round(s), %d units per measurement, %s %s volumes of %d bytes\n",
		t.Driver, t.Version, t.Endpoint, t.NodeID, r.Config.Rounds, r.Config.Count, r.Config.AccessType, r.Config.FsType, r.Config.SizeBytes)
	fl := r.Floor
	fmt.Fprintf(&b, "floor (concurrency 1, same run): Probe p50 %s p99 %s; bbolt.Update p50 %s p99 %s (in %s, %s)\n\n",
		ms(fl.Probe.P50), ms(fl.Probe.P99), ms(fl.BoltUpdate.P50), ms(fl.BoltUpdate.P99), fl.Dir, fl.FSType)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tconc\texisting\trpc\tcount\terrors\tops/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\t")
	for _, s := range r.Summary {
		if s.Phase == string(PhaseFloor) {
			continue
		}
		if len(s.RPCs) != 1 || s.RPCs[0].Method != s.Unit {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%.1f\t\t\t\t\t\n", s.Phase, s.Concurrency, s.Existing, "("+s.Unit+")",
				s.Count, s.Errors, s.OpsPerSecond)
		}
		for _, st := range s.RPCs {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t\n", s.Phase, s.Concurrency, s.Existing, st.Method,
				st.Count, st.Errors, st.OpsPerSecond, ms(st.P50), ms(st.P90), ms(st.P99), ms(st.Max))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Ratios) > 0 {
		b.WriteString("\nratios of ops/s, median of the rounds' ratios:\n")
		for _, q := range r.Ratios {
			var what string
			if q.Kind == "concurrency" {
				what = fmt.Sprintf("%s at concurrency %d / %d (%d existing)", q.Phase, q.Numerator.Concurrency, q.Denominator.Concurrency, q.Numerator.Existing)
			} else {
				what = fmt.Sprintf("%s with %d existing volumes / %d (concurrency %d)", q.Phase, q.Numerator.Existing, q.Denominator.Existing, q.Numerator.Concurrency)
			}
			per := make([]string, len(q.PerRound))
			for i, x := range q.PerRound {
				per[i] = fmt.Sprintf("%.2f", x)
			}
			fmt.Fprintf(&b, "  %s: %.2fx  [%s]\n", what, q.Value, strings.Join(per, " "))
		}
	}
	c := r.Cleanup
	fmt.Fprintf(&b, "\ncleanup: %d created, %d deleted", c.Created, c.Deleted)
	if c.Recovered > 0 {
		fmt.Fprintf(&b, ", %d of killed runs", c.Recovered)
	}
	switch {
	case !c.Verified:
		b.WriteString(" (ListVolumes not asked)\n")
	case len(c.Leftover) == 0:
		b.WriteString("; ListVolumes shows none left\n")
	default:
		fmt.Fprintf(&b, "; LEFT BEHIND: %s\n", strings.Join(c.Leftover, " "))
	}
	if r.Interrupted {
		b.WriteString("interrupted: the figures cover what ran\n")
	}
	if r.Errors.Count > 0 {
		fmt.Fprintf(&b, "%d units failed; the first errors:\n", r.Errors.Count)
		for _, e := range r.Errors.First {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
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
