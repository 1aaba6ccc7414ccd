// Package bench is a load generator that speaks CSI to any endpoint (csid
// or another driver): it measures the throughput and the latency of each
// RPC in phases (probe, create, delete, the full lifecycle of a volume, and
// create+delete with many volumes around), beside a floor measured in the
// same run (the gRPC round trip of Probe, and a bare bbolt commit), and
// cleans up every volume it created, also after Ctrl-C, and after a run
// that was killed (see journal). `csid bench` is a thin command around Run.
//
// Only what the driver advertises is called: ControllerPublish and
// ControllerUnpublish with PUBLISH_UNPUBLISH_VOLUME, NodeStage and
// NodeUnstage with STAGE_UNSTAGE_VOLUME, ListVolumes with LIST_VOLUMES.
package bench

import (
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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
	// PhaseFloor is the floor measured at the start of every round, at
	// concurrency 1: Probe's round trip and a bare bbolt commit,
	// interleaved. It is always measured.
	PhaseFloor Phase = "floor"
)

// Phases lists the phases Config.Phases may name, in the order they run.
var Phases = []Phase{PhaseProbe, PhaseCreate, PhaseDelete, PhaseLifecycle, PhaseScale}

// Config configures a run. Zero values take the defaults named.
type Config struct {
	// Endpoint is the driver's gRPC address: unix:///path, /path, or
	// host:port.
	Endpoint string
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
	// FloorDir is where the floor's bbolt file is made (default the
	// temporary directory): put it on the driver's state file system to
	// compare like with like.
	FloorDir string
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

// caps is what the driver advertises, as far as the bench cares.
type caps struct {
	controller, createDelete, publish, list bool
	node, stage                             bool
	topology                                bool
}

func (c caps) names() []string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{c.controller, "CONTROLLER_SERVICE"}, {c.topology, "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
		{c.createDelete, "CREATE_DELETE_VOLUME"}, {c.publish, "PUBLISH_UNPUBLISH_VOLUME"}, {c.list, "LIST_VOLUMES"},
		{c.node, "NODE_SERVICE"}, {c.stage, "STAGE_UNSTAGE_VOLUME"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	return out
}

// volume is a volume the run made, and what it may have done to it: a
// flag is set before the call that might do it and cleared after the
// call that undoes it, so the cleanup undoes whatever may have happened.
type volume struct {
	name, id        string
	staging, target string
	ctrlPublished   bool
	staged          bool
	published       bool
}

// runner is one run.
type runner struct {
	cfg    Config
	csi    client
	caps   caps
	vc     *csi.VolumeCapability
	header journalHeader // the creation arguments, also of the journal
	prefix string
	seed   uint64 // scatters the names of the run
	seq    atomic.Uint64
	report *Report
	prog   *progress
	jrnl   *journal

	mu      sync.Mutex
	live    map[string]*volume // created or being created, not deleted
	ids     map[string]bool    // every id the run created
	pending map[int][]*volume  // made by the create phase, by concurrency, for the delete phase
	errs    []string
	nerrs   int
	deleted int
}

// client speaks CSI.
type client struct {
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

// grpcTarget turns an endpoint into a gRPC target.
func grpcTarget(endpoint string) string {
	if strings.HasPrefix(endpoint, "/") {
		return "unix://" + endpoint
	}
	return endpoint
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
	conn, err := grpc.NewClient(grpcTarget(cfg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", cfg.Endpoint, err)
	}
	defer conn.Close()
	r := &runner{cfg: cfg, csi: client{csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)},
		prog: newProgress(cfg.Progress), live: map[string]*volume{}, ids: map[string]bool{}, pending: map[int][]*volume{},
		report: &Report{Schema: Schema, StartedAt: time.Now().UTC().Truncate(time.Second)}}
	if err := r.discover(ctx); err != nil {
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
	if err := r.checkPhases(); err != nil {
		return nil, err
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
	if r.jrnl, err = createJournal(cfg.JournalDir, id, r.header); err != nil {
		return nil, err
	}
	start := time.Now()
	runErr := r.rounds(ctx)
	r.report.ElapsedSeconds = time.Since(start).Seconds()
	r.report.Interrupted = ctx.Err() != nil
	cleanErr := r.cleanup(cctx)
	r.summarise()
	return r.report, errors.Join(runErr, cleanErr)
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

// discover asks the driver who it is and what it serves, and the node's id
// and topology.
func (r *runner) discover(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	info, err := r.csi.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("GetPluginInfo on %s: %w", r.cfg.Endpoint, err)
	}
	pc, err := r.csi.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	for _, c := range pc.GetCapabilities() {
		switch c.GetService().GetType() {
		case csi.PluginCapability_Service_CONTROLLER_SERVICE:
			r.caps.controller = true
		case csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
			r.caps.topology = true
		}
	}
	if cc, err := r.csi.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{}); err == nil {
		for _, c := range cc.GetCapabilities() {
			switch c.GetRpc().GetType() {
			case csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME:
				r.caps.createDelete = true
			case csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME:
				r.caps.publish = true
			case csi.ControllerServiceCapability_RPC_LIST_VOLUMES:
				r.caps.list = true
			}
		}
	} else if status.Code(err) != codes.Unimplemented {
		return fmt.Errorf("ControllerGetCapabilities: %w", err)
	}
	var topology map[string]string
	if nc, err := r.csi.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{}); err == nil {
		r.caps.node = true
		for _, c := range nc.GetCapabilities() {
			if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
				r.caps.stage = true
			}
		}
		ni, err := r.csi.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		if err != nil {
			return fmt.Errorf("NodeGetInfo: %w", err)
		}
		if r.cfg.NodeID == "" {
			r.cfg.NodeID = ni.GetNodeId()
		}
		if r.caps.topology {
			topology = ni.GetAccessibleTopology().GetSegments()
		}
	} else if status.Code(err) != codes.Unimplemented {
		return fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	r.header = journalHeader{Endpoint: r.cfg.Endpoint, NodeID: r.cfg.NodeID, Topology: topology, SizeBytes: r.cfg.SizeBytes,
		AccessType: r.cfg.AccessType, FsType: r.cfg.FsType, Parameters: r.cfg.Parameters, PID: os.Getpid()}
	r.vc = capability(r.header)
	r.report.Target = Target{Endpoint: r.cfg.Endpoint, Driver: info.GetName(), Version: info.GetVendorVersion(),
		NodeID: r.cfg.NodeID, Capabilities: r.caps.names()}
	r.report.Config = ReportConfig{Phases: phaseNames(r.cfg.Phases), Concurrency: r.cfg.Concurrency, Count: r.cfg.Count,
		Existing: r.cfg.Existing, Rounds: r.cfg.Rounds, Slices: r.slices(r.cfg.Concurrency), SizeBytes: r.cfg.SizeBytes, AccessType: r.cfg.AccessType,
		FsType: r.cfg.FsType, TimeoutSeconds: r.cfg.Timeout.Seconds()}
	if r.caps.list {
		ids, err := r.listIDs(ctx)
		if err != nil {
			return err
		}
		r.report.Target.VolumesBefore = len(ids)
	}
	return nil
}

func phaseNames(ps []Phase) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// checkPhases refuses phases the driver cannot serve.
func (r *runner) checkPhases() error {
	for _, p := range r.cfg.Phases {
		if p != PhaseProbe && !r.caps.createDelete {
			return fmt.Errorf("phase %s needs CREATE_DELETE_VOLUME, which %s does not advertise", p, r.cfg.Endpoint)
		}
		if p == PhaseLifecycle && !r.caps.node {
			return fmt.Errorf("phase lifecycle needs the Node service, which %s does not serve", r.cfg.Endpoint)
		}
	}
	return nil
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

// capability is the volume capability of a run.
func capability(h journalHeader) *csi.VolumeCapability {
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if h.AccessType == "block" {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: h.FsType}}
	}
	return vc
}

// createRequest is the CreateVolume of a volume: the same for a run and
// for whoever cleans up after it (CreateVolume is idempotent by name only
// for identical arguments).
func createRequest(name string, h journalHeader) *csi.CreateVolumeRequest {
	req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: h.SizeBytes},
		VolumeCapabilities: []*csi.VolumeCapability{capability(h)}, Parameters: h.Parameters}
	if len(h.Topology) > 0 {
		t := &csi.Topology{Segments: h.Topology}
		req.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{t}, Preferred: []*csi.Topology{t}}
	}
	return req
}

