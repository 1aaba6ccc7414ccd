package mounter

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/csid-dev/csid/internal/crash"
)

// runner runs a program with an argument list (never a shell) and returns
// its standard output; a failure carries the exit status (ExitCode) and the
// standard error.
type runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Tool is a host program (mkfs, e2fsck, resize2fs, xfs_growfs, blkid...)
// the mounter is running.
type Tool struct {
	Name    string
	Args    []string
	Started time.Time
}

func (t Tool) String() string { return strings.Join(append([]string{t.Name}, t.Args...), " ") }

// tools runs host programs to completion and knows which are running.
//
// csid never kills a host tool: mkfs, e2fsck or resize2fs killed in the
// middle leave a half-made or half-grown filesystem. A context that has
// ended keeps a tool from starting; one that ends while the tool runs does
// not stop it: the tool finishes, and the caller, finding its context
// ended, stops before its next step. The tools stay in csid's process
// group, so that the death of csid's container takes them with it, a
// crash the mounter recovers from (grow.go).
type tools struct {
	mu      sync.Mutex
	next    uint64
	running map[uint64]Tool
}

// running lists the tools running now, longest-running first.
func (t *tools) list() []Tool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Tool, 0, len(t.running))
	for _, tool := range t.running {
		out = append(out, tool)
	}
	slices.SortFunc(out, func(a, b Tool) int { return a.Started.Compare(b.Started) })
	return out
}

func (t *tools) add(tool Tool) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running == nil {
		t.running = map[uint64]Tool{}
	}
	t.next++
	t.running[t.next] = tool
	return t.next
}

func (t *tools) done(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.running, id)
}

// runningPoints are the crash points reached while a tool runs: a crash
// there kills csid's process group, the tool with it.
var runningPoints = map[string]string{"resize2fs": crash.MounterResizeRunning}

// run runs name with args to completion; see tools.
func (t *tools) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return t.runWith(ctx, nil, name, args...)
}

// runWith is run with files as the program's descriptors 3, 4, ... (mount(8)
// gets its target so, never by a path it could resolve otherwise).
func (t *tools) runWith(ctx context.Context, files []*os.File, name string, args ...string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s not started: %w", name, err)
	}
	cmd := exec.Command(name, args...)
	cmd.ExtraFiles = files
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	fail := func(err error) error {
		return &execError{cmd: name + " " + strings.Join(args, " "), err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	if err := cmd.Start(); err != nil {
		return nil, fail(err)
	}
	id := t.add(Tool{Name: name, Args: args, Started: time.Now()})
	defer t.done(id)
	if p := runningPoints[name]; p != "" {
		defer crash.PointWhileWriting(p, cmd.Process.Pid)()
	}
	if err := cmd.Wait(); err != nil {
		return stdout.Bytes(), fail(err)
	}
	return stdout.Bytes(), nil
}

// execError is a failed command: its exit status and what it said.
type execError struct {
	cmd    string
	err    error
	stderr string
}

func (e *execError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("%s: %v", e.cmd, e.err)
	}
	return fmt.Sprintf("%s: %v: %s", e.cmd, e.err, e.stderr)
}

func (e *execError) Unwrap() error { return e.err }
