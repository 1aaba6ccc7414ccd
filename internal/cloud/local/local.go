// Package local is csid's embedded provider: block storage on one Linux
// machine with nothing else installed. A disk is a sparse file under the
// state directory; attaching it to a node records the attachment, and the
// node (Host) materialises it as a loop device, found again by its backing
// file after a restart. Like the offline-only clouds csid is built for, a
// disk grows only while detached.
//
// Two processes use one state directory at once (a controller and a node
// plugin on the same machine), so every change happens under a flock(2) on
// <state>/lock as well as a mutex. Every file is written crash-safely
// (temporary file, fsync, rename, fsync of the directory), and a disk exists
// only once its record is in place: a crash never leaves a half-created disk
// that looks whole, and Open removes what a crash left behind.
//
// Operations complete before the call that starts them returns (the work is
// a few file operations). Each is recorded under <state>/ops with its result
// or typed error, so WaitOperation answers after a restart too; records older
// than Options.OpRetention beyond the newest Options.OpKeep are pruned.
//
// Disk ids are "disk-" and 16 random hex digits; anything else is refused
// (ErrNotFound for lookups, ErrInvalid for mutations) before it can reach a
// path. Node ids are stored inside a file, never used as paths.
package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/loopdev"
)

// Limits.
const (
	// Granularity is the size unit: sizes round up to a multiple of 1 MiB
	// (loop devices need multiples of 512 bytes; whole MiB keep the numbers
	// readable).
	Granularity = 1 << 20
	// MaxDiskBytes is the largest disk: 8 TiB, well inside the file size
	// limits of ext4 and xfs, on which the state directory lives.
	MaxDiskBytes = 8 << 40
	// MaxNameBytes is the longest disk name.
	MaxNameBytes = 256
	// MaxNodeIDBytes is the longest node id.
	MaxNodeIDBytes = 128
	// DefaultPageSize is the ListDisks page size when none is asked for;
	// MaxPageSize caps it.
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Options configure the backend.
type Options struct {
	// Zone is the one zone of the machine. Default: "local".
	Zone string
	// OpKeep and OpRetention bound the operation records: a record is
	// pruned once it is older than OpRetention and not among the newest
	// OpKeep. Defaults: 2000 and 24h.
	OpKeep      int
	OpRetention time.Duration

	// now is the clock (tests).
	now func() time.Time
	// crash is called at named points of the mutating paths (crash tests).
	crash func(point string)
}

// DefaultZone is the zone when Options.Zone is empty.
const DefaultZone = "local"

// pruneEvery is how many operations a process records between two prunings.
const pruneEvery = 64

// Cloud is the local provider, as a client of one state directory. It is
// safe for concurrent use, also with other processes on the same directory.
type Cloud struct {
	s    *state
	opts Options
	ops  atomic.Int64 // operations recorded by this process, for pruning
}

var (
	_ cloud.Cloud     = (*Cloud)(nil)
	_ cloud.Registrar = (*Cloud)(nil)
)

// Open opens the state directory dir, creating it if needed, and removes
// what a crash may have left behind (temporary files, images without a
// record). A directory written by another layout version is an error; it is
// never rewritten.
func Open(ctx context.Context, dir string, opts Options) (*Cloud, error) {
	if opts.Zone == "" {
		opts.Zone = DefaultZone
	}
	if opts.OpKeep <= 0 {
		opts.OpKeep = 2000
	}
	if opts.OpRetention <= 0 {
		opts.OpRetention = 24 * time.Hour
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	s, err := openState(dir)
	if err != nil {
		return nil, err
	}
	s.crash = opts.crash
	c := &Cloud{s: s, opts: opts}
	err = c.locked(ctx, func() error {
		if err := s.checkFormat(); err != nil {
			return err
		}
		if err := s.collectGarbage(); err != nil {
			return fmt.Errorf("clean up after a crash: %w", err)
		}
		return s.pruneOps(opts.now(), opts.OpKeep, opts.OpRetention)
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("local cloud %s: %w", dir, err)
	}
	return c, nil
}

// Close releases the state directory. Loop devices stay: they belong to the
// disks, not to the process.
func (c *Cloud) Close() error {
	return c.s.close()
}

// Dir is the state directory (absolute, symlinks resolved).
func (c *Cloud) Dir() string { return c.s.dir }

func (c *Cloud) locked(ctx context.Context, fn func() error) error {
	unlock, err := c.s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// record stores a finished operation and returns it. The caller holds the
// lock. An operation that failed while running keeps its error for
// WaitOperation; the call that started it still succeeds.
func (c *Cloud) record(kind cloud.OpKind, id diskID, nodeID string, started time.Time, left *cloud.Disk, failed error) (cloud.Operation, error) {
	op := cloud.Operation{ID: string(newOpID(started)), Kind: kind, DiskID: string(id), NodeID: nodeID, Done: true}
	rec := opRecord{Op: op, Started: started, Finished: c.opts.now(), Disk: left, Error: recordErr(failed)}
	if err := c.s.writeOp(rec); err != nil {
		if failed != nil {
			return cloud.Operation{}, fmt.Errorf("%w (and recording the operation failed: %v)", failed, err)
		}
		// The work is done and idempotent: the caller's retry finds it so.
		return cloud.Operation{}, fmt.Errorf("record %s operation on %s: %v: %w", kind, id, err, cloud.ErrTransient)
	}
	if c.ops.Add(1)%pruneEvery == 0 {
		// Best effort: a failed pruning leaves records for the next one.
		_ = c.s.pruneOps(c.opts.now(), c.opts.OpKeep, c.opts.OpRetention)
	}
	return op, nil
}

// ioFailure classifies an error of the state directory: out of space is
// ErrLimitReached, another failing system call may pass (ErrTransient), and
// anything else (a damaged record) is left untyped: retrying will not cure
// it.
func ioFailure(what string, err error) error {
	var errno unix.Errno
	switch {
	case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%s: %v: %w", what, err, cloud.ErrLimitReached)
	case errors.As(err, &errno):
		return fmt.Errorf("%s: %v: %w", what, err, cloud.ErrTransient)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}

func roundSize(size int64) (int64, error) {
	if size <= 0 || size > MaxDiskBytes {
		return 0, fmt.Errorf("size %d: must be between 1 and %d bytes: %w", size, int64(MaxDiskBytes), cloud.ErrInvalid)
	}
	return (size + Granularity - 1) / Granularity * Granularity, nil
}

func (c *Cloud) checkZone(zone string) (string, error) {
	if zone == "" || zone == c.opts.Zone {
		return c.opts.Zone, nil
	}
	return "", fmt.Errorf("zone %q: this machine is zone %q: %w", zone, c.opts.Zone, cloud.ErrInvalid)
}

// checkNodeID accepts what a node name can be (Kubernetes node names are DNS
// subdomains). Node ids never become paths; they are refused like paths all
// the same, so that nothing downstream is tempted.
func checkNodeID(id string) error {
	if id == "" || len(id) > MaxNodeIDBytes || !utf8.ValidString(id) || id == "." || id == ".." ||
		strings.ContainsFunc(id, func(r rune) bool { return r == '/' || unicode.IsControl(r) }) {
		return fmt.Errorf("node id %q: empty, longer than %d bytes, not UTF-8, or with '/', '..' or control characters: %w", id, MaxNodeIDBytes, cloud.ErrInvalid)
	}
	return nil
}

func invalidDiskID(id string) error {
	return fmt.Errorf("disk id %q is not one of this provider's (disk- and 16 hex digits): %w", id, cloud.ErrInvalid)
}

// CreateDisk creates a disk; see cloud.Cloud. The image is written under a
// temporary name, sized, fsynced and renamed into place, and only then is
// the record written: the disk exists once its record does. A disk larger
// than the free space of the state directory is ErrLimitReached (images are
// sparse, so disks created earlier may still fill it later).
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
	var op cloud.Operation
	err = c.locked(ctx, func() error {
		started := c.opts.now()
		disks, err := c.s.allDisks()
		if err != nil {
			return ioFailure("list disks", err)
		}
		for _, d := range disks {
			if d.Name != spec.Name {
				continue
			}
			if d.SizeBytes != size {
				return fmt.Errorf("disk name %q is taken by %s (%d bytes): %w", spec.Name, d.ID, d.SizeBytes, cloud.ErrAlreadyExists)
			}
			op, err = c.record(cloud.OpCreate, diskID(d.ID), "", started, &d, nil)
			return err
		}
		free, err := c.s.freeBytes()
		if err != nil {
			return ioFailure("free space", err)
		}
		if size > free {
			return fmt.Errorf("%s has %d bytes free, the disk needs %d: %w", c.s.disks, free, size, cloud.ErrLimitReached)
		}
		id := newDiskID()
		for {
			if _, err := os.Lstat(c.s.imagePath(id)); errors.Is(err, os.ErrNotExist) {
				break
			}
			id = newDiskID() // 64 random bits collided: pick again
		}
		d := cloud.Disk{ID: string(id), Name: spec.Name, SizeBytes: size, Zone: zone, Tags: maps.Clone(spec.Tags), CreatedAt: started.UTC()}
		if err := c.createImage(id, size); err != nil {
			return c.recordedFailure(&op, cloud.OpCreate, id, "", started, ioFailure("create image", err))
		}
		c.s.hit("create:image-in-place")
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpCreate, id, "", started, ioFailure("write disk record", err))
		}
		c.s.hit("create:recorded")
		op, err = c.record(cloud.OpCreate, id, "", started, &d, nil)
		return err
	})
	return op, err
}

// recordedFailure records an operation that failed while running and makes
// the call return it (with a nil error), so the failure is reported by
// WaitOperation, as for any operation that was started.
func (c *Cloud) recordedFailure(op *cloud.Operation, kind cloud.OpKind, id diskID, nodeID string, started time.Time, failed error) error {
	var err error
	*op, err = c.record(kind, id, nodeID, started, nil, failed)
	return err
}

// createImage writes a sparse image of size bytes at its final name, via a
// temporary name.
func (c *Cloud) createImage(id diskID, size int64) error {
	return replaceFile(c.s.disks, string(id)+imageSuffix,
		func(f *os.File) error { return f.Truncate(size) },
		func() { c.s.hit("create:image-synced") })
}

// DeleteDisk deletes a disk; see cloud.Cloud. The record goes first (the
// disk no longer exists), then the image; a crash in between leaves an
// image that Open removes. A loop device left bound to the image on this
// machine is released first; one in use makes the call fail with
// ErrAttached.
func (c *Cloud) DeleteDisk(ctx context.Context, diskIDStr string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			op, err = c.record(cloud.OpDelete, id, "", started, nil, nil)
			return err
		}
		if err != nil {
			return ioFailure("read disk", err)
		}
		if d.AttachedTo != "" {
			return fmt.Errorf("disk %s is attached to %s: %w", id, d.AttachedTo, cloud.ErrAttached)
		}
		if err := c.releaseDevices(ctx, id); err != nil {
			return err
		}
		if err := os.Remove(c.s.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return c.recordedFailure(&op, cloud.OpDelete, id, "", started, ioFailure("remove disk record", err))
		}
		if err := syncDir(c.s.disks); err != nil {
			return c.recordedFailure(&op, cloud.OpDelete, id, "", started, ioFailure("remove disk record", err))
		}
		c.s.hit("delete:record-removed")
		// The disk is gone with its record. Should removing the image
		// fail, the next Open removes it.
		_ = os.Remove(c.s.imagePath(id))
		_ = syncDir(c.s.disks)
		op, err = c.record(cloud.OpDelete, id, "", started, nil, nil)
		return err
	})
	return op, err
}

