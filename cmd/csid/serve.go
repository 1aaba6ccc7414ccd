package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/version"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveLong is `csid serve --help`'s description.
const serveLong = `Run the CSI driver on a unix socket until SIGTERM or SIGINT.

With no flags, csid runs all three CSI services on its embedded local backend:
disks are sparse files under the state directory (./csid-data), attached as
loop devices (this needs root). In Kubernetes, run one --mode controller and
one --mode node per node (see docs/deploy.md).`

// serveExample is `csid serve --help`'s examples.
const serveExample = `  # all-in-one on this machine, state in ./csid-data
  sudo csid serve

  # a node plugin as the DaemonSet runs it
  csid serve --mode node --endpoint unix:///csi/csi.sock --state-dir /var/lib/csid --node-id "$NODE_NAME"`

// serveOptions are the flags of `csid serve`: app.Options, and those that
// need parsing first.
type serveOptions struct {
	o                                              app.Options
	mode, logFormat, logLevel, crashAt, socketMode string
	deadlines                                      map[string]string
	spareProcs                                     int
}

func newServe() *cobra.Command {
	var so serveOptions
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Run the CSI driver",
		Long:    serveLong,
		Example: serveExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if so.spareProcs < 0 {
				return fmt.Errorf("--spare-procs %d: want 0 or more", so.spareProcs)
			}
			o, err := so.options(cmd)
			if err != nil {
				return err
			}
			setProcs(so.spareProcs)
			if err := app.Run(cmd.Context(), o); err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		},
	}
	so.flags(cmd.Flags())
	return cmd
}

// flags defines the flags of `csid serve` on f.
func (so *serveOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&so.mode, "mode", string(driver.ModeAll), "services to serve: all, controller or node")
	f.StringVar(&so.o.Endpoint, "endpoint", "", "CSI socket, unix:///path or /path (default <state-dir>/csi.sock)")
	f.StringVar(&so.o.StateDir, "state-dir", "csid-data", "directory of the state file (and of the local backend's disks)")
	f.StringVar(&so.socketMode, "socket-mode", "0660", "permission bits of the CSI socket, whatever the umask (directories csid creates for it get the matching search bits)")
	f.StringVar(&so.o.SocketOwner, "socket-owner", "", "owner of the CSI socket and of the directories csid creates for it, user[:group] by name or number (default: csid's own)")
	f.StringVar(&so.o.KubeletRoot, "kubelet-root", "", "kubelet's root directory: node requests for paths outside it are refused (empty: any absolute path, as all-in-one and the sanity suite need; no symbolic link is ever followed either way)")
	f.StringVar(&so.o.AdminSocket, "admin-socket", "", "read-only admin socket of csid inspect and check, mode 0600 (default <state-dir>/admin-<mode>.sock)")
	f.StringVar(&so.o.Cloud, "cloud", "local", "backend: local (sparse files and loop devices), yandex (Yandex Compute Cloud) or fake (in memory, for load tests)")
	f.StringVar(&so.o.NodeID, "node-id", "", "this node's id (default: the hostname; with --cloud yandex, the instance id from the metadata service)")
	f.StringVar(&so.o.DriverName, "driver-name", driver.DefaultName, "CSI driver name")
	f.IntVar(&so.o.MaxVolumesPerNode, "max-volumes-per-node", 0, "volumes this node can hold (0: no limit; with --cloud yandex, --yandex-max-disks)")
	f.StringVar(&so.o.Zone, "zone", "", "this node's zone on the local and fake backends (default \"local\", \"fake\"); not read with --cloud yandex, where it is the instance's zone as the Compute API reports it")
	f.IntVar(&so.o.Workers, "workers", 64, "operations whose effects run at once")
	f.BoolVar(&so.o.RebuildFromCloud, "rebuild-from-cloud", false, "start on a new (missing or empty) state file although the cloud has csid's disks: "+
		"a controller rebuilds its records from the disks' tags, a node from this host's mounts (without it, such a start is refused)")
	f.StringVar(&so.o.MetricsAddress, "metrics-address", "", "serve /metrics, /readyz and /healthz on this address, e.g. :9090 (off when empty)")
	f.DurationVar(&so.o.ShutdownTimeout, "shutdown-timeout", app.DefaultShutdownTimeout, "bound of each shutdown step: stopping gRPC, then letting running operations finish")
	f.DurationVar(&so.o.HostToolGrace, "host-tool-grace", app.DefaultHostToolGrace,
		"how long shutdown then waits for host tools still running (mkfs, e2fsck, resize2fs, xfs_growfs), which csid never kills; "+
			"a pod's terminationGracePeriodSeconds must exceed 2*shutdown-timeout + host-tool-grace")
	f.StringToStringVar(&so.deadlines, "op-deadline", nil, "deadline of one attempt of an operation, by event, e.g. controller_publish=2m,node_stage=30m; "+
		"an attempt past it is retried, and host tools are never killed for it (defaults: "+defaultDeadlines()+")")
	f.IntVar(&so.spareProcs, "spare-procs", defaultSpareProcs, "processors the Go scheduler runs beyond the CPUs it would use (GOMAXPROCS = its default + this), "+
		"so that a write returning from a flush goes on at once; the GOMAXPROCS environment variable, when set, is used as it is")
	f.StringVar(&so.logFormat, "log-format", "json", "log format: json or console")
	f.StringVar(&so.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&so.crashAt, "crash-at", "", "arm a crash point (drills): name or name:N")
	_ = f.MarkHidden("crash-at")
	yandexFlags(f, &so.o.Yandex)
}

