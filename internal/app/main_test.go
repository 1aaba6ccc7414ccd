package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
)

// envChild makes this test binary run a csid process (app.Run) with the
// options it holds (JSON), so tests can SIGKILL a real csid.
const envChild = "CSID_APP_CHILD"

// childOptions are the options a child csid runs with.
type childOptions struct {
	Mode            driver.Mode
	Endpoint        string
	StateDir        string
	Cloud           string
	NodeID          string
	ShutdownTimeout time.Duration
	HostToolGrace   time.Duration
	KubeletRoot     string
}

func TestMain(m *testing.M) {
	if raw := os.Getenv(envChild); raw != "" {
		os.Exit(childMain(raw))
	}
	os.Exit(m.Run())
}

func childMain(raw string) int {
	var co childOptions
	if err := json.Unmarshal([]byte(raw), &co); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := crash.ArmFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := app.Run(ctx, app.Options{Mode: co.Mode, Endpoint: co.Endpoint, StateDir: co.StateDir, Cloud: co.Cloud, NodeID: co.NodeID,
		ShutdownTimeout: co.ShutdownTimeout, HostToolGrace: co.HostToolGrace, KubeletRoot: co.KubeletRoot,
		Log: zerolog.New(os.Stderr).Level(zerolog.InfoLevel)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "csid:", err)
		return 1
	}
	return 0
}

// child is a csid run as a separate process.
type child struct {
	cmd    *exec.Cmd
	socket string
	exited chan error
	log    testutil.Buffer // what it logged
}

// startChild runs csid in a child process and waits until it answers Probe
// as ready; crashAt arms a crash point in it.
func startChild(t *testing.T, co childOptions, crashAt, crashLog string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	return runChild(t, co, cmd, crash.EnvAt+"="+crashAt, crash.EnvLog+"="+crashLog)
}

// runChild starts cmd, which runs this test binary (perhaps through a
// launcher), as a csid with options co and the extra environment env, and
// waits until it answers Probe as ready.
func runChild(t *testing.T, co childOptions, cmd *exec.Cmd, env ...string) *child {
	t.Helper()
	raw, _ := json.Marshal(co)
	cmd.Env = append(append(os.Environ(), envChild+"="+string(raw), "GORACE=atexit_sleep_ms=0"), env...)
	c := &child{cmd: cmd, socket: co.Endpoint[len("unix://"):], exited: make(chan error, 1)}
	cmd.Stderr = io.MultiWriter(&testWriter{t: t, prefix: "csid: "}, &c.log)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed once Wait has returned
	go func() { err := cmd.Wait(); close(done); c.exited <- err }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	})
	cl := apptest.Dial(t, c.socket)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := cl.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return c
		}
		select {
		case err := <-c.exited:
			t.Fatalf("csid exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("csid not ready after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process's socket
	}
}

// kill SIGKILLs the child and waits for it.
func (c *child) kill(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	c.waitKilled(t)
}

// waitKilled waits for the child to die of SIGKILL (its own crash point, or
// kill).
func (c *child) waitKilled(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("csid did not die of SIGKILL: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("csid still running 30s after it should have been killed")
	}
}

// stop SIGTERMs the child and waits for a clean exit.
func (c *child) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("csid exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("csid still running 30s after SIGTERM")
	}
}

// testWriter forwards a child's output to the test log.
type testWriter struct {
	t      *testing.T
	prefix string
}

func (w *testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(w.prefix + string(p))
	}
	return len(p), nil
}