// GetDisk reports a disk; see cloud.Cloud. It takes no lock: records are
// replaced atomically.
func (c *Cloud) GetDisk(ctx context.Context, diskIDStr string) (cloud.Disk, error) {
	if err := ctx.Err(); err != nil {
		return cloud.Disk{}, err
	}
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Disk{}, fmt.Errorf("disk %q: %w", diskIDStr, cloud.ErrNotFound)
	}
	return c.s.readDisk(id)
}

// ListDisks lists disks; see cloud.Cloud. The page token is the ID of the
// last disk of the previous page. It takes no lock: a disk created or
// deleted during the listing may or may not appear.
func (c *Cloud) ListDisks(ctx context.Context, opts cloud.ListOptions) (cloud.DiskPage, error) {
	if err := ctx.Err(); err != nil {
		return cloud.DiskPage{}, err
	}
	var after diskID
	if opts.PageToken != "" {
		var ok bool
		if after, ok = parseDiskID(opts.PageToken); !ok {
			return cloud.DiskPage{}, fmt.Errorf("page token %q: %w", opts.PageToken, cloud.ErrInvalid)
		}
	}
	limit := opts.MaxResults
	switch {
	case limit < 0:
		return cloud.DiskPage{}, fmt.Errorf("page size %d: %w", limit, cloud.ErrInvalid)
	case limit == 0:
		limit = DefaultPageSize
	case limit > MaxPageSize:
		limit = MaxPageSize
	}
	ids, err := c.s.diskIDs()
	if err != nil {
		return cloud.DiskPage{}, ioFailure("list disks", err)
	}
	var page cloud.DiskPage
	for _, id := range ids {
		if id <= after {
			continue
		}
		if len(page.Disks) == limit {
			page.NextToken = page.Disks[limit-1].ID
			break
		}
		d, err := c.s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			continue // deleted since the directory was read
		}
		if err != nil {
			return cloud.DiskPage{}, ioFailure("read disk", err)
		}
		page.Disks = append(page.Disks, d)
	}
	return page, nil
}

