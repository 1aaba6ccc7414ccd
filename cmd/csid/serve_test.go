package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/app/apptest"
)

// serveArgs are the arguments of a csid serve on the local backend with
// its own state dir and endpoint.
func serveArgs(stateDir, socket string) []string {
	return []string{"serve", "--state-dir", stateDir, "--endpoint", "unix://" + socket, "--node-id", "node-1"}
}

// TestSecondServeIsRefused starts a csid serve, then a second one (a) on
// the same state dir with another endpoint and (b) on another state dir
// with the same endpoint. Each second one must exit non-zero within 2s,
// naming the first process's pid, instead of hanging on the state file's
// lock or stealing the socket. The first one then shuts down cleanly on
// SIGTERM, and a new serve on the same state dir and socket starts; after a
// SIGKILL, which leaves the socket file behind, the next serve replaces the
// stale socket.
func TestSecondServeIsRefused(t *testing.T) {
	dirA, dirB := apptest.ShortTempDir(t), apptest.ShortTempDir(t)
	sockA := filepath.Join(dirA, "csi.sock")

	first := startCSIDProcess(t, "", serveArgs(dirA, sockA)...)
	waitReady(t, first, sockA)
	namesFirst := regexp.MustCompile(fmt.Sprintf(`\bpid %d\b`, first.pid()))

	for _, tc := range []struct {
		name, stateDir, socket string
	}{
		{"same state dir, other endpoint", dirA, filepath.Join(dirB, "other.sock")},
		{"other state dir, same endpoint", dirB, sockA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			second := startCSIDProcess(t, "", serveArgs(tc.stateDir, tc.socket)...)
			code, ran := second.wait(t, 10*time.Second)
			t.Logf("the second csid exited %d after %v: %s", code, ran.Round(time.Millisecond), lastLine(second.stderr.String()))
			if code == 0 {
				t.Errorf("the second csid exited 0; want a failure")
			}
			if ran > 2*time.Second {
				t.Errorf("the second csid took %v to give up; want at most 2s", ran)
			}
			if !namesFirst.MatchString(second.stderr.String()) {
				t.Errorf("the second csid's output does not name the first one (pid %d):\n%s", first.pid(), second.stderr)
			}
		})
	}
	// The first one still serves its socket: nothing was stolen.
	if pid := socketServer(t, sockA); pid != first.pid() {
		t.Fatalf("%s is served by pid %d, want the first csid, pid %d", sockA, pid, first.pid())
	}
	waitReady(t, first, sockA)

	took := terminate(t, first, 5*time.Second)
	t.Logf("the first csid exited 0 %v after SIGTERM", took.Round(time.Millisecond))

	// A new serve on the same state dir and socket starts.
	third := startCSIDProcess(t, "", serveArgs(dirA, sockA)...)
	waitReady(t, third, sockA)
	if pid := socketServer(t, sockA); pid != third.pid() {
		t.Fatalf("%s is served by pid %d, want the new csid, pid %d", sockA, pid, third.pid())
	}
	// Killed, it leaves its socket file behind; the next serve replaces it.
	if err := third.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-third.done
	if st, err := os.Lstat(sockA); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("after SIGKILL, %s is %v (%v); want the stale socket file", sockA, st, err)
	}
	fourth := startCSIDProcess(t, "", serveArgs(dirA, sockA)...)
	waitReady(t, fourth, sockA)
	if pid := socketServer(t, sockA); pid != fourth.pid() {
		t.Fatalf("%s is served by pid %d, want the csid that replaced the stale socket, pid %d", sockA, pid, fourth.pid())
	}
	terminate(t, fourth, 5*time.Second)
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
