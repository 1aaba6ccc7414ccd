package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
)

// CreateDisk creates a disk; see cloud.Cloud. Under the lock of its name:
// the name index is asked for the name (a disk of that name is the answer
// to a repeated call); the new disk's record is written and fsynced,
// entered under the name (durably), and only then linked into place: the
// disk exists once its record does, and its name entry is durable before
// that, so a crash can never leave a disk that a repeated call would not
// find. The disk has no image yet: a disk that was never attached holds
// only zeros, and its image is made by its first attach (ensureImage), as
// a cloud allocates a volume's blocks when they are first written. A disk
// larger than the free space of the state directory is ErrLimitReached
// (images are sparse, so disks created earlier may still fill it later).
// A disk with a source is made by cloneLocked (clone.go).
func (c *Cloud) CreateDisk(ctx context.Context, spec cloud.DiskSpec) (cloud.Operation, error) {
	size, err := roundSize(spec.SizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	if spec.Name == "" || len(spec.Name) > MaxNameBytes || !utf8.ValidString(spec.Name) {
		return cloud.Operation{}, fmt.Errorf("disk name %q: empty, longer than %d bytes or not UTF-8: %w", spec.Name, MaxNameBytes, cloud.ErrInvalid)
	}
	zone, err := c.checkZone(spec.Zone)
	if err != nil {
		return cloud.Operation{}, err
	}
	hash := nameHash(spec.Name)
	leave := c.s.jrnl.arrive()
	defer leave()
	var op cloud.Operation
	err = c.locked(ctx, func() error {
		started := c.opts.now()
		d, found, err := c.byName(hash, spec.Name)
		if err != nil {
			return err
		}
		if found {
			leave() // logs no intent: no commit gathers for it
			if d.SizeBytes != size {
				return fmt.Errorf("disk name %q is taken by %s (%d bytes): %w", spec.Name, d.ID, d.SizeBytes, cloud.ErrAlreadyExists)
			}
			if !sameSource(d.Source, spec.Source) {
				return fmt.Errorf("disk name %q is taken by %s, made from %+v: %w", spec.Name, d.ID, d.Source, cloud.ErrAlreadyExists)
			}
			op, err = c.record(cloud.OpCreate, diskID(d.ID), "", started, &d, nil)
			return err
		}
		if err := c.checkSource(spec.Source, size); err != nil {
			return err
		}
		free, err := c.s.freeBytes()
		if err != nil {
			return ioFailure("free space", err)
		}
		if size > free {
			return fmt.Errorf("%s has %d bytes free, the disk needs %d: %w", c.s.disks, free, size, cloud.ErrLimitReached)
		}
		d = cloud.Disk{ID: string(c.s.freshID()), Name: spec.Name, SizeBytes: size, Zone: zone, Tags: maps.Clone(spec.Tags), CreatedAt: started.UTC(), Source: cloneSource(spec.Source)}
		// The new id's lock keeps Open's collection away from the image
		// before the record is in place.
		return c.locked(ctx, func() error {
			if d.Source != nil {
				// A clone logs no intent, and copies for as long as it
				// takes: no commit gathers for it.
				leave()
				op, err = c.cloneLocked(ctx, hash, d, started) // clone.go
			} else {
				op, err = c.createLocked(hash, d, started, leave)
			}
			if err == nil {
				c.names.remember(diskID(d.ID), hash)
			}
			return err
		}, diskKey(diskID(d.ID)))
	}, nameKey(hash))
	return op, err
}

// byName finds the disk named name through the name index. The caller
// holds the name's lock. An entry whose disk is gone (a create or a delete
// a crash cut short) is removed.
func (c *Cloud) byName(hash, name string) (cloud.Disk, bool, error) {
	id, ok, err := c.s.named(hash)
	if err != nil || !ok {
		return cloud.Disk{}, false, err
	}
	d, err := c.s.readDisk(id)
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		if err := c.s.dropName(hash); err != nil {
			return cloud.Disk{}, false, ioFailure("remove a stale name entry", err)
		}
		return cloud.Disk{}, false, nil
	case err != nil:
		return cloud.Disk{}, false, ioFailure("read disk", err)
	case d.Name != name:
		return cloud.Disk{}, false, fmt.Errorf("name index %s points to disk %s, named %q, not %q: the state directory is damaged", c.s.namePath(hash), id, d.Name, name)
	}
	return d, true, nil
}

