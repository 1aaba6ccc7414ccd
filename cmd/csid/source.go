package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// modes are tried in this order when looking for a csid in a state
// directory.
var modes = []driver.Mode{driver.ModeAll, driver.ModeController, driver.ModeNode}

// dbLockTimeout bounds the wait for a state file's lock: a file held that
// long is held by a running csid, which holds it for its whole life.
const dbLockTimeout = 500 * time.Millisecond

// source is an open view.Source and what it is.
type source struct {
	view.Source
	// what names it for people: "csid (node) at /var/lib/csid/admin-node.sock".
	what string
	// mode is the csid mode it holds records of ("" when unknown).
	mode driver.Mode
	// info is what the source's Info answered when it was opened.
	info  view.Info
	close func() error
}

func (s *source) Close() error { return s.close() }

// openSocket connects to a live csid's admin socket and asks who it is.
func openSocket(ctx context.Context, path string) (*source, error) {
	c := admin.NewClient(path, 10*time.Second)
	info, err := c.Info(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &source{Source: c, what: fmt.Sprintf("csid (%s, pid %d) at %s", info.Mode, info.PID, path),
		mode: driver.Mode(info.Mode), info: info, close: c.Close}, nil
}

// modeOfFile guesses the mode of a state file from its name (app.StateFile).
func modeOfFile(path string) driver.Mode {
	for _, m := range modes {
		if filepath.Base(path) == filepath.Base(app.StateFile("", m)) {
			return m
		}
	}
	return ""
}

// openDB opens a state file read-only. A file a running csid holds is
// refused within dbLockTimeout, naming the holder and the socket to use.
func openDB(path, command string) (*source, error) {
	st, err := store.OpenReadOnly(path, store.Options{LockTimeout: dbLockTimeout})
	var locked *store.LockedError
	if errors.As(err, &locked) {
		sock := "<state-dir>/admin-<mode>.sock"
		if m := modeOfFile(path); m != "" {
			sock = app.AdminSocketPath(filepath.Dir(path), m)
		}
		return nil, fmt.Errorf("%w: csid is running on it and --db reads only the file of a stopped csid; "+
			"read the running csid through its admin socket instead:\n    csid %s --socket %s", err, command, sock)
	}
	if err != nil {
		return nil, err
	}
	m := modeOfFile(path)
	info := view.Info{Mode: string(m), StateFile: path, Schema: store.SchemaVersion}
	return &source{Source: view.NewStoreSource(st, info), what: fmt.Sprintf("state file %s (read-only)", path),
		mode: m, info: info, close: st.Close}, nil
}

// found is a csid answering on one of a state directory's admin sockets.
type found struct {
	*source
	socket string
}

// discover returns the csids answering on the admin sockets of a state
// directory (all, controller, node, in that order) and, when none answers,
// an error saying what was tried and what to do.
func discover(ctx context.Context, stateDir, command string) ([]found, error) {
	if abs, err := filepath.Abs(stateDir); err == nil {
		stateDir = abs
	}
	var live []found
	var tried []string
	for _, m := range modes {
		sock := app.AdminSocketPath(stateDir, m)
		s, err := openSocket(ctx, sock)
		switch {
		case err == nil:
			live = append(live, found{s, sock})
			continue
		case errors.Is(err, admin.ErrNotServing):
			if _, serr := os.Lstat(sock); serr != nil {
				tried = append(tried, fmt.Sprintf("%s: no such socket", sock))
			} else {
				tried = append(tried, fmt.Sprintf("%s: nobody answers (a csid that stopped)", sock))
			}
		default:
			tried = append(tried, err.Error())
		}
	}
	if len(live) > 0 {
		return live, nil
	}
	var hint strings.Builder
	fmt.Fprintf(&hint, "no csid answers in %s (--state-dir):\n    %s\n", stateDir, strings.Join(tried, "\n    "))
	var dbs []string
	for _, m := range modes {
		if _, err := os.Stat(app.StateFile(stateDir, m)); err == nil {
			dbs = append(dbs, app.StateFile(stateDir, m))
		}
	}
	if len(dbs) > 0 {
		fmt.Fprintf(&hint, "csid is not running here; to read its state file (read-only):\n")
		for _, db := range dbs {
			fmt.Fprintf(&hint, "    csid %s --db %s\n", command, db)
		}
	} else {
		fmt.Fprintf(&hint, "and no state file either: give the state directory csid runs with (--state-dir, in a csid pod /var/lib/csid), or its admin socket (--socket)\n")
	}
	return nil, errors.New(strings.TrimSuffix(hint.String(), "\n"))
}

// sourceFlags are the flags that say where `csid inspect` reads.
type sourceFlags struct {
	socket, db, stateDir string
}

// define defines the flags on fl (cmd's own flags, or its persistent flags
// for its subcommands), with their shell completions.
func (f *sourceFlags) define(cmd *cobra.Command, fl *pflag.FlagSet) {
	fl.StringVar(&f.socket, "socket", "", "admin socket of a running csid (default: the one answering in --state-dir; of several, this container's, else the first)")
	fl.StringVar(&f.db, "db", "", "state file of a stopped csid, opened read-only (csid.db, controller.db or node.db)")
	fl.StringVar(&f.stateDir, "state-dir", "csid-data", "state directory of the csid to read (where its admin sockets are)")
	_ = cmd.RegisterFlagCompletionFunc("db", extCompletion("db"))
	_ = cmd.RegisterFlagCompletionFunc("socket", extCompletion("sock"))
	_ = cmd.RegisterFlagCompletionFunc("state-dir", dirCompletion)
}

// open returns the one source the flags name: --db, --socket, or a csid
// answering in --state-dir. When several answer there (a controller and a
// node plugin sharing a state directory, as on a single-node cluster), it
// is the one running in this process's pid namespace, if exactly one does:
// in Kubernetes, the csid of the container `kubectl exec` runs in;
// otherwise the first of all, controller, node. chosen then says which it
// is and which others answer ("" when only one answers).
func (f *sourceFlags) open(ctx context.Context, command string) (src *source, chosen string, err error) {
	switch {
	case f.socket != "" && f.db != "":
		return nil, "", errors.New("--socket and --db: choose one (--socket for a running csid, --db for the state file of a stopped one)")
	case f.db != "":
		src, err = openDB(f.db, command)
		return src, "", err
	case f.socket != "":
		src, err = openSocket(ctx, f.socket)
		return src, "", err
	}
	live, err := discover(ctx, f.stateDir, command)
	if err != nil {
		return nil, "", err
	}
	if len(live) == 1 {
		return live[0].source, "", nil
	}
	pick, why := 0, ""
	var local []int
	for i, l := range live {
		if inOurPIDNamespace(l.socket) {
			local = append(local, i)
		}
	}
	if len(local) == 1 {
		pick, why = local[0], ", the csid of this container"
	}
	var others []string
	for i, l := range live {
		if i != pick {
			others = append(others, l.socket)
			l.Close()
		}
	}
	chosen = fmt.Sprintf("showing %s%s; also answering in %s: %s (choose with --socket)",
		live[pick].what, why, f.stateDir, strings.Join(others, ", "))
	return live[pick].source, chosen, nil
}

// inOurPIDNamespace reports whether the csid serving socket runs in this
// process's pid namespace. The kernel reports a unix socket's server pid as
// seen from here (SO_PEERCRED), and 0 for a process in a pid namespace this
// one does not contain (another pod's container).
func inOurPIDNamespace(socket string) bool {
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	pid, err := app.PeerPID(conn)
	if err != nil || pid <= 0 {
		return false
	}
	mine, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false
	}
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	return err == nil && theirs == mine
}
