package ops

import (
	"testing"
	"time"
)

// TestSpawnerKeepsItsGoroutines: a function spawned while a kept goroutine
// waits runs on that goroutine (no new one starts); one spawned while the
// kept goroutine is busy gets a goroutine of its own; closing stop ends
// every kept goroutine.
func TestSpawnerKeepsItsGoroutines(t *testing.T) {
	stop := make(chan struct{})
	parked, ended := make(chan struct{}), make(chan struct{})
	s := newSpawner(stop, time.Hour)
	s.parked, s.ended = parked, ended

	ran := make(chan int, 1)
	for i := 1; i <= 5; i++ {
		s.spawn(func() { ran <- i })
		if got := <-ran; got != i {
			t.Fatalf("ran %d, want %d", got, i)
		}
		<-parked // the goroutine waits for the next
	}
	if n := s.started.Load(); n != 1 {
		t.Fatalf("5 functions spawned one after another started %d goroutines, want 1", n)
	}

	release := make(chan struct{})
	s.spawn(func() { <-release }) // the kept goroutine takes it, and is busy
	s.spawn(func() { ran <- 6 })
	<-ran
	<-parked
	if n := s.started.Load(); n != 2 {
		t.Fatalf("a function spawned while the kept goroutine is busy: %d goroutines started in all, want 2", n)
	}
	close(release)
	<-parked

	close(stop)
	<-ended
	<-ended
}

// TestSpawnerLetsAnIdleGoroutineGo: a kept goroutine that waits keepIdle
// for work ends, and the next function starts a new one.
func TestSpawnerLetsAnIdleGoroutineGo(t *testing.T) {
	ended := make(chan struct{})
	s := newSpawner(make(chan struct{}), time.Millisecond)
	s.ended = ended
	ran := make(chan struct{})
	s.spawn(func() { close(ran) })
	<-ran
	<-ended
	s.spawn(func() {})
	<-ended
	if n := s.started.Load(); n != 2 {
		t.Fatalf("%d goroutines started, want 2 (the first ended when idle)", n)
	}
}