// freshID is a disk id nothing in the directory uses yet: no record, and
// no image left by a delete a kill cut short.
func (s *state) freshID() diskID {
	for {
		id := newDiskID()
		_, err := os.Lstat(s.imagePath(id))
		if errors.Is(err, os.ErrNotExist) {
			_, err = os.Lstat(s.recordPath(id))
		}
		if errors.Is(err, os.ErrNotExist) {
			return id
		}
		// 64 random bits collided: pick again.
	}
}

// createLocked makes disk d: its intent is journaled (durably, in a
// group commit: journal.go), then its record placed without an fsync
// (placeRecord). The caller holds the locks of its name and its id.
func (c *Cloud) createLocked(hash string, d cloud.Disk, started time.Time, leave func()) (cloud.Operation, error) {
	id := diskID(d.ID)
	in := intent{Op: newOpID(time.Now()), Kind: intentCreate, ID: id, Disk: &d}
	done, err := c.s.jrnl.log(in, leave)
	if err != nil {
		return cloud.Operation{}, ioFailure("journal the create", err)
	}
	c.s.hit(crash.LocalCreateLogged)
	what, err := c.s.placeRecord(hash, d, false)
	if err != nil {
		c.s.jrnl.abort(in.Op)
	}
	done()
	if err != nil {
		var op cloud.Operation
		err = c.recordedFailure(&op, cloud.OpCreate, id, "", started, ioFailure(what, err))
		return op, err
	}
	return c.record(cloud.OpCreate, id, "", started, &d, nil)
}

// placeRecord writes the record of new disk d whole under a temporary
// name (recordFile), enters it under its name in the name index, then
// renames it into place, which makes the disk exist. durable: each step
// is durable before the next (a clone's); else the create's intent is
// journaled, which the first Open after a crash of the machine replays
// (journal.go). On failure it says what failed and leaves no temporary
// name. The caller holds the locks of the disk's name and its id.
func (s *state) placeRecord(hash string, d cloud.Disk, durable bool) (string, error) {
	tmp, err := s.recordFile(d, durable)
	if err != nil {
		return "write disk record", err
	}
	if err := s.name(hash, tmp, durable); err != nil {
		_ = os.Remove(tmp)
		return "index the disk's name", err
	}
	s.hit(crash.LocalCreateNamed)
	if err := renameNoReplace(tmp, s.recordPath(diskID(d.ID))); err != nil {
		_ = os.Remove(tmp)
		return "write disk record", err
	}
	if durable {
		if err := s.syncDir(s.disks); err != nil {
			return "write disk record", err
		}
	}
	s.hit(crash.LocalCreateRecorded)
	return "", nil
}

// recordedFailure records an operation that failed while running and makes
// the call return it (with a nil error), so the failure is reported by
// WaitOperation, as for any operation that was started.
func (c *Cloud) recordedFailure(op *cloud.Operation, kind cloud.OpKind, id diskID, nodeID string, started time.Time, failed error) error {
	var err error
	*op, err = c.record(kind, id, nodeID, started, nil, failed)
	return err
}

