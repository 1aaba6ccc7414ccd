// Package bench is a load generator that speaks CSI to any endpoint (csid
// or another driver): it measures the throughput and the latency of each
// RPC in phases (probe, create, delete, the full lifecycle of a volume, and
// create+delete with many volumes around), beside floors measured in the
// same run (the gRPC round trip of Probe, a bare bbolt commit, and a bare
// mkfs + mount of a volume's size), optionally against a second driver (a
// baseline) measured in the same run, and cleans up every volume it
// created, also after Ctrl-C, and after a run that was killed (see
// journal). `csid bench` is a thin command around Run.
//
// Only what the driver advertises is called: ControllerPublish and
// ControllerUnpublish with PUBLISH_UNPUBLISH_VOLUME, NodeStage and
// NodeUnstage with STAGE_UNSTAGE_VOLUME, ListVolumes with LIST_VOLUMES.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Phase is one kind of measurement.
type Phase string

// The phases, in the order a round runs them.
const (
	// PhaseProbe: Probe calls; the throughput of the bare gRPC path.
	PhaseProbe Phase = "probe"
	// PhaseCreate: CreateVolume calls; the volumes are left for PhaseDelete.
	PhaseCreate Phase = "create"
	// PhaseDelete: DeleteVolume calls of the volumes PhaseCreate made (or,
	// if it did not run, of volumes made beforehand, untimed).
	PhaseDelete Phase = "delete"
	// PhaseLifecycle: each unit is one volume's whole life: create,
	// controller publish, stage, publish, unpublish, unstage, controller
	// unpublish, delete.
	PhaseLifecycle Phase = "lifecycle"
	// PhaseScale: each unit is a create then a delete of one volume,
	// measured with no volumes of the run around and with Existing volumes
	// created beforehand (untimed), alternately.
	PhaseScale Phase = "scale"
	// PhaseFloor is a floor, measured at concurrency 1 in every round:
	// at its start, Probe's round trip and a bare bbolt commit,
	// interleaved (always measured); with the lifecycle phase, a bare
	// mkfs + mount of a volume's size, between the units of its lane of
	// concurrency 1 or, with none, right before it (see
	// Config.MkfsFloorSamples).
	PhaseFloor Phase = "floor"
)

// Phases lists the phases Config.Phases may name, in the order they run.
var Phases = []Phase{PhaseProbe, PhaseCreate, PhaseDelete, PhaseLifecycle, PhaseScale}

