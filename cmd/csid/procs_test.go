package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/app/apptest"
)

// TestSetProcs holds setProcs to its word in this process: GOMAXPROCS
// becomes the runtime's default plus the spare processors, stays the
// default with none, and stays what the GOMAXPROCS environment variable
// chose when it is set.
func TestSetProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	t.Setenv("GOMAXPROCS", "")
	os.Unsetenv("GOMAXPROCS")

	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	if got := setProcs(1); got != def+1 {
		t.Errorf("setProcs(1) with the default %d: GOMAXPROCS %d, want %d", def, got, def+1)
	}
	runtime.SetDefaultGOMAXPROCS()
	if got := setProcs(0); got != def {
		t.Errorf("setProcs(0) with the default %d: GOMAXPROCS %d, want it unchanged", def, got)
	}

	t.Setenv("GOMAXPROCS", "7")
	runtime.GOMAXPROCS(7) // as the runtime read it at start
	if got := setProcs(1); got != 7 {
		t.Errorf("setProcs(1) with GOMAXPROCS=7 in the environment: GOMAXPROCS %d, want 7", got)
	}
}

// TestServeSparesAProcessor starts csid serve three times and reads the
// GOMAXPROCS it serves with from its log: with --spare-procs 0 (the
// runtime's default), without the flag (one more) and with the GOMAXPROCS
// environment variable set (that value, whatever the flag).
func TestServeSparesAProcessor(t *testing.T) {
	served := func(t *testing.T, args ...string) int {
		t.Helper()
		dir := apptest.ShortTempDir(t)
		sock := filepath.Join(dir, "csi.sock")
		p := startCSIDProcess(t, "", append(serveArgs(dir, sock), args...)...)
		waitReady(t, p, sock)
		terminate(t, p, 10*time.Second)
		m := regexp.MustCompile(`"gomaxprocs":(\d+)`).FindStringSubmatch(p.stderr.String())
		if m == nil {
			t.Fatalf("csid serve %v logged no gomaxprocs:\n%s", args, p.stderr)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	t.Setenv("GOMAXPROCS", "")
	os.Unsetenv("GOMAXPROCS") // the children inherit this process's environment
	def := served(t, "--spare-procs", "0")
	if got := served(t); got != def+1 {
		t.Errorf("csid serve runs with GOMAXPROCS %d; want its default %d plus one spare", got, def)
	}
	t.Setenv("GOMAXPROCS", "5")
	if got := served(t, "--spare-procs", "2"); got != 5 {
		t.Errorf("csid serve with GOMAXPROCS=5 in its environment runs with %d; want 5", got)
	}
}
