package ops

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestEngineKnowsNoProvider: the engine and its tests depend neither on the
// cloud nor on the mounter, directly or through another package. Executors
// translate what those report into the engine's kinds (internal/effects).
func TestEngineKnowsNoProvider(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !slices.Contains(deps, "github.com/csid-dev/csid/internal/store") {
		t.Fatalf("go list gave %d packages, without the store: %v", len(deps), deps)
	}
	for _, d := range deps {
		for _, bad := range []string{"github.com/csid-dev/csid/internal/cloud", "github.com/csid-dev/csid/internal/mounter"} {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("internal/ops depends on %s", d)
			}
		}
	}
}
