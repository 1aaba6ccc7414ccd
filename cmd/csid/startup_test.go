package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The variables that shape BenchmarkStartup.
const (
	// startupVolumesEnv is how many volumes the state of the csid it
	// starts holds (default 1000; issue 16's target 5 is about 10000).
	startupVolumesEnv = "CSID_BENCH_STARTUP_VOLUMES"
	// startupDirEnv, if set, is where the state is made and kept, to be
	// reused by later runs (creating 10,000 volumes on the local backend
	// takes minutes); a state holding fewer volumes is topped up.
	startupDirEnv = "CSID_BENCH_STARTUP_DIR"
)

// BenchmarkStartup measures issue 16's target 5: how long a real `csid
// serve` (the binary, built as `task build` builds it) on the local backend
// takes from exec to ready when its state holds N volumes, and its memory.
// The state is made once per process (or kept in CSID_BENCH_STARTUP_DIR):
// a csid creates the N volumes through CSI (CreateVolume over its socket;
// no root needed: a disk is a sparse file until it is attached). Then each
// iteration starts csid on it, waits for its "ready" log line and then for
// /readyz (on --metrics-address) to answer 200 (what a pod's readiness
// probe asks), reads the process's peak RSS (VmHWM in /proc/PID/status),
// lists every volume three times (ListVolumes, paged), reads the peak
// again, and stops it with SIGTERM. It reports the mean time to ready
// (ready-s/op), the largest peak RSS at ready (ready-RSS-MiB) and after
// the listings (peak-RSS-MiB); ns/op is suppressed (it would include the
// listings and the shutdown).
//
//	CSID_BENCH_STARTUP_VOLUMES=10000 go test -run '^$' -bench Startup -benchtime 5x -count 3 ./cmd/csid
func BenchmarkStartup(b *testing.B) {
	n := startupVolumes(b)
	b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
		fx := startupState(b, n)
		var total time.Duration
		var readyRSS, peakRSS int64
		for i := 0; i < b.N; i++ {
			p, ready := startTimed(b, fx.bin, fx.dir)
			total += ready
			readyRSS = max(readyRSS, p.peakRSS(b))
			for range 3 {
				if got := listedVolumes(b, p.socket); got != n {
					b.Fatalf("ListVolumes lists %d volumes, want %d", got, n)
				}
			}
			peakRSS = max(peakRSS, p.peakRSS(b))
			p.stop(b)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(total.Seconds()/float64(b.N), "ready-s/op")
		b.ReportMetric(float64(readyRSS)/(1<<20), "ready-RSS-MiB")
		b.ReportMetric(float64(peakRSS)/(1<<20), "peak-RSS-MiB")
	})
}

// startupVolumes reads CSID_BENCH_STARTUP_VOLUMES.
func startupVolumes(b *testing.B) int {
	raw := os.Getenv(startupVolumesEnv)
	if raw == "" {
		return 1000
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number of volumes", startupVolumesEnv, raw)
	}
	return n
}

// startupFixture is a csid binary and a state directory holding volumes.
type startupFixture struct {
	bin, dir string
}

// startupFixtures are the fixtures made by this process, by number of
// volumes: a benchmark function runs several times (b.N grows), its setup
// once. TestMain removes their temporary directories.
var startupFixtures = struct {
	sync.Mutex
	byCount map[int]*startupFixture
	temp    []string
}{byCount: map[int]*startupFixture{}}

// removeStartupFixtures removes the temporary directories of the fixtures.
func removeStartupFixtures() {
	startupFixtures.Lock()
	defer startupFixtures.Unlock()
	for _, dir := range startupFixtures.temp {
		_ = os.RemoveAll(dir)
	}
}

// startupState builds csid and makes a state holding n volumes, once per
// process for each n.
func startupState(b *testing.B, n int) *startupFixture {
	startupFixtures.Lock()
	defer startupFixtures.Unlock()
	if fx := startupFixtures.byCount[n]; fx != nil {
		return fx
	}
	tmp, err := os.MkdirTemp("", "csid-startup-")
	if err != nil {
		b.Fatal(err)
	}
	startupFixtures.temp = append(startupFixtures.temp, tmp)
	fx := &startupFixture{bin: buildCSID(b, tmp), dir: filepath.Join(tmp, "state")}
	if dir := os.Getenv(startupDirEnv); dir != "" {
		fx.dir = dir
	}
	start := time.Now()
	made := fillState(b, fx.bin, fx.dir, n)
	b.Logf("state %s: %d volumes, %d created through CSI in %v", fx.dir, n, made, time.Since(start).Round(time.Second))
	startupFixtures.byCount[n] = fx
	return fx
}