// Config configures a run. Zero values take the defaults named.
type Config struct {
	// Endpoint is the driver's gRPC address: unix:///path, /path, or
	// host:port.
	Endpoint string
	// Baseline, if set, is a second driver's address, measured in the same
	// run: every phase runs on both, their slices interleaved like the
	// concurrencies', and the report adds ratios of Endpoint's rates over
	// Baseline's ("endpoint"). The floors are measured on Endpoint only;
	// NodeID applies to Endpoint only (the baseline publishes to its
	// NodeGetInfo's node).
	Baseline string
	// Phases to run (default all, in Phases order).
	Phases []Phase
	// Concurrency lists the numbers of workers to run each phase with
	// (default [8]). With several, each round runs every phase at each,
	// in an order that alternates from round to round.
	Concurrency []int
	// Count is the units per measurement (default 100): calls for probe,
	// create and delete, lifecycles, create+delete pairs for scale.
	Count int
	// Existing is the volumes the scale phase creates before its second
	// measurement (default 1000; 0 measures only without).
	Existing int
	// Rounds repeats everything (default 1); the summary gives medians.
	Rounds int
	// Slices cuts each measurement into this many slices, run alternately
	// at each concurrency (default: enough for each worker of the highest
	// concurrency to run 25 units per slice; 1 with one concurrency).
	Slices int
	// SizeBytes is each volume's required size (default 64 MiB).
	SizeBytes int64
	// AccessType is "mount" (default) or "block"; FsType the mount's
	// filesystem (default "ext4").
	AccessType string
	FsType     string
	// Parameters are passed to CreateVolume.
	Parameters map[string]string
	// NodeID is the node to publish to (default: NodeGetInfo's).
	NodeID string
	// StagingDir and TargetDir are where volumes are staged and published,
	// one directory each per volume (default: "staging" and "target" in a
	// new temporary directory, removed at the end). They must be paths the
	// node plugin can reach.
	StagingDir, TargetDir string
	// Prefix starts every volume name (default "csid-bench-"); a random
	// run id follows it.
	Prefix string
	// Timeout bounds each RPC (default 2m).
	Timeout time.Duration
	// FloorSamples is the Probe and bbolt samples of the floor per round
	// (default 200).
	FloorSamples int
	// FloorDir is where the floors work, in a directory of the run's own
	// (the bbolt file, the mkfs+mount floor's image; see scratch.go),
	// default the temporary directory: put it on the driver's state file
	// system to compare like with like.
	FloorDir string
	// MkfsFloorSamples is the mkfs+mount samples of the floor per round
	// (default 24; at most Count, more are taken as Count; negative: none).
	// Each binds a sparse file of SizeBytes in FloorDir to a loop device,
	// formats it as csid does (mkfs.FsType with csid's options) and mounts
	// it (mount(8), csid's arguments): the timed part; then unmounts it,
	// releases the device and removes the file. The samples are taken
	// between the units of the lifecycle's lane of concurrency 1, spread
	// evenly, and the lifecycle's time leaves them out (floorBetween); with
	// no such lane, back to back before the lifecycle. It is measured only
	// as root, when the lifecycle phase runs with the mount access type
	// (Report.Floor.MkfsMountAbsent says why not).
	MkfsFloorSamples int
	// JournalDir keeps the journals of runs (default
	// $XDG_CACHE_HOME/csid-bench, or ~/.cache/csid-bench).
	JournalDir string
	// CleanupOnly cleans up after killed runs against Endpoint, and stops.
	CleanupOnly bool
	// Progress, if set, receives a progress line, redrawn in place.
	Progress io.Writer
	// Abandon, if set, ends the cleanup when closed (a second Ctrl-C);
	// what is left is cleaned up by the next run.
	Abandon <-chan struct{}
}

// fillConcurrency is the least concurrency the scale phase creates and
// deletes its Existing volumes with.
const fillConcurrency = 16

func (c *Config) defaults() error {
	if c.Endpoint == "" {
		return errors.New("no endpoint")
	}
	if len(c.Phases) == 0 {
		c.Phases = slices.Clone(Phases)
	}
	for _, p := range c.Phases {
		if !slices.Contains(Phases, p) {
			return fmt.Errorf("unknown phase %q (%s)", p, strings.Join(phaseNames(Phases), ", "))
		}
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{8}
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			return fmt.Errorf("concurrency %d: at least 1", n)
		}
	}
	switch {
	case c.Count < 0, c.Existing < 0, c.Rounds < 0, c.Slices < 0, c.SizeBytes < 0, c.FloorSamples < 0:
		return errors.New("counts, rounds and sizes must not be negative")
	case c.Baseline != "" && grpcTarget(c.Baseline) == grpcTarget(c.Endpoint):
		return fmt.Errorf("the baseline %s is the endpoint itself", c.Baseline)
	}
	if c.Count == 0 {
		c.Count = 100
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.SizeBytes == 0 {
		c.SizeBytes = 64 << 20
	}
	switch c.AccessType {
	case "":
		c.AccessType = "mount"
	case "mount", "block":
	default:
		return fmt.Errorf("access type %q: mount or block", c.AccessType)
	}
	if c.FsType == "" && c.AccessType == "mount" {
		c.FsType = "ext4"
	}
	if c.Prefix == "" {
		c.Prefix = "csid-bench-"
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.FloorSamples == 0 {
		c.FloorSamples = 200
	}
	if c.MkfsFloorSamples == 0 {
		c.MkfsFloorSamples = 24
	}
	c.MkfsFloorSamples = min(c.MkfsFloorSamples, c.Count) // at most one after each lifecycle unit
	if c.FloorDir == "" {
		c.FloorDir = os.TempDir()
	}
	if c.JournalDir == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		c.JournalDir = filepath.Join(dir, "csid-bench")
	}
	return nil
}

