package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/csid-dev/csid/internal/version"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// run builds the command tree and runs it; it returns the exit code: 1 for
// any error (csid check: also when it finds anything), else 0.
func run(ctx context.Context, args []string) int { return runIO(ctx, args, os.Stdout, os.Stderr) }

// runIO is run with the command's output and errors going to stdout and
// stderr.
func runIO(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "csid:", err)
		return 1
	}
	return 0
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "csid",
		Short: "A CSI driver for block storage that can only be grown while detached",
		Long: `csid serves the CSI Identity, Controller and Node services for block storage
that grows only while detached. Every volume moves through a crash-safe state
machine kept in a bbolt file, and an expansion asked for while a volume is
attached waits durably and runs the moment the volume is detached.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newInspect(time.Now), newCheck(), newState(), newDrill(), newBench(), newVersion())
	return root
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print csid's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "csid", version.Version)
		},
	}
}

// newLogger builds the process logger: JSON lines (the default), or a
// console format for people.
func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: %w", level, err)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q: json or console", format)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
