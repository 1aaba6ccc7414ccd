package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// NodeID is the node id the drill's csid runs as.
const NodeID = "drill-node"

// proc is one run of the real csid binary.
type proc struct {
	cmd    *exec.Cmd
	socket string
	exited chan struct{}
	err    error // set before exited is closed
	conn   *grpc.ClientConn
	client clients
}

type clients struct {
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

// start runs `csid serve` on the cell's state dir with the cloud's flags
// and the given extra environment (a crash point, a census), appending its
// output to csid.log, and waits until it answers Probe as ready.
func start(ctx context.Context, binary, dir string, cloudArgs, env []string) (*proc, error) {
	socket := filepath.Join(dir, "csi.sock")
	logf, err := os.OpenFile(filepath.Join(dir, "csid.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	args := []string{binary, "serve", "--state-dir", dir, "--endpoint", "unix://" + socket,
		"--node-id", NodeID, "--log-format", "json", "--shutdown-timeout", "5s"}
	args = append(args, cloudArgs...)
	// Without CAP_SYS_RESOURCE, csid grows ext4 offline: the growth with
	// crash points of its own (the kernel journals an online one).
	if setpriv, err := exec.LookPath("setpriv"); err == nil {
		args = append([]string{setpriv, "--bounding-set", "-sys_resource", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	// csid leads its process group, as in a container: a crash point
	// during a host tool kills the group, the tool with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	p := &proc{cmd: cmd, socket: socket, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	// csid restarts under the drill all the time: reconnect within
	// milliseconds, not after gRPC's default second of backoff.
	p.conn, err = grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		p.kill()
		return nil, err
	}
	p.client = clients{csi.NewIdentityClient(p.conn), csi.NewControllerClient(p.conn), csi.NewNodeClient(p.conn)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := p.client.Probe(pctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return p, nil
		}
		select {
		case <-p.exited:
			p.conn.Close()
			return p, fmt.Errorf("csid exited before it was ready: %v (see csid.log)", p.err)
		case <-ctx.Done():
			p.kill()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling another process's socket
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("csid not ready after 30s: %v", err)
		}
	}
}

// dead reports whether the process has exited, waiting up to d for it.
func (p *proc) dead(d time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// killedBySignal reports whether the process died of SIGKILL (a crash point).
func (p *proc) killedBySignal() bool {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// stop shuts csid down with SIGTERM, as Kubernetes does, and waits.
func (p *proc) stop() error {
	defer p.conn.Close()
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			return fmt.Errorf("csid exited with %v after SIGTERM", p.err)
		}
		return nil
	case <-time.After(30 * time.Second):
		p.kill()
		return errors.New("csid did not stop within 30s of SIGTERM")
	}
}

// kill ends the process at once, with the host tools it runs (Ctrl-C of
// the drill, a hung csid).
func (p *proc) kill() {
	select {
	case <-p.exited: // its group may be gone and its id reused
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.exited
	if p.conn != nil {
		p.conn.Close()
	}
}
