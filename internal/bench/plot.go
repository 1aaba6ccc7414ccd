package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Plot geometry, in SVG user units (pixels).
const (
	plotLabelW = 330
	plotChartW = 560
	plotRightW = 30
	plotRowH   = 22
	plotTop    = 84
	plotBottom = 50
)

// WriteSVG draws the summary as a small SVG bar chart: for each RPC of each
// measurement, its p50 and p99 latency on a logarithmic axis, with the
// floors' p50s (Probe's round trip, a bare bbolt commit, and a bare mkfs +
// mount when measured) as vertical lines.
// It is hand-written SVG: no plotting dependency.
func (r *Report) WriteSVG(w io.Writer) error {
	rows := r.plotRows()
	floors := r.plotFloors()
	sc := newLogScale(rows, floors...)
	height := plotTop + len(rows)*plotRowH + plotBottom
	width := plotLabelW + plotChartW + plotRightW
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	r.plotHeader(&b)
	axisY := plotTop + len(rows)*plotRowH
	for d := sc.lmin; d <= sc.lmax; d++ {
		xx := sc.x(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e2e8f0"/>`+"\n", xx, plotTop-6, xx, axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xx, axisY+16, decade(d))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">latency (log scale)</text>`+"\n", plotLabelW+plotChartW/2, axisY+36)
	for i, rw := range rows {
		y := plotTop + i*plotRowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", plotLabelW-8, y+13, html.EscapeString(rw.label))
		if rw.p50 > 0 {
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="8" fill="#2b6cb0"><title>p50 %s ms</title></rect>`+"\n",
				plotLabelW, y+2, sc.x(rw.p50)-plotLabelW, ms(rw.p50))
		}
		if rw.p99 > 0 {
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="8" fill="#90cdf4"><title>p99 %s ms</title></rect>`+"\n",
				plotLabelW, y+11, sc.x(rw.p99)-plotLabelW, ms(rw.p99))
		}
	}
	for i, name := range []string{"Probe", "bbolt", "mkfs+mount"} {
		if i >= len(floors) || floors[i] <= 0 {
			continue
		}
		xx := sc.x(floors[i])
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c53030" stroke-dasharray="4 3"/>`+"\n", xx, plotTop-6-12*i, xx, axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#c53030" text-anchor="middle">%s</text>`+"\n", xx, plotTop-8-12*i, name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// plotFloors are the floors' p50s: Probe, bbolt and, when measured, mkfs+mount.
func (r *Report) plotFloors() []float64 {
	out := []float64{r.Floor.Probe.P50, r.Floor.BoltUpdate.P50}
	if r.Floor.MkfsMount != nil {
		out = append(out, r.Floor.MkfsMount.P50)
	}
	return out
}

// plotRow is one bar pair of the chart: an RPC of a phase at a concurrency.
type plotRow struct {
	label    string
	p50, p99 float64
}

// plotRows lists the chart's rows, every RPC of every phase but the floor.
func (r *Report) plotRows() []plotRow {
	var rows []plotRow
	for _, s := range r.Summary {
		if s.Phase == string(PhaseFloor) {
			continue
		}
		for _, st := range s.RPCs {
			l := fmt.Sprintf("%s c=%d", s.Phase, s.Concurrency)
			if s.Baseline {
				l = "baseline " + l
			}
			if s.Phase == string(PhaseScale) {
				l += fmt.Sprintf(" existing=%d", s.Existing)
			}
			rows = append(rows, plotRow{label: l + "  " + st.Method, p50: st.P50, p99: st.P99})
		}
	}
	return rows
}

// logScale maps latencies to x on whole decades covering every value shown.
type logScale struct{ lmin, lmax float64 }

func newLogScale(rows []plotRow, floors ...float64) logScale {
	lo, hi := math.Inf(1), 0.0
	see := func(v float64) {
		if v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	for _, rw := range rows {
		see(rw.p50)
		see(rw.p99)
	}
	for _, f := range floors {
		see(f)
	}
	if hi == 0 {
		lo, hi = 1e-4, 1
	}
	sc := logScale{math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))}
	if sc.lmax <= sc.lmin {
		sc.lmax = sc.lmin + 1
	}
	return sc
}

func (sc logScale) x(v float64) float64 {
	if v <= 0 {
		return plotLabelW
	}
	return plotLabelW + (math.Log10(v)-sc.lmin)/(sc.lmax-sc.lmin)*plotChartW
}

// plotHeader writes the chart's title and legend.
func (r *Report) plotHeader(b *strings.Builder) {
	title := fmt.Sprintf("csid bench: %s %s, latency per RPC (medians of %d round(s), %d units each)",
		r.Target.Driver, r.Target.Version, r.Config.Rounds, r.Config.Count)
	fmt.Fprintf(b, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(b, `<rect x="10" y="34" width="14" height="8" fill="#2b6cb0"/><text x="28" y="42">p50</text>`+"\n")
	fmt.Fprintf(b, `<rect x="70" y="34" width="14" height="8" fill="#90cdf4"/><text x="88" y="42">p99</text>`+"\n")
	floors := fmt.Sprintf("floor p50: Probe round trip %s ms, bbolt commit %s ms", ms(r.Floor.Probe.P50), ms(r.Floor.BoltUpdate.P50))
	if m := r.Floor.MkfsMount; m != nil {
		floors += fmt.Sprintf(", mkfs+mount %s ms", ms(m.P50))
	}
	fmt.Fprintf(b, `<line x1="130" y1="38" x2="150" y2="38" stroke="#c53030" stroke-dasharray="4 3"/><text x="154" y="42">%s (%s)</text>`+"\n",
		floors, html.EscapeString(r.Floor.FSType))
}

// decade labels 10^d seconds.
func decade(d float64) string {
	v := math.Pow(10, d)
	switch {
	case v >= 1:
		return fmt.Sprintf("%g s", math.Round(v))
	case v >= 1e-3:
		return fmt.Sprintf("%g ms", math.Round(v*1e3))
	default:
		return fmt.Sprintf("%g µs", math.Round(v*1e6))
	}
}