// RegisterNode records a node of this machine with its attach limit (0: no
// limit); see cloud.Registrar.
func (c *Cloud) RegisterNode(ctx context.Context, node cloud.Node) error {
	if err := checkNodeID(node.ID); err != nil {
		return err
	}
	if node.MaxAttachments < 0 {
		return fmt.Errorf("node %s: negative attach limit: %w", node.ID, cloud.ErrInvalid)
	}
	zone, err := c.checkZone(node.Zone)
	if err != nil {
		return err
	}
	node.Zone = zone
	return c.locked(ctx, func() error {
		nodes, err := c.s.readNodes()
		if err != nil {
			return ioFailure("read nodes", err)
		}
		if old, ok := nodes[node.ID]; ok && old == node {
			return nil
		}
		nodes[node.ID] = node
		if err := c.s.writeNodes(nodes); err != nil {
			return ioFailure("write nodes", err)
		}
		return nil
	})
}

// GetNode reports a registered node; see cloud.Cloud.
func (c *Cloud) GetNode(ctx context.Context, nodeID string) (cloud.Node, error) {
	if err := ctx.Err(); err != nil {
		return cloud.Node{}, err
	}
	nodes, err := c.s.readNodes()
	if err != nil {
		return cloud.Node{}, ioFailure("read nodes", err)
	}
	n, ok := nodes[nodeID]
	if !ok {
		return cloud.Node{}, fmt.Errorf("node %q is not registered: %w", nodeID, cloud.ErrNotFound)
	}
	return n, nil
}