// yandexFlags defines the flags of --cloud yandex on f.
func yandexFlags(f *pflag.FlagSet, y *app.YandexOptions) {
	f.StringVar(&y.Endpoint, "yandex-endpoint", yandex.DefaultEndpoint, "Yandex Cloud API endpoint (endpoint discovery finds each service from it)")
	f.BoolVar(&y.Insecure, "yandex-insecure", false, "talk plaintext gRPC to --yandex-endpoint (a fake API in tests; never a real one)")
	f.StringVar(&y.FolderID, "yandex-folder-id", "", "the folder of csid's disks (required with --cloud yandex)")
	f.StringVar(&y.KeyFile, "yandex-key-file", "", "service-account key file (JSON, as `yc iam key create` writes it); empty: the instance's service account, through the metadata service")
	f.StringSliceVar(&y.Zones, "yandex-zones", nil, "zones of csid's disks, comma separated, the first the default (empty: the zones the API lists as up)")
	f.StringVar(&y.MetadataURL, "yandex-metadata-url", yandex.DefaultMetadataURL, "the instance metadata service (node id, the instance's service account)")
	f.StringVar(&y.ByIDDir, "yandex-by-id-dir", yandex.DefaultByIDDir, "where the node finds attached disks' by-id links (virtio-<disk id>)")
	f.IntVar(&y.MaxDisks, "yandex-max-disks", yandex.DefaultMaxDisks, "disks an instance holds (its max volumes)")
	f.Float64Var(&y.RateLimit, "yandex-rate-limit", yandex.DefaultRateLimit, "calls per second to the Yandex API (every compute and operation call, polls of operations included, and the endpoint discovery at start-up)")
	f.IntVar(&y.RateBurst, "yandex-rate-burst", yandex.DefaultBurst, "calls to the Yandex API allowed at once above --yandex-rate-limit")
	f.BoolVar(&y.LoopSerial, "yandex-loop-serial", false, "prove a device by its loop backing file's name (a test's node simulator; never on a real node)")
	_ = f.MarkHidden("yandex-insecure")
	_ = f.MarkHidden("yandex-loop-serial")
}

// options parses the flags into app.Options, arms a crash point if asked,
// and makes the logger.
func (so *serveOptions) options(cmd *cobra.Command) (app.Options, error) {
	o := so.o
	log, err := newLogger(cmd.ErrOrStderr(), so.logFormat, so.logLevel)
	if err != nil {
		return o, err
	}
	if err := crash.Arm(so.crashAt, os.Getenv(crash.EnvLog)); err != nil {
		return o, err
	}
	if so.crashAt == "" {
		if err := crash.ArmFromEnv(); err != nil {
			return o, err
		}
	}
	if o.Deadlines, err = parseDeadlines(so.deadlines); err != nil {
		return o, err
	}
	o.Mode, o.Log, o.Version = driver.Mode(so.mode), log, version.Version
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		return o, err
	}
	if o.Endpoint == "" {
		o.Endpoint = "unix://" + filepath.Join(o.StateDir, "csi.sock")
	}
	perm, err := strconv.ParseUint(so.socketMode, 8, 32)
	if err != nil || perm > 0o777 || perm == 0 {
		return o, fmt.Errorf("--socket-mode %q: want octal permission bits, such as 0660", so.socketMode)
	}
	o.SocketMode = os.FileMode(perm)
	if o.KubeletRoot != "" {
		if !filepath.IsAbs(o.KubeletRoot) {
			return o, fmt.Errorf("--kubelet-root %q: want an absolute path", o.KubeletRoot)
		}
		o.KubeletRoot = filepath.Clean(o.KubeletRoot)
	}
	return o, nil
}

// parseDeadlines reads --op-deadline: event=duration pairs, events of the
// lifecycle that ops run, durations positive.
func parseDeadlines(flag map[string]string) (ops.Deadlines, error) {
	out := ops.Deadlines{}
	for k, v := range flag {
		e := fsm.Event(k)
		if !slices.Contains(fsm.AllOpEvents(), e) {
			return nil, fmt.Errorf("--op-deadline: %q is not an operation's event (%v)", k, fsm.AllOpEvents())
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("--op-deadline: %s=%q is not a positive duration", k, v)
		}
		out[e] = d
	}
	return out, nil
}

// defaultDeadlines lists the default deadlines, for the flag's help.
func defaultDeadlines() string {
	var parts []string
	d := ops.DefaultDeadlines()
	for _, e := range fsm.AllOpEvents() {
		parts = append(parts, fmt.Sprintf("%s=%v", e, d[e]))
	}
	return strings.Join(parts, ",")
}
