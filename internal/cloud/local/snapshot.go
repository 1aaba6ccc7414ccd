package local

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/crash"
)

// Snapshots live beside the disks, in directories of their own (added to
// layout 2 without a version change: a directory without them holds no
// snapshots, and a csid that predates them leaves them alone):
//
//	snapshots/<id>.img     snapshot image: a reflink clone or a sparse copy
//	                       of the disk's image when it was taken (copy.go)
//	snapshots/<id>.json    snapshot record; the snapshot exists iff this
//	                       file does
//	snapnames/<name hash>  the name index of snapshots: a hard link to the
//	                       snapshot's record, as names/ is for disks
//	frozen/<disk id>.json  the filesystems a snapshot or a clone of the disk
//	                       has frozen, written before it freezes them
//	                       (freeze.go)
//
// A snapshot is made whole before it exists: its image is copied into an
// unnamed file, fsynced and linked; then its record is written under a
// temporary name (newfile.go), linked into the name index, and renamed
// into place. A kill at any point
// leaves an image or a name entry without a record, which Open removes,
// and a repeated call finds the snapshot by its name once it exists.
const (
	snapshotsDir = "snapshots"
	snapNamesDir = "snapnames"
)

// snapID is a validated snapshot id: "snap-" and 16 lower-case hex digits.
type snapID string

var snapIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

func parseSnapID(s string) (snapID, bool) {
	if !snapIDPattern.MatchString(s) {
		return "", false
	}
	return snapID(s), true
}

func newSnapID() snapID {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return snapID(fmt.Sprintf("snap-%016x", binary.BigEndian.Uint64(b[:])))
}

func snapKey(id snapID) string       { return "snapshot/" + string(id) }
func snapNameKey(hash string) string { return "snapname/" + hash }

func (s *state) snapshots() string               { return filepath.Join(s.dir, snapshotsDir) }
func (s *state) snapNames() string               { return filepath.Join(s.dir, snapNamesDir) }
func (s *state) snapNamePath(hash string) string { return filepath.Join(s.snapNames(), hash) }
func (s *state) snapImagePath(id snapID) string {
	return filepath.Join(s.snapshots(), string(id)+imageSuffix)
}
func (s *state) snapRecordPath(id snapID) string {
	return filepath.Join(s.snapshots(), string(id)+recSuffix)
}

type snapshotRecord struct {
	Version  int            `json:"version"`
	Snapshot cloud.Snapshot `json:"snapshot"`
}

var _ cloud.Snapshotter = (*Cloud)(nil)

// openSnapshots makes the snapshot directories and learns whether the
// state directory's file system clones files (reflink). The caller is
// Open.
func (c *Cloud) openSnapshots() error {
	if err := c.s.mkdirsDurable(c.s.snapshots(), c.s.snapNames(), c.s.frozen()); err != nil {
		return err
	}
	var err error
	c.reflink, err = reflinks(c.s.disks, c.s.snapshots())
	return err
}

// CreateSnapshot takes a snapshot of a disk; see cloud.Snapshotter. Under
// the locks of its name, its new id and the disk, the disk's image is
// copied at one point in time (copy.go: a reflink where the file system
// has them, the filesystem on an attached disk frozen while it is copied
// where it is mounted on this machine); a disk whose image is in use by a
// loop device that cannot be frozen, on a file system without reflinks,
// is ErrNotSupported. Before it starts, any filesystem a killed snapshot
// left frozen is thawed.
func (c *Cloud) CreateSnapshot(ctx context.Context, spec cloud.SnapshotSpec) (cloud.Operation, error) {
	if spec.Name == "" || len(spec.Name) > MaxNameBytes || !utf8.ValidString(spec.Name) {
		return cloud.Operation{}, fmt.Errorf("snapshot name %q: empty, longer than %d bytes or not UTF-8: %w", spec.Name, MaxNameBytes, cloud.ErrInvalid)
	}
	src, ok := parseDiskID(spec.SourceDiskID)
	if !ok {
		return cloud.Operation{}, invalidDiskID(spec.SourceDiskID)
	}
	// Best effort for other disks: the source's own freeze is thawed, or
	// the call refused, under its lock (snapshotLocked).
	_ = c.thawAbandoned()
	hash := nameHash(spec.Name)
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		snap, found, err := c.snapshotByName(hash, spec.Name)
		if err != nil {
			return err
		}
		if found {
			if snap.SourceDiskID != string(src) {
				return fmt.Errorf("snapshot name %q is taken by %s, of disk %s: %w", spec.Name, snap.ID, snap.SourceDiskID, cloud.ErrAlreadyExists)
			}
			op, err = c.recordSnapshot(cloud.OpSnapshot, snap.SourceDiskID, snapID(snap.ID), started, nil)
			return err
		}
		id := c.s.freshSnapID()
		return c.locked(ctx, func() error {
			op, err = c.snapshotLocked(ctx, hash, id, src, spec, started)
			return err
		}, snapKey(id), diskKey(src))
	}, snapNameKey(hash))
	return op, err
}

