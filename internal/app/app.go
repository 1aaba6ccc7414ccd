// Package app assembles one csid process: the state file, the cloud and
// host, the mounter, the executors, the operation engine and the CSI
// driver on its gRPC socket. It owns the order of start-up (lock the state,
// take the socket, answer Identity at once, resume ops, then report ready)
// and of shutdown (stop gRPC gracefully within a bound, then not ready: drain
// the workers to a safe point, close the store last).
package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/kubelet"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/mounter/fakemount"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/reconcile"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
)

// Options configure a csid process (the flags of `csid serve`).
type Options struct {
	Mode     driver.Mode
	Endpoint string
	// StateDir holds the state file and, for the local backend, its disks.
	StateDir string
	// Cloud is "local" (the embedded default), "yandex" (Yandex Compute
	// Cloud, Options.Yandex) or "fake" (in memory, with a fake mounter: for
	// load tests and drills of the engine without root).
	Cloud  string
	NodeID string
	// DriverName is the CSI driver name.
	DriverName string
	Version    string
	// MaxVolumesPerNode is this node's attach limit (0: none) on the local
	// and fake backends; on Yandex, YandexOptions.MaxDisks.
	MaxVolumesPerNode int
	// Zone is this node's zone on the local and fake backends; on Yandex
	// it is not read (the instance's zone is the Compute API's).
	Zone string
	// Workers bounds the effects running at once.
	Workers int
	// Deadlines bound each attempt of an op, by event (the engine's
	// defaults for the events left out).
	Deadlines ops.Deadlines
	// RebuildFromCloud lets csid start on a new state file (missing or
	// empty) although the cloud shows it held volumes: a controller
	// rebuilds its records from its disks' tags, a node from this host's
	// mounts. Without it, such a start is refused.
	RebuildFromCloud bool
	// StateWatchInterval is how often csid compares its open state file
	// with the file at its path (default 1s; tests).
	StateWatchInterval time.Duration
	// ShutdownTimeout bounds the graceful stop of gRPC, then of the
	// workers (default 10s each).
	ShutdownTimeout time.Duration
	// HostToolGrace bounds how long shutdown then waits for the host
	// tools still running (mkfs, e2fsck, resize2fs, xfs_growfs), which
	// csid never kills (default 5m). The whole shutdown takes at most
	// 2*ShutdownTimeout+HostToolGrace: a Kubernetes pod's
	// terminationGracePeriodSeconds must be longer.
	HostToolGrace time.Duration
	Log           zerolog.Logger
	// Ready, if set, is closed once the process answers Probe as ready.
	Ready chan<- struct{}
	// Yandex configures Cloud "yandex".
	Yandex YandexOptions
	// Fake, if set, is the provider of Cloud "fake" (tests and benchmarks
	// that set its latency or read its call log); nil makes a new one.
	Fake *fake.Cloud
	// FakeLatency sets the fake provider's latency per operation kind.
	FakeLatency map[cloud.OpKind]time.Duration
	// AdminSocket is the read-only admin endpoint's unix socket (default
	// AdminSocketPath(StateDir, Mode)).
	AdminSocket string
	// MetricsAddress serves /metrics, /readyz and /healthz (off when
	// empty); MetricsListener, if set, is used instead (tests).
	MetricsAddress  string
	MetricsListener net.Listener
	// SocketMode is the CSI socket's mode (default DefaultSocketMode),
	// whatever the umask; SocketOwner its owner, "user[:group]" by name or
	// number ("" keeps csid's own). Directories csid creates for the
	// socket get the same owner.
	SocketMode  os.FileMode
	SocketOwner string
	// KubeletRoot is kubelet's root directory: node requests for paths
	// outside it are refused ("": any absolute path; see
	// driver.Config.KubeletRoot).
	KubeletRoot string
}

// Defaults of Options.
const (
	DefaultShutdownTimeout = 10 * time.Second
	DefaultHostToolGrace   = 5 * time.Minute
)

// GrowDir is the directory, inside the state directory, where the node
// records the offline growths of filesystems in progress (one file per
// filesystem UUID), so that it repairs one a crash interrupted.
const GrowDir = "grow"

// StateFile is the state file of a mode inside a state directory.
func StateFile(dir string, mode driver.Mode) string {
	name := "csid.db"
	if mode != driver.ModeAll {
		name = string(mode) + ".db"
	}
	return filepath.Join(dir, name)
}

