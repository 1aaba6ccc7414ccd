package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
)

// Disks made from a source (cloud.DiskSpec.Source): the new disk's image
// is a copy of the snapshot's image, or of the source disk's image taken
// at one point in time as a snapshot is (copy.go), made larger with zeros
// when the disk is. CreateDisk keeps its guarantees: the disk exists once
// its record does, its name entry is durable before that, and what a kill
// leaves (an image, a name entry) is removed by Open or by the next create
// of the name.

var clonePoints = copyPoints{frozen: crash.LocalCloneFrozen, copying: crash.LocalCloneCopying}

// checkSource refuses a source that cannot make a disk of size bytes:
// malformed (ErrInvalid), unknown (ErrNotFound), larger than the disk
// (ErrInvalid). The copy checks it again under the locks it takes.
func (c *Cloud) checkSource(src *cloud.DiskSource, size int64) error {
	if src == nil {
		return nil
	}
	var (
		what     string
		srcBytes int64
		err      error
	)
	switch {
	case (src.SnapshotID == "") == (src.DiskID == ""):
		return fmt.Errorf("disk source %+v: exactly one of a snapshot and a disk: %w", *src, cloud.ErrInvalid)
	case src.SnapshotID != "":
		id, ok := parseSnapID(src.SnapshotID)
		if !ok {
			return fmt.Errorf("snapshot id %q is not one of this provider's: %w", src.SnapshotID, cloud.ErrInvalid)
		}
		var snap cloud.Snapshot
		snap, err = c.s.readSnapshot(id)
		what, srcBytes = "snapshot "+string(id), snap.SizeBytes
	default:
		id, ok := parseDiskID(src.DiskID)
		if !ok {
			return invalidDiskID(src.DiskID)
		}
		var d cloud.Disk
		d, err = c.s.readDisk(id)
		what, srcBytes = "disk "+string(id), d.SizeBytes
	}
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		return err
	case err != nil:
		return ioFailure("read the disk's source", err)
	case srcBytes > size:
		return fmt.Errorf("%s has %d bytes, more than the %d of the disk to make from it: %w", what, srcBytes, size, cloud.ErrInvalid)
	}
	return nil
}

// sameSource reports whether two disk sources are the same (both none, or
// both of the same snapshot or disk).
func sameSource(a, b *cloud.DiskSource) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func cloneSource(src *cloud.DiskSource) *cloud.DiskSource {
	if src == nil {
		return nil
	}
	out := *src
	return &out
}

// cloneLocked makes disk d, whose d.Source is set, as createLocked makes a
// disk: its image first (a copy of the source), then its record
// (placeRecord). The caller holds the locks of its name and its
// id. A source gone since it was checked, or that cannot be copied
// consistently now, is the call's error: nothing is made then.
func (c *Cloud) cloneLocked(ctx context.Context, hash string, d cloud.Disk, started time.Time) (cloud.Operation, error) {
	id := diskID(d.ID)
	var op cloud.Operation
	fail := func(what string, err error) (cloud.Operation, error) {
		err = c.recordedFailure(&op, cloud.OpCreate, id, "", started, ioFailure(what, err))
		return op, err
	}
	image, copyErr, err := c.copySource(ctx, *d.Source, d.SizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	if copyErr != nil {
		return fail("copy the disk's source", copyErr)
	}
	defer image.Close()
	if err := linkFile(image, c.s.imagePath(id)); err != nil {
		return fail("name the disk's image", err)
	}
	// From here the image is this create's alone: a failure removes it.
	fail = func(what string, err error) (cloud.Operation, error) {
		_ = os.Remove(c.s.imagePath(id))
		err = c.recordedFailure(&op, cloud.OpCreate, id, "", started, ioFailure(what, err))
		return op, err
	}
	if err := c.s.syncEarlier(c.s.disks); err != nil {
		return fail("name the disk's image", err)
	}
	c.s.hit(crash.LocalCloneImage)
	if what, err := c.s.placeRecord(hash, d, true); err != nil {
		return fail(what, err)
	}
	return c.record(cloud.OpCreate, id, "", started, &d, nil)
}

// copySource copies a disk source into a new unnamed image of size bytes
// in the disks directory. refused is the call's error (nothing was
// copied: the source is gone, or cannot be copied consistently); failed,
// the copy's.
func (c *Cloud) copySource(ctx context.Context, src cloud.DiskSource, size int64) (image *os.File, failed, refused error) {
	if src.SnapshotID != "" {
		return c.copySnapshot(ctx, snapID(src.SnapshotID), size)
	}
	from := diskID(src.DiskID)
	refused = c.locked(ctx, func() error {
		d, err := c.s.readExisting(from)
		if err != nil {
			return err
		}
		if err := c.thawRecorded(from); err != nil {
			return err
		}
		plan, err := c.planCopy(from, d.SizeBytes)
		if err != nil {
			return err
		}
		image, _, failed = c.copyDisk(ctx, from, d.SizeBytes, size, plan, c.s.disks, clonePoints)
		return nil
	}, diskKey(from))
	return image, failed, refused
}

// copySnapshot copies the image of snapshot id into a new unnamed image
// of size bytes in the disks directory; see copySource. A snapshot's image
// never changes, so no lock is needed: the image is opened, then its
// record read, and a delete after that leaves the open image whole.
func (c *Cloud) copySnapshot(ctx context.Context, id snapID, size int64) (image *os.File, failed, refused error) {
	src, err := os.OpenFile(c.s.snapImagePath(id), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("snapshot %s: %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return nil, nil, ioFailure("open the snapshot's image", err)
	}
	defer src.Close()
	snap, err := c.s.readSnapshot(id)
	if err != nil {
		return nil, nil, err
	}
	plan := copyPlan{reflink: c.reflink}
	if !plan.reflink {
		if err := c.roomFor(c.s.snapImagePath(id), snap.SizeBytes); err != nil {
			return nil, nil, err
		}
	}
	image, _, failed = c.copyFile(ctx, diskID(snap.SourceDiskID), src, snap.SizeBytes, size, plan, c.s.disks, clonePoints)
	return image, failed, nil
}