// snapshotLocked takes snapshot id of disk src. The caller holds the locks
// of its name, its id and the disk. What can be told before anything is
// made (no such disk, no consistent way to copy it, no room) is the
// call's error; what fails after is the operation's.
func (c *Cloud) snapshotLocked(ctx context.Context, hash string, id snapID, src diskID, spec cloud.SnapshotSpec, started time.Time) (cloud.Operation, error) {
	d, err := c.s.readExisting(src)
	if err != nil {
		return cloud.Operation{}, err
	}
	if err := c.thawRecorded(src); err != nil {
		return cloud.Operation{}, err
	}
	plan, err := c.planCopy(src, d.SizeBytes)
	if err != nil {
		return cloud.Operation{}, err
	}
	fail := func(what string, err error) (cloud.Operation, error) {
		return c.recordSnapshot(cloud.OpSnapshot, string(src), id, started, ioFailure(what, err))
	}
	image, stored, err := c.copyDisk(ctx, src, d.SizeBytes, d.SizeBytes, plan, c.s.snapshots(), copyPoints{frozen: crash.LocalSnapshotFrozen, copying: crash.LocalSnapshotCopying})
	if err != nil {
		return fail("copy the disk's image", err)
	}
	defer image.Close()
	if err := linkFile(image, c.s.snapImagePath(id)); err != nil {
		return fail("name the snapshot's image", err)
	}
	// From here the image is this snapshot's alone: a failure removes it.
	fail = func(what string, err error) (cloud.Operation, error) {
		_ = os.Remove(c.s.snapImagePath(id))
		return c.recordSnapshot(cloud.OpSnapshot, string(src), id, started, ioFailure(what, err))
	}
	if err := c.s.syncEarlier(c.s.snapshots()); err != nil {
		return fail("name the snapshot's image", err)
	}
	c.s.hit(crash.LocalSnapshotImage)
	snap := cloud.Snapshot{
		ID: string(id), Name: spec.Name, SourceDiskID: string(src), SizeBytes: d.SizeBytes,
		StoredBytes: stored, Tags: maps.Clone(spec.Tags), CreatedAt: started.UTC(), Ready: true,
	}
	if what, err := c.s.placeSnapshotRecord(hash, snap); err != nil {
		return fail(what, err)
	}
	return c.recordSnapshot(cloud.OpSnapshot, string(src), id, started, nil)
}

// DeleteSnapshot deletes a snapshot; see cloud.Snapshotter. Under the locks
// of its name and its id, the record goes first (the snapshot no longer
// exists), then its name entry and its image; a crash in between leaves
// what Open removes. Disks made from it have their own images.
func (c *Cloud) DeleteSnapshot(ctx context.Context, snapshotID string) (cloud.Operation, error) {
	id, ok := parseSnapID(snapshotID)
	if !ok {
		return cloud.Operation{}, fmt.Errorf("snapshot id %q is not one of this provider's (snap- and 16 hex digits): %w", snapshotID, cloud.ErrInvalid)
	}
	started := c.opts.now()
	snap, err := c.s.readSnapshot(id)
	if errors.Is(err, cloud.ErrNotFound) {
		// Nothing makes a snapshot of this id again: gone stays gone.
		var op cloud.Operation
		err := c.locked(ctx, func() error {
			var err error
			op, err = c.recordSnapshot(cloud.OpDeleteSnapshot, "", id, started, nil)
			return err
		}, snapKey(id))
		return op, err
	}
	if err != nil {
		return cloud.Operation{}, ioFailure("read snapshot", err)
	}
	hash := nameHash(snap.Name)
	var op cloud.Operation
	err = c.locked(ctx, func() error {
		if _, err := c.s.readSnapshot(id); errors.Is(err, cloud.ErrNotFound) {
			op, err = c.recordSnapshot(cloud.OpDeleteSnapshot, snap.SourceDiskID, id, started, nil)
			return err
		} else if err != nil {
			return ioFailure("read snapshot", err)
		}
		fail := func(err error) error {
			op, err = c.recordSnapshot(cloud.OpDeleteSnapshot, snap.SourceDiskID, id, started, ioFailure("remove snapshot record", err))
			return err
		}
		if err := os.Remove(c.s.snapRecordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fail(err)
		}
		if err := c.s.syncDir(c.s.snapshots()); err != nil {
			return fail(err)
		}
		c.s.hit(crash.LocalSnapshotDeleted)
		// The snapshot is gone with its record; what is left if these
		// fail is found stale and removed later.
		_ = c.s.unnameSnapshot(hash, id)
		_ = os.Remove(c.s.snapImagePath(id))
		var err error
		op, err = c.recordSnapshot(cloud.OpDeleteSnapshot, snap.SourceDiskID, id, started, nil)
		return err
	}, snapNameKey(hash), snapKey(id))
	return op, err
}

