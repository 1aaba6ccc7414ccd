package local

import (
	"maps"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Callers that arrive while a directory's fsync runs are served together by
// the next one, never by the one already running: it may have begun before
// their change.
func TestDirSyncerSharesTheNextFsync(t *testing.T) {
	d := newDirSyncer(t.TempDir())
	defer d.close()
	entered, release := make(chan struct{}), make(chan struct{})
	var rounds atomic.Int64
	d.fsync = func() error {
		if rounds.Add(1) == 1 {
			close(entered)
			<-release
		}
		return d.syncOpen()
	}
	first := make(chan error)
	go func() { first <- d.sync() }()
	<-entered // round 1 runs, and has begun before the callers below

	const callers = 8
	var wg sync.WaitGroup
	var servedEarly atomic.Int64
	queued := make(chan struct{}, callers)
	for range callers {
		wg.Go(func() {
			queued <- struct{}{}
			if err := d.sync(); err != nil {
				t.Error(err)
			}
			if rounds.Load() < 2 {
				servedEarly.Add(1)
			}
		})
	}
	for range callers {
		<-queued
	}
	// Every caller is about to wait or waiting; none may be served by
	// round 1. Wait until all are counted as waiting for round 2.
	// Wait until every caller is queued (round 1's own caller counts once),
	// then see which round each queued for.
	for {
		d.mu.Lock()
		queuedFor, total := maps.Clone(d.waiting), 0
		d.mu.Unlock()
		for _, n := range queuedFor {
			total += n
		}
		if total == callers+1 {
			if queuedFor[2] != callers {
				close(release)
				t.Fatalf("callers queued for rounds %v, want all %d for round 2 (round 1 began before them)", queuedFor, callers)
			}
			break
		}
		runtime.Gosched()
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := servedEarly.Load(); n != 0 {
		t.Fatalf("%d callers returned before a round that began after their call", n)
	}
	if got := rounds.Load(); got != 2 {
		t.Fatalf("%d fsyncs for 1 + %d callers, want 2 (the running one, then one shared)", got, callers)
	}
}
