package crash

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestMain doubles as the process a point kills: with CSID_CRASH_TEST_HITS
// set, it passes each named point that many times.
func TestMain(m *testing.M) {
	if hits := os.Getenv("CSID_CRASH_TEST_HITS"); hits != "" {
		if err := ArmFromEnv(); err != nil {
			os.Exit(3)
		}
		for _, name := range strings.Fields(hits) {
			Point(name)
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
