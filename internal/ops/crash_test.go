package ops

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The crash test runs the engine in a child process (this test binary with
// CSID_OPS_CRASH_DIR set), kills it with SIGKILL at a crash point, runs it
// again unarmed, and checks that every accepted op completed exactly once in
// effect. The executor keeps its effects as files (a ledger of "resources"),
// so an effect applied twice to a different result would show.

const envCrashDir = "CSID_OPS_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashDir); dir != "" {
		if err := crashWorkload(dir); err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ledgerExec performs effects as files under dir/res, idempotently: an
// effect finds its resource already in the right state and does nothing. It
// logs every execution (durably, before the effect) to dir/exec.log, and
// writes dir/violations if it ever finds a resource in a different state
// than the one it would produce.
type ledgerExec struct{ dir string }

func (l *ledgerExec) res(name string) string { return filepath.Join(l.dir, "res", name) }

func (l *ledgerExec) logLine(path, line string) error {
	f, err := os.OpenFile(filepath.Join(l.dir, path), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		return err
	}
	return f.Sync()
}

// ensure makes resource name hold content; a resource already holding other
// content is a violation unless overwrite is set (a resize sets a new size).
func (l *ledgerExec) ensure(name, content string, overwrite bool) error {
	old, err := os.ReadFile(l.res(name))
	switch {
	case err == nil && string(old) == content:
		return nil
	case err == nil && !overwrite:
		return l.logLine("violations", fmt.Sprintf("%s holds %q, effect would write %q", name, old, content))
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return err
	}
	return os.WriteFile(l.res(name), []byte(content), 0o600)
}

func (l *ledgerExec) remove(name string) error {
	if err := os.Remove(l.res(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func pathKey(p string) string {
	s := sha256.Sum256([]byte(p))
	return hex.EncodeToString(s[:6])
}

func (l *ledgerExec) Execute(ctx context.Context, x *Exec) (Result, error) {
	op := x.Op
	if err := l.logLine("exec.log", fmt.Sprintf("%d %s %s", op.Seq, op.Event, op.Subject())); err != nil {
		return Result{}, err
	}
	id := op.Subject()
	var err error
	switch op.Event {
	case fsm.Create:
		a, _ := DecodeArgs[CreateArgs](op)
		err = l.ensure("disk-"+id, strconv.FormatInt(a.SizeBytes, 10)+sourceSuffix(x.Volume.Source), false)
	case fsm.SnapshotCreate:
		err = l.ensure("snap-"+id, x.Snapshot.SourceVolumeID, false)
	case fsm.SnapshotDelete:
		err = l.remove("snap-" + id)
	case fsm.Delete:
		err = l.remove("disk-" + id)
	case fsm.ControllerPublish:
		a, _ := DecodeArgs[ControllerPublishArgs](op)
		err = l.ensure("attach-"+id, a.Node, false)
	case fsm.ControllerUnpublish:
		err = l.remove("attach-" + id)
	case fsm.NodeStage:
		a, _ := DecodeArgs[NodeStageArgs](op)
		err = l.ensure("stage-"+id, a.StagingPath, false)
	case fsm.NodeUnstage:
		err = l.remove("stage-" + id)
	case fsm.NodePublish:
		a, _ := DecodeArgs[NodePublishArgs](op)
		err = l.ensure("target-"+id+"-"+pathKey(a.TargetPath), a.TargetPath, false)
	case fsm.NodeUnpublish:
		a, _ := DecodeArgs[NodeUnpublishArgs](op)
		err = l.remove("target-" + id + "-" + pathKey(a.TargetPath))
	case fsm.Expand:
		a, _ := DecodeArgs[ExpandArgs](op)
		if op.Guard == fsm.Deferred { // the queued target, recorded on the disk
			err = l.ensure("resize-to-"+id, strconv.FormatInt(a.RequiredBytes, 10), true)
		} else if _, statErr := os.Stat(l.res("attach-" + id)); statErr == nil {
			err = l.logLine("violations", fmt.Sprintf("resize of %s while attached", id))
		} else if err = l.ensure("disk-"+id, strconv.FormatInt(a.RequiredBytes, 10), true); err == nil {
			err = l.remove("resize-to-" + id) // the grown disk's tag is cleared
		}
	}
	if err != nil {
		return Result{}, err
	}
	return fakeResult(x)
}

func (l *ledgerExec) Compensate(ctx context.Context, x *Exec) error {
	return l.logLine("violations", fmt.Sprintf("op %d (%s) compensated: no op of the workload fails", x.Op.Seq, x.Op.Event))
}

// sourceSuffix marks the disk of a volume created from a snapshot.
func sourceSuffix(src *store.Source) string {
	if src == nil {
		return ""
	}
	return " from " + src.SnapshotID
}

// crashWorkload is what the child process runs: two volumes through the
// lifecycle, an expansion deferred while attached, then unpublished and
// published again (the resize runs in between); a snapshot of the other
// volume, a volume restored from it, and the snapshot's delete. Like a
// CO, it keeps a durable cursor of the steps that returned (and the
// snapshot id CreateSnapshot answered), and after a restart it retries the
// step that was in flight with the same arguments.
func crashWorkload(dir string) error {
	if err := crash.ArmFromEnv(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "res"), 0o700); err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(dir, "csid.db"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	eng := New(Config{Store: st, Executors: allEvents(&ledgerExec{dir: dir}), NodeID: "node-1", Log: zerolog.Nop()})
	ctx := context.Background()
	if err := eng.Start(ctx); err != nil {
		return err
	}
	defer eng.Close(ctx)

	idOf := func(name string) string {
		var id string
		_ = st.View(func(tx *store.Tx) error { id, _ = tx.VolumeIDByName(name); return nil })
		return id
	}
	type step struct {
		req  func() Request
		code codes.Code
	}
	var steps []step
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("pvc-%d", i)
		id := func() string { return idOf(name) }
		steps = append(steps,
			step{func() Request { return createReq(name, gib) }, codes.OK},
			step{func() Request { return publishReq(id(), "node-1") }, codes.OK},
			step{func() Request { return stageReq(id(), "/stage/"+id()) }, codes.OK},
			step{func() Request { return nodePublishReq(id(), "/target/"+id()) }, codes.OK})
	}
	id0 := func() string { return idOf("pvc-0") }
	steps = append(steps,
		step{func() Request { return expandReq(id0(), 2*gib) }, codes.FailedPrecondition},
		step{func() Request { return nodeUnpublishReq(id0(), "/target/"+id0()) }, codes.OK},
		step{func() Request { return unstageReq(id0(), "/stage/"+id0()) }, codes.OK},
		step{func() Request { return unpublishReq(id0()) }, codes.OK},
		step{func() Request { return publishReq(id0(), "node-1") }, codes.OK},
		step{func() Request { return snapshotReq("vs-1", idOf("pvc-1")) }, codes.OK},
		step{func() Request { return restoreReq("pvc-r", ContentSource{SnapshotID: snapIDOf(dir)}, 0) }, codes.OK},
		step{func() Request { return deleteSnapshotReq(snapIDOf(dir)) }, codes.OK})

	cursor := filepath.Join(dir, "cursor")
	done := len(readCursor(cursor))
	for i := done; i < len(steps); i++ {
		req := steps[i].req()
		out, err := eng.Submit(ctx, req)
		if status.Code(err) != steps[i].code {
			return fmt.Errorf("step %d: %s %s: got %v, want %s", i, req.Event, req.VolumeID, err, steps[i].code)
		}
		if req.Event == fsm.Expand && err == nil && out.Volume.CapacityBytes < 2*gib {
			return fmt.Errorf("expand answered OK at %d bytes", out.Volume.CapacityBytes)
		}
		if req.Event == fsm.SnapshotCreate {
			if err := os.WriteFile(filepath.Join(dir, "snap-id"), []byte(out.Snapshot.ID), 0o600); err != nil {
				return err
			}
		}
		if err := (&ledgerExec{dir: dir}).logLine("cursor", strconv.Itoa(i)); err != nil {
			return err
		}
	}
	return nil
}

// snapIDOf is the snapshot id the workload's CreateSnapshot answered.
func snapIDOf(dir string) string {
	raw, _ := os.ReadFile(filepath.Join(dir, "snap-id"))
	return string(raw)
}

func readCursor(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(raw))
}

// runWorkload runs the child; it returns whether it was killed by SIGKILL.
func runWorkload(t *testing.T, dir, crashAt string) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashDir+"="+dir, crash.EnvAt+"="+crashAt, crash.EnvLog+"="+filepath.Join(dir, "fired"),
		"GORACE=atexit_sleep_ms=0") // a -race child otherwise sleeps 1s before exiting
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil {
		t.Fatalf("workload (crash at %q): %v\n%s", crashAt, err, out)
	}
	return false
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func TestCrashRecoveryCompletesEveryAcceptedOpOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns dozens of processes")
	}
	// The workload accepts 16 ops; kill at each of them, at each step.
	const ops = 16
	points := []string{crash.OpsQueued, crash.OpsBeforeEffect, crash.OpsBeforeCommit}
	start := time.Now()
	for _, point := range points {
		for hit := 1; hit <= ops; hit++ {
			t.Run(fmt.Sprintf("%s:%d", point, hit), func(t *testing.T) {
				dir := t.TempDir()
				if !runWorkload(t, dir, fmt.Sprintf("%s:%d", point, hit)) {
					t.Fatalf("the workload was not killed at %s hit %d", point, hit)
				}
				if fired := readLines(t, filepath.Join(dir, "fired")); !slices.Equal(fired, []string{point}) {
					t.Fatalf("fired: %v", fired)
				}
				before := readLines(t, filepath.Join(dir, "exec.log"))
				if runWorkload(t, dir, "") {
					t.Fatal("the unarmed run was killed")
				}
				checkCrashOutcome(t, dir, point, before)
			})
		}
	}
	t.Logf("%d crash-and-recover runs in %v", len(points)*ops, time.Since(start).Round(time.Millisecond))
}