// AttachDisk records the attachment of a disk to a registered node; see
// cloud.Cloud. The node's Host makes the loop device when asked for it.
func (c *Cloud) AttachDisk(ctx context.Context, diskIDStr, nodeID string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	if err := checkNodeID(nodeID); err != nil {
		return cloud.Operation{}, err
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		nodes, err := c.s.readNodes()
		if err != nil {
			return ioFailure("read nodes", err)
		}
		node, ok := nodes[nodeID]
		if !ok {
			return fmt.Errorf("node %q is not registered: %w", nodeID, cloud.ErrNotFound)
		}
		d, err := c.s.readDisk(id)
		if err != nil {
			if errors.Is(err, cloud.ErrNotFound) {
				return err
			}
			return ioFailure("read disk", err)
		}
		switch d.AttachedTo {
		case nodeID:
			op, err = c.record(cloud.OpAttach, id, nodeID, started, &d, nil)
			return err
		case "":
		default:
			return fmt.Errorf("disk %s is attached to %s: %w", id, d.AttachedTo, cloud.ErrAttached)
		}
		if node.MaxAttachments > 0 {
			disks, err := c.s.allDisks()
			if err != nil {
				return ioFailure("list disks", err)
			}
			n := 0
			for _, other := range disks {
				if other.AttachedTo == nodeID {
					n++
				}
			}
			if n >= node.MaxAttachments {
				return fmt.Errorf("node %s holds %d disks, its limit: %w", nodeID, n, cloud.ErrLimitReached)
			}
		}
		d.AttachedTo = nodeID
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpAttach, id, nodeID, started, ioFailure("write disk record", err))
		}
		c.s.hit("attach:recorded")
		op, err = c.record(cloud.OpAttach, id, nodeID, started, &d, nil)
		return err
	})
	return op, err
}

// DetachDisk detaches a disk from a node; see cloud.Cloud. The loop device
// of the disk on this machine is released first, as a cloud takes a disk
// away from its instance; a device still in use (mounted) makes the call
// fail with ErrTransient and the disk stays attached: unmount it and retry.
func (c *Cloud) DetachDisk(ctx context.Context, diskIDStr, nodeID string) (cloud.Operation, error) {
	id, ok := parseDiskID(diskIDStr)
	if !ok {
		return cloud.Operation{}, invalidDiskID(diskIDStr)
	}
	var op cloud.Operation
	err := c.locked(ctx, func() error {
		started := c.opts.now()
		d, err := c.s.readDisk(id)
		if errors.Is(err, cloud.ErrNotFound) {
			op, err = c.record(cloud.OpDetach, id, nodeID, started, nil, nil)
			return err
		}
		if err != nil {
			return ioFailure("read disk", err)
		}
		if d.AttachedTo != nodeID {
			op, err = c.record(cloud.OpDetach, id, nodeID, started, &d, nil)
			return err
		}
		if err := c.releaseDevices(ctx, id); err != nil {
			if errors.Is(err, loopdev.ErrBusy) {
				return fmt.Errorf("disk %s is still in use on node %s (unmount it first): %v: %w", id, nodeID, err, cloud.ErrTransient)
			}
			return err
		}
		c.s.hit("detach:released")
		d.AttachedTo = ""
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpDetach, id, nodeID, started, ioFailure("write disk record", err))
		}
		op, err = c.record(cloud.OpDetach, id, nodeID, started, &d, nil)
		return err
	})
	return op, err
}