// volume is a volume the run made, and what it may have done to it: a
// flag is set before the call that might do it and cleared after the
// call that undoes it, so the cleanup undoes whatever may have happened.
type volume struct {
	ep              *endpoint
	name, id        string
	staging, target string
	ctrlPublished   bool
	staged          bool
	published       bool
}

// lane is one series of a measurement: an endpoint at a concurrency.
type lane struct {
	ep   *endpoint
	conc int
}

// runner is one run.
type runner struct {
	cfg    Config
	eps    []*endpoint // the endpoint under test, then the baseline
	prefix string
	seed   uint64 // scatters the names of the run
	seq    atomic.Uint64
	report *Report
	prog   *progress

	mu      sync.Mutex
	live    map[string]*volume // created or being created, not deleted
	pending map[lane][]*volume // made by the create phase, for the delete phase
	errs    []string
	nerrs   int
	deleted int
	// scratchLeft: the floors' scratch directory could not be removed.
	scratchLeft bool
}

// Run runs the benchmark and cleans up after it. ctx ending (Ctrl-C)
// stops the measurements; the cleanup then runs on (until Config.Abandon
// is closed). The report is returned also when measurements failed: RPC
// errors are in it, not in the error, which is for a run that could not
// start or could not clean up.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, prog: newProgress(cfg.Progress), live: map[string]*volume{}, pending: map[lane][]*volume{},
		report: &Report{Schema: Schema, StartedAt: time.Now().UTC().Truncate(time.Second)}}
	defer r.disconnect()
	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	cctx, cancel := cleanupContext(ctx, cfg.Abandon)
	defer cancel()
	if err := r.recoverDeadRuns(cctx); err != nil {
		return r.report, err
	}
	if cfg.CleanupOnly {
		r.summarise()
		return r.report, nil
	}
	for _, ep := range r.eps {
		if err := ep.checkPhases(r.cfg.Phases); err != nil {
			return nil, err
		}
	}
	cleanupDirs, err := r.prepareDirs()
	if err != nil {
		return nil, err
	}
	defer cleanupDirs()
	id := runID()
	r.prefix = cfg.Prefix + id + "-"
	r.seed, _ = strconv.ParseUint(id, 16, 64)
	r.report.Config.Prefix = r.prefix
	if err := r.createJournals(id); err != nil {
		return nil, err
	}
	start := time.Now()
	runErr := r.rounds(ctx, id)
	r.report.ElapsedSeconds = time.Since(start).Seconds()
	r.report.Interrupted = ctx.Err() != nil
	cleanErr := r.cleanup(cctx)
	r.summarise()
	return r.report, errors.Join(runErr, cleanErr)
}

// connect dials the endpoint and the baseline, and asks each who it is and
// what it serves.
func (r *runner) connect(ctx context.Context) error {
	addrs := []string{r.cfg.Endpoint}
	if r.cfg.Baseline != "" {
		addrs = append(addrs, r.cfg.Baseline)
	}
	for i, addr := range addrs {
		ep, err := dial(addr, i > 0)
		if err != nil {
			return err
		}
		r.eps = append(r.eps, ep)
		nodeID := r.cfg.NodeID
		if ep.baseline {
			nodeID = ""
		}
		dctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		err = ep.discover(dctx, &r.cfg, nodeID)
		cancel()
		if err != nil {
			return err
		}
	}
	r.report.Target = r.eps[0].info
	if len(r.eps) > 1 {
		baseline := r.eps[1].info
		r.report.Baseline = &baseline
	}
	r.report.Config = ReportConfig{Phases: phaseNames(r.cfg.Phases), Concurrency: r.cfg.Concurrency, Count: r.cfg.Count,
		Existing: r.cfg.Existing, Rounds: r.cfg.Rounds, Slices: r.slices(r.lanes(r.cfg.Concurrency)), SizeBytes: r.cfg.SizeBytes,
		AccessType: r.cfg.AccessType, FsType: r.cfg.FsType, TimeoutSeconds: r.cfg.Timeout.Seconds()}
	return nil
}

