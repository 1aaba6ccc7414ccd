// Package drill is csid's crash-recovery drill. It starts the real csid
// binary (all-in-one, local backend, a temporary state dir), drives volumes
// through scenarios the way an orchestrator does — including its retries
// with the same arguments after an error or a deadline — kills csid with
// SIGKILL at each hit of each crash point a scenario reaches, restarts it,
// lets the retries come, and checks the invariants of csid's design:
//
//  1. every volume went through legal transitions that explain its state;
//  2. every accepted op completed (none left queued, none failed);
//  3. nothing leaked: no disk, loop device, mount or attachment is left once
//     the scenario has brought everything down;
//  4. no volume was attached while its resize was queued or running;
//  5. data written before the crash reads back after it;
//  6. a read through a volume's target returns that volume's data, never
//     another's (markers at the start of raw block devices), and a publish
//     of a volume whose disk was detached behind the node's back is refused.
//
// A census run of each scenario first counts which crash points it
// reaches and how often (the points are compiled into csid, inert unless
// armed); then each hit is a cell of the matrix. Every crash point must fire
// somewhere, or the drill fails.
package drill

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/crash"
)

// Config configures a drill.
type Config struct {
	// Binary is the csid executable to drill (default: this executable).
	Binary string
	// Dir is where the cells' temporary state dirs go (default: the system
	// temporary directory). Keep its path short: a unix socket path holds
	// at most 107 bytes.
	Dir string
	// Scenarios and Points select parts of the matrix (default: all).
	Scenarios []string
	Points    []string
	// FirstHitOnly kills csid at the first hit of each point only, instead
	// of at every hit the census counted.
	FirstHitOnly bool
	// Keep keeps the state dirs of passing cells too.
	Keep bool
	// Progress, if set, receives one line per cell as it starts.
	Progress func(done, total int, c Cell)
	// Backend, if set, is the cloud csid runs on instead of the local
	// backend (its scenarios that need the local backend are refused).
	Backend *Backend
}

// Cell is one case of the matrix: a scenario with csid killed at one hit of
// one crash point.
type Cell struct {
	Scenario string `json:"scenario"`
	Point    string `json:"point"`
	Hit      int    `json:"hit"`
	// Result is "pass", "fail", or "not-reached" (the point did not fire in
	// this run although the census counted it: a timing-dependent hit).
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
	// Restarts is how many times csid was restarted after a crash.
	Restarts int     `json:"restarts"`
	Seconds  float64 `json:"seconds"`
	// Dir is the state dir and logs of a failing cell, kept for inspection.
	Dir string `json:"dir,omitempty"`
}

