package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/testutil"
)

// readmeCommand returns the command (comment and indentation stripped) of
// the one README.md line containing marker.
func readmeCommand(t *testing.T, marker string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.Contains(line, marker) {
			cmd, _, _ := strings.Cut(line, "#")
			found = append(found, strings.TrimSpace(cmd))
		}
	}
	if len(found) != 1 {
		t.Fatalf("README.md has %d lines containing %q, want exactly one: %q", len(found), marker, found)
	}
	return found[0]
}

// TestReadmeTestCommandIsWhatCIRuns checks that the README's test command
// is, verbatim, a line of .ci/run (CI's entry point), after the line that
// makes root-only tests fail instead of skipping, as the README says.
func TestReadmeTestCommandIsWhatCIRuns(t *testing.T) {
	cmd := readmeCommand(t, "go test")
	if !strings.HasPrefix(cmd, "go test ") || !strings.HasSuffix(cmd, "./...") {
		t.Fatalf("README.md's test command is %q; want a go test of ./...", cmd)
	}
	script, err := os.ReadFile(filepath.Join("..", "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(script), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	at := slices.Index(lines, cmd)
	if at < 0 {
		t.Fatalf(".ci/run has no line %q (README.md's test command); CI must run what the README tells people to run", cmd)
	}
	if !slices.Contains(lines[:at], "export CSID_REQUIRE_ROOT=1") {
		t.Errorf(".ci/run runs %q without exporting CSID_REQUIRE_ROOT=1 first; root-only tests would skip in CI", cmd)
	}
}

// TestReadmeServeCommand runs the README's run command as written, minus
// `go run` (this test binary is csid): `serve` with no flags, as root, in
// a fresh working directory. It must answer Probe ready on
// ./csid-data/csi.sock, keep its state in ./csid-data, and exit 0 on
// SIGTERM.
func TestReadmeServeCommand(t *testing.T) {
	cmd := strings.Fields(readmeCommand(t, "go run ./cmd/csid serve"))
	at := slices.Index(cmd, "./cmd/csid")
	if at < 0 || !slices.Equal(cmd[at+1:], []string{"serve"}) {
		t.Fatalf("README.md's run command is %q; this test runs `csid serve` with no flags", strings.Join(cmd, " "))
	}
	testutil.RequireRoot(t) // the README runs it with sudo: loop devices need root
	wd := apptest.ShortTempDir(t)
	p := startCSIDProcess(t, wd, cmd[at+1:]...)
	waitReady(t, p, filepath.Join(wd, "csid-data", "csi.sock"))
	if _, err := os.Stat(filepath.Join(wd, "csid-data", "csid.db")); err != nil {
		t.Errorf("no state file in ./csid-data: %v", err)
	}
	took := terminate(t, p, 5*time.Second)
	t.Logf("csid serve exited 0 %v after SIGTERM", took.Round(time.Millisecond))
}