// ResizeDisk grows a detached disk; see cloud.Cloud. The image grows
// (sparse) and is fsynced before the record says so; a crash in between
// leaves an image larger than its record, which is harmless (the loop
// device is capped at the recorded size) and the retry completes.
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
		d, err := c.s.readDisk(id)
		if err != nil {
			if errors.Is(err, cloud.ErrNotFound) {
				return err
			}
			return ioFailure("read disk", err)
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
		c.s.hit("resize:image-grown")
		d.SizeBytes = size
		if err := c.s.writeDisk(d); err != nil {
			return c.recordedFailure(&op, cloud.OpResize, id, "", started, ioFailure("write disk record", err))
		}
		op, err = c.record(cloud.OpResize, id, "", started, &d, nil)
		return err
	})
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
		d, err := c.s.readDisk(id)
		if err != nil {
			if errors.Is(err, cloud.ErrNotFound) {
				return err
			}
			return ioFailure("read disk", err)
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
	})
	return op, err
}

// growImage extends an image to size bytes (never shrinks it) and fsyncs it.
func growImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
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

// WaitOperation replays a recorded operation; see cloud.Cloud. Operations of
// this provider have finished when their call returns, so it never blocks.
func (c *Cloud) WaitOperation(ctx context.Context, opIDStr string) (cloud.Disk, error) {
	if err := ctx.Err(); err != nil {
		return cloud.Disk{}, err
	}
	id, ok := parseOpID(opIDStr)
	if !ok {
		return cloud.Disk{}, fmt.Errorf("operation id %q is not one of this provider's: %w", opIDStr, cloud.ErrNotFound)
	}
	rec, err := c.s.readOp(id)
	if err != nil {
		return cloud.Disk{}, err
	}
	if rec.Error != nil {
		return cloud.Disk{}, rec.Error.replay()
	}
	if rec.Disk == nil {
		return cloud.Disk{}, nil
	}
	return *rec.Disk, nil
}

// Capacity is the free space of the state directory's file system; see
// cloud.Cloud.
func (c *Cloud) Capacity(ctx context.Context, zone string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if _, err := c.checkZone(zone); err != nil {
		return 0, err
	}
	free, err := c.s.freeBytes()
	if err != nil {
		return 0, ioFailure("free space", err)
	}
	return free, nil
}

// Zones returns the machine's one zone.
func (c *Cloud) Zones() []string { return []string{c.opts.Zone} }

// MaxDiskBytes is the largest disk; see cloud.Cloud.
func (c *Cloud) MaxDiskBytes() int64 { return MaxDiskBytes }

// releaseDevices releases every loop device bound to the image of a disk on
// this machine. The caller holds the lock. A device in use is an error
// wrapping loopdev.ErrBusy and cloud.ErrAttached.
func (c *Cloud) releaseDevices(ctx context.Context, id diskID) error {
	devs, fid, err := c.devicesOf(id)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if err := loopdev.Release(ctx, d.Path, fid); err != nil {
			if errors.Is(err, loopdev.ErrBusy) {
				return fmt.Errorf("disk %s: %w: %w", id, err, cloud.ErrAttached)
			}
			return fmt.Errorf("disk %s: %v: %w", id, err, cloud.ErrTransient)
		}
	}
	return nil
}

// devicesOf finds the loop devices bound to the image of a disk, by the
// image's inode. No image, no devices.
func (c *Cloud) devicesOf(id diskID) ([]loopdev.Device, loopdev.FileID, error) {
	img := c.s.imagePath(id)
	fi, err := os.Stat(img)
	if errors.Is(err, os.ErrNotExist) {
		return nil, loopdev.FileID{}, nil
	}
	if err != nil {
		return nil, loopdev.FileID{}, ioFailure("stat image", err)
	}
	fid, err := loopdev.IDOf(fi)
	if err != nil {
		return nil, loopdev.FileID{}, err
	}
	name := filepath.Base(img)
	devs, err := loopdev.Find(fid, func(d loopdev.Device) bool { return filepath.Base(d.BackingFile) == name })
	if err != nil {
		return nil, loopdev.FileID{}, fmt.Errorf("find loop devices of %s: %v: %w", id, err, cloud.ErrTransient)
	}
	return devs, fid, nil
}
