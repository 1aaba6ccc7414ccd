package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/view"
	"github.com/spf13/cobra"
)

const inspectLong = `Show what csid knows: each volume's state, how it got there, the op in flight
on it and why the last one failed, the deferred resize queue, and the
snapshots.

csid inspect reads a running csid through its admin socket (read-only, mode
0600: run it as the user csid runs as), or, with --db, the state file of a
stopped csid (opened read-only, never modified). Without --socket or --db it
looks in --state-dir for admin-all.sock, admin-controller.sock and
admin-node.sock, and reads the csid that answers. When several answer (the
controller and the node plugin of a single-node cluster share the node's
/var/lib/csid), it reads the one running in its own container (pid
namespace) — in the node plugin's pod, the node plugin — or else the first
of all, controller, node; a note above the table (on stderr with -o json or
yaml) says which it shows and which others answer.

Tables are for people (sizes in binary units, times in UTC with their age);
-o json and -o yaml print the documents of the admin API, whose field names
are stable and listed in the doc of package internal/view (and
docs/operations.md).`

const inspectExample = `  # every volume of the csid in ./csid-data
  csid inspect volumes

  # in Kubernetes: the node plugin of the node a pod runs on
  kubectl exec -n csid <csid-node pod> -c csid -- csid inspect volumes --socket /var/lib/csid/admin-node.sock

  # one volume (the PV's spec.csi.volumeHandle): record, history, pending op, resize
  csid inspect volume vol-3f9c2a61d0b84e7a5c11 --state-dir /var/lib/csid

  # what is stuck, what failed, what waits for a detach
  csid inspect ops --pending
  csid inspect ops --failed -o json
  csid inspect resizes

  # the snapshots, and one of them (the VolumeSnapshotContent's snapshotHandle)
  csid inspect snapshots
  csid inspect snapshot snap-01a2100e38a2a19a1811

  # a stopped csid's state file
  csid inspect volumes --db /var/lib/csid/controller.db`

