// Package apptest runs csid in-process for tests (app.Run: the real
// wiring, the real gRPC server on a real unix socket, the real backend),
// and holds what tests share to talk to it: a short temporary directory
// for its sockets (the drill's tests use it too), a CSI client, and Result
// for calls that must succeed.
package apptest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Instance is a csid run in-process by Start.
type Instance struct {
	Dir     string // the state directory
	Socket  string // the CSI socket's path
	cancel  context.CancelFunc
	stopped chan error
}

// Start runs app.Run with o and waits until it answers ready; it stops at
// the end of the test. Empty fields are filled in: the state dir (a
// ShortTempDir), the endpoint (csi.sock in the state dir), the mode (all)
// and the node id (node-1). A logger at debug level, as the zero Logger
// is, is replaced by zerolog.Nop() unless the test runs with -v.
func Start(t testing.TB, o app.Options) *Instance {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = ShortTempDir(t)
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
	in := &Instance{Dir: o.StateDir, Socket: strings.TrimPrefix(o.Endpoint, "unix://"), cancel: cancel, stopped: make(chan error, 1)}
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
	t.Cleanup(func() { in.Stop(t) })
	return in
}

// Stop cancels csid's context and waits for app.Run to return; the test
// fails if it returned an error. Stopping a stopped instance does nothing.
func (in *Instance) Stop(t testing.TB) {
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

// ShortTempDir is a temporary directory with a short path: a unix socket
// path holds at most 107 bytes, and t.TempDir() can be longer. At the end
// of the test it is removed, after (as root) releasing the mounts and loop
// devices a failed test may have left in it.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Geteuid() == 0 {
			hostscrub.Scrub(context.Background(), dir)
		}
		os.RemoveAll(dir)
	})
	return dir
}

// Client speaks the CSI services to a csid socket; Conn is its connection
// (for a call by method name).
type Client struct {
	Conn *grpc.ClientConn
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

// Dial connects to the CSI socket at path socket; the connection is
// closed at the end of the test.
func Dial(t testing.TB, socket string) Client {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return Client{Conn: conn, IdentityClient: csi.NewIdentityClient(conn), ControllerClient: csi.NewControllerClient(conn), NodeClient: csi.NewNodeClient(conn)}
}

// MountCap is a single-node-writer filesystem capability of type fs.
func MountCap(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// KubeletStaging is where kubelet (1.24 and later) stages the filesystem
// volume volumeID of csid's default driver, under kubelet's root.
func KubeletStaging(root, volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return filepath.Join(root, "plugins/kubernetes.io/csi", driver.DefaultName, hex.EncodeToString(sum[:]), "globalmount")
}

// WriteVolData writes the vol_data.json kubelet keeps in dir (made if
// missing) beside a volume's mount point: it names csid's default driver
// and the volume.
func WriteVolData(t testing.TB, dir, volumeID string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	raw := fmt.Sprintf(`{"driverName":%q,"volumeHandle":%q}`, driver.DefaultName, volumeID)
	if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Result carries a call's two values so a test can write
// apptest.R(c.CreateVolume(ctx, req)).Must(t).
type Result[T any] struct {
	v   T
	err error
}

// R wraps a call's two values.
func R[T any](v T, err error) Result[T] { return Result[T]{v, err} }

// Must returns the value, or fails the test now with the error.
func (x Result[T]) Must(t testing.TB) T {
	t.Helper()
	if x.err != nil {
		t.Fatal(x.err)
	}
	return x.v
}