// disconnect closes the endpoints' connections.
func (r *runner) disconnect() {
	for _, ep := range r.eps {
		ep.conn.Close()
	}
}

// createJournals makes the journal of each endpoint: run id's, and the
// baseline's beside it.
func (r *runner) createJournals(id string) error {
	for _, ep := range r.eps {
		name := id
		if ep.baseline {
			name += "-baseline"
		}
		j, err := createJournal(r.cfg.JournalDir, name, ep.header)
		if err != nil {
			for _, made := range r.eps {
				if made.jrnl != nil {
					made.jrnl.close(true) // nothing created yet
					made.jrnl = nil
				}
			}
			return err
		}
		ep.jrnl = j
	}
	return nil
}

// lanes are the series of a measurement at concs: each endpoint at each.
func (r *runner) lanes(concs []int) []lane {
	var out []lane
	for _, ep := range r.eps {
		for _, c := range concs {
			out = append(out, lane{ep, c})
		}
	}
	return out
}

// cleanupContext outlives ctx (Ctrl-C stops the measurements, not the
// cleanup) and ends when abandon is closed.
func cleanupContext(ctx context.Context, abandon <-chan struct{}) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if abandon != nil {
		go func() {
			select {
			case <-abandon:
				cancel()
			case <-cctx.Done():
			}
		}()
	}
	return cctx, cancel
}

func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func phaseNames(ps []Phase) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// prepareDirs makes the staging and target base directories; the returned
// func removes what prepareDirs made.
func (r *runner) prepareDirs() (func(), error) {
	if !slices.Contains(r.cfg.Phases, PhaseLifecycle) {
		return func() {}, nil
	}
	var tmp string
	if r.cfg.StagingDir == "" || r.cfg.TargetDir == "" {
		var err error
		if tmp, err = os.MkdirTemp("", "csid-bench-"); err != nil {
			return nil, err
		}
		if r.cfg.StagingDir == "" {
			r.cfg.StagingDir = filepath.Join(tmp, "staging")
		}
		if r.cfg.TargetDir == "" {
			r.cfg.TargetDir = filepath.Join(tmp, "target")
		}
	}
	for _, d := range []string{r.cfg.StagingDir, r.cfg.TargetDir} {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("%s: the staging and target directories must be absolute paths", d)
		}
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	return func() {
		if tmp != "" {
			_ = os.RemoveAll(tmp) // only empty directories are left, once the cleanup unpublished everything
		}
	}, nil
}

// rounds runs every round: the floor, then each phase on every lane (each
// endpoint at each concurrency), interleaved (see measure); with the
// lifecycle phase, the mkfs+mount floor, between the units of its lane of
// concurrency 1 (floorBetween) or, with none, right before it (mkfsFloor).
func (r *runner) rounds(ctx context.Context, id string) (err error) {
	scratch, err := r.makeScratch(id)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := removeScratch(scratch); rerr != nil {
			r.scratchLeft = true // the journal keeps it for the next run
			err = errors.Join(err, rerr)
		}
	}()
	db, err := openFloor(scratch)
	if err != nil {
		return err
	}
	defer db.close()
	r.report.Floor.Dir, r.report.Floor.FSType = r.cfg.FloorDir, fsType(r.cfg.FloorDir)
	mf, err := r.openMkfsFloor(scratch)
	if err != nil {
		return err
	}
	for round := 1; round <= r.cfg.Rounds && ctx.Err() == nil; round++ {
		r.add(r.floor(ctx, round, db))
		lanes := r.lanes(r.cfg.Concurrency)
		if round%2 == 0 {
			slices.Reverse(lanes)
		}
		for _, p := range Phases {
			if !slices.Contains(r.cfg.Phases, p) || ctx.Err() != nil {
				continue
			}
			var between *floorBetween
			if p == PhaseLifecycle && mf != nil {
				if slices.ContainsFunc(lanes, isFloorLane) {
					between = r.newFloorBetween(round, mf)
				} else {
					r.add(r.mkfsFloor(ctx, round, mf))
				}
			}
			for _, res := range r.phase(ctx, p, round, lanes, between) {
				r.add(res)
			}
			if between != nil {
				r.add(between.result())
			}
		}
	}
	return nil
}

