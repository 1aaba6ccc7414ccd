package crash

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain doubles as the process a point kills: with CSID_CRASH_TEST_HITS
// set, it passes each named point that many times; with
// CSID_CRASH_TEST_TOOL set, it starts a host tool of its own, and a point of
// GroupPoints is reached while that tool runs.
func TestMain(m *testing.M) {
	if hits := os.Getenv("CSID_CRASH_TEST_HITS"); hits != "" {
		if err := ArmFromEnv(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		var tool *exec.Cmd
		if os.Getenv("CSID_CRASH_TEST_TOOL") != "" {
			// A tool that writes (WritesBeforeFiring times and more),
			// then works on: the test reads its output until the tool
			// is gone too.
			tool = exec.Command("sh", "-c", fmt.Sprintf("for i in $(seq %d); do echo $i; done; exec sleep 3600", 2*WritesBeforeFiring))
			tool.Stdout = os.Stdout
			if err := tool.Start(); err != nil {
				os.Exit(4)
			}
		}
		for _, name := range strings.Fields(hits) {
			if GroupPoints[name] && tool != nil {
				defer PointWhileWriting(name, tool.Process.Pid)()
				_ = tool.Wait() // the point kills it
			} else {
				Point(name)
			}
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHits runs the child; it returns whether SIGKILL ended it. Any other
// failure of the child (it could not arm, say) fails the test.
func runHits(t *testing.T, hits string, env ...string) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "CSID_CRASH_TEST_HITS="+hits, "GORACE=atexit_sleep_ms=0"), env...)
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil {
		t.Fatalf("child with hits %q, env %v: %v", hits, env, err)
	}
	return false
}

func TestArmedPointKillsOnItsHitAndLogs(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "fired")
	hits := OpsQueued + " " + OpsBeforeEffect + " " + OpsQueued + " " + OpsQueued
	if runHits(t, hits, EnvAt+"="+OpsQueued+":3", EnvLog+"="+log) != true {
		t.Fatal("the third hit of ops.queued did not SIGKILL the process")
	}
	if got, _ := os.ReadFile(log); strings.TrimSpace(string(got)) != OpsQueued {
		t.Fatalf("fired log: %q", got)
	}
	if runHits(t, hits, EnvAt+"="+OpsQueued+":4") {
		t.Fatal("a point killed on a hit that never came")
	}
	if runHits(t, hits) {
		t.Fatal("an unarmed point killed the process")
	}
}

// A group point kills the process group once the host tool it watches has
// begun to write, the tool included, as a container's death does; it can
// only be armed in a process that leads its group.
func TestGroupPointKillsTheToolsToo(t *testing.T) {
	hits := OpsBeforeEffect + " " + MounterResizeRunning
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CSID_CRASH_TEST_HITS="+hits, "CSID_CRASH_TEST_TOOL=1", EnvAt+"="+MounterResizeRunning,
		"GORACE=atexit_sleep_ms=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	gone := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, out); gone <- err }() // EOF once the child and its tool are dead
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the tool outlived the crash of its process group")
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not SIGKILLed: %v (%s)", err, stderr.String())
	}

	// Not the leader of its group (it shares the test's): arming refuses.
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CSID_CRASH_TEST_HITS="+hits, EnvAt+"="+MounterResizeRunning)
	raw, err := cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(raw), "process group") {
		t.Fatalf("a group point armed outside a group leader: %v: %s", err, raw)
	}
}

func TestCensusCountsEveryPointWithoutFiring(t *testing.T) {
	count := filepath.Join(t.TempDir(), "census")
	hits := OpsQueued + " " + OpsBeforeEffect + " " + OpsQueued
	if runHits(t, hits, EnvCount+"="+count) {
		t.Fatal("a census killed the process")
	}
	got, _ := os.ReadFile(count)
	if strings.Fields(string(got))[0] != OpsQueued || len(strings.Fields(string(got))) != 3 {
		t.Fatalf("census: %q", got)
	}
}

func TestArmRefusesUnknownPointsAndBadCounts(t *testing.T) {
	for _, spec := range []string{"no.such.point", OpsQueued + ":0", OpsQueued + ":x"} {
		if err := Arm(spec, ""); err == nil {
			t.Errorf("Arm(%q) accepted", spec)
		}
	}
	if err := Arm("", ""); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkUnarmedPoint(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Point(OpsBeforeEffect)
	}
}