// GetSnapshot reports a snapshot; see cloud.Snapshotter. It takes no lock:
// records are linked and removed whole.
func (c *Cloud) GetSnapshot(ctx context.Context, snapshotID string) (cloud.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return cloud.Snapshot{}, err
	}
	id, ok := parseSnapID(snapshotID)
	if !ok {
		return cloud.Snapshot{}, fmt.Errorf("snapshot %q: %w", snapshotID, cloud.ErrNotFound)
	}
	return c.s.readSnapshot(id)
}

// ListSnapshots lists snapshots; see cloud.Snapshotter. The page token is
// the ID of the last snapshot of the previous page. It takes no lock.
func (c *Cloud) ListSnapshots(ctx context.Context, opts cloud.SnapshotListOptions) (cloud.SnapshotPage, error) {
	if err := ctx.Err(); err != nil {
		return cloud.SnapshotPage{}, err
	}
	var after snapID
	if opts.PageToken != "" {
		var ok bool
		if after, ok = parseSnapID(opts.PageToken); !ok {
			return cloud.SnapshotPage{}, fmt.Errorf("page token %q: %w", opts.PageToken, cloud.ErrInvalid)
		}
	}
	limit := opts.MaxResults
	switch {
	case limit < 0:
		return cloud.SnapshotPage{}, fmt.Errorf("page size %d: %w", limit, cloud.ErrInvalid)
	case limit == 0:
		limit = DefaultPageSize
	case limit > MaxPageSize:
		limit = MaxPageSize
	}
	if _, ok := parseDiskID(opts.SourceDiskID); opts.SourceDiskID != "" && !ok {
		return cloud.SnapshotPage{}, nil // no snapshot is of a disk that cannot exist
	}
	ids, err := c.s.snapshotIDs()
	if err != nil {
		return cloud.SnapshotPage{}, ioFailure("list snapshots", err)
	}
	var page cloud.SnapshotPage
	for _, id := range ids {
		if id <= after {
			continue
		}
		snap, err := c.s.readSnapshot(id)
		if errors.Is(err, cloud.ErrNotFound) {
			continue // deleted since the directory was read
		}
		if err != nil {
			return cloud.SnapshotPage{}, ioFailure("read snapshot", err)
		}
		if opts.SourceDiskID != "" && snap.SourceDiskID != opts.SourceDiskID {
			continue
		}
		if len(page.Snapshots) == limit {
			page.NextToken = page.Snapshots[limit-1].ID
			break
		}
		page.Snapshots = append(page.Snapshots, snap)
	}
	return page, nil
}

// recordSnapshot stores a finished snapshot operation and returns it; see
// record.
func (c *Cloud) recordSnapshot(kind cloud.OpKind, disk string, id snapID, started time.Time, failed error) (cloud.Operation, error) {
	op := cloud.Operation{ID: string(newOpID(started)), Kind: kind, DiskID: disk, SnapshotID: string(id), Done: true}
	return c.recordOp(op, started, nil, failed)
}

// snapshotIDs lists the ids of the snapshots that exist, sorted.
func (s *state) snapshotIDs() ([]snapID, error) {
	ids, err := recordIDs(s.snapshots(), parseSnapID)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // a directory of a csid that took no snapshots (Inspector)
	}
	return ids, err
}

// readSnapshot reads a snapshot record; a missing one is ErrNotFound.
func (s *state) readSnapshot(id snapID) (cloud.Snapshot, error) {
	raw, err := readRegular(s.snapRecordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return cloud.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, cloud.ErrNotFound)
	}
	if err != nil {
		return cloud.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return parseSnapshotRecord(s.snapRecordPath(id), raw, id)
}

func parseSnapshotRecord(path string, raw []byte, id snapID) (cloud.Snapshot, error) {
	var rec snapshotRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return cloud.Snapshot{}, fmt.Errorf("snapshot record %s: %w", path, err)
	}
	if rec.Version != recordVersion || (id != "" && rec.Snapshot.ID != string(id)) {
		return cloud.Snapshot{}, fmt.Errorf("snapshot record %s: version %d for %q, want version %d for %s", path, rec.Version, rec.Snapshot.ID, recordVersion, id)
	}
	return rec.Snapshot, nil
}

// freshSnapID is a snapshot id nothing in the directory uses yet.
func (s *state) freshSnapID() snapID {
	for {
		id := newSnapID()
		if _, err := os.Lstat(s.snapImagePath(id)); errors.Is(err, os.ErrNotExist) {
			return id
		}
	}
}