func (r *runner) add(res Result) {
	r.report.Results = append(r.report.Results, res)
}

// phase runs one phase on every lane; it returns a result per lane (per
// lane and number of existing volumes for scale).
func (r *runner) phase(ctx context.Context, p Phase, round int, lanes []lane, between *floorBetween) []Result {
	base := Result{Phase: string(p), Round: round, Count: r.cfg.Count}
	switch p {
	case PhaseProbe:
		base.Unit = "Probe"
		return r.measure(ctx, base, lanes, func(ctx context.Context, s *samples, ln lane, _ int) error {
			return r.call(ctx, s, "Probe", func(ctx context.Context) error {
				_, err := ln.ep.csi.Probe(ctx, &csi.ProbeRequest{})
				return err
			})
		})
	case PhaseCreate:
		base.Unit = "CreateVolume"
		return r.measure(ctx, base, lanes, func(ctx context.Context, s *samples, ln lane, _ int) error {
			v := r.newVolume(ln.ep, false)
			if err := r.create(ctx, s, v); err != nil {
				return err
			}
			r.mu.Lock()
			r.pending[ln] = append(r.pending[ln], v)
			r.mu.Unlock()
			return nil
		})
	case PhaseDelete:
		base.Unit = "DeleteVolume"
		r.mu.Lock()
		vols := r.pending
		r.pending = map[lane][]*volume{}
		r.mu.Unlock()
		for _, ln := range lanes {
			if missing := r.cfg.Count - len(vols[ln]); missing > 0 {
				label := fmt.Sprintf("round %d delete c=%d%s: creating %d volumes to delete", round, ln.conc, ln.ep.suffix(), missing)
				vols[ln] = append(vols[ln], r.createUntimed(ctx, ln.ep, missing, ln.conc, label)...)
			}
		}
		return r.measure(ctx, base, lanes, func(ctx context.Context, s *samples, ln lane, i int) error {
			if i >= len(vols[ln]) {
				return fmt.Errorf("no volume to delete (their creation failed)")
			}
			return r.delete(ctx, s, vols[ln][i])
		})
	case PhaseLifecycle:
		base.Unit = "lifecycle"
		return r.measure(ctx, base, lanes, func(ctx context.Context, s *samples, ln lane, i int) error {
			err := r.lifecycle(ctx, s, ln, i)
			if err == nil && between != nil {
				between.after(ctx, s, ln, i)
			}
			return err
		})
	case PhaseScale:
		return r.scale(ctx, base, lanes)
	}
	return nil
}

// scale measures create+delete pairs without the run's volumes around and
// with Existing of them (on each endpoint), in an order that alternates
// from round to round (odd: none first; even: Existing first), creating
// the Existing volumes before and deleting them after their measurement.
func (r *runner) scale(ctx context.Context, base Result, lanes []lane) []Result {
	base.Unit = "create+delete"
	// pairs measures with existing volumes around, by endpoint (the
	// baseline's is true); nil: none. The label counts the endpoint's.
	pairs := func(existing map[bool]int) []Result {
		b := base
		b.Existing = existing[false]
		res := r.measure(ctx, b, lanes, func(ctx context.Context, s *samples, ln lane, _ int) error {
			v := r.newVolume(ln.ep, false)
			if err := r.create(ctx, s, v); err != nil {
				return err
			}
			return r.delete(ctx, s, v)
		})
		for i := range res {
			res[i].Existing = existing[res[i].Baseline]
		}
		return res
	}
	if r.cfg.Existing == 0 {
		return pairs(nil)
	}
	fillConc := max(fillConcurrency, slices.Max(r.cfg.Concurrency)) // as the cleanup's
	withExisting := func() []Result {
		fills := map[*endpoint][]*volume{}
		existing := map[bool]int{}
		for _, ep := range r.eps {
			label := fmt.Sprintf("round %d scale%s: creating %d volumes", base.Round, ep.suffix(), r.cfg.Existing)
			fills[ep] = r.createUntimed(ctx, ep, r.cfg.Existing, fillConc, label)
			existing[ep.baseline] = len(fills[ep])
		}
		res := pairs(existing)
		for _, ep := range r.eps {
			label := fmt.Sprintf("round %d scale%s: deleting %d volumes", base.Round, ep.suffix(), len(fills[ep]))
			r.deleteUntimed(ctx, fills[ep], fillConc, label)
		}
		return res
	}
	if base.Round%2 == 1 {
		return append(pairs(nil), withExisting()...)
	}
	return append(withExisting(), pairs(nil)...)
}

