package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestRecoverScratchRefusesWhatIsNotOne: a journal (a file a user can
// edit) names the scratch directory to recover; a path that is not of the
// scratch form, relative, or a symbolic link to a directory is refused,
// and the directory it names is left as it was. One of the form that is
// gone already is nothing to do.
func TestRecoverScratchRefusesWhatIsNotOne(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "data")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, scratchImage), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "csid-bench-0000abcd")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{victim, "csid-bench-0000abcd", filepath.Join(dir, "csid-bench-0000abcd/.."), link} {
		if err := recoverScratch(context.Background(), path); err == nil {
			t.Errorf("recoverScratch(%q) accepted", path)
		}
	}
	if raw, err := os.ReadFile(filepath.Join(victim, scratchImage)); err != nil || string(raw) != "keep" {
		t.Errorf("the directory behind the link was touched: %q, %v", raw, err)
	}
	if err := recoverScratch(context.Background(), filepath.Join(dir, "csid-bench-0000beef")); err != nil {
		t.Errorf("a scratch directory already gone: %v", err)
	}
}