// rounds runs every round: the floor, then each phase at every
// concurrency, interleaved (see measure).
func (r *runner) rounds(ctx context.Context) error {
	db, err := openFloor(r.cfg.FloorDir)
	if err != nil {
		return err
	}
	defer db.close()
	r.report.Floor.Dir, r.report.Floor.FSType = r.cfg.FloorDir, fsType(r.cfg.FloorDir)
	for round := 1; round <= r.cfg.Rounds && ctx.Err() == nil; round++ {
		r.add(r.floor(ctx, round, db))
		concs := slices.Clone(r.cfg.Concurrency)
		if round%2 == 0 {
			slices.Reverse(concs)
		}
		for _, p := range Phases {
			if !slices.Contains(r.cfg.Phases, p) || ctx.Err() != nil {
				continue
			}
			for _, res := range r.phase(ctx, p, round, concs) {
				r.add(res)
			}
		}
	}
	return nil
}

func (r *runner) add(res Result) {
	r.report.Results = append(r.report.Results, res)
}

// phase runs one phase at each concurrency; it returns a result per
// concurrency (per concurrency and number of existing volumes for scale).
func (r *runner) phase(ctx context.Context, p Phase, round int, concs []int) []Result {
	base := Result{Phase: string(p), Round: round, Count: r.cfg.Count}
	switch p {
	case PhaseProbe:
		base.Unit = "Probe"
		return r.measure(ctx, base, concs, func(ctx context.Context, s *samples, _, _ int) error {
			return r.call(ctx, s, "Probe", func(ctx context.Context) error {
				_, err := r.csi.Probe(ctx, &csi.ProbeRequest{})
				return err
			})
		})
	case PhaseCreate:
		base.Unit = "CreateVolume"
		return r.measure(ctx, base, concs, func(ctx context.Context, s *samples, conc, _ int) error {
			v := r.newVolume(false)
			if err := r.create(ctx, s, v); err != nil {
				return err
			}
			r.mu.Lock()
			r.pending[conc] = append(r.pending[conc], v)
			r.mu.Unlock()
			return nil
		})
	case PhaseDelete:
		base.Unit = "DeleteVolume"
		r.mu.Lock()
		vols := r.pending
		r.pending = map[int][]*volume{}
		r.mu.Unlock()
		for _, conc := range concs {
			if missing := r.cfg.Count - len(vols[conc]); missing > 0 {
				label := fmt.Sprintf("round %d delete c=%d: creating %d volumes to delete", round, conc, missing)
				vols[conc] = append(vols[conc], r.createUntimed(ctx, missing, conc, label)...)
			}
		}
		return r.measure(ctx, base, concs, func(ctx context.Context, s *samples, conc, i int) error {
			if i >= len(vols[conc]) {
				return fmt.Errorf("no volume to delete (their creation failed)")
			}
			return r.delete(ctx, s, vols[conc][i])
		})
	case PhaseLifecycle:
		base.Unit = "lifecycle"
		return r.measure(ctx, base, concs, r.lifecycle)
	case PhaseScale:
		return r.scale(ctx, base, concs)
	}
	return nil
}

