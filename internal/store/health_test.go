package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/testutil"
)

// guard bounds a wait that would hang if the behaviour under test is broken;
// it is not a synchronisation (the wait ends on the event itself).
const guard = 20 * time.Second

func waitOrFail(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatalf("%s: still waiting after %v", what, guard)
	}
}

func TestPanicInUpdateFailsOnlyItsCaller(t *testing.T) {
	s, _ := openTemp(t, Options{})
	// A panicking call shares a batch with others: they commit, it fails.
	var wg sync.WaitGroup
	errs := make([]error, 16)
	release := make(chan struct{})
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			errs[i] = s.Update(func(tx *Tx) error {
				if i == 7 {
					panic("boom")
				}
				return tx.AddNote(fmt.Sprintf("v%d", i), HistoryEntry{Outcome: "ok"})
			})
		}()
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if i == 7 {
			if !errors.Is(err, ErrPanic) || !strings.Contains(err.Error(), "boom") {
				t.Fatalf("the panicking call returned %v, want ErrPanic naming the panic", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("call %d beside a panicking one: %v", i, err)
		}
	}
	// The committer goes on: a lone panicking call, then 1,000 commits.
	if err := s.Update(func(*Tx) error { panic("alone") }); !errors.Is(err, ErrPanic) {
		t.Fatalf("lone panicking call: %v", err)
	}
	for i := range 1000 {
		if err := s.Update(func(tx *Tx) error { return tx.AddNote("after", HistoryEntry{Outcome: fmt.Sprint(i)}) }); err != nil {
			t.Fatalf("commit %d after the panics: %v", i, err)
		}
	}
	err := s.View(func(tx *Tx) error {
		for i := range errs {
			h, err := tx.History(fmt.Sprintf("v%d", i))
			if err != nil {
				return err
			}
			if (i == 7) != (len(h) == 0) {
				return fmt.Errorf("volume v%d has %d history lines", i, len(h))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	waitOrFail(t, "Close after panics", closed)
}

// bigNote is larger than the state file so far: its commit grows the file
// and writes pages never written before, which a full file system or an
// immutable file refuses (an immutable file still takes writes over its
// existing bytes through a descriptor opened earlier).
func bigNote(tx *Tx, id string) error {
	return tx.AddNote(id, HistoryEntry{Outcome: strings.Repeat("x", 1<<20)})
}

func TestFailedCommitIsUnavailableUntilTheCauseIsGone(t *testing.T) {
	for _, fault := range []string{"full", "immutable"} {
		t.Run(fault, func(t *testing.T) {
			dir := testutil.SmallFS(t, 16<<20)
			path := filepath.Join(dir, "csid.db")
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Update(func(tx *Tx) error { return bigNote(tx, "before") }); err != nil {
				t.Fatal(err)
			}
			var clear func()
			switch fault {
			case "full":
				clear = testutil.Fill(t, dir, "filler")
			case "immutable":
				testutil.SetImmutable(t, path, true)
				clear = func() { testutil.SetImmutable(t, path, false) }
			}
			err = s.Update(func(tx *Tx) error { return bigNote(tx, "during") })
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("commit on a %s state file: %v, want ErrUnavailable", fault, err)
			}
			herr := s.Health()
			if herr == nil || !errors.Is(herr, ErrUnavailable) || !strings.Contains(herr.Error(), path) {
				t.Fatalf("Health after a failed commit: %v, want ErrUnavailable naming %s", herr, path)
			}
			select {
			case <-s.Healthy():
				t.Fatal("Healthy is closed while commits fail")
			default:
			}
			clear()
			// Nobody writes: the store's own probe finds the file writable.
			waitOrFail(t, "health after the fault was cleared", s.Healthy())
			if err := s.Health(); err != nil {
				t.Fatalf("Health after the fault cleared: %v", err)
			}
			if err := s.Update(func(tx *Tx) error { return bigNote(tx, "after") }); err != nil {
				t.Fatalf("commit after the fault cleared: %v", err)
			}
			err = s.View(func(tx *Tx) error {
				for id, want := range map[string]int{"before": 1, "during": 0, "after": 1} {
					h, err := tx.History(id)
					if err != nil {
						return err
					}
					if len(h) != want {
						return fmt.Errorf("%s has %d notes, want %d", id, len(h), want)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