// newInspect builds `csid inspect`; now is the clock of the ages in tables.
func newInspect(now func() time.Time) *cobra.Command {
	in := &inspector{now: now}
	cmd := &cobra.Command{
		Use:     "inspect",
		Short:   "Show volumes, ops, resizes and snapshots of a running csid, or of a state file",
		Long:    inspectLong,
		Example: inspectExample,
		Args:    cobra.NoArgs,
	}
	pf := cmd.PersistentFlags()
	in.f.define(cmd, pf)
	pf.StringVarP(&in.output, "output", "o", outTable, "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion(outputs...))
	cmd.AddCommand(in.volumesCmd(), in.volumeCmd(), in.opsCmd(), in.resizesCmd(), in.snapshotsCmd(), in.snapshotCmd())
	return cmd
}

// inspector holds what every `csid inspect` subcommand shares: where to
// read (its persistent flags), the output format, the clock.
type inspector struct {
	f      sourceFlags
	output string
	now    func() time.Time
}

// with opens the source, runs fn on it, and closes it.
func (in *inspector) with(cmd *cobra.Command, name string, fn func(ctx context.Context, src *source, p printer) error) error {
	if err := checkOutput(in.output); err != nil {
		return err
	}
	src, chosen, err := in.f.open(cmd.Context(), name)
	if err != nil {
		return err
	}
	defer src.Close()
	if chosen != "" {
		// Said where people look: above the table, or beside a document
		// that must stay one.
		if in.output == outTable {
			fmt.Fprintf(cmd.OutOrStdout(), "Note: %s.\n\n", chosen)
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", chosen)
		}
	}
	return fn(cmd.Context(), src, printer{now: in.now()})
}

// show renders v in the chosen format, the table with table.
func (in *inspector) show(cmd *cobra.Command, v any, table func(w io.Writer) error) error {
	return render(cmd.OutOrStdout(), in.output, v, table)
}

// volumesCmd is `csid inspect volumes`.
func (in *inspector) volumesCmd() *cobra.Command {
	var state, node string
	volumes := &cobra.Command{
		Use:   "volumes",
		Short: "List volumes: state, size, node, pending op, queued resize, last op",
		Example: `  csid inspect volumes
  csid inspect volumes --state PUBLISHED --node node-1
  csid inspect volumes -o json | jq -r '.volumes[] | select(.pendingOp) | .id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter := view.VolumeFilter{State: fsm.State(state), Node: node}
			if err := view.CheckState(filter.State); err != nil {
				return fmt.Errorf("--state: %w", err)
			}
			return in.with(cmd, "inspect volumes", func(ctx context.Context, src *source, p printer) error {
				l, err := src.Volumes(ctx, filter)
				if err != nil {
					return err
				}
				return in.show(cmd, l, func(w io.Writer) error { return p.volumes(w, l) })
			})
		},
	}
	volumes.Flags().StringVar(&state, "state", "", "only volumes in this state: ABSENT, CREATED, NODE_READY, VOL_READY or PUBLISHED")
	volumes.Flags().StringVar(&node, "node", "", "only volumes attached to this node")
	_ = volumes.RegisterFlagCompletionFunc("state", stateCompletion)
	_ = volumes.RegisterFlagCompletionFunc("node", in.f.nodeCompletion)
	return volumes
}

// volumeCmd is `csid inspect volume ID`.
func (in *inspector) volumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "volume ID",
		Short: "Show one volume: its record, full history, pending op and queued resize",
		Long: `Show one volume: its record; the op in flight on it, with its attempts, last
error and next attempt; its queued resize and what it waits for; its last op
and why it failed; and its history, oldest first: every transition with its
time, event, states, op and outcome, and the notes no op explains (a resize
queued, a volume adopted, a resize dropped).`,
		Example: `  csid inspect volume vol-3f9c2a61d0b84e7a5c11
  csid inspect volume "$(kubectl get pv <pv> -o jsonpath='{.spec.csi.volumeHandle}')" -o yaml`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: in.f.volumeCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			return in.with(cmd, "inspect volume "+args[0], func(ctx context.Context, src *source, p printer) error {
				v, err := src.Volume(ctx, args[0])
				if errors.Is(err, view.ErrNotFound) {
					return fmt.Errorf("no volume %s in %s: csid inspect volumes lists them (a deleted volume has no record; its ops stay for a while: csid inspect ops --volume %s)", args[0], src.what, args[0])
				}
				if err != nil {
					return err
				}
				return in.show(cmd, v, func(w io.Writer) error { return p.volume(w, v) })
			})
		},
	}
}

// opsCmd is `csid inspect ops`.
func (in *inspector) opsCmd() *cobra.Command {
	var pending, failed bool
	var opVolume, opSnapshot string
	var limit int
	ops := &cobra.Command{
		Use:   "ops",
		Short: "List ops, newest first: pending (queued, retrying, compensating) or failed ones",
		Long: `List ops, newest first. An op is one accepted transition of one volume (or one
snapshot): queued
(waiting for or running its effect, also while it backs off between
attempts), compensating (undoing a failed forward op), succeeded or failed.
--pending shows what is in flight, with its attempts and last error; --failed
shows what failed, with the gRPC code and message the CO got.`,
		Example: `  csid inspect ops --pending
  csid inspect ops --failed --limit 20
  csid inspect ops --volume vol-3f9c2a61d0b84e7a5c11
  csid inspect ops --snapshot snap-01a2100e38a2a19a1811`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter := view.OpFilter{Status: view.OpsAll, VolumeID: opVolume, SnapshotID: opSnapshot, Limit: limit}
			switch {
			case pending:
				filter.Status = view.OpsPending
				if !cmd.Flags().Changed("limit") {
					filter.Limit = 0
				}
			case failed:
				filter.Status = view.OpsFailed
			}
			if filter.Limit < 0 {
				return fmt.Errorf("--limit %d: 0 (all) or more", filter.Limit)
			}
			return in.with(cmd, "inspect ops", func(ctx context.Context, src *source, p printer) error {
				l, err := src.Ops(ctx, filter)
				if err != nil {
					return err
				}
				if in.output == outTable && filter.Limit > 0 && len(l.Ops) == filter.Limit {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: showing the newest %d ops; --limit 0 shows all\n", filter.Limit)
				}
				return in.show(cmd, l, func(w io.Writer) error { return p.ops(w, l) })
			})
		},
	}
	ops.Flags().BoolVar(&pending, "pending", false, "only ops in flight: queued, retrying or compensating (all of them, unless --limit is given)")
	ops.Flags().BoolVar(&failed, "failed", false, "only failed ops")
	ops.Flags().StringVar(&opVolume, "volume", "", "only the ops of this volume")
	ops.Flags().StringVar(&opSnapshot, "snapshot", "", "only the ops of this snapshot")
	ops.Flags().IntVar(&limit, "limit", 100, "at most this many ops, newest first (0: all that are kept)")
	ops.MarkFlagsMutuallyExclusive("pending", "failed")
	_ = ops.RegisterFlagCompletionFunc("volume", in.f.volumeCompletion)
	return ops
}

// resizesCmd is `csid inspect resizes`.
func (in *inspector) resizesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resizes",
		Short: "List the deferred resizes: what each waits for",
		Long: `List the deferred offline-resize queue. An expansion asked for while a volume
is attached waits here (queued) until the volume is detached, then an expand
op grows the disk (running). WAITING FOR says what each one needs.`,
		Example: `  csid inspect resizes
  csid inspect resizes -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return in.with(cmd, "inspect resizes", func(ctx context.Context, src *source, p printer) error {
				l, err := src.Resizes(ctx)
				if err != nil {
					return err
				}
				return in.show(cmd, l, func(w io.Writer) error { return p.resizes(w, l) })
			})
		},
	}
}

