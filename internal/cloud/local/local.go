// Package local is csid's embedded provider: block storage on one Linux
// machine with nothing else installed. A disk is a sparse file under the
// state directory, made by the disk's first attach (until then the disk is
// zeros, and only its record exists); attaching it to a node records the
// attachment, and the node (Host) materialises it as a loop device, found
// again by its backing file after a restart. Like the offline-only clouds csid is built for, a
// disk grows only while detached.
//
// Two processes use one state directory at once (a controller and a node
// plugin on the same machine), so every change happens under the kernel's
// locks on <state>/lock, one per thing changed (a disk, a name, a node's
// attachments: see locks.go), so that independent disks never wait on each
// other. Every file that must survive a crash of the machine is written
// crash-safely (whole under a temporary name, fsynced, then linked or
// renamed into place and its directory fsynced: newfile.go), except what
// creates and deletes write: they journal their intent first, sharing one
// fdatasync among concurrent calls, and the first Open after a crash of
// the machine replays the journals (journal.go). A disk exists only once
// its record is in place: a crash never leaves a half-created disk that
// looks whole, and Open removes what a crash left behind. Record files are recycled rather than freed (spare.go). Two indexes (index.go) find a disk by name and count a node's
// disks without reading every record, so an operation costs the same with
// ten disks or ten thousand.
//
// Operations complete before the call that starts them returns (the work is
// a few file operations). Each is recorded in its process's log under
// <state>/ops with its result or typed error (oplog.go), so WaitOperation
// answers in another process and after a restart too; logs last appended
// to longer than Options.OpRetention ago, beyond the newest that hold
// Options.OpKeep records, are pruned.
//
// Disk ids are "disk-" and 16 random hex digits; anything else is refused
// (ErrNotFound for lookups, ErrInvalid for mutations) before it can reach a
// path. Node ids are stored inside a file, never used as paths.
package local

import (
	"context"
	"errors"
	"fmt"
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
	// opsPerLog is how many records an operation log takes (tests).
	opsPerLog int
	// crash is called at named points of the mutating paths (crash tests).
	crash func(point string)
	// bootID stands for this boot's id (tests: a crash of the machine).
	bootID string
	// journalIntents is how many intents a journal file takes (tests).
	journalIntents int
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
	// reflink: the state directory's file system clones files (copy.go).
	reflink bool
	// names: the name of each disk this process created and has not
	// deleted, for DeleteDisk's locks (diskNames, index.go).
	names diskNames
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
	if opts.bootID != "" {
		s.boot, s.jrnl.boot = opts.bootID, opts.bootID
	}
	if opts.journalIntents > 0 {
		s.jrnl.limit = opts.journalIntents
	}
	s.oplog.perLog = opts.opsPerLog
	if s.oplog.perLog <= 0 {
		s.oplog.perLog = defaultOpsPerLog
	}
	s.oplog.maxIdle = min(time.Hour, opts.OpRetention/2)
	c := &Cloud{s: s, opts: opts}
	err = s.open(ctx)
	if err == nil {
		var f *os.File
		if f, err = openUnnamed(s.disks); err == nil {
			f.Close()
		}
	}
	if err == nil {
		// Journals of killed processes of this boot: a crash of the
		// machine no longer needs them (journal.go).
		err = s.settleJournals()
	}
	if err == nil {
		err = c.openSnapshots()
	}
	if err == nil {
		// First: an application may be waiting on a filesystem a killed
		// snapshot left frozen.
		err = c.thawAbandoned()
	}
	if err == nil {
		err = errors.Join(s.collectGarbage(), s.collectSnapshots())
		if err != nil {
			err = fmt.Errorf("clean up after a crash: %w", err)
		}
	}
	if err == nil {
		err = s.loadSpares()
	}
	if err == nil {
		err = s.pruneOps(opts.now(), opts.OpKeep, opts.OpRetention)
	}
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

// locked runs fn under the key locks of keys (in order).
func (c *Cloud) locked(ctx context.Context, fn func() error, keys ...string) error {
	unlock, err := c.s.lock(ctx, keys...)
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// record stores a finished operation and returns it. The caller holds the
// disk's lock. An operation that failed while running keeps its error for
// WaitOperation; the call that started it still succeeds.
func (c *Cloud) record(kind cloud.OpKind, id diskID, nodeID string, started time.Time, left *cloud.Disk, failed error) (cloud.Operation, error) {
	op := cloud.Operation{ID: string(newOpID(started)), Kind: kind, DiskID: string(id), NodeID: nodeID, Done: true}
	return c.recordOp(op, started, left, failed)
}

// recordOp stores the finished operation op; see record.
func (c *Cloud) recordOp(op cloud.Operation, started time.Time, left *cloud.Disk, failed error) (cloud.Operation, error) {
	kind, id := op.Kind, op.DiskID
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
	devs, err := loopdev.Find(fid, func(backing string) bool { return filepath.Base(backing) == name })
	if err != nil {
		return nil, loopdev.FileID{}, fmt.Errorf("find loop devices of %s: %v: %w", id, err, cloud.ErrTransient)
	}
	return devs, fid, nil
}
