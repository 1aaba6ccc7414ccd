package local

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// The indexes answer, without reading every record, the two questions a
// change asks about other disks: which disk has this name (CreateDisk is
// idempotent by name), and how many disks a node holds (AttachDisk keeps
// its limit). Both are hints kept behind the records: an entry is written
// before the record that needs it and removed after the record that
// stops needing it, so a crash can leave a stale entry (checked against the
// records when it is read, removed by Open) but never a record without its
// entry.

// nameHash is a disk name's key in the name index: names are any UTF-8 up
// to MaxNameBytes, never a path.
func nameHash(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])
}

// nodeHash is a node id's key in the attachment index.
func nodeHash(node string) string {
	sum := sha256.Sum256([]byte(node))
	return hex.EncodeToString(sum[:16])
}

func (s *state) namePath(hash string) string { return filepath.Join(s.names, hash) }
func (s *state) nodeDir(hash string) string  { return filepath.Join(s.attached, hash) }

// diskNames remembers the name hash of the disks this process created:
// DeleteDisk takes the lock of a disk's name before the disk's, so it must
// know the name before it reads the record under that lock, and without
// this it reads the record twice. A disk's name never changes and its id
// is never reused, so an entry stays true for as long as the disk exists,
// whatever another process does meanwhile; DeleteDisk still reads the
// record under its locks. Entries leave with a delete this process makes
// (also of a disk another process deleted first: it finds the record gone
// and forgets the id), so the map holds at most the disks this process
// created and did not delete itself. The zero value is empty.
type diskNames struct {
	mu sync.Mutex
	m  map[diskID]string
}

func (n *diskNames) remember(id diskID, hash string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[diskID]string{}
	}
	n.m[id] = hash
}

func (n *diskNames) lookup(id diskID) (hash string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	hash, ok = n.m[id]
	return hash, ok
}

func (n *diskNames) forget(id diskID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.m, id)
}

// named reads the name index: the disk the entry of hash names, or false
// when there is no entry. An entry is a hard link to the disk's first
// record (records are replaced, never rewritten in place, so its content
// stays the disk's as created). An entry that is not such a record is
// damage, reported.
func (s *state) named(hash string) (diskID, bool, error) {
	path := s.namePath(hash)
	raw, err := readRegular(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("name index %s: %w", path, err)
	}
	var rec diskRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return "", false, fmt.Errorf("name index %s: %w", path, err)
	}
	id, ok := parseDiskID(rec.Disk.ID)
	if !ok || nameHash(rec.Disk.Name) != hash {
		return "", false, fmt.Errorf("name index %s holds disk %q named %q, not one of this name", path, rec.Disk.ID, rec.Disk.Name)
	}
	return id, true, nil
}

// readRegular reads the regular file at path, never through a link, in as
// few system calls as it takes (open, fstat, read until the end, close):
// records and name entries are read on every change, and os.ReadFile's
// bookkeeping for pollable files costs five more calls than the read.
func readRegular(path string) ([]byte, error) {
	raw, _, err := readRegularStat(path)
	return raw, err
}

// readRegularStat is readRegular, and the file's status as it was read.
func readRegularStat(path string) ([]byte, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openNoEINTR(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, st, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, fmt.Errorf("%s is not a regular file", path)
	}
	// One byte more than the size, to see the end in the first read.
	buf := make([]byte, 0, max(st.Size, 0)+1)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, len(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, st, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, st, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// openNoEINTR opens path, again when a signal interrupts the call.
func openNoEINTR(path string, flags int) (int, error) {
	return uninterrupted(func() (int, error) { return unix.Open(path, flags, 0) })
}

// name links the new disk's record, written whole at path (a temporary
// name), under hash in the name index; durable: before the record is in
// place (syncEarlier), else a journaled create's (journal.go). The caller
// holds the name's lock and has removed any stale entry.
func (s *state) name(hash, path string, durable bool) error {
	if err := os.Link(path, s.namePath(hash)); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return s.syncEarlier(s.names)
}

// unname removes the entry of hash if it points to id; its file becomes a
// spare once it is no record either (spare.go). rec is the status of the
// disk's record as the caller read it under the disk's lock: an entry that
// is that very file (the record was never replaced, as for most disks) is
// the disk's without being read. The caller holds the name's lock and has
// journaled the delete. The removal is not made durable: an entry that
// comes back after a crash of the machine is removed by the delete's
// replay.
func (s *state) unname(hash string, id diskID, rec *unix.Stat_t) error {
	var st unix.Stat_t
	err := unix.Lstat(s.namePath(hash), &st)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil || st.Ino != rec.Ino || st.Dev != rec.Dev {
		got, ok, err := s.named(hash)
		if err != nil || !ok || got != id {
			return err
		}
	}
	// No cooling (spare.go): the delete is journaled, and the replay
	// of its intent removes an entry that comes back (journal.go).
	s.spares.retire(s.namePath(hash))
	return nil
}

// dropName removes the entry of hash whatever it points to. The caller
// holds the name's lock and found the entry stale.
func (s *state) dropName(hash string) error {
	if err := os.Remove(s.namePath(hash)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// attachments lists the disks the attachment index has for a node.
func (s *state) attachments(hash string) ([]diskID, error) {
	ids, err := listIDs(s.nodeDir(hash), "", parseDiskID)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return ids, err
}

// indexAttachment enters disk id under node hash, durable before the
// record says attached (syncEarlier). A new directory and a new entry are
// new inodes, each written (fsynced) before a directory entry names it,
// on a file system that does not order its metadata: there, a name that
// reached the device before its inode is removed by e2fsck after a crash
// of the machine. The caller holds the disk's lock.
func (s *state) indexAttachment(hash string, id diskID) error {
	dir := s.nodeDir(hash)
	switch err := os.Mkdir(dir, 0o700); {
	case err == nil:
		if !s.orderedMeta {
			if err := syncDir(dir); err != nil {
				return err
			}
		}
		if err := s.syncEarlier(s.attached); err != nil {
			return err
		}
	case !errors.Is(err, os.ErrExist):
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, string(id)), os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if !s.orderedMeta {
		err = f.Sync()
	}
	if err := errors.Join(err, f.Close()); err != nil {
		return err
	}
	return s.syncEarlier(dir)
}

// unindexAttachment removes disk id from node hash's entries. The caller
// holds the disk's lock. It is not made durable: an entry that comes back
// is stale, and found so when the node is at its limit.
func (s *state) unindexAttachment(hash string, id diskID) error {
	err := os.Remove(filepath.Join(s.nodeDir(hash), string(id)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// migrate builds the indexes of a directory of layout 1 from its records.
// The caller holds the layout lock exclusively: nothing else changes the
// directory meanwhile.
func (s *state) migrate() error {
	disks, err := s.allDisks()
	if err != nil {
		return err
	}
	for _, d := range disks {
		id := diskID(d.ID)
		hash := nameHash(d.Name)
		if got, ok, err := s.named(hash); err != nil {
			return err
		} else if ok && got != id {
			return fmt.Errorf("disks %s and %s are both named %q", got, id, d.Name)
		} else if !ok {
			if err := os.Link(s.recordPath(id), s.namePath(hash)); err != nil {
				return err
			}
		}
		if d.AttachedTo != "" {
			if err := s.indexAttachment(nodeHash(d.AttachedTo), id); err != nil {
				return err
			}
		}
	}
	return syncDir(s.names)
}