// Run serves until ctx ends, then shuts down in order.
func Run(ctx context.Context, o Options) error {
	if err := o.yandexNode(ctx); err != nil {
		return err
	}
	sock, perm, err := o.complete()
	if err != nil {
		return err
	}
	log := o.Log.With().Str("mode", string(o.Mode)).Str("node", o.NodeID).Logger()

	// The state file first: a second csid on the same state dir stops here,
	// naming the holder, within a second.
	ob := newObservability(o, log)
	st, err := openStore(o, ob, log)
	if err != nil {
		return err
	}
	defer st.Close()
	stopAdmin, err := serveAdmin(o, st, log)
	if err != nil {
		return err
	}
	defer stopAdmin()

	p, err := newProvider(ctx, o)
	if err != nil {
		return err
	}
	sd, err := newSides(ctx, o, p)
	if err != nil {
		return err
	}
	rec := reconcile.Reconciler{Store: st, Cloud: p.cloud, Host: p.host, Mounter: p.mounter, DriverName: o.DriverName,
		Kubelet: kubelet.Layout{Root: o.KubeletRoot, Driver: o.DriverName}, Forget: o.Mode == driver.ModeNode,
		Log: log.With().Str("component", "reconcile").Logger()}
	if err := startOnNewFile(ctx, o, st, &rec, log); err != nil {
		return err
	}
	eng := ops.New(ops.Config{Store: st, Executors: sd.execs, NodeID: sd.nodeID, Adopt: sd.adopt, Confirm: effects.Confirmer(sd.ctrl, sd.node),
		ConfirmSnapshot: sd.confirmSnapshot(),
		Forget:          o.Mode == driver.ModeNode, Workers: o.Workers, Deadlines: o.Deadlines,
		DrainTimeout: o.ShutdownTimeout, Log: log.With().Str("component", "ops").Logger(), Observer: ob.opsObserver()})

	drv, err := driver.New(driver.Config{Name: o.DriverName, Version: o.Version, Mode: o.Mode, Engine: eng,
		Controller: controllerBackend{p.cloud}, Node: nodeBackend{cloud: p.cloud, mounter: p.mounter, nodeID: o.NodeID},
		Topology: len(p.cloud.Zones()) > 0, TopologyKey: p.topologyKey, Snapshots: takesSnapshots(p.cloud), DiskTypes: diskTypes(p.cloud), KubeletRoot: o.KubeletRoot})
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.NumStreamWorkers(streamWorkers), grpc.UnaryInterceptor(driver.Interceptor(log.With().Str("component", "csi").Logger(), ob.rpcObserver())))
	drv.Register(srv)
	if err := ob.start(o, eng, st, srv, backendCheck(o.Mode, p.cloud, o.NodeID)); err != nil {
		return err
	}
	defer ob.stop()
	lis, err := listenUnix(sock, perm)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info().Str("endpoint", sock).Str("state", st.Path()).Str("cloud", o.Cloud).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("serving CSI; resuming operations")

	// Identity answers from here on; Probe says ready once the records are
	// reconciled with the cloud and the host, and ops are resumed.
	if err := recoverAndReady(ctx, o, &rec, eng, log); err != nil {
		srv.Stop()
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		if err != nil {
			log.Error().Err(err).Msg("gRPC server stopped")
		}
	}
	return shutdown(log, srv, eng, p.mounter, o)
}

// complete fills in the defaults of o and checks what can be checked
// before anything is opened: the socket's path, mode and owner, and the
// state directory (made if missing).
func (o *Options) complete() (sock string, perm SocketPerm, err error) {
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.HostToolGrace <= 0 {
		o.HostToolGrace = DefaultHostToolGrace
	}
	if o.DriverName == "" {
		o.DriverName = driver.DefaultName
	}
	if o.NodeID == "" { // a node on Yandex has its instance id by now (yandexNode)
		h, err := os.Hostname()
		if err != nil {
			return "", perm, fmt.Errorf("no --node-id and no hostname: %w", err)
		}
		o.NodeID = h
	}
	if sock, err = SocketPath(o.Endpoint); err != nil {
		return "", perm, err
	}
	perm = SocketPerm{Mode: o.SocketMode}
	if perm.Mode == 0 {
		perm.Mode = DefaultSocketMode
	}
	if perm.Mode&^os.ModePerm != 0 {
		return "", perm, fmt.Errorf("socket mode %v: want permission bits only", o.SocketMode)
	}
	if perm.UID, perm.GID, err = ParseOwner(o.SocketOwner); err != nil {
		return "", perm, fmt.Errorf("socket owner: %w", err)
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return "", perm, fmt.Errorf("state dir: %w", err)
	}
	return sock, perm, nil
}

