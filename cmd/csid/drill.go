package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/drill"
	"github.com/spf13/cobra"
)

func newDrill() *cobra.Command {
	var cfg drill.Config
	var output string
	var binary string
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Run the crash-recovery drill: kill csid at every crash point, restart it, check nothing is lost",
		Long: `Run csid's crash-recovery drill on this machine.

The drill starts this csid binary (all-in-one, local backend, a temporary state
dir) and drives volumes through scenarios the way an orchestrator does,
including its retries. For each scenario it first counts which crash points are
reached, then for every hit of every point it kills csid there with SIGKILL,
restarts it, lets the retries come, and checks: every transition legal, every
op completed, no disk, loop device, mount or attachment left, no attach while a
resize was queued or running, and data written before the crash readable after
it. It needs root (loop devices, mkfs, mounts), like csid's local backend.

The state dir and logs of a failing case are kept and their path printed;
everything else is removed, also on Ctrl-C. Exit status 1 on any failure.`,
		Example: `  sudo csid drill
  sudo csid drill --scenarios expand-attached --points resize.after_cloud_resize,ops.queued
  sudo csid drill -o json > drill.json

  # on a cluster, in a node plugin pod (privileged, root):
  kubectl exec -n csid ds/csid-node -c csid -- csid drill --dir /var/lib/csid`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != outTable && output != outJSON {
				return fmt.Errorf("-o %q: table or json", output)
			}
			cfg.Binary = binary
			if isTerminal(os.Stderr) && output == outTable {
				cfg.Progress = progressBar(cmd.ErrOrStderr())
			}
			rep, err := drill.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case outJSON:
				if err := encodeJSON(out, rep); err != nil {
					return err
				}
			case outTable:
				if err := rep.Table(out); err != nil {
					return err
				}
				fmt.Fprintln(out)
				for _, c := range rep.Cells {
					if c.Result == drill.Fail {
						fmt.Fprintf(out, "FAIL %s at %s (hit %d): %s\n     state dir and logs kept in %s\n", c.Scenario, c.Point, c.Hit, c.Reason, c.Dir)
					}
				}
				fmt.Fprintln(out, rep.Summary())
			}
			if !rep.OK() {
				return errors.New("the drill failed: " + rep.Summary())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Scenarios, "scenarios", nil, "scenarios to run (default all): "+scenarioNames())
	f.StringSliceVar(&cfg.Points, "points", nil, "crash points to kill at (default all): "+pointNames())
	f.BoolVar(&cfg.FirstHitOnly, "first-hit-only", false, "kill at the first hit of each point only, not at every hit")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the state dirs of passing cases too")
	f.StringVar(&cfg.Dir, "dir", "", "where to make the temporary state dirs (default the system temp dir; keep it short)")
	f.StringVarP(&output, "output", "o", outTable, "output: table or json")
	f.StringVar(&binary, "binary", "", "the csid binary to drill (default: this one)")
	_ = f.MarkHidden("binary")
	_ = cmd.RegisterFlagCompletionFunc("scenarios", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return strings.Split(scenarioNames(), ", "), cobra.ShellCompDirectiveNoFileComp
	})
	_ = cmd.RegisterFlagCompletionFunc("points", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return strings.Split(pointNames(), ", "), cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

func scenarioNames() string {
	var n []string
	for _, s := range drill.Scenarios {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}

func pointNames() string {
	var n []string
	for p := range crash.Points {
		n = append(n, p)
	}
	slices.Sort(n)
	return strings.Join(n, ", ")
}

// progressBar draws one line that it rewrites as cells start.
func progressBar(w io.Writer) func(done, total int, c drill.Cell) {
	return func(done, total int, c drill.Cell) {
		const width = 30
		n := 0
		if total > 0 {
			n = done * width / total
		}
		what := ""
		if c.Scenario != "" {
			what = fmt.Sprintf("%s, %s:%d", c.Scenario, c.Point, c.Hit)
		}
		fmt.Fprintf(w, "\r[%s%s] %d/%d %-60s", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total, what)
		if done == total {
			fmt.Fprintln(w)
		}
	}
}