// scale measures create+delete pairs without the run's volumes around and
// with Existing of them, in an order that alternates from round to round
// (odd: none first; even: Existing first), creating the Existing volumes
// before and deleting them after their measurement.
func (r *runner) scale(ctx context.Context, base Result, concs []int) []Result {
	base.Unit = "create+delete"
	pairs := func(existing int) []Result {
		res := base
		res.Existing = existing
		return r.measure(ctx, res, concs, func(ctx context.Context, s *samples, _, _ int) error {
			v := r.newVolume(false)
			if err := r.create(ctx, s, v); err != nil {
				return err
			}
			return r.delete(ctx, s, v)
		})
	}
	if r.cfg.Existing == 0 {
		return pairs(0)
	}
	fillConc := max(fillConcurrency, slices.Max(concs))
	withExisting := func() []Result {
		label := fmt.Sprintf("round %d scale: creating %d volumes", base.Round, r.cfg.Existing)
		fill := r.createUntimed(ctx, r.cfg.Existing, fillConc, label)
		res := pairs(len(fill))
		label = fmt.Sprintf("round %d scale: deleting %d volumes", base.Round, len(fill))
		r.deleteUntimed(ctx, fill, fillConc, label)
		return res
	}
	if base.Round%2 == 1 {
		return append(pairs(0), withExisting()...)
	}
	return append(withExisting(), pairs(0)...)
}