// streamWorkers is the number of goroutines gRPC keeps to serve calls: a
// call finds one whose stack has grown already (a new goroutine a call
// grew it again, copying it at each step; docs/benchmarks.md, "Seventh
// pass"). Calls beyond them get a goroutine each, as without workers. The
// Kubernetes sidecars make up to tens of calls at once.
const streamWorkers = 32

// openStore opens the mode's state file, watched for changes under csid.
func openStore(o Options, ob *observability, log zerolog.Logger) (*store.Store, error) {
	st, err := store.Open(StateFile(o.StateDir, o.Mode), store.Options{LockTimeout: 500 * time.Millisecond, Observe: ob.storeHook(),
		WatchInterval: o.StateWatchInterval, OnFileFault: func(err error) {
			log.Error().Err(err).Msg("the state file changed under csid: csid is not ready and takes no writes")
		}})
	if err != nil {
		return nil, fmt.Errorf("open the state file: %w", err)
	}
	if from := st.MigratedFrom(); from != 0 {
		log.Warn().Int("from", from).Int("to", store.SchemaVersion).Str("state", st.Path()).Msg("state file migrated to this csid's schema")
	}
	return st, nil
}

// sides are the controller and node halves a process runs (per its mode):
// their executors, and the node's id and adopter.
type sides struct {
	execs  map[fsm.Event]ops.Executor
	ctrl   *effects.Controller
	node   *effects.Node
	adopt  ops.Adopter
	nodeID string
}

// takesSnapshots reports whether the backend takes snapshots and creates
// disks from sources.
func takesSnapshots(c cloud.Cloud) bool {
	_, ok := c.(cloud.Snapshotter)
	return ok
}

// diskTypes are the provider's disk types (none without cloud.DiskTyper).
func diskTypes(c cloud.Cloud) []string {
	if t, ok := c.(cloud.DiskTyper); ok {
		return t.DiskTypes()
	}
	return nil
}

// confirmSnapshot is the controller's check of a snapshot at the provider,
// nil without a controller.
func (sd sides) confirmSnapshot() func(context.Context, *store.Snapshot) (string, error) {
	if sd.ctrl == nil {
		return nil
	}
	return sd.ctrl.ConfirmSnapshot()
}

// newSides builds the sides of o.Mode on provider p; a node registers
// itself with a backend that wants it.
func newSides(ctx context.Context, o Options, p *provider) (sides, error) {
	sd := sides{execs: map[fsm.Event]ops.Executor{}}
	if o.Mode != driver.ModeNode {
		sd.ctrl = &effects.Controller{Cloud: p.cloud, DriverName: o.DriverName}
		maps.Copy(sd.execs, sd.ctrl.Executors())
	}
	if o.Mode == driver.ModeController {
		return sd, nil
	}
	if reg, ok := p.cloud.(cloud.Registrar); ok {
		if err := reg.RegisterNode(ctx, cloud.Node{ID: o.NodeID, Zone: p.zone, MaxAttachments: o.MaxVolumesPerNode}); err != nil {
			return sd, fmt.Errorf("register node %s: %w", o.NodeID, err)
		}
	}
	sd.node = &effects.Node{Host: p.host, Mounter: p.mounter}
	maps.Copy(sd.execs, sd.node.Executors())
	if o.Mode == driver.ModeNode {
		sd.adopt = sd.node.Adopt
	}
	sd.nodeID = o.NodeID
	return sd, nil
}

// recoverAndReady reconciles a node's records with the host, resumes the
// ops left from an earlier run, and then says ready (o.Ready).
func recoverAndReady(ctx context.Context, o Options, rec *reconcile.Reconciler, eng *ops.Engine, log zerolog.Logger) error {
	if o.Mode != driver.ModeController {
		if _, err := rec.Node(ctx); err != nil {
			return fmt.Errorf("reconcile with the host: %w", err)
		}
	}
	if err := eng.Start(ctx); err != nil {
		return fmt.Errorf("resume operations: %w", err)
	}
	log.Info().Msg("ready")
	if o.Ready != nil {
		close(o.Ready)
	}
	return nil
}

// heldShown bounds the disks a refusal to start names.
const heldShown = 3

