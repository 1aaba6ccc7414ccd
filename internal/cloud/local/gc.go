package local

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// collectGarbage removes what a crash can leave behind: temporary files;
// images without a record (a create that never finished, or a delete that
// removed the record and not yet the image); name entries pointing to no
// disk; attachment entries of disks not attached there. Other processes
// may be changing the directory meanwhile, so each removal is made under
// the key lock of what it removes, taken without waiting: what is locked is
// in use, and left for the next Open.
func (s *state) collectGarbage() error {
	if err := s.collectTemporary(); err != nil {
		return err
	}
	if err := s.collectImages(); err != nil {
		return err
	}
	if err := s.collectNames(); err != nil {
		return err
	}
	return s.collectAttachments()
}

// collectTemporary removes temporary files. A temporary file is named
// after the file it is replacing; the key lock of that file's owner is
// the one its writer holds.
func (s *state) collectTemporary() error {
	for _, dir := range []string{s.dir, s.disks, s.ops, s.frozen(), s.snapshots()} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		removed := false
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), tmpPrefix)
			if !ok {
				continue
			}
			done, err := s.removeUnder(s.tmpKey(dir, rest), filepath.Join(dir, e.Name()), nil)
			if err != nil {
				return err
			}
			removed = removed || done
		}
		if removed {
			if err := syncDir(dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// tmpKey is the key lock under which a temporary file in dir, named
// tmpPrefix+rest, is written; "" for a name csid no longer writes (a
// record of layout 1, or a stranger: removed without a lock).
func (s *state) tmpKey(dir, rest string) string {
	switch dir {
	case s.disks, s.frozen():
		// A disk's record or image; a freeze record, written under the
		// lock of the disk it froze.
		for _, suffix := range []string{recSuffix, imageSuffix} {
			if i := strings.Index(rest, suffix+"-"); i > 0 {
				if id, ok := parseDiskID(rest[:i]); ok {
					return diskKey(id)
				}
			}
		}
	case s.snapshots():
		// A snapshot's record, written under the snapshot's lock.
		if i := strings.Index(rest, recSuffix+"-"); i > 0 {
			if id, ok := parseSnapID(rest[:i]); ok {
				return snapKey(id)
			}
		}
	case s.dir:
		if strings.HasPrefix(rest, nodesFile+"-") {
			return nodesKey
		}
		// The format marker is written under the layout lock held
		// exclusively, which excludes this process's shared hold.
	}
	return ""
}

// removeUnder removes path under the key lock of key (none for ""), if
// nobody holds it and stale, when given, still says so under the lock.
func (s *state) removeUnder(key, path string, stale func() (bool, error)) (bool, error) {
	if key != "" {
		unlock, ok, err := s.locks.tryLock(key)
		if err != nil || !ok {
			return false, err
		}
		defer unlock()
	}
	if stale != nil {
		if ok, err := stale(); err != nil || !ok {
			return false, err
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// collectImages removes images without a record.
func (s *state) collectImages() error {
	images, err := listIDs(s.disks, imageSuffix, parseDiskID)
	if err != nil {
		return err
	}
	removed := false
	for _, id := range images {
		done, err := s.removeUnder(diskKey(id), s.imagePath(id), func() (bool, error) { return s.noRecord(id) })
		if err != nil {
			return err
		}
		removed = removed || done
	}
	if removed {
		return syncDir(s.disks)
	}
	return nil
}

func (s *state) noRecord(id diskID) (bool, error) { return noFile(s.recordPath(id)) }

// collectNames removes name entries whose disk has no record. Every disk
// has its entry, made before its record and removed after it, so there can
// be a stale entry only when there are more entries than records: then,
// and only then (a crash cut a create or a delete short), each entry is
// read. A damaged entry (not a record of a disk of its name) is left where
// it is: a create of its name reports it.
func (s *state) collectNames() error {
	entries, err := os.ReadDir(s.names)
	if err != nil {
		return err
	}
	records, err := s.diskIDs()
	if err != nil {
		return err
	}
	if len(entries) <= len(records) {
		return nil
	}
	for _, e := range entries {
		hash := e.Name()
		stale := func() (bool, error) {
			id, ok, err := s.named(hash)
			if err != nil || !ok {
				return false, nil
			}
			return s.noRecord(id)
		}
		if _, err := s.removeUnder(nameKey(hash), s.namePath(hash), stale); err != nil {
			return err
		}
	}
	return nil
}

// collectAttachments removes attachment entries of disks that are not
// attached to the entry's node.
func (s *state) collectAttachments() error {
	nodes, err := os.ReadDir(s.attached)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		hash := n.Name()
		ids, err := s.attachments(hash)
		if err != nil {
			return err
		}
		for _, id := range ids {
			stale := func() (bool, error) { return s.notAttachedTo(id, hash) }
			if _, err := s.removeUnder(diskKey(id), filepath.Join(s.nodeDir(hash), string(id)), stale); err != nil {
				return err
			}
		}
	}
	return nil
}

// notAttachedTo reports whether disk id is gone or not attached to the
// node of hash.
func (s *state) notAttachedTo(id diskID, hash string) (bool, error) {
	d, err := s.readDisk(id)
	if err != nil {
		if ok, nerr := s.noRecord(id); nerr == nil && ok {
			return true, nil
		}
		return false, err
	}
	return d.AttachedTo == "" || nodeHash(d.AttachedTo) != hash, nil
}