// buildCSID builds csid into dir as `task build` does (static, stripped)
// and returns its path.
func buildCSID(b *testing.B, dir string) string {
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, "csid")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = filepath.Dir(file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// fillState starts csid on dir and creates volumes through CSI until it
// holds n (names startup-00000, ...: a repeated create of one is
// idempotent); it returns how many it created.
func fillState(b *testing.B, bin, dir string, n int) int {
	p, _ := startTimed(b, bin, dir)
	defer p.stop(b)
	have := listedVolumes(b, p.socket)
	if have > n {
		b.Fatalf("%s holds %d volumes, more than the %d asked for: use another %s", dir, have, n, startupDirEnv)
	}
	if have == n {
		return 0
	}
	conn := dialCSI(b, p.socket)
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				_, err := ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("startup-%05d", i),
					CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{vc}})
				if err != nil {
					errs <- fmt.Errorf("CreateVolume startup-%05d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	if got := listedVolumes(b, p.socket); got != n {
		b.Fatalf("after the creates, ListVolumes lists %d volumes, want %d", got, n)
	}
	return n - have
}

// serveProcess is a running `csid serve`.
type serveProcess struct {
	cmd    *exec.Cmd
	socket string
	log    *testutil.Buffer
	done   chan struct{}
	err    error // cmd.Wait's, set before done is closed
}

// startTimed starts `csid serve` on dir with metrics on a free port, and
// returns once /readyz answers 200, with the time from exec to then. It
// waits for csid's "ready" log line first, so the polling of /readyz does
// not load the start-up it measures.
func startTimed(b *testing.B, bin, dir string) (*serveProcess, time.Duration) {
	p := &serveProcess{socket: filepath.Join(dir, "csi.sock"), log: &testutil.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve", "--state-dir", dir, "--node-id", "startup-node", "--metrics-address", "127.0.0.1:0",
		"--log-format", "json", "--log-level", "info")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	events := make(chan logEvent, 4)
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		watchLog(io.TeeReader(stderr, p.log), events)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	b.Cleanup(p.kill)
	var metrics string
	for ready := false; !ready; {
		select {
		case e := <-events:
			if e.Address != "" {
				metrics = e.Address
			}
			ready = e.Message == "ready"
		case <-p.done:
			b.Fatalf("csid exited (%v) before it was ready:\n%s", p.err, p.log)
		case <-time.After(5 * time.Minute):
			b.Fatalf("csid not ready within 5 minutes:\n%s", p.log)
		}
	}
	if metrics == "" {
		b.Fatalf("csid logged no metrics address:\n%s", p.log)
	}
	waitReadyz(b, p, metrics)
	return p, time.Since(start)
}

// logEvent is what BenchmarkStartup reads of csid's JSON log lines.
type logEvent struct {
	Message string `json:"message"`
	Address string `json:"address"`
}

// watchLog sends the log lines csid's start-up is timed by (the metrics
// address, "ready") and reads the rest to the end.
func watchLog(r io.Reader, events chan<- logEvent) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e logEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Message == "ready" || strings.HasPrefix(e.Message, "serving /metrics")) {
			select {
			case events <- e:
			default: // nobody waits any more
			}
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// waitReadyz polls /readyz until it answers 200.
func waitReadyz(b *testing.B, p *serveProcess, addr string) {
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		if time.Now().After(deadline) {
			b.Fatalf("/readyz not 200 a minute after csid logged ready: %v\n%s", err, p.log)
		}
		select {
		case <-p.done:
			b.Fatalf("csid exited (%v):\n%s", p.err, p.log)
		case <-time.After(2 * time.Millisecond): // polling another process's endpoint
		}
	}
}

// peakRSS reads the process's peak resident set size (VmHWM), in bytes.
func (p *serveProcess) peakRSS(b *testing.B) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				b.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	return 0
}

// stop sends SIGTERM and waits for a clean exit.
func (p *serveProcess) stop(b *testing.B) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			b.Fatalf("csid exited with %v after SIGTERM:\n%s", p.err, p.log)
		}
	case <-time.After(time.Minute):
		b.Fatalf("csid still running a minute after SIGTERM:\n%s", p.log)
	}
}

// kill ends the process if it still runs (a benchmark that failed).
func (p *serveProcess) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// dialCSI connects to a CSI socket.
func dialCSI(b *testing.B, socket string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	return conn
}

// listedVolumes pages through ListVolumes and counts the volumes.
func listedVolumes(b *testing.B, socket string) int {
	conn := dialCSI(b, socket)
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	n, token := 0, ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		resp, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: token})
		cancel()
		if err != nil {
			b.Fatalf("ListVolumes: %v", err)
		}
		n += len(resp.GetEntries())
		if token = resp.GetNextToken(); token == "" {
			return n
		}
	}
}
