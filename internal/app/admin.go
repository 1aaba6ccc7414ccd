package app

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
)

// AdminSocketPath is the default admin socket of a mode in a state
// directory: <dir>/admin-<mode>.sock (`csid inspect` looks for it there).
func AdminSocketPath(dir string, mode driver.Mode) string {
	return filepath.Join(dir, "admin-"+string(mode)+".sock")
}

// serveAdmin starts the read-only admin endpoint (internal/admin) on its
// unix socket, mode 0600, before the engine resumes anything: an operator
// can inspect a csid that is still recovering. A socket a live process
// serves is refused, naming it; a stale one is replaced. stop closes the
// endpoint and removes the socket; call it before closing the store.
func serveAdmin(o Options, st *store.Store, log zerolog.Logger) (stop func(), err error) {
	path := o.AdminSocket
	if path == "" {
		path = AdminSocketPath(o.StateDir, o.Mode)
	}
	if path, err = filepath.Abs(path); err == nil {
		path, err = SocketPath(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--admin-socket: %w", err)
	}
	lis, err := listenUnix(path, SocketPerm{Mode: 0o600, UID: -1, GID: -1})
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w (choose another with --admin-socket)", err)
	}
	info := view.Info{Mode: string(o.Mode), StateFile: st.Path(), Schema: store.SchemaVersion, PID: os.Getpid(), Version: o.Version,
		DriverName: cmp.Or(o.DriverName, driver.DefaultName)}
	if o.Mode != driver.ModeController {
		info.NodeID, info.KubeletRoot = o.NodeID, o.KubeletRoot
	}
	srv := admin.Serve(lis, view.NewStoreSource(st, info), log.With().Str("component", "admin").Logger())
	log.Info().Str("admin_socket", path).Msg("serving the admin endpoint")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	}, nil
}