// lifecycle is one unit of the lifecycle phase.
func (r *runner) lifecycle(ctx context.Context, s *samples, ln lane, _ int) error {
	ep := ln.ep
	v := r.newVolume(ep, true)
	if err := r.create(ctx, s, v); err != nil {
		return err
	}
	var pc map[string]string
	if ep.caps.publish {
		v.ctrlPublished = true
		err := r.call(ctx, s, "ControllerPublishVolume", func(ctx context.Context) error {
			resp, err := ep.csi.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id,
				NodeId: ep.nodeID, VolumeCapability: ep.vc})
			pc = resp.GetPublishContext()
			return err
		})
		if err != nil {
			return err
		}
	}
	staging := ""
	if ep.caps.stage {
		staging = v.staging
		if err := os.Mkdir(staging, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("staging directory: %w", err)
		}
		v.staged = true
		err := r.call(ctx, s, "NodeStageVolume", func(ctx context.Context) error {
			_, err := ep.csi.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: staging,
				VolumeCapability: ep.vc, PublishContext: pc})
			return err
		})
		if err != nil {
			return err
		}
	}
	v.published = true
	err := r.call(ctx, s, "NodePublishVolume", func(ctx context.Context) error {
		_, err := ep.csi.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, TargetPath: v.target,
			StagingTargetPath: staging, VolumeCapability: ep.vc, PublishContext: pc})
		return err
	})
	if err != nil {
		return err
	}
	return r.unwind(ctx, s, v)
}

// unwind is the second half of a lifecycle: unpublish, unstage, controller
// unpublish, delete.
func (r *runner) unwind(ctx context.Context, s *samples, v *volume) error {
	ep := v.ep
	if err := r.call(ctx, s, "NodeUnpublishVolume", func(ctx context.Context) error {
		_, err := ep.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
		return err
	}); err != nil {
		return err
	}
	v.published = false
	if ep.caps.stage {
		if err := r.call(ctx, s, "NodeUnstageVolume", func(ctx context.Context) error {
			_, err := ep.csi.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			return err
		}); err != nil {
			return err
		}
		v.staged = false
		_ = os.Remove(v.staging)
	}
	if ep.caps.publish {
		if err := r.call(ctx, s, "ControllerUnpublishVolume", func(ctx context.Context) error {
			_, err := ep.csi.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: ep.nodeID})
			return err
		}); err != nil {
			return err
		}
		v.ctrlPublished = false
	}
	return r.delete(ctx, s, v)
}

// measure runs res.Count units of a phase on each lane (an endpoint at a
// concurrency) and returns a result per lane, by concurrency, the
// endpoint under test before the baseline. With several lanes, the units
// are cut into slices, and the slices of the lanes run alternately (c1,
// c8, c8, c1, c1, ...): what the machine's drifting load does to one, it
// does to the other, and their ratio holds. A slice keeps each worker busy
// for about sliceUnitsPerWorker units, so the idle tail of a slice
// (workers finishing their last unit) costs little. A unit that fails
// counts as an error; ctx ending stops the workers between units.
func (r *runner) measure(ctx context.Context, base Result, lanes []lane, unit func(ctx context.Context, s *samples, ln lane, i int) error) []Result {
	type acc struct {
		s *samples
		tally
	}
	accs := make([]acc, len(lanes))
	for i := range accs {
		accs[i].s = newSamples()
	}
	n := r.slices(lanes)
	l := r.measureLabel(base, lanes)
	r.prog.begin(l, base.Count*len(lanes))
	for k := 0; k < n && ctx.Err() == nil; k++ {
		lo, hi := k*base.Count/n, (k+1)*base.Count/n
		order := make([]int, len(lanes))
		for i := range order {
			order[i] = i
		}
		if k%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			a, ln := &accs[i], lanes[i]
			elapsed, done, failed := r.runSlice(ctx, ln.conc, lo, hi, l+ln.ep.suffix(), func(ctx context.Context, j int) error {
				return unit(ctx, a.s, ln, j)
			})
			a.elapsed += elapsed
			a.done += done
			a.failed += failed
		}
	}
	r.prog.end()
	out := make([]Result, len(lanes))
	for i, a := range accs {
		res := base
		res.Concurrency, res.Baseline = lanes[i].conc, lanes[i].ep.baseline
		a.elapsed = a.s.timed(a.elapsed)
		out[i] = a.result(res, a.s)
	}
	slices.SortStableFunc(out, func(a, b Result) int {
		return cmp.Or(cmp.Compare(a.Concurrency, b.Concurrency), cmp.Compare(boolInt(a.Baseline), boolInt(b.Baseline)))
	})
	return out
}