// startOnNewFile decides what a new state file (missing or empty at start,
// store.Created) means. Where the cloud shows this csid held volumes (its
// disks; for a node, those attached to it), the file that recorded them
// was lost or emptied: csid refuses to start, unless the operator asked
// for a rebuild (o.RebuildFromCloud), which a controller does from the
// disks' tags and a node from the host's mounts (Node reconciliation,
// later in the start). A first start, with no such disk, goes on as
// before. Either way the file is then confirmed as the state file.
func startOnNewFile(ctx context.Context, o Options, st *store.Store, rec *reconcile.Reconciler, log zerolog.Logger) error {
	if !st.Created() {
		if o.RebuildFromCloud {
			log.Warn().Str("state", st.Path()).Msg("--rebuild-from-cloud: the state file has records; nothing to rebuild (the flag applies to a new or empty state file)")
		}
		return nil
	}
	node := ""
	if o.Mode == driver.ModeNode {
		node = o.NodeID
	}
	max := heldShown
	if o.RebuildFromCloud {
		max = 0
	}
	held, err := rec.Held(ctx, node, max)
	if err != nil {
		return fmt.Errorf("the state file %s is new; look in the cloud for disks of csid (driver %s): %w", st.Path(), o.DriverName, err)
	}
	if len(held) > 0 && !o.RebuildFromCloud {
		return newFileRefused(o, st.Path(), node, held)
	}
	if len(held) > 0 && o.Mode != driver.ModeNode {
		if _, err := rec.Rebuild(ctx); err != nil {
			return fmt.Errorf("rebuild records from the cloud: %w", err)
		}
	}
	if err := st.Confirm(); err != nil {
		return fmt.Errorf("confirm the new state file: %w", err)
	}
	if len(held) > 0 {
		log.Warn().Int("disks", len(held)).Str("state", st.Path()).Msg("started on a new state file, rebuilt from the cloud and the host (--rebuild-from-cloud)")
	}
	return nil
}

// newFileRefused is the refusal to start on a new state file where the
// cloud shows csid held volumes.
func newFileRefused(o Options, path, node string, held []cloud.Disk) error {
	var eg []string
	for _, d := range held {
		eg = append(eg, fmt.Sprintf("%s of volume %s", d.ID, d.Tags[effects.TagVolumeID]))
	}
	where, rebuild := "has disks csid made", "the controller rebuilds its records from the disks' tags (queued resizes included)"
	if node != "" {
		where, rebuild = "has disks of csid attached to node "+node, "the node rebuilds its records from this host's mounts, and picks up volumes attached but not staged at their next NodeStageVolume"
	} else if o.Mode == driver.ModeAll {
		rebuild += ", and the node from this host's mounts"
	}
	return fmt.Errorf("the state file %s is new (it was missing or empty), but the cloud %s (driver %s; %s): "+
		"the state file that recorded them was lost or emptied, and csid does not start from nothing. "+
		"Restore it from a backup (csid state backup); or start csid with --rebuild-from-cloud: %s, and op history and ops in flight are lost "+
		"(docs/operations.md, \"Starting on a new state file\")", path, where, o.DriverName, strings.Join(eg, ", "), rebuild)
}

// shutdown stops in order: gRPC stops gracefully within ShutdownTimeout
// (no new RPCs; then hard: handlers still waiting return Aborted, their ops
// go on); then the engine reports not ready, refuses new requests, starts
// no new attempt, lets the effects running finish within ShutdownTimeout,
// and then cancels them: each stops before its next step, but a host tool
// already running is left to finish, within HostToolGrace (a killed
// resize2fs can leave a filesystem needing repair). The caller closes the
// store last.
func shutdown(log zerolog.Logger, srv *grpc.Server, eng *ops.Engine, m mounter.Mounter, o Options) error {
	log.Info().Msg("shutting down")
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(o.ShutdownTimeout):
		log.Warn().Float64("after_seconds", o.ShutdownTimeout.Seconds()).Msg("RPCs still running; stopping hard")
		srv.Stop()
		<-done
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout+o.HostToolGrace)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- eng.Close(ctx) }()
	running := func() []string { return nil }
	if t, ok := m.(interface{ Running() []mounter.Tool }); ok {
		running = func() []string { return toolNames(t.Running()) }
	}
	var err error
	select {
	case err = <-closed:
	case <-time.After(o.ShutdownTimeout):
		if tools := running(); len(tools) > 0 {
			log.Warn().Strs("tools", tools).Float64("grace_seconds", o.HostToolGrace.Seconds()).
				Msg("waiting for host tools to finish: csid never kills one")
		}
		err = <-closed
	}
	if err != nil {
		if tools := running(); len(tools) > 0 {
			log.Error().Strs("tools", tools).Msg("host tools still running at the end of the grace period: they die with csid's container (the next NodeStage repairs an interrupted growth)")
		}
		return err
	}
	log.Info().Msg("stopped")
	return nil
}

