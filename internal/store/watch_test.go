package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
)

// watched opens a store whose file watch runs every 10ms and reports what
// it finds on the returned channel.
func watched(t *testing.T) (*Store, string, <-chan error) {
	t.Helper()
	found := make(chan error, 8)
	path := filepath.Join(t.TempDir(), "csid.db")
	s, err := Open(path, Options{WatchInterval: 10 * time.Millisecond, OnFileFault: func(err error) { found <- err }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Update(func(tx *Tx) error {
		return tx.Accept(&Volume{ID: "v1", Name: "n1", State: fsm.Absent}, &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created})
	}); err != nil {
		t.Fatal(err)
	}
	return s, path, found
}

// noticed waits for the watch to report a finding that says want.
func noticed(t *testing.T, found <-chan error, want string) error {
	t.Helper()
	select {
	case err := <-found:
		if !errors.Is(err, ErrFileLost) || !strings.Contains(err.Error(), want) {
			t.Fatalf("the watch found %v, want %q", err, want)
		}
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("the watch did not notice within 5s (%s)", want)
	}
	return nil
}

func write(s *Store) error {
	return s.Update(func(tx *Tx) error { return tx.AddNote("v1", HistoryEntry{Outcome: "a write"}) })
}

// TestWatchNoticesTheFileRemovedReplacedOrCut: a state file removed (moved
// away), replaced, or cut short under an open store is noticed by the
// watch within its interval: Health names the file and what to do, writes
// fail with ErrUnavailable without touching the file, and reads of a file
// cut short are refused instead of faulting. A file moved back clears the
// fault: nothing is wedged.
func TestWatchNoticesTheFileRemovedReplacedOrCut(t *testing.T) {
	t.Run("removed, then moved back", func(t *testing.T) {
		s, path, found := watched(t)
		if err := os.Rename(path, path+".away"); err != nil {
			t.Fatal(err)
		}
		noticed(t, found, "was removed while csid ran")
		if err := s.Health(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "csid state backup") {
			t.Fatalf("Health: %v", err)
		}
		if err := write(s); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a write to a removed file: %v", err)
		}
		if err := s.View(func(tx *Tx) error { _, err := tx.Volume("v1"); return err }); err != nil {
			t.Fatalf("the open file no longer reads: %v", err)
		}
		if err := os.Rename(path+".away", path); err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.Healthy():
		case <-time.After(5 * time.Second):
			t.Fatalf("the file is back, and the store is still not healthy: %v", s.Health())
		}
		if err := write(s); err != nil {
			t.Fatalf("a write once the file is back: %v", err)
		}
	})
	t.Run("replaced", func(t *testing.T) {
		s, path, found := watched(t)
		if err := os.WriteFile(path+".new", []byte("another file"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
		noticed(t, found, "was replaced while csid ran")
		if err := write(s); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a write after the file was replaced: %v", err)
		}
		if raw, _ := os.ReadFile(path); string(raw) != "another file" {
			t.Fatalf("the new file was written to: %q", raw)
		}
	})
	t.Run("cut short", func(t *testing.T) {
		s, path, found := watched(t)
		if err := os.Truncate(path, 8192); err != nil {
			t.Fatal(err)
		}
		noticed(t, found, "was cut to 8192 bytes")
		if err := write(s); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a write to a file cut short: %v", err)
		}
		if err := s.View(func(tx *Tx) error { _, err := tx.Volume("v1"); return err }); !errors.Is(err, ErrFileLost) {
			t.Fatalf("a read of a file cut short: %v", err)
		}
		if st, _ := os.Stat(path); st.Size() != 8192 {
			t.Fatalf("the file cut short was written to: %d bytes", st.Size())
		}
	})
}
