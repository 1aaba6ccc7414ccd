package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"github.com/spf13/cobra"
)

const stateLong = `Save and check csid's state file: the memory of every volume, op and queued
resize.

csid state backup writes a consistent copy of it, from a running csid
(through its admin socket: csid goes on serving, the copy holds every record
as of the moment it began) or from the file of a stopped csid (--db). The
copy is checked before the command says it is done.

csid state verify checks a state file (--db: its structure, then every
record's checksum) or a running csid's records, and lists what is damaged.
docs/operations.md, "Backup and restore", shows how to restore a copy.`

// backuper is a source that can write a backup: a live csid's admin
// socket, or a state file.
type backuper interface {
	Backup(ctx context.Context, w io.Writer) (int64, error)
}

func newState() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Back up and verify csid's state file",
		Long:  stateLong,
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newStateBackup(), newStateVerify())
	return cmd
}

// openNoted opens the source the flags name; when several csids answer
// in --state-dir, a note on stderr says which one it read.
func openNoted(cmd *cobra.Command, f *sourceFlags, command string) (*source, error) {
	src, chosen, err := f.open(cmd.Context(), command)
	if err == nil && chosen != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", chosen)
	}
	return src, err
}

func newStateBackup() *cobra.Command {
	var f sourceFlags
	var to string
	cmd := &cobra.Command{
		Use:   "backup --to FILE",
		Short: "Write a consistent copy of a running csid's state file (or of a stopped one's, --db)",
		Example: `  # the all-in-one csid in ./csid-data, while it serves
  csid state backup --to /backups/csid-$(date +%F).db

  # in Kubernetes: the controller
  kubectl exec -n csid csid-controller-0 -c csid -- csid state backup --state-dir /var/lib/csid --to /var/lib/csid/backup.db
  kubectl cp -n csid -c csid csid-controller-0:/var/lib/csid/backup.db ./controller-backup.db

  # a stopped csid's file
  csid state backup --db /var/lib/csid/node.db --to /tmp/node-backup.db`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return errors.New("--to: the file to write the copy to")
			}
			src, err := openNoted(cmd, &f, "state backup")
			if err != nil {
				return err
			}
			defer src.Close()
			b, ok := src.Source.(backuper)
			if !ok {
				return fmt.Errorf("%s cannot write a backup", src.what)
			}
			n, err := backup(cmd.Context(), b, to)
			if err != nil {
				return err
			}
			bad, err := checkCopy(cmd.Context(), to)
			if err != nil {
				os.Remove(to) // ours, and useless
				return fmt.Errorf("the copy does not read back: %w (removed %s)", err, to)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %d bytes to %s from %s; the copy reads back.\n", n, to, src.what)
			if len(bad) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: the copy holds %d damaged records, as the state file does (csid state verify --db %s lists them)\n", len(bad), to)
			}
			return nil
		},
	}
	f.define(cmd, cmd.Flags())
	cmd.Flags().StringVar(&to, "to", "", "the file to write (a new file: an existing one is refused)")
	return cmd
}

// backup streams b's copy into a new file at path.
func backup(ctx context.Context, b backuper, path string) (int64, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := b.Backup(ctx, pw)
		pw.CloseWithError(err)
	}()
	n, err := store.WriteFile(path, pr)
	pr.CloseWithError(err) // stops the writer if the file could not be written
	return n, err
}

// checkCopy opens a copy read-only (its structure is checked on open) and
// checks every record; it returns the damaged ones.
func checkCopy(ctx context.Context, path string) ([]view.DamagedRecord, error) {
	st, err := store.OpenReadOnly(path, store.Options{LockTimeout: dbLockTimeout})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	l, err := view.NewStoreSource(st, view.Info{StateFile: path}).Damaged(ctx)
	return l.Records, err
}

func newStateVerify() *cobra.Command {
	var f sourceFlags
	var output string
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check a state file's structure and every record's checksum; list what is damaged",
		Long: `Check a state file (--db, read-only: its structure, then every record's
checksum) or the records of a running csid (through its admin socket), and
list the damaged records: where each is, the volume it belongs to, and what
is wrong. Exit status 0 when nothing is damaged, 1 otherwise. csid check
reports the same records with the action to take.`,
		Example: `  csid state verify --db /var/lib/csid/controller.db
  csid state verify --state-dir /var/lib/csid -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			src, err := openNoted(cmd, &f, "state verify")
			if err != nil {
				return err
			}
			defer src.Close()
			l, err := src.Damaged(cmd.Context())
			if err != nil {
				return err
			}
			err = render(cmd.OutOrStdout(), output, l, func(w io.Writer) error { return printDamaged(w, src.what, l) })
			if err == nil && len(l.Records) > 0 {
				err = fmt.Errorf("%s damaged", count(len(l.Records), "record"))
			}
			return err
		},
	}
	f.define(cmd, cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", outTable, "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion(outputs...))
	return cmd
}

func printDamaged(w io.Writer, what string, l view.DamageList) error {
	if len(l.Records) == 0 {
		_, err := fmt.Fprintf(w, "%s: sound; every record passes its checksum.\n", what)
		return err
	}
	fmt.Fprintf(w, "%s: %s damaged (csid does not act on them; csid check says what to do):\n\n", what, count(len(l.Records), "record"))
	tw := newTab(w)
	fmt.Fprintln(tw, "RECORD\tVOLUME\tPROBLEM")
	for _, r := range l.Records {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Record, dash(r.VolumeID), r.Problem)
	}
	return tw.Flush()
}