// ensureImage makes the image of disk d, a sparse file of its size, if it
// has none yet, whole or not at all (createFile), and makes its directory
// entry durable before a later change is (syncEarlier): the caller then
// records the disk attached, and an attached disk always has its image.
// An image found in place is the disk's own (ids are never reused, and
// Open removes images without a record); it may come from an attach that
// a kill cut short before its entry was durable, so the entry is made
// durable all the same. The caller holds the disk's lock.
func (s *state) ensureImage(d cloud.Disk) error {
	id := diskID(d.ID)
	_, err := os.Lstat(s.imagePath(id))
	if errors.Is(err, os.ErrNotExist) {
		// The image's size is metadata, made durable with its entry on a
		// file system that orders its metadata, and by an fsync of the
		// image before it is named on any other.
		err = createFile(s.disks, string(id)+imageSuffix, func(f *os.File) error { return f.Truncate(d.SizeBytes) }, !s.orderedMeta)
		if err == nil {
			s.hit(crash.LocalAttachImage)
		}
	}
	if err != nil {
		return err
	}
	return s.syncEarlier(s.disks)
}

// DeleteDisk deletes a disk; see cloud.Cloud. Under the locks of its name
// (remembered from its create in this process, else read from its record
// first: diskNames) and its id, the record is read, the delete's intent is
// journaled (durably, in a group commit: journal.go), then the record goes
// first (the disk no longer exists), then its name entry and its image (if
// it was ever attached), none of them fsynced: a kill in between leaves an
// entry and an image that the next create of the name, or Open, removes,
// and the first Open after a crash of the machine replays the delete. The record file (and the name entry's, when the
// record was replaced since) becomes a spare for a later create (spare.go).
// A detached disk has no loop device csid made (a detach releases it,
// under the same lock as the node's binding); one bound by hand is not
// csid's to release, keeps the deleted image's blocks until its owner
// releases it, and is shown by csid check.
func (c *Cloud) DeleteDisk(ctx context.Context, diskIDStr string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	leave := c.s.jrnl.arrive()
	defer leave()
	started := c.opts.now()
	hash, known := c.names.lookup(id)
	if !known {
		d, err := c.s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			// Nothing makes a disk of this id again: gone stays gone.
			return c.recordLocked(ctx, cloud.OpDelete, id, "", started, nil)
		}
		if err != nil {
			return cloud.Operation{}, ioFailure("read disk", err)
		}
		hash = nameHash(d.Name)
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		return c.deleteLocked(&op, id, hash, started, leave)
	}, nameKey(hash), diskKey(id))
	return op, err
}

// deleteLocked deletes disk id, named by hash, under the locks of both.
func (c *Cloud) deleteLocked(op *cloud.Operation, id diskID, hash string, started time.Time, leave func()) error {
	d, rec, err := c.s.readDiskStat(id)
	if errors.Is(err, cloud.ErrNotFound) {
		c.names.forget(id)
		*op, err = c.record(cloud.OpDelete, id, "", started, nil, nil)
		return err
	}
	if err != nil {
		return ioFailure("read disk", err)
	}
	if nameHash(d.Name) != hash {
		return fmt.Errorf("disk %s is named %q now, not as when it was made: the state directory is damaged", id, d.Name)
	}
	if d.AttachedTo != "" {
		return fmt.Errorf("disk %s is attached to %s: %w", id, d.AttachedTo, cloud.ErrAttached)
	}
	in := intent{Op: newOpID(time.Now()), Kind: intentDelete, ID: id, Name: hash}
	done, err := c.s.jrnl.log(in, leave)
	if err != nil {
		return ioFailure("journal the delete", err)
	}
	defer done()
	c.s.hit(crash.LocalDeleteLogged)
	// The record leaves its place for a temporary name, from which it
	// becomes a spare.
	retired := tempPath(c.s.disks, string(id)+recSuffix)
	if err := os.Rename(c.s.recordPath(id), retired); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.s.jrnl.abort(in.Op)
		return c.recordedFailure(op, cloud.OpDelete, id, "", started, ioFailure("remove disk record", err))
	}
	c.s.hit(crash.LocalDeleteRemoved)
	c.names.forget(id)
	// The disk is gone with its record. What is left if these fail is
	// found stale and removed later. The file becomes a spare at once: a
	// crash of the machine that brings back its name entry or its place
	// replays the delete, which removes them (journal.go). The image is
	// unlinked without os.Remove's second try as a directory: most disks
	// were never attached and have none.
	_ = c.s.unname(hash, id, &rec)
	c.s.spares.retire(retired)
	_ = unix.Unlink(c.s.imagePath(id))
	*op, err = c.record(cloud.OpDelete, id, "", started, nil, nil)
	return err
}