func checkCrashOutcome(t *testing.T, dir, point string, beforeCrash []string) {
	t.Helper()
	if v := readLines(t, filepath.Join(dir, "violations")); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	st, err := store.OpenReadOnly(filepath.Join(dir, "csid.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Every accepted op finished, and succeeded.
	var want []string
	err = st.View(func(tx *store.Tx) error {
		active, err := tx.ActiveOps()
		if err != nil {
			return err
		}
		if len(active) > 0 {
			t.Errorf("ops left active: %+v", active)
		}
		var ops []*store.Op
		_ = tx.ForEachOp(func(op *store.Op) bool { ops = append(ops, op); return true })
		if len(ops) != 17 { // 16 steps, and the op recording the queued resize on the disk
			t.Errorf("%d ops stored, want 17", len(ops))
		}
		for _, op := range ops {
			if op.Status != store.OpSucceeded {
				t.Errorf("op %d (%s) %s: %s", op.Seq, op.Event, op.Status, op.Message)
			}
		}
		// The resources are exactly what the final states imply.
		err = tx.ForEachSnapshot("", func(s *store.Snapshot) bool {
			want = append(want, "snap-"+s.ID+"="+s.SourceVolumeID)
			return true
		})
		if err != nil {
			return err
		}
		return tx.ForEachVolume("", func(v *store.Volume) bool {
			want = append(want, "disk-"+v.ID+"="+strconv.FormatInt(v.CapacityBytes, 10)+sourceSuffix(v.Source))
			if v.Attachment != nil {
				want = append(want, "attach-"+v.ID+"="+v.Attachment.Node)
			}
			if v.Stage != nil {
				want = append(want, "stage-"+v.ID+"="+v.Stage.Path)
			}
			for p := range v.Targets {
				want = append(want, "target-"+v.ID+"-"+pathKey(p)+"="+p)
			}
			return true
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "res"))
	var got []string
	for _, e := range entries {
		raw, _ := os.ReadFile(filepath.Join(dir, "res", e.Name()))
		got = append(got, e.Name()+"="+string(raw))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("resources %v, want exactly %v", got, want)
	}
	// Counting executions: only the op cut off after its effect runs twice.
	runs := map[string]int{}
	for _, line := range readLines(t, filepath.Join(dir, "exec.log")) {
		runs[strings.Fields(line)[0]]++
	}
	var twice []string
	for seq, n := range runs {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("op %s ran %d times", seq, n))
		}
	}
	switch point {
	case crash.OpsBeforeCommit:
		last := strings.Fields(beforeCrash[len(beforeCrash)-1])[0]
		if len(twice) != 1 || runs[last] != 2 {
			t.Fatalf("after a crash before the commit of op %s: %v", last, twice)
		}
	default:
		if len(twice) != 0 {
			t.Fatalf("a crash before the effect re-ran effects: %v", twice)
		}
	}
}
