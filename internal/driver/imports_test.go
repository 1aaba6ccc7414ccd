package driver

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// forbiddenImports are the packages that act on the world. The driver's
// handlers translate, they never act (design: "Handlers translate; they
// never act"): they validate, submit to the engine and map its outcome, and
// reach the cloud and the host only through the engine's executors and the
// small read-only backends the caller provides. A forbidden path forbids
// its subpackages too.
var forbiddenImports = []string{
	"github.com/csid-dev/csid/internal/cloud",
	"github.com/csid-dev/csid/internal/mounter",
	"github.com/csid-dev/csid/internal/effects",
	"github.com/csid-dev/csid/internal/loopdev",
	"os/exec",
}

// TestDriverDoesNotAct parses the imports of the package's non-test files
// and fails on any forbidden one.
func TestDriverDoesNotAct(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	parsed, sawEngine := 0, false
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		parsed++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			sawEngine = sawEngine || path == "github.com/csid-dev/csid/internal/ops"
			for _, bad := range forbiddenImports {
				if path == bad || strings.HasPrefix(path, bad+"/") {
					t.Errorf("%s imports %s: the driver must not act; go through the operation engine or a backend interface",
						fset.Position(imp.Pos()), path)
				}
			}
		}
	}
	// The scan itself must work: the package has files, and one of them
	// imports the engine it submits to.
	if parsed == 0 || !sawEngine {
		wd, _ := os.Getwd()
		t.Fatalf("parsed %d files in %s and found no import of internal/ops; the scan is broken", parsed, wd)
	}
}
