package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/rs/zerolog"
)

// instance is a csid process run in-process for a test: the real wiring,
// the real gRPC server on a real unix socket, the real backend.
type instance struct {
	dir     string
	socket  string
	cancel  context.CancelFunc
	stopped chan error
}

// startCSID runs app.Run with o (filling in the state dir and endpoint when
// empty) and waits until it answers ready. It stops at the end of the test.
func startCSID(t testing.TB, o app.Options) *instance {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = shortTempDir(t)
	}
	if o.Endpoint == "" {
		o.Endpoint = "unix://" + filepath.Join(o.StateDir, "csi.sock")
	}
	if o.Mode == "" {
		o.Mode = driver.ModeAll
	}
	if o.NodeID == "" {
		o.NodeID = "node-1"
	}
	if o.Log.GetLevel() == zerolog.DebugLevel && !testing.Verbose() {
		o.Log = zerolog.Nop()
	}
	ready := make(chan struct{})
	o.Ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{dir: o.StateDir, socket: strings.TrimPrefix(o.Endpoint, "unix://"), cancel: cancel, stopped: make(chan error, 1)}
	go func() { in.stopped <- app.Run(ctx, o) }()
	select {
	case <-ready:
	case err := <-in.stopped:
		cancel()
		t.Fatalf("csid did not start: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("csid did not become ready within 30s")
	}
	t.Cleanup(func() { in.stop(t) })
	return in
}

func (in *instance) stop(t testing.TB) {
	t.Helper()
	if in.cancel == nil {
		return
	}
	in.cancel()
	in.cancel = nil
	if err := <-in.stopped; err != nil {
		t.Errorf("csid stopped with: %v", err)
	}
}

// shortTempDir is a temporary directory with a short path: a unix socket
// path holds at most 107 bytes, and t.TempDir() can be longer.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Geteuid() == 0 {
			hostscrub.Scrub(context.Background(), dir) // a failed test may leave mounts and loop devices
		}
		os.RemoveAll(dir)
	})
	return dir
}