// lifecycle is one unit of the lifecycle phase.
func (r *runner) lifecycle(ctx context.Context, s *samples, _, _ int) error {
	v := r.newVolume(true)
	if err := r.create(ctx, s, v); err != nil {
		return err
	}
	var pc map[string]string
	if r.caps.publish {
		v.ctrlPublished = true
		err := r.call(ctx, s, "ControllerPublishVolume", func(ctx context.Context) error {
			resp, err := r.csi.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id,
				NodeId: r.cfg.NodeID, VolumeCapability: r.vc})
			pc = resp.GetPublishContext()
			return err
		})
		if err != nil {
			return err
		}
	}
	staging := ""
	if r.caps.stage {
		staging = v.staging
		if err := os.Mkdir(staging, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("staging directory: %w", err)
		}
		v.staged = true
		err := r.call(ctx, s, "NodeStageVolume", func(ctx context.Context) error {
			_, err := r.csi.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: staging,
				VolumeCapability: r.vc, PublishContext: pc})
			return err
		})
		if err != nil {
			return err
		}
	}
	v.published = true
	err := r.call(ctx, s, "NodePublishVolume", func(ctx context.Context) error {
		_, err := r.csi.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, TargetPath: v.target,
			StagingTargetPath: staging, VolumeCapability: r.vc, PublishContext: pc})
		return err
	})
	if err != nil {
		return err
	}
	if err := r.call(ctx, s, "NodeUnpublishVolume", func(ctx context.Context) error {
		_, err := r.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
		return err
	}); err != nil {
		return err
	}
	v.published = false
	if r.caps.stage {
		if err := r.call(ctx, s, "NodeUnstageVolume", func(ctx context.Context) error {
			_, err := r.csi.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: staging})
			return err
		}); err != nil {
			return err
		}
		v.staged = false
		_ = os.Remove(staging)
	}
	if r.caps.publish {
		if err := r.call(ctx, s, "ControllerUnpublishVolume", func(ctx context.Context) error {
			_, err := r.csi.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: r.cfg.NodeID})
			return err
		}); err != nil {
			return err
		}
		v.ctrlPublished = false
	}
	return r.delete(ctx, s, v)
}

