package drill

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Table writes the matrix: one row per crash point, one column per
// scenario; a cell says how many of its hits passed ("3/3"), "FAIL" with
// the failing hits, or "-" when the scenario does not reach the point.
func (r *Report) Table(w io.Writer) error {
	var scenarios []string
	for _, s := range Scenarios {
		if _, ok := r.Census[s.Name]; ok {
			scenarios = append(scenarios, s.Name)
		}
	}
	type agg struct {
		pass, total int
		failed      []string
	}
	cells := map[[2]string]*agg{}
	var points []string
	for _, c := range r.Cells {
		k := [2]string{c.Point, c.Scenario}
		a := cells[k]
		if a == nil {
			a = &agg{}
			cells[k] = a
		}
		a.total++
		switch c.Result {
		case Pass:
			a.pass++
		case Fail:
			a.failed = append(a.failed, fmt.Sprint(c.Hit))
		}
		if !slices.Contains(points, c.Point) {
			points = append(points, c.Point)
		}
	}
	slices.Sort(points)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "crash point\t%s\n", strings.Join(scenarios, "\t"))
	for _, p := range points {
		row := []string{p}
		for _, s := range scenarios {
			a := cells[[2]string{p, s}]
			switch {
			case a == nil:
				row = append(row, "-")
			case len(a.failed) > 0:
				row = append(row, "FAIL (hit "+strings.Join(a.failed, ",")+")")
			default:
				row = append(row, fmt.Sprintf("%d/%d", a.pass, a.total))
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