// tally counts the units of a measurement: those done (failed or not),
// those that failed, and the time they took.
type tally struct {
	done, failed int
	elapsed      time.Duration
}

// count counts a unit that returned err, and notes a failed unit's error
// under label. A unit cut short by ctx ending is interrupted, not failed:
// it is not counted, and count returns false.
func (t *tally) count(ctx context.Context, r *runner, label string, err error) bool {
	if err != nil && ctx.Err() != nil {
		return false
	}
	t.done++
	if err != nil {
		t.failed++
		r.noteError(fmt.Errorf("%s: %w", label, err))
	}
	return true
}

// result is res with the measurement's figures: t's units and their
// throughput over t.elapsed, and s's, method by method.
func (t tally) result(res Result, s *samples) Result {
	res.Count, res.Errors, res.ElapsedSeconds = t.done, t.failed, t.elapsed.Seconds()
	if t.elapsed > 0 {
		res.OpsPerSecond = float64(t.done-t.failed) / t.elapsed.Seconds()
	}
	res.RPCs = s.stats(t.elapsed)
	return res
}

// measureLabel names a measurement in the progress line and in errors.
func (r *runner) measureLabel(base Result, lanes []lane) string {
	var concs []int
	for _, ln := range lanes {
		if !slices.Contains(concs, ln.conc) {
			concs = append(concs, ln.conc)
		}
	}
	l := fmt.Sprintf("round %d %s c=%s", base.Round, base.Phase, joinInts(concs))
	if base.Phase == string(PhaseScale) {
		l += fmt.Sprintf(" (%d existing)", base.Existing)
	}
	return l
}

// suffix marks the baseline's measurements in labels.
func (ep *endpoint) suffix() string {
	if ep.baseline {
		return " on the baseline"
	}
	return ""
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sliceUnitsPerWorker is how many units each worker runs in one slice of
// an interleaved measurement, at the highest concurrency.
const sliceUnitsPerWorker = 25

// slices is the number of slices a measurement on lanes is cut into.
func (r *runner) slices(lanes []lane) int {
	if r.cfg.Slices > 0 {
		return min(r.cfg.Slices, r.cfg.Count)
	}
	if len(lanes) < 2 {
		return 1
	}
	most := 0
	for _, ln := range lanes {
		most = max(most, ln.conc)
	}
	return max(1, r.cfg.Count/(sliceUnitsPerWorker*most))
}

// runSlice runs units [lo, hi) on conc workers and returns how long that
// took, how many units ran and how many failed.
func (r *runner) runSlice(ctx context.Context, conc, lo, hi int, label string, fn func(ctx context.Context, i int) error) (time.Duration, int, int) {
	var next, done, failed atomic.Int64
	next.Store(int64(lo))
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= hi {
					return
				}
				if err := fn(ctx, i); err != nil {
					if ctx.Err() != nil {
						return // interrupted, not failed: the cleanup sees to it
					}
					failed.Add(1)
					r.noteError(fmt.Errorf("%s: %w", label, err))
				}
				done.Add(1)
				r.prog.step()
			}
		}()
	}
	wg.Wait()
	return time.Since(start), int(done.Load()), int(failed.Load())
}