// measure runs res.Count units of a phase at each concurrency of concs
// and returns a result per concurrency. With several concurrencies, the
// units are cut into slices, and the slices of the concurrencies run
// alternately (c1, c8, c8, c1, c1, ...): what the machine's drifting load
// does to one, it does to the other, and their ratio holds. A slice keeps
// each worker busy for about sliceUnitsPerWorker units, so the idle tail
// of a slice (workers finishing their last unit) costs little. A unit that
// fails counts as an error; ctx ending stops the workers between units.
func (r *runner) measure(ctx context.Context, base Result, concs []int, unit func(ctx context.Context, s *samples, conc, i int) error) []Result {
	type acc struct {
		s            *samples
		done, failed int
		elapsed      time.Duration
	}
	accs := make([]acc, len(concs))
	for i := range accs {
		accs[i].s = newSamples()
	}
	n := r.slices(concs)
	l := fmt.Sprintf("round %d %s c=%s", base.Round, base.Phase, joinInts(concs))
	if base.Phase == string(PhaseScale) {
		l += fmt.Sprintf(" (%d existing)", base.Existing)
	}
	r.prog.begin(l, base.Count*len(concs))
	for k := 0; k < n && ctx.Err() == nil; k++ {
		lo, hi := k*base.Count/n, (k+1)*base.Count/n
		order := make([]int, len(concs))
		for i := range order {
			order[i] = i
		}
		if k%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			a, conc := &accs[i], concs[i]
			elapsed, done, failed := r.runSlice(ctx, conc, lo, hi, l, func(ctx context.Context, j int) error {
				return unit(ctx, a.s, conc, j)
			})
			a.elapsed += elapsed
			a.done += done
			a.failed += failed
		}
	}
	r.prog.end()
	out := make([]Result, len(concs))
	for i, a := range accs {
		res := base
		res.Concurrency, res.Count, res.Errors = concs[i], a.done, a.failed
		res.ElapsedSeconds = a.elapsed.Seconds()
		if a.elapsed > 0 {
			res.OpsPerSecond = float64(a.done-a.failed) / a.elapsed.Seconds()
		}
		res.RPCs = a.s.stats(a.elapsed)
		out[i] = res
	}
	slices.SortStableFunc(out, func(a, b Result) int { return a.Concurrency - b.Concurrency })
	return out
}

// sliceUnitsPerWorker is how many units each worker runs in one slice of
// an interleaved measurement, at the highest concurrency.
const sliceUnitsPerWorker = 25

// slices is the number of slices a measurement at concs is cut into.
func (r *runner) slices(concs []int) int {
	if r.cfg.Slices > 0 {
		return min(r.cfg.Slices, r.cfg.Count)
	}
	if len(concs) < 2 {
		return 1
	}
	return max(1, r.cfg.Count/(sliceUnitsPerWorker*slices.Max(concs)))
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
func (r *runner) newVolume(lifecycle bool) *volume {
	v := &volume{name: fmt.Sprintf("%s%016x", r.prefix, mix(r.seq.Add(1)^r.seed))}
	if lifecycle {
		v.staging, v.target = filepath.Join(r.cfg.StagingDir, v.name), filepath.Join(r.cfg.TargetDir, v.name)
	}
	r.mu.Lock()
	r.live[v.name] = v
	r.mu.Unlock()
	if err := r.jrnl.write(journalLine{Begin: v.name, Staging: v.staging, Target: v.target}); err != nil {
		r.noteError(err)
	}
	return v
}

func (r *runner) create(ctx context.Context, s *samples, v *volume) error {
	err := r.call(ctx, s, "CreateVolume", func(ctx context.Context) error {
		resp, err := r.csi.CreateVolume(ctx, createRequest(v.name, r.header))
		v.id = resp.GetVolume().GetVolumeId()
		return err
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.ids[v.id] = true
	r.mu.Unlock()
	if err := r.jrnl.write(journalLine{Created: v.name, ID: v.id}); err != nil {
		r.noteError(err)
	}
	return nil
}

func (r *runner) delete(ctx context.Context, s *samples, v *volume) error {
	if err := r.call(ctx, s, "DeleteVolume", func(ctx context.Context) error {
		_, err := r.csi.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
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
	if r.jrnl != nil {
		if err := r.jrnl.write(journalLine{Deleted: v.name}); err != nil {
			r.noteError(err)
		}
	}
}

// createUntimed creates n volumes on conc workers, outside any measurement,
// and returns those that were created.
func (r *runner) createUntimed(ctx context.Context, n, conc int, label string) []*volume {
	var mu sync.Mutex
	var out []*volume
	r.untimed(ctx, n, conc, label, func(ctx context.Context, _ int) error {
		v := r.newVolume(false)
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