// snapshotByName finds the snapshot named name through the name index. The
// caller holds the name's lock. An entry whose snapshot is gone (a
// snapshot or a delete a crash cut short) is removed.
func (c *Cloud) snapshotByName(hash, name string) (cloud.Snapshot, bool, error) {
	id, ok, err := c.s.snapshotNamed(hash)
	if err != nil || !ok {
		return cloud.Snapshot{}, false, err
	}
	snap, err := c.s.readSnapshot(id)
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		if err := os.Remove(c.s.snapNamePath(hash)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return cloud.Snapshot{}, false, ioFailure("remove a stale name entry", err)
		}
		return cloud.Snapshot{}, false, nil
	case err != nil:
		return cloud.Snapshot{}, false, ioFailure("read snapshot", err)
	case snap.Name != name:
		return cloud.Snapshot{}, false, fmt.Errorf("name index %s points to snapshot %s, named %q, not %q: the state directory is damaged", c.s.snapNamePath(hash), id, snap.Name, name)
	}
	return snap, true, nil
}

// snapshotNamed reads the snapshot name index: the snapshot the entry of
// hash names, or false when there is none. An entry that is not a record
// of a snapshot of its name is damage, reported.
func (s *state) snapshotNamed(hash string) (snapID, bool, error) {
	path := s.snapNamePath(hash)
	raw, err := readRegular(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("name index %s: %w", path, err)
	}
	snap, err := parseSnapshotRecord(path, raw, "")
	if err != nil {
		return "", false, err
	}
	id, ok := parseSnapID(snap.ID)
	if !ok || nameHash(snap.Name) != hash {
		return "", false, fmt.Errorf("name index %s holds snapshot %q named %q, not one of this name", path, snap.ID, snap.Name)
	}
	return id, true, nil
}

// unnameSnapshot removes the entry of hash if it points to id. The caller
// holds the name's lock. It is not made durable: an entry that comes back
// after a power loss is stale, and treated so.
func (s *state) unnameSnapshot(hash string, id snapID) error {
	got, ok, err := s.snapshotNamed(hash)
	if err != nil || !ok || got != id {
		return err
	}
	if err := os.Remove(s.snapNamePath(hash)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// placeSnapshotRecord writes the record of new snapshot snap whole and
// durably under a temporary name (writeTemp), enters it under its name in
// the name index (durably), then renames it into place, which makes the
// snapshot exist: placeRecord's steps for a disk. On failure it says what
// failed and leaves no temporary name. The caller holds the locks of the
// snapshot's name and its id.
func (s *state) placeSnapshotRecord(hash string, snap cloud.Snapshot) (string, error) {
	raw, err := json.Marshal(snapshotRecord{Version: recordVersion, Snapshot: snap})
	if err != nil {
		return "write the snapshot's record", err
	}
	tmp, err := writeTemp(s.snapshots(), snap.ID+recSuffix, writeBytes(raw), true)
	if err != nil {
		return "write the snapshot's record", err
	}
	if err := os.Link(tmp, s.snapNamePath(hash)); err != nil {
		_ = os.Remove(tmp)
		return "index the snapshot's name", err
	}
	if err := s.syncEarlier(s.snapNames()); err != nil {
		_ = os.Remove(tmp)
		return "index the snapshot's name", err
	}
	s.hit(crash.LocalSnapshotNamed)
	if err := renameNoReplace(tmp, s.snapRecordPath(snapID(snap.ID))); err != nil {
		_ = os.Remove(tmp)
		return "write the snapshot's record", err
	}
	if err := s.syncDir(s.snapshots()); err != nil {
		return "write the snapshot's record", err
	}
	s.hit(crash.LocalSnapshotRecorded)
	return "", nil
}

// collectSnapshots removes what a killed snapshot or snapshot delete can
// leave: images and name entries without a record. Each removal is made
// under the lock of what it removes, taken without waiting (see
// collectGarbage).
func (s *state) collectSnapshots() error {
	images, err := listIDs(s.snapshots(), imageSuffix, parseSnapID)
	if err != nil {
		return err
	}
	removed := false
	for _, id := range images {
		done, err := s.removeUnder(snapKey(id), s.snapImagePath(id), func() (bool, error) { return noFile(s.snapRecordPath(id)) })
		if err != nil {
			return err
		}
		removed = removed || done
	}
	if removed {
		if err := syncDir(s.snapshots()); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(s.snapNames())
	if err != nil {
		return err
	}
	for _, e := range entries {
		hash := e.Name()
		stale := func() (bool, error) {
			id, ok, err := s.snapshotNamed(hash)
			if err != nil || !ok {
				return false, nil // damage is left for a create of the name to report
			}
			return noFile(s.snapRecordPath(id))
		}
		if _, err := s.removeUnder(snapNameKey(hash), s.snapNamePath(hash), stale); err != nil {
			return err
		}
	}
	return nil
}

func noFile(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	return false, err
}
