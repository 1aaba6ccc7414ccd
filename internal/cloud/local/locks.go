package local

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Locking. The state directory is shared by every process that opens it (a
// controller and a node plugin on one machine), so its locks are the
// kernel's, on the one file <state>/lock:
//
//   - A key lock serialises the changes of one thing: a disk (its id), a
//     disk name, a node's attachments, the node list. It is an
//     open-file-description lock (fcntl F_OFD_SETLK) on one byte of the
//     lock file, at an offset hashed from the key: independent keys do not
//     wait on each other, in this process or another. Two keys that hash
//     alike share a byte, which costs only some waiting.
//   - The layout lock is a flock(2) on the same file (flock and fcntl locks
//     are independent on Linux): every process holds it shared for as long
//     as it has the directory open, and Open takes it exclusively only to
//     write the format of a new directory or migrate one of an older
//     layout, which no running process of this layout can then be using. A process of the older layout, which
//     took the flock exclusively for each change, waits for this one to
//     close rather than racing it.
//
// Open-file-description locks belong to the open file, not to a goroutine:
// two goroutines of one process would both "hold" a byte. So each byte is
// first taken among this process's goroutines (a channel per offset), then
// from the kernel.
type locks struct {
	f *os.File

	mu    sync.Mutex
	bytes map[int64]*byteLock
}

// byteLock is one byte's lock among this process's goroutines: a token in
// a channel of one, and how many goroutines hold or want it.
type byteLock struct {
	token chan struct{}
	refs  int
}

func newLocks(f *os.File) *locks {
	return &locks{f: f, bytes: map[int64]*byteLock{}}
}

// keyOffset is the byte of the lock file that stands for key.
func keyOffset(key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64() >> 2) // non-negative, as an off_t must be
}

// Lock keys.
func diskKey(id diskID) string     { return "disk/" + string(id) }
func nameKey(hash string) string   { return "name/" + hash }
func attachKey(hash string) string { return "attached/" + hash }

const nodesKey = "nodes"

// lock takes the locks of keys, in the order given (callers take a name's
// lock before a disk's, a node's before a disk's), and returns their
// release. It gives up when ctx ends.
func (l *locks) lock(ctx context.Context, keys ...string) (unlock func(), err error) {
	var held []int64
	release := func() {
		for i := len(held) - 1; i >= 0; i-- {
			l.release(held[i])
		}
	}
	for _, key := range keys {
		off := keyOffset(key)
		if slices.Contains(held, off) {
			continue // two keys of one call share a byte: it is held
		}
		if err := l.acquire(ctx, off, key); err != nil {
			release()
			return nil, err
		}
		held = append(held, off)
	}
	return release, nil
}

// tryLock takes the lock of key if nobody holds it, without waiting.
func (l *locks) tryLock(key string) (unlock func(), ok bool, err error) {
	off := keyOffset(key)
	b := l.ref(off)
	select {
	case b.token <- struct{}{}:
	default:
		l.unref(off)
		return nil, false, nil
	}
	got, err := l.setByte(off, unix.F_WRLCK)
	if err != nil || !got {
		<-b.token
		l.unref(off)
		return nil, false, err
	}
	return func() { l.release(off) }, true, nil
}

func (l *locks) ref(off int64) *byteLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bytes[off]
	if b == nil {
		b = &byteLock{token: make(chan struct{}, 1)}
		l.bytes[off] = b
	}
	b.refs++
	return b
}

func (l *locks) unref(off int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bytes[off]
	if b.refs--; b.refs == 0 {
		delete(l.bytes, off)
	}
}

// acquire takes byte off: first among goroutines, then from the kernel,
// polling with a growing delay (a blocking F_OFD_SETLKW could not be
// given up when ctx ends).
func (l *locks) acquire(ctx context.Context, off int64, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("waiting for the lock of %s: %w", key, err)
	}
	b := l.ref(off)
	select {
	case b.token <- struct{}{}:
	case <-ctx.Done():
		l.unref(off)
		return fmt.Errorf("waiting for the lock of %s: %w", key, ctx.Err())
	}
	delay := 50 * time.Microsecond
	for {
		got, err := l.setByte(off, unix.F_WRLCK)
		if err == nil && got {
			return nil
		}
		if err == nil {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				delay = min(2*delay, 5*time.Millisecond)
				continue
			case <-ctx.Done():
				t.Stop()
				err = fmt.Errorf("waiting for the lock of %s (held by another process): %w", key, ctx.Err())
			}
		}
		<-b.token
		l.unref(off)
		return err
	}
}

func (l *locks) release(off int64) {
	_, _ = l.setByte(off, unix.F_UNLCK)
	l.mu.Lock()
	b := l.bytes[off]
	l.mu.Unlock()
	<-b.token
	l.unref(off)
}

// setByte sets (F_WRLCK) or clears (F_UNLCK) the lock on byte off without
// waiting; got is false when another open file holds it.
func (l *locks) setByte(off int64, typ int16) (got bool, err error) {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
	for {
		err = unix.FcntlFlock(l.f.Fd(), unix.F_OFD_SETLK, &lk)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
			return false, nil
		default:
			return false, fmt.Errorf("lock %s at %d: %w", l.f.Name(), off, err)
		}
	}
}
