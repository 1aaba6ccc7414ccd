package local

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Record files are recycled. A deleted disk's record file, and a record
// replaced by a newer one, become spares (spare/<random>); a new record is
// written into a spare, in place, rather than into a new file. A file
// system without a journal makes a new inode dear: ext4 then avoids
// reusing an inode freed in the last minutes (until its deletion is surely
// on the device) and scans past every such inode to allocate one, so that
// after 10,000 deletes a create+delete pair cost twice the CPU here
// (BenchmarkCreateDelete). A spare is rewritten and fdatasynced: its
// blocks and its inode are on the device already, so that makes one write
// of data durable, and no inode is allocated or freed.
//
// A spare may be a deleted disk's record, or its name entry's file, whose
// removal is not durable yet: after a crash of the machine that name could
// come back and name the disk the spare now holds. The delete's intent is
// journaled, and its replay removes such a name (journal.go); until the
// journal, a spare that had been a name entry waited for an fsync of the
// name index before it was taken.
//
// A spare is taken by renaming it to the temporary name of the record it
// becomes, which another process taking the same spare cannot also do;
// then it must have no other link (after a crash of the machine, a file
// whose move out of spare/ was not yet durable is also still linked there,
// and e2fsck counts both links: such a "spare" is left alone). Each
// process keeps the spares it may take, at most maxSpares; beyond, the
// files it retires are removed.
const (
	spareDir  = "spare"
	maxSpares = 1024
)

// spares are the spare record files this process may take, oldest first.
type spares struct {
	dir string

	mu    sync.Mutex
	queue []string // names in dir
}

// loadSpares makes the spares in the directory this process's to take,
// after making durable every removal of a name or record made before (by
// any process): any of them may have been a spare's name.
func (s *state) loadSpares() error {
	if err := syncDir(s.names); err != nil {
		return err
	}
	if err := syncDir(s.disks); err != nil {
		return err
	}
	return s.spares.load()
}

// load lists the spares in the directory, up to maxSpares.
func (p *spares) load() error {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue = p.queue[:0]
	for _, e := range entries {
		if len(p.queue) == maxSpares {
			break
		}
		if e.Type().IsRegular() {
			p.queue = append(p.queue, e.Name())
		}
	}
	return nil
}

// next returns the oldest spare, removed from the queue; ok is false when
// there is none.
func (p *spares) next() (name string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return "", false
	}
	name = p.queue[0]
	p.queue = p.queue[1:]
	return name, true
}

// take renames the oldest spare to path and returns its descriptor, open
// for writing, and its size; fd -1 when there is none to take. A spare
// another process took first is passed over; one with another link (see
// above) is given up (its spare name removed).
func (p *spares) take(path string) (fd int, size int64, err error) {
	for {
		name, ok := p.next()
		if !ok {
			return -1, 0, nil
		}
		err := renameNoReplace(dirPath(p.dir, name), path)
		if errors.Is(err, os.ErrNotExist) {
			continue // another process took it
		}
		if err != nil {
			return -1, 0, err
		}
		fd, err := openNoEINTR(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if err != nil {
			_ = os.Remove(path)
			return -1, 0, &os.PathError{Op: "open", Path: path, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
			_ = unix.Close(fd)
			_ = os.Remove(path)
			if err != nil {
				return -1, 0, &os.PathError{Op: "fstat", Path: path, Err: err}
			}
			continue
		}
		return fd, st.Size, nil
	}
}

// retire makes the file at path a spare if it has no other link and the
// process keeps fewer than maxSpares, and removes the name path otherwise.
// Best effort: a file left at path is a temporary name that Open removes.
func (p *spares) retire(path string) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
		if name, ok := p.reserve(); ok {
			if renameNoReplace(path, dirPath(p.dir, name)) == nil {
				p.mu.Lock()
				p.queue = append(p.queue, name)
				p.mu.Unlock()
				return
			}
		}
	}
	_ = os.Remove(path)
}

// reserve returns a fresh spare name, or false when the process keeps
// maxSpares already.
func (p *spares) reserve() (string, bool) {
	p.mu.Lock()
	n := len(p.queue)
	p.mu.Unlock()
	if n >= maxSpares {
		return "", false
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:]), true
}
