package drill

import (
	"context"
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

// buildCSID builds the csid binary (with extra build tags, if any) into dir.
func buildCSID(t *testing.T, dir string, tags ...string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "csid")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "./cmd/csid")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestDrill runs the full matrix against the real csid binary: every hit
// of every crash point in every scenario. It must pass, and every crash
// point must fire. CSID_DRILL_SCENARIOS limits the scenarios (comma list).
func TestDrill(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	cfg := Config{Binary: buildCSID(t, dir), Dir: dir}
	if s := os.Getenv("CSID_DRILL_SCENARIOS"); s != "" {
		cfg.Scenarios = strings.Split(s, ",")
	}
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
	if len(cfg.Scenarios) == 0 && len(rep.Unfired) > 0 {
		t.Errorf("crash points that never fired: %v", rep.Unfired)
	}
}

// TestDrillCatchesANonIdempotentExecutor builds csid with a planted bug (the
// drillbug tag: the create executor ignores the cloud operation it recorded
// and creates a new disk every time it runs) and shows that the drill fails
// on it: after the crash at cloud.after_create, the repeated create leaks a
// disk.
func TestDrillCatchesANonIdempotentExecutor(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	rep, err := Run(context.Background(), Config{Binary: buildCSID(t, dir, "drillbug"), Dir: dir,
		Scenarios: []string{"create"}, Points: []string{"cloud.after_create"}})
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
	// The same drill passes on the real code.
	rep, err = Run(context.Background(), Config{Binary: buildCSID(t, t.TempDir()), Dir: dir,
		Scenarios: []string{"create"}, Points: []string{"cloud.after_create"}})
	if err != nil || !rep.OK() {
		t.Fatalf("the drill fails on the real code: %v %s", err, rep.Summary())
	}
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
