package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
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

// open returns the one source the flags name: --db, --socket, or the first
// csid answering in --state-dir (a note on stderr when several answer).
func (f *sourceFlags) open(ctx context.Context, command string, stderr io.Writer) (*source, error) {
	switch {
	case f.socket != "" && f.db != "":
		return nil, errors.New("--socket and --db: choose one (--socket for a running csid, --db for the state file of a stopped one)")
	case f.db != "":
		return openDB(f.db, command)
	case f.socket != "":
		return openSocket(ctx, f.socket)
	}
	live, err := discover(ctx, f.stateDir, command)
	if err != nil {
		return nil, err
	}
	if len(live) > 1 {
		var names []string
		for _, l := range live[1:] {
			names = append(names, l.socket)
			l.Close()
		}
		fmt.Fprintf(stderr, "note: several csids answer in %s; showing %s (the others: %s; choose with --socket)\n",
			f.stateDir, live[0].what, strings.Join(names, ", "))
	}
	return live[0].source, nil
}