// recordLocked records a finished operation under the disk's lock.
func (c *Cloud) recordLocked(ctx context.Context, kind cloud.OpKind, id diskID, nodeID string, started time.Time, left *cloud.Disk) (cloud.Operation, error) {
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		var err error
		op, err = c.record(kind, id, nodeID, started, left, nil)
		return err
	}, diskKey(id))
	return op, err
}

// ResizeDisk grows a detached disk; see cloud.Cloud. The image, if the disk
// has one yet, grows (sparse) and is fsynced before the record says so; a
// crash in between leaves an image larger than its record, which is
// harmless (the loop device is capped at the recorded size) and the retry
// completes. A disk never attached has no image: its record alone grows,
// and its first attach makes the image of the new size.
func (c *Cloud) ResizeDisk(ctx context.Context, diskIDStr string, sizeBytes int64) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	size, err := roundSize(sizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	var op cloud.Operation
	err = c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readExisting(id)
		if err != nil {
			return err
		}
		if d.AttachedTo != "" {
			return fmt.Errorf("disk %s is attached to %s, and this provider grows detached disks only: %w", id, d.AttachedTo, cloud.ErrAttached)
		}
		if size <= d.SizeBytes {
			op, err = c.record(cloud.OpResize, id, "", started, &d, nil)
			return err
		}
		free, err := c.s.freeBytes()
		if err != nil {
			return ioFailure("free space", err)
		}
		if size-d.SizeBytes > free {
			return fmt.Errorf("%s has %d bytes free, growing %s needs %d: %w", c.s.disks, free, id, size-d.SizeBytes, cloud.ErrLimitReached)
		}
		// A device left bound to the image would keep the old size.
		if err := c.releaseDevices(ctx, id); err != nil {
			return err
		}
		if err := growImage(c.s.imagePath(id), size); err != nil {
			return c.recordedFailure(&op, cloud.OpResize, id, "", started, ioFailure("grow image", err))
		}
		c.s.hit(crash.LocalResizeGrown)
		d.SizeBytes = size
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpResize, id, "", started, ioFailure("write disk record", err))
		}
		op, err = c.record(cloud.OpResize, id, "", started, &d, nil)
		return err
	}, diskKey(id))
	return op, err
}

// UpdateDiskTags sets and removes tags of a disk; see cloud.Cloud. The
// disk's record is rewritten crash-safely; a disk whose tags are already
// so is not written.
func (c *Cloud) UpdateDiskTags(ctx context.Context, diskIDStr string, tags map[string]string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	if _, _, err := cloud.MergeTags(nil, tags); err != nil {
		return cloud.Operation{}, err
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readExisting(id)
		if err != nil {
			return err
		}
		merged, changed, err := cloud.MergeTags(d.Tags, tags)
		if err != nil {
			return err
		}
		if changed {
			d.Tags = merged
			if err := c.s.writeDisk(d); err != nil {
				return c.recordedFailure(&op, cloud.OpTag, id, "", started, ioFailure("write disk record", err))
			}
		}
		op, err = c.record(cloud.OpTag, id, "", started, &d, nil)
		return err
	}, diskKey(id))
	return op, err
}

// growImage extends an image to size bytes (never shrinks it) and fsyncs
// it. A disk without an image (never attached) has nothing to grow.
func growImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < size {
		if err := f.Truncate(size); err != nil {
			return err
		}
	}
	return f.Sync()
}