// Report is the outcome of a drill.
type Report struct {
	Cells []Cell `json:"cells"`
	// Census is, per scenario, how often each crash point was reached.
	Census map[string]map[string]int `json:"census"`
	// Fired counts, per crash point, the cells in which it fired.
	Fired map[string]int `json:"fired"`
	// Unfired lists the crash points that never fired: a failure.
	Unfired []string `json:"unfired,omitempty"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
	Seconds float64  `json:"seconds"`
	// Interrupted is set when the drill was stopped before the end.
	Interrupted bool `json:"interrupted,omitempty"`
}

// OK reports whether the drill passed: no failing cell, every crash point
// fired, not interrupted.
func (r *Report) OK() bool { return r.Failed == 0 && len(r.Unfired) == 0 && !r.Interrupted }

// Results
const (
	Pass       = "pass"
	Fail       = "fail"
	NotReached = "not-reached"
)

// Run runs the drill. It returns the report of what ran, also when ctx ends
// early (then Interrupted is set); cells that were running are cleaned up.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	scenarios, points, err := cfg.check()
	if err != nil {
		return nil, err
	}
	rep := &Report{Census: map[string]map[string]int{}, Fired: map[string]int{}}
	plans, err := planCells(ctx, cfg, scenarios, points, rep)
	if err != nil || rep.Interrupted {
		return rep, err
	}
	for i, pl := range plans {
		if ctx.Err() != nil {
			rep.Interrupted = true
			break
		}
		if cfg.Progress != nil {
			cfg.Progress(i, len(plans), Cell{Scenario: pl.sc.Name, Point: pl.point, Hit: pl.hit})
		}
		c := runCell(ctx, cfg, pl.sc, pl.point, pl.hit)
		if ctx.Err() != nil && c.Result == Fail {
			scrub(c.Dir, false) // not a failure of csid: the drill was stopped
			rep.Interrupted = true
			break
		}
		rep.add(c)
	}
	if cfg.Progress != nil && !rep.Interrupted {
		cfg.Progress(len(plans), len(plans), Cell{})
	}
	if !rep.Interrupted {
		for _, p := range points {
			if rep.Fired[p] == 0 {
				rep.Unfired = append(rep.Unfired, p)
			}
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// check fills in the binary (this one) and returns the scenarios and the
// crash points to drill, refusing unknown ones and a run without root.
func (cfg *Config) check() ([]scenario, []string, error) {
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, nil, err
		}
		cfg.Binary = exe
	}
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("the drill needs root: csid's local backend uses loop devices, mkfs and mounts")
	}
	scenarios, err := pick(cfg.Scenarios)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Backend != nil {
		for _, sc := range scenarios {
			if sc.localOnly {
				return nil, nil, fmt.Errorf("scenario %s needs the local backend, not %s", sc.Name, cfg.Backend.Name)
			}
		}
	}
	points := slices.Sorted(slices.Values(cfg.Points)) // a copy: the caller's slice stays as it was
	if len(points) == 0 {
		points = slices.Sorted(maps.Keys(crash.Points))
	}
	for _, p := range points {
		if _, ok := crash.Points[p]; !ok {
			return nil, nil, fmt.Errorf("unknown crash point %q", p)
		}
	}
	return scenarios, points, nil
}

// cellPlan is one cell to run: a scenario killed at a point's n-th hit.
type cellPlan struct {
	sc    scenario
	point string
	hit   int
}

// planCells runs each scenario's census and lists the cells: every hit of
// every point it reaches (or the first, with FirstHitOnly). An interrupted
// census marks the report interrupted.
func planCells(ctx context.Context, cfg Config, scenarios []scenario, points []string, rep *Report) ([]cellPlan, error) {
	var plans []cellPlan
	for _, sc := range scenarios {
		census, err := runCensus(ctx, cfg, sc)
		if err != nil {
			if ctx.Err() != nil {
				rep.Interrupted = true
				return nil, nil
			}
			return nil, fmt.Errorf("census of scenario %s: %w", sc.Name, err)
		}
		rep.Census[sc.Name] = census
		for _, p := range points {
			hits := census[p]
			if cfg.FirstHitOnly {
				hits = min(hits, 1)
			}
			for h := 1; h <= hits; h++ {
				plans = append(plans, cellPlan{sc, p, h})
			}
		}
	}
	return plans, nil
}

// add counts a cell's result in the report.
func (r *Report) add(c Cell) {
	r.Cells = append(r.Cells, c)
	switch c.Result {
	case Pass:
		r.Passed++
		r.Fired[c.Point]++
	case Fail:
		r.Failed++
		if c.Restarts > 0 {
			r.Fired[c.Point]++
		}
	}
}

func pick(names []string) ([]scenario, error) {
	if len(names) == 0 {
		return Scenarios, nil
	}
	var out []scenario
	for _, n := range names {
		i := slices.IndexFunc(Scenarios, func(s scenario) bool { return s.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown scenario %q", n)
		}
		out = append(out, Scenarios[i])
	}
	return out, nil
}

// runCensus runs a scenario with every crash point counting instead of
// firing during its main part, and returns how often each was reached.
func runCensus(ctx context.Context, cfg Config, sc scenario) (map[string]int, error) {
	dir, err := os.MkdirTemp(cfg.Dir, "csid-census-")
	if err != nil {
		return nil, err
	}
	defer scrub(dir, false)
	cc, err := cfg.openCloud(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	c := &cell{binary: cfg.Binary, dir: dir, cloud: cc, scale: cfg.scale(), census: filepath.Join(dir, "census"), vols: map[string]*volume{}, snaps: map[string]*snap{}}
	if err := c.scenario(ctx, sc); err != nil {
		return nil, fmt.Errorf("%w (logs in %s/csid.log)", err, dir)
	}
	raw, err := os.ReadFile(c.census)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	counts := map[string]int{}
	for _, p := range strings.Fields(string(raw)) {
		counts[p]++
	}
	return counts, nil
}

// scenario runs setup unarmed, main armed, end unarmed, then stops csid.
func (c *cell) scenario(ctx context.Context, sc scenario) error {
	parts := []struct {
		armed bool
		f     func(context.Context, *cell) error
	}{{false, sc.setup}, {true, sc.main}, {false, sc.end}}
	for _, part := range parts {
		if c.p == nil || c.armed != part.armed {
			if err := c.run(ctx, part.armed); err != nil {
				return err
			}
		}
		if part.f != nil {
			if err := part.f(ctx, c); err != nil {
				return err
			}
		}
	}
	return c.p.stop()
}

// runCell runs one cell and checks the invariants afterwards.
func runCell(ctx context.Context, cfg Config, sc scenario, point string, hit int) Cell {
	started := time.Now()
	res := Cell{Scenario: sc.Name, Point: point, Hit: hit}
	dir, err := os.MkdirTemp(cfg.Dir, "csid-drill-")
	if err != nil {
		res.Result, res.Reason = Fail, err.Error()
		return res
	}
	cc, err := cfg.openCloud(ctx, dir)
	if err != nil {
		res.Result, res.Reason, res.Dir = Fail, err.Error(), dir
		return res
	}
	defer cc.Close()
	c := &cell{binary: cfg.Binary, dir: dir, cloud: cc, scale: cfg.scale(), point: point, hit: hit, vols: map[string]*volume{}, snaps: map[string]*snap{}}
	err = c.scenario(ctx, sc)
	if err == nil {
		err = verify(ctx, dir, cc, c.refused, len(c.snaps) > 0)
	}
	fired, _ := os.ReadFile(filepath.Join(dir, "fired"))
	res.Restarts = c.restarts
	res.Seconds = time.Since(started).Seconds()
	switch {
	case err != nil:
		if c.p != nil {
			c.p.kill()
		}
		res.Result, res.Reason, res.Dir = Fail, err.Error(), dir
		scrub(dir, true)
		return res
	case strings.TrimSpace(string(fired)) != point:
		res.Result = NotReached
	default:
		res.Result = Pass
	}
	if cfg.Keep {
		res.Dir = dir
	} else {
		scrub(dir, false)
	}
	return res
}

// Summary is a one-line account of a report.
func (r *Report) Summary() string {
	s := fmt.Sprintf("%d cells: %d passed, %d failed", len(r.Cells), r.Passed, r.Failed)
	if n := len(r.Cells) - r.Passed - r.Failed; n > 0 {
		s += fmt.Sprintf(", %d not reached", n)
	}
	if len(r.Unfired) > 0 {
		s += fmt.Sprintf("; crash points that never fired: %s", strings.Join(r.Unfired, ", "))
	}
	if r.Interrupted {
		s += " (interrupted)"
	}
	return s + fmt.Sprintf(" in %.0fs", r.Seconds)
}
