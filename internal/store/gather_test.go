package store

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestLeaderGathersAfterASharedCommit: after a commit that served several
// callers, the next leader waits for as many before it commits, and a
// caller that arrives meanwhile shares its commit; a caller alone after a
// shared commit still commits, once the window has passed.
func TestLeaderGathersAfterASharedCommit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		window  time.Duration
		arrives bool // a second caller arrives while the leader gathers
		want    []int
	}{
		{"a caller arrives", time.Hour, true, []int{1, 2, 2}},
		{"nobody comes", time.Millisecond, false, []int{1, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var batches []int
			s, _ := openTemp(t, Options{GatherWindow: tc.window, Observe: func(n int, _ time.Duration) {
				mu.Lock()
				batches = append(batches, n)
				mu.Unlock()
			}})
			var wg sync.WaitGroup
			update := func(key string, hold <-chan struct{}) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := s.Update(func(tx *Tx) error {
						if hold != nil {
							<-hold
						}
						return tx.AddNote(key, HistoryEntry{})
					}); err != nil {
						t.Error(err)
					}
				}()
			}
			// A shared commit: a's commit is held open until b and c
			// have queued behind it; they are then committed together.
			release := make(chan struct{})
			update("a", release)
			waitFor(t, "a leading", func() bool { return queued(s) == 0 && leading(s) })
			update("b", nil)
			update("c", nil)
			waitFor(t, "b and c queued", func() bool { return queued(s) == 2 })
			close(release)
			wg.Wait()

			// d leads next, and gathers: with the window an hour, d's
			// commit can only be written with e in it.
			update("d", nil)
			if tc.arrives {
				waitFor(t, "d queued", func() bool { return queued(s) == 1 })
				// Long after a yield: only the gather's wait keeps d
				// from committing alone meanwhile.
				time.Sleep(50 * time.Millisecond)
				update("e", nil)
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(batches) != fmt.Sprint(tc.want) {
				t.Fatalf("commits served %v callers, want %v", batches, tc.want)
			}
		})
	}
}

// queued is the number of calls waiting in s's commit queue.
func queued(s *Store) int {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	return len(s.queue)
}

// leading reports whether a commit is in progress.
func leading(s *Store) bool {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	return s.leading
}

// waitFor yields until cond holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
		runtime.Gosched()
	}
}
