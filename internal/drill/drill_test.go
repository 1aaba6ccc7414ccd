package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/testutil"
)

// buildCSID builds the csid binary into dir. replace, if set, swaps source
// files for the build (go build -overlay): a path relative to the module
// root, and the content to compile in its place. Production code carries
// no test scaffolding; a planted bug is compiled in this way only.
func buildCSID(t *testing.T, dir string, replace map[string]string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "csid")
	args := []string{"build", "-o", bin}
	if len(replace) > 0 {
		overlay := map[string]map[string]string{"Replace": {}}
		for rel, content := range replace {
			abs, err := filepath.Abs(filepath.Join(root, rel))
			if err != nil {
				t.Fatal(err)
			}
			swapped := filepath.Join(dir, strings.ReplaceAll(rel, "/", "_"))
			if err := os.WriteFile(swapped, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			overlay["Replace"][abs] = swapped
		}
		raw, err := json.Marshal(overlay)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-overlay", path)
	}
	cmd := exec.Command("go", append(args, "./cmd/csid")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// plantBug returns internal/effects/controller.go with its create executor
// made non-idempotent: it neither records nor looks for a cloud operation,
// and creates a disk under a fresh name on every run, so a crash after the
// cloud created the disk leaks it. The test fails if the code it rewrites
// has changed.
func plantBug(t *testing.T) map[string]string {
	t.Helper()
	return plant(t, "internal/effects/controller.go",
		`d, err := startOrResume(ctx, x, e.c, func() (cloud.Operation, error) { return e.c.CreateDisk(ctx, spec) })`,
		`spec.Name = fmt.Sprintf("%s-%d", spec.Name, time.Now().UnixNano())
	op, err := e.c.CreateDisk(ctx, spec)
	if err != nil {
		return ops.Result{}, err
	}
	d, err := e.c.WaitOperation(ctx, op.ID)`)
}

// plant returns the source file rel (relative to the repository's root)
// with its one occurrence of idempotent replaced by planted, and package
// time imported beside fmt, as an overlay for buildCSID. It fails the test
// if rel no longer has exactly one of each.
func plant(t *testing.T, rel, idempotent, planted string) map[string]string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	src := string(raw)
	if strings.Count(src, idempotent) != 1 || strings.Count(src, "\n\t\"fmt\"\n") != 1 {
		t.Fatalf("%s no longer has the code (or the import) the planted bug replaces", rel)
	}
	src = strings.Replace(src, idempotent, planted, 1)
	src = strings.Replace(src, "\n\t\"fmt\"\n", "\n\t\"fmt\"\n\t\"time\"\n", 1)
	return map[string]string{rel: src}
}

// TestDrill runs the full matrix against the real csid binary: every hit
// of every crash point in every scenario. It must pass, and every crash
// point must fire. CSID_DRILL_SCENARIOS limits the scenarios (comma list).
func TestDrill(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	cfg := Config{Binary: buildCSID(t, dir, nil), Dir: dir}
	if s := os.Getenv("CSID_DRILL_SCENARIOS"); s != "" {
		cfg.Scenarios = strings.Split(s, ",")
	}
	rep := runAndReport(t, cfg)
	if len(cfg.Scenarios) == 0 && len(rep.Unfired) > 0 {
		t.Errorf("crash points that never fired: %v", rep.Unfired)
	}
}

// runAndReport runs a drill, logs its table and fails the test for each
// failing cell, with the end of its log.
func runAndReport(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	if err := rep.Table(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s\n%s", table.String(), rep.Summary())
	for _, c := range rep.Cells {
		if c.Result == Fail {
			// The cell's dir goes with the test's temp dir, so its log is
			// shown here (`csid drill` keeps the dir instead).
			t.Errorf("%s at %s:%d: %s\n%s", c.Scenario, c.Point, c.Hit, c.Reason, logTail(filepath.Join(c.Dir, "csid.log"), 40))
		}
	}
	return rep
}

// TestDrillCatchesANonIdempotentExecutor builds csid with a planted bug
// (plantBug: the create executor ignores the cloud operation it recorded
// and creates a new disk every time it runs) and shows that the drill fails
// on it: after the crash at cloud.after_create, the repeated create leaks a
// disk.
func TestDrillCatchesANonIdempotentExecutor(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	rep, err := Run(context.Background(), Config{Binary: buildCSID(t, dir, plantBug(t)), Dir: dir,
		Scenarios: []string{"create"}, Points: []string{"cloud.after_create"}})
	caughtLeakedDisk(t, rep, err)
	// The same drill passes on the real code.
	rep, err = Run(context.Background(), Config{Binary: buildCSID(t, t.TempDir(), nil), Dir: dir,
		Scenarios: []string{"create"}, Points: []string{"cloud.after_create"}})
	if err != nil || !rep.OK() {
		t.Fatalf("the drill fails on the real code: %v %s", err, rep.Summary())
	}
}

// caughtLeakedDisk fails the test unless the drill (rep, err) failed in
// its one cell, on a disk left in the cloud.
func caughtLeakedDisk(t *testing.T, rep *Report, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.Failed != 1 {
		t.Fatalf("the drill did not catch the planted bug: %s", rep.Summary())
	}
	if reason := rep.Cells[0].Reason; !strings.Contains(reason, "is left in the cloud") {
		t.Fatalf("the drill failed for another reason than the leaked disk: %s", reason)
	}
	t.Logf("caught: %s", rep.Cells[0].Reason)
}

// plantSnapshotBug returns internal/effects/snapshots.go with its
// snapshot executor made non-idempotent: it names every provider snapshot
// afresh, so a crash after the provider cut one leaves it behind when the
// resumed op takes another. The test fails if the code it rewrites has
// changed.
func plantSnapshotBug(t *testing.T) map[string]string {
	t.Helper()
	return plant(t, "internal/effects/snapshots.go",
		`spec := cloud.SnapshotSpec{Name: s.ID, SourceDiskID: s.SourceDiskID, Tags: tags}`,
		`spec := cloud.SnapshotSpec{Name: fmt.Sprintf("%s-%d", s.ID, time.Now().UnixNano()), SourceDiskID: s.SourceDiskID, Tags: tags}`)
}

// TestDrillCatchesANonIdempotentSnapshot builds csid with a snapshot
// executor that names its provider snapshot afresh on every run
// (plantSnapshotBug): the drill fails at cloud.after_snapshot, on the
// provider snapshot the resumed op leaves behind.
func TestDrillCatchesANonIdempotentSnapshot(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	rep, err := Run(context.Background(), Config{Binary: buildCSID(t, dir, plantSnapshotBug(t)), Dir: dir,
		Scenarios: []string{"snapshot"}, Points: []string{"cloud.after_snapshot"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.Failed != 1 {
		t.Fatalf("the drill did not catch the planted bug: %s", rep.Summary())
	}
	if reason := rep.Cells[0].Reason; !strings.Contains(reason, "left at the provider") && !strings.Contains(reason, "snapshot-without-record") {
		t.Fatalf("the drill failed for another reason than the leaked snapshot: %s", reason)
	}
	t.Logf("caught: %s", rep.Cells[0].Reason)
}

// logTail is the last n lines of the file at path, or why it cannot be read.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return "last lines of " + path + ":\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}