// toolNames describes running host tools for a log line.
func toolNames(tools []mounter.Tool) []string {
	out := make([]string, len(tools))
	for i, t := range tools {
		out[i] = fmt.Sprintf("%s (running %s)", t, time.Since(t.Started).Round(time.Second))
	}
	return out
}

// provider is the cloud side of one process.
type provider struct {
	cloud   cloud.Cloud
	host    cloud.Host
	mounter mounter.Mounter
	zone    string
	// topologyKey is the segment csid names the zone with (driver.Config);
	// empty: csid's own.
	topologyKey string
}

func newProvider(ctx context.Context, o Options) (*provider, error) {
	switch o.Cloud {
	case "", "local":
		c, err := local.Open(ctx, o.StateDir, local.Options{Zone: o.Zone})
		if err != nil {
			return nil, fmt.Errorf("local backend in %s: %w", o.StateDir, err)
		}
		zone := o.Zone
		if zone == "" {
			zone = local.DefaultZone
		}
		m := mounter.NewWithState(filepath.Join(o.StateDir, GrowDir))
		return &provider{cloud: c, host: c.Host(o.NodeID), mounter: m, zone: zone}, nil
	case "fake":
		zone := o.Zone
		if zone == "" {
			zone = "fake"
		}
		c := o.Fake
		if c == nil {
			c = fake.New(fake.Options{Zones: []string{zone}})
		}
		for kind, d := range o.FakeLatency {
			c.SetLatency(kind, d)
		}
		if err := c.AddNode(cloud.Node{ID: o.NodeID, Zone: zone, MaxAttachments: o.MaxVolumesPerNode}); err != nil {
			return nil, err
		}
		m := fakemount.New()
		return &provider{cloud: c, host: sizedHost{Host: c.Host(o.NodeID), mounter: m}, mounter: m, zone: zone}, nil
	case "yandex":
		return newYandex(ctx, o)
	}
	return nil, fmt.Errorf("unknown cloud %q (local, yandex or fake)", o.Cloud)
}

// sizedHost keeps the fake mounter's devices the size of the fake cloud's
// disks, as a real device is the size of its disk.
type sizedHost struct {
	cloud.Host
	mounter *fakemount.Mounter
}

func (h sizedHost) OpenDevice(ctx context.Context, diskID string, opts cloud.OpenOptions) (*cloud.Device, error) {
	dev, err := h.Host.OpenDevice(ctx, diskID, opts)
	if err != nil {
		return nil, err
	}
	h.mounter.SetDeviceSize(dev.Path, dev.Disk.SizeBytes)
	return dev, nil
}

type controllerBackend struct{ c cloud.Cloud }

func (b controllerBackend) Capacity(ctx context.Context, zone string) (int64, error) {
	return b.c.Capacity(ctx, zone)
}

func (b controllerBackend) Zones() []string { return b.c.Zones() }

func (b controllerBackend) MaxVolumeBytes() int64 { return b.c.MaxDiskBytes() }

type nodeBackend struct {
	cloud   cloud.Cloud
	mounter mounter.Mounter
	nodeID  string
}

func (b nodeBackend) Info(ctx context.Context) (driver.NodeInfo, error) {
	n, err := b.cloud.GetNode(ctx, b.nodeID)
	if err != nil {
		return driver.NodeInfo{}, err
	}
	return driver.NodeInfo{ID: n.ID, MaxVolumes: int64(n.MaxAttachments), Zone: n.Zone}, nil
}

func (b nodeBackend) Stats(ctx context.Context, path string) (driver.VolumeStats, error) {
	s, err := b.mounter.Stats(ctx, path)
	if errors.Is(err, mounter.ErrNotMounted) {
		return driver.VolumeStats{}, fmt.Errorf("%s is not a mounted volume: %w", path, fs.ErrNotExist)
	}
	if err != nil {
		return driver.VolumeStats{}, err
	}
	return driver.VolumeStats{TotalBytes: s.TotalBytes, AvailableBytes: s.AvailableBytes, UsedBytes: s.UsedBytes,
		TotalInodes: s.TotalInodes, FreeInodes: s.FreeInodes, UsedInodes: s.UsedInodes, Block: s.Block}, nil
}
