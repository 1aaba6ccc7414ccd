package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/csid-dev/csid/internal/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// errBenchFailed makes `csid bench` exit 1 after printing a report that
// shows failures, an interruption or volumes left behind.
var errBenchFailed = errors.New("the run was not clean (see the report)")

// benchLong is `csid bench --help`'s description.
const benchLong = `Run a load against a CSI endpoint (csid or any other driver) and report the
throughput and latency of each RPC, phase by phase:

  probe      Probe calls
  create     CreateVolume calls (the volumes are kept for the delete phase)
  delete     DeleteVolume calls
  lifecycle  create, controller publish, stage, publish, unpublish, unstage,
             controller unpublish, delete: one volume's whole life per unit
  scale      create+delete pairs with none of the run's volumes around, and
             with --existing volumes created beforehand, alternately

Every round starts with the floor, measured at concurrency 1: Probe's round
trip on the same endpoint and a bare bbolt commit in --floor-dir (point it at
the driver's state file system). As root, with the lifecycle phase and mount
volumes, each round's lifecycle comes right after the floor of a stage: a
sparse file of --size in --floor-dir bound to a loop device, formatted with
mkfs and mounted as csid does (the timed part), then unmounted, released and
removed. With several --concurrency values, each phase runs at each, in
slices that alternate between them (so the machine's drifting load hits them
alike), and the report gives their ratios round by round.

With --baseline-endpoint, a second driver is measured in the same run: every
phase runs on both, in alternating slices like the concurrencies, and the
report gives the ratio of the endpoint's rate over the baseline's, round by
round (the floors are measured on --endpoint only).

Only what the driver advertises is called (controller publish with
PUBLISH_UNPUBLISH_VOLUME, stage with STAGE_UNSTAGE_VOLUME). Volume names start
with --prefix and a random run id. Every volume the run creates is deleted at
the end, also after Ctrl-C (press it twice to leave them); a journal under
--journal-dir lets the next run (or --cleanup-only) clean up after a run that
was killed. At the end of a run (not with --cleanup-only), ListVolumes confirms
nothing of the run is left.

The report goes to stdout (a table, or JSON with -o json: docs/benchmarks.md
describes its fields); a progress line goes to stderr when it is a terminal.
The exit code is 1 when any unit failed, the run was interrupted, or a volume
was left behind.`

// benchExample is `csid bench --help`'s examples.
const benchExample = `  # csid on the fake backend, in the background
  csid serve --cloud fake --state-dir /tmp/csid-fake &
  csid bench --endpoint unix:///tmp/csid-fake/csi.sock --floor-dir /tmp/csid-fake \
    --concurrency 1,8 --rounds 5 --existing 5000 --plot bench.svg

  # csid on the local backend against csid on the fake backend, in one run
  csid bench --endpoint /tmp/csid-local/csi.sock --baseline-endpoint /tmp/csid-fake/csi.sock \
    --floor-dir /tmp/csid-local --phases scale --existing 0 -c 1,8 --rounds 3

  # only the lifecycle, as JSON
  csid bench --endpoint /var/lib/kubelet/plugins/csid.csi.dev/csi.sock --phases lifecycle -o json`

// benchOptions are the flags of `csid bench`.
type benchOptions struct {
	cfg                bench.Config
	phases             []string
	size, output, plot string
	mkfsFloorSamples   int
	progress           bool
}

func newBench() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "Measure a CSI driver: ops/s and p50/p90/p99 per RPC, beside the floor",
		Long:    benchLong,
		Example: benchExample,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.flags(cmd.Flags())
	return cmd
}