// snapshotsCmd is `csid inspect snapshots`.
func (in *inspector) snapshotsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshots",
		Short: "List snapshots: state, size, source volume, pending op, last op",
		Long: `List the snapshots csid took, in id order: READY ones (cut; restorable and
listed to the CO) and ABSENT ones (being cut: their snapshot_create op is in
flight). A snapshot outlives its source volume.`,
		Example: `  csid inspect snapshots
  csid inspect snapshots -o json | jq -r '.snapshots[] | select(.sourceVolumeID == "vol-3f9c2a61d0b84e7a5c11") | .id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return in.with(cmd, "inspect snapshots", func(ctx context.Context, src *source, p printer) error {
				l, err := src.Snapshots(ctx)
				if err != nil {
					return err
				}
				return in.show(cmd, l, func(w io.Writer) error { return p.snapshots(w, l) })
			})
		},
	}
}

// snapshotCmd is `csid inspect snapshot ID`.
func (in *inspector) snapshotCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot ID",
		Short: "Show one snapshot: its record, history, pending and last op",
		Example: `  csid inspect snapshot snap-01a2100e38a2a19a1811
  csid inspect snapshot "$(kubectl get volumesnapshotcontent <name> -o jsonpath='{.status.snapshotHandle}')" -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return in.with(cmd, "inspect snapshot "+args[0], func(ctx context.Context, src *source, p printer) error {
				s, err := src.Snapshot(ctx, args[0])
				if errors.Is(err, view.ErrNotFound) {
					return fmt.Errorf("no snapshot %s in %s: csid inspect snapshots lists them (a deleted snapshot has no record; its ops stay for a while: csid inspect ops --snapshot %s)", args[0], src.what, args[0])
				}
				if err != nil {
					return err
				}
				return in.show(cmd, s, func(w io.Writer) error { return p.snapshot(w, s) })
			})
		},
	}
}

// Shell completion.

func fixedCompletion(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

func extCompletion(ext string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{ext}, cobra.ShellCompDirectiveFilterFileExt
	}
}

func dirCompletion(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

func stateCompletion(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	out := make([]string, len(fsm.States))
	for i, s := range fsm.States {
		out[i] = string(s)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completionVolumes lists the volumes of the source the flags name, for
// completion (errors complete nothing).
func (f *sourceFlags) completionVolumes(cmd *cobra.Command) []view.Volume {
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, 3*time.Second)
	defer cancel()
	src, _, err := f.open(ctx, "inspect")
	if err != nil {
		return nil
	}
	defer src.Close()
	l, err := src.Volumes(ctx, view.VolumeFilter{})
	if err != nil {
		return nil
	}
	return l.Volumes
}

// volumeCompletion completes volume ids, described by state and name.
func (f *sourceFlags) volumeCompletion(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if cmd.Name() == "volume" && len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, v := range f.completionVolumes(cmd) {
		out = append(out, fmt.Sprintf("%s\t%s %s", v.ID, v.State, v.Name))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// nodeCompletion completes the nodes volumes are attached to.
func (f *sourceFlags) nodeCompletion(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	var out []string
	for _, v := range f.completionVolumes(cmd) {
		if v.Node != "" && !slices.Contains(out, v.Node) {
			out = append(out, v.Node)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
