package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/testutil"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// runAsCSID, when set to 1, makes the test binary run csid's own main
// instead of the tests: the tests start real csid processes by running
// their own binary again, so they exercise the real CLI, signal handling
// and exit codes.
const runAsCSID = "CSID_TEST_RUN_AS_CSID"

func TestMain(m *testing.M) {
	if os.Getenv(runAsCSID) == "1" {
		main() // exits with run's code
	}
	code := m.Run()
	removeStartupFixtures()
	os.Exit(code)
}

// process is a csid child process.
type process struct {
	cmd     *exec.Cmd
	stderr  *testutil.Buffer
	started time.Time
	done    chan struct{} // closed when the process has exited
	exited  time.Time
	err     error // cmd.Wait's
}

// startCSIDProcess starts `csid args...` in dir ("" for the test's working
// directory). The process is killed at the end of the test if still running.
func startCSIDProcess(t *testing.T, dir string, args ...string) *process {
	t.Helper()
	return startCSIDProcessWith(t, nil, dir, args...)
}

// startCSIDProcessWith is startCSIDProcess with attributes for the child
// (a namespace of its own, say).
func startCSIDProcessWith(t *testing.T, attr *syscall.SysProcAttr, dir string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Dir = dir
	cmd.SysProcAttr = attr
	// A -race child otherwise sleeps 1s at exit.
	cmd.Env = append(os.Environ(), runAsCSID+"=1", "GORACE=atexit_sleep_ms=0")
	p := &process{cmd: cmd, stderr: &testutil.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		p.exited = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
			t.Logf("killed csid %v (pid %d); its output:\n%s", args, cmd.Process.Pid, p.stderr)
		}
	})
	return p
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// wait waits up to limit for the process to exit and returns its exit code
// and how long it ran.
func (p *process) wait(t *testing.T, limit time.Duration) (code int, ran time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("csid %v (pid %d) still runs after %v; its output:\n%s", p.cmd.Args[1:], p.pid(), limit, p.stderr)
	}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
		code = 0
	case errors.As(p.err, &exit) && exit.Exited():
		code = exit.ExitCode()
	default:
		t.Fatalf("csid %v: %v; its output:\n%s", p.cmd.Args[1:], p.err, p.stderr)
	}
	return code, p.exited.Sub(p.started)
}

// waitReady waits until the csid process answers Probe with ready=true on
// socket, or fails the test if it exits or the deadline passes first. gRPC
// retries the connection (with short backoff) until the socket answers.
func waitReady(t *testing.T, p *process, socket string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.done: // it died: stop waiting at once
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	tick := time.NewTicker(10 * time.Millisecond) // paces the retries of a not-yet-ready Probe
	defer tick.Stop()
	for {
		resp, err := id.Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.GetReady().GetValue() {
			return
		}
		select {
		case <-ctx.Done():
			select {
			case <-p.done:
				t.Fatalf("csid %v exited (%v) before it was ready; its output:\n%s", p.cmd.Args[1:], p.err, p.stderr)
			default:
			}
			t.Fatalf("csid %v not ready on %s within 30s (last Probe: %v, %v); its output:\n%s", p.cmd.Args[1:], socket, resp, err, p.stderr)
		case <-tick.C:
		}
	}
}

// socketServer returns the pid of the process serving a unix socket.
func socketServer(t *testing.T, socket string) int {
	t.Helper()
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		t.Fatalf("%s does not answer: %v", socket, err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		t.Fatal(err)
	}
	if credErr != nil {
		t.Fatal(credErr)
	}
	return int(cred.Pid)
}

// terminate sends SIGTERM and expects a clean exit (code 0) within limit.
func terminate(t *testing.T, p *process, limit time.Duration) time.Duration {
	t.Helper()
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, _ := p.wait(t, limit)
	took := p.exited.Sub(sent)
	if code != 0 {
		t.Fatalf("csid (pid %d) exited %d after SIGTERM, want 0 (graceful shutdown); its output:\n%s", p.pid(), code, p.stderr)
	}
	return took
}