// flags defines the flags of `csid bench` on f.
func (o *benchOptions) flags(f *pflag.FlagSet) {
	cfg := &o.cfg
	f.StringVar(&cfg.Endpoint, "endpoint", "", "the driver's CSI endpoint: unix:///path, /path or host:port (default unix://<./csid-data>/csi.sock)")
	f.StringVar(&cfg.Baseline, "baseline-endpoint", "", "a second driver's CSI endpoint, measured in the same run, interleaved: the report gives the endpoint's rates over its")
	f.StringSliceVar(&o.phases, "phases", []string{"probe", "create", "delete", "lifecycle", "scale"}, "phases to run, in this order")
	f.IntSliceVarP(&cfg.Concurrency, "concurrency", "c", []int{8}, "workers; several values (1,8) measure each phase at each")
	f.IntVarP(&cfg.Count, "count", "n", 100, "units per measurement: calls, lifecycles or create+delete pairs")
	f.IntVar(&cfg.Existing, "existing", 1000, "volumes the scale phase creates before its second measurement (0: only the first)")
	f.IntVar(&cfg.Rounds, "rounds", 1, "repeat everything; the summary gives medians, the ratios are taken round by round")
	f.IntVar(&cfg.Slices, "slices", 0, "cut each measurement into this many slices, run alternately at each concurrency (default: 25 units per worker per slice)")
	f.StringVar(&o.size, "size", "64Mi", "each volume's size (Ki, Mi, Gi, or bytes)")
	f.StringVar(&cfg.AccessType, "access-type", "mount", "mount or block")
	f.StringVar(&cfg.FsType, "fs-type", "ext4", "filesystem of mount volumes")
	f.StringToStringVar(&cfg.Parameters, "parameter", nil, "a CreateVolume parameter, key=value (repeatable)")
	f.StringVar(&cfg.NodeID, "node-id", "", "node to publish to (default: NodeGetInfo's)")
	f.StringVar(&cfg.StagingDir, "staging-dir", "", "directory of the staging paths, one per volume (default: under a new temporary directory)")
	f.StringVar(&cfg.TargetDir, "target-dir", "", "directory of the target paths, one per volume (default: under a new temporary directory)")
	f.StringVar(&cfg.Prefix, "prefix", "csid-bench-", "start of every volume name (a random run id follows)")
	f.DurationVar(&cfg.Timeout, "timeout", 0, "bound of each RPC (default 2m)")
	f.IntVar(&cfg.FloorSamples, "floor-samples", 200, "Probe and bbolt samples of the floor per round")
	f.StringVar(&cfg.FloorDir, "floor-dir", "", "directory of the floors' bbolt file and image: the driver's state dir's file system (default: the temporary directory)")
	f.IntVar(&o.mkfsFloorSamples, "mkfs-floor-samples", 24, "mkfs+mount samples of the stage's floor per round, taken between the units of the lifecycle's concurrency-1 lane; back to back before the lifecycle when -c has no 1 (root, lifecycle, mount volumes; 0: none)")
	f.StringVar(&cfg.JournalDir, "journal-dir", "", "where runs journal their volumes (default ~/.cache/csid-bench)")
	f.BoolVar(&cfg.CleanupOnly, "cleanup-only", false, "only clean up after killed runs against --endpoint")
	f.StringVarP(&o.output, "output", "o", "table", "report format: table or json")
	f.StringVar(&o.plot, "plot", "", "also write an SVG chart of p50 and p99 per RPC to this file")
	f.BoolVar(&o.progress, "progress", false, "draw the progress line on stderr even when it is not a terminal")
}

// run is `csid bench`: check the flags, run the load with an interrupt
// that ends the measurements and, a second time, the cleanup, and report.
func (o *benchOptions) run(cmd *cobra.Command) error {
	cfg := o.cfg
	var err error
	if cfg.SizeBytes, err = bench.ParseSize(o.size); err != nil {
		return err
	}
	cfg.MkfsFloorSamples = o.mkfsFloorSamples
	if o.mkfsFloorSamples == 0 {
		cfg.MkfsFloorSamples = -1 // the library's "none"; its 0 is "the default"
	} else if o.mkfsFloorSamples < 0 {
		return fmt.Errorf("--mkfs-floor-samples %d: not negative", o.mkfsFloorSamples)
	}
	for _, p := range o.phases {
		cfg.Phases = append(cfg.Phases, bench.Phase(p))
	}
	if o.output != "table" && o.output != "json" {
		return fmt.Errorf("-o %q: table or json", o.output)
	}
	if cfg.Endpoint == "" {
		dir, err := filepath.Abs("csid-data")
		if err != nil {
			return err
		}
		cfg.Endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	}
	if o.progress || isTerminal(os.Stderr) {
		cfg.Progress = cmd.ErrOrStderr()
	}
	var stop func()
	cfg.Abandon, stop = abandonOnSecondSignal(cmd)
	defer stop()

	rep, runErr := bench.Run(cmd.Context(), cfg)
	if rep != nil {
		if err := o.report(cmd, rep); err != nil {
			return err
		}
	}
	if runErr != nil {
		return fmt.Errorf("bench: %w", runErr)
	}
	if !cfg.CleanupOnly && !rep.OK() {
		return errBenchFailed
	}
	return nil
}

// abandonOnSecondSignal returns a channel closed by a second SIGINT or
// SIGTERM: the first ends the measurements (main's context), the second
// abandons the cleanup. stop releases the signals.
func abandonOnSecondSignal(cmd *cobra.Command) (abandon <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; !ok {
			return
		}
		fmt.Fprintln(cmd.ErrOrStderr(), "\ninterrupted: deleting the volumes of this run; interrupt again to leave them to the next run")
		if _, ok := <-sigs; ok {
			close(ch)
		}
	}()
	return ch, func() { signal.Stop(sigs); close(sigs) }
}

// report writes the report in the asked format, and the plot if asked.
func (o *benchOptions) report(cmd *cobra.Command, rep *bench.Report) error {
	out := cmd.OutOrStdout()
	var err error
	if o.output == "json" {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteTable(out)
	}
	if err != nil || o.plot == "" {
		return err
	}
	return writePlot(o.plot, rep)
}

func writePlot(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := rep.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot: %w", err)
	}
	return f.Close()
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