func joinInts(x []int) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

// call makes one RPC within the run's timeout and records it in s (nil:
// untimed).
func (r *runner) call(ctx context.Context, s *samples, method string, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	start := time.Now()
	err := f(cctx)
	if s != nil && (err == nil || ctx.Err() == nil) { // a call cut short by Ctrl-C is no sample
		s.add(method, time.Since(start), err != nil)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

func (r *runner) noteError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nerrs++
	if len(r.errs) < maxErrors {
		r.errs = append(r.errs, err.Error())
	}
}

// maxErrors is how many error messages a report keeps.
const maxErrors = 10

// newVolume names a volume and journals it before it is created. A name
// is the run's prefix and 16 hex digits that look random but are a
// bijection of a sequence number (no two alike): a CO's names (pvc-<uuid>)
// are random, and a driver that indexes names pays for that with a write
// to a random place of its index; sequential names would hide the cost.
func (r *runner) newVolume(ep *endpoint, lifecycle bool) *volume {
	v := &volume{ep: ep, name: fmt.Sprintf("%s%016x", r.prefix, mix(r.seq.Add(1)^r.seed))}
	if lifecycle {
		v.staging, v.target = filepath.Join(r.cfg.StagingDir, v.name), filepath.Join(r.cfg.TargetDir, v.name)
	}
	r.mu.Lock()
	r.live[v.name] = v
	r.mu.Unlock()
	if err := ep.jrnl.write(journalLine{Begin: v.name, Staging: v.staging, Target: v.target}); err != nil {
		r.noteError(err)
	}
	return v
}

func (r *runner) create(ctx context.Context, s *samples, v *volume) error {
	err := r.call(ctx, s, "CreateVolume", func(ctx context.Context) error {
		resp, err := v.ep.csi.CreateVolume(ctx, createRequest(v.name, v.ep.header))
		v.id = resp.GetVolume().GetVolumeId()
		return err
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	v.ep.ids[v.id] = true
	r.mu.Unlock()
	if err := v.ep.jrnl.write(journalLine{Created: v.name, ID: v.id}); err != nil {
		r.noteError(err)
	}
	return nil
}

func (r *runner) delete(ctx context.Context, s *samples, v *volume) error {
	if err := r.call(ctx, s, "DeleteVolume", func(ctx context.Context) error {
		_, err := v.ep.csi.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
		return err
	}); err != nil {
		return err
	}
	r.gone(v)
	return nil
}

// gone records that a volume no longer exists.
func (r *runner) gone(v *volume) {
	r.mu.Lock()
	delete(r.live, v.name)
	r.deleted++
	r.mu.Unlock()
	if v.ep.jrnl != nil {
		if err := v.ep.jrnl.write(journalLine{Deleted: v.name}); err != nil {
			r.noteError(err)
		}
	}
}

// createUntimed creates n volumes on ep with conc workers, outside any
// measurement, and returns those that were created.
func (r *runner) createUntimed(ctx context.Context, ep *endpoint, n, conc int, label string) []*volume {
	var mu sync.Mutex
	var out []*volume
	r.untimed(ctx, n, conc, label, func(ctx context.Context, _ int) error {
		v := r.newVolume(ep, false)
		if err := r.create(ctx, nil, v); err != nil {
			return err
		}
		mu.Lock()
		out = append(out, v)
		mu.Unlock()
		return nil
	})
	return out
}

// deleteUntimed deletes volumes on conc workers, outside any measurement.
func (r *runner) deleteUntimed(ctx context.Context, vols []*volume, conc int, label string) {
	r.untimed(ctx, len(vols), conc, label, func(ctx context.Context, i int) error {
		return r.delete(ctx, nil, vols[i])
	})
}

func (r *runner) untimed(ctx context.Context, n, conc int, label string, fn func(ctx context.Context, i int) error) {
	r.prog.begin(label, n)
	r.runSlice(ctx, conc, 0, n, label, fn)
	r.prog.end()
}

// mix is splitmix64's finaliser: a bijection of uint64 that scatters
// consecutive numbers.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
