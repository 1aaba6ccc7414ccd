package fake

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"unicode/utf8"

	"github.com/csid-dev/csid/internal/cloud"
)

var _ cloud.Snapshotter = (*Cloud)(nil)

var snapIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

type snapshot struct {
	s cloud.Snapshot // Ready once the snapshot operation has finished
	// content is the source disk's content when the call was made.
	content content
	// pending is the operation in flight on the snapshot, nil when none.
	pending *operation
}

// CreateSnapshot starts taking a snapshot of a disk; see cloud.Snapshotter.
// The snapshot holds the disk's content as it is when the call is made; it
// is reported (GetSnapshot, ListSnapshots) at once, Ready once the
// operation has finished. The disk is not made busy: it can be changed,
// even deleted, while the snapshot is taken.
func (c *Cloud) CreateSnapshot(_ context.Context, spec cloud.SnapshotSpec) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("CreateSnapshot", cloud.OpSnapshot, spec.SourceDiskID, "")
	if err := take(c.failCalls, cloud.OpSnapshot); err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	if spec.Name == "" || len(spec.Name) > MaxNameBytes || !utf8.ValidString(spec.Name) {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("snapshot name %q: empty, longer than %d bytes or not UTF-8: %w", spec.Name, MaxNameBytes, cloud.ErrInvalid))
	}
	if !diskIDPattern.MatchString(spec.SourceDiskID) {
		return cloud.Operation{}, c.refuse(call, invalidDiskID(spec.SourceDiskID))
	}
	key := "snapshot|" + spec.Name + "|" + spec.SourceDiskID
	if id, ok := c.snapNames[spec.Name]; ok {
		s := c.snaps[id]
		call.SnapshotID = id
		if s.s.SourceDiskID != spec.SourceDiskID {
			return cloud.Operation{}, c.refuse(call, fmt.Errorf("snapshot name %q is taken by %s, of disk %s: %w", spec.Name, id, s.s.SourceDiskID, cloud.ErrAlreadyExists))
		}
		switch {
		case s.pending != nil && s.pending.key == key:
			return c.join(call, s.pending)
		case s.pending != nil:
			return cloud.Operation{}, c.refuse(call, busySnapshot(s))
		}
		return c.finish(call, c.newSnapshotOp(cloud.OpSnapshot, s.s.SourceDiskID, id, ""), cloud.Disk{})
	}
	d, ok := c.disks[spec.SourceDiskID]
	if !ok || !d.created {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s: %w", spec.SourceDiskID, cloud.ErrNotFound))
	}
	c.snapSeq++
	id := fmt.Sprintf("snap-%016x", c.snapSeq)
	call.SnapshotID = id
	s := &snapshot{s: cloud.Snapshot{
		ID: id, Name: spec.Name, SourceDiskID: d.d.ID, SizeBytes: d.d.SizeBytes,
		StoredBytes: d.content.stored(), Tags: maps.Clone(spec.Tags), CreatedAt: c.opts.Now(),
	}, content: d.content.clone()}
	c.snaps[id] = s
	c.snapNames[spec.Name] = id
	o := c.newSnapshotOp(cloud.OpSnapshot, d.d.ID, id, key)
	o.apply = func() cloud.Disk { s.s.Ready = true; return cloud.Disk{} }
	o.undo = func() {
		delete(c.snaps, id)
		delete(c.snapNames, spec.Name)
	}
	return c.start(call, &s.pending, o)
}

// DeleteSnapshot starts deleting a snapshot; see cloud.Snapshotter. Disks
// made from it keep their content.
func (c *Cloud) DeleteSnapshot(_ context.Context, snapshotID string) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("DeleteSnapshot", cloud.OpDeleteSnapshot, "", "")
	call.SnapshotID = snapshotID
	if err := take(c.failCalls, cloud.OpDeleteSnapshot); err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	if !snapIDPattern.MatchString(snapshotID) {
		return cloud.Operation{}, c.refuse(call, invalidSnapshotID(snapshotID))
	}
	s, ok := c.snaps[snapshotID]
	if !ok {
		return c.finish(call, c.newSnapshotOp(cloud.OpDeleteSnapshot, "", snapshotID, ""), cloud.Disk{})
	}
	call.DiskID = s.s.SourceDiskID
	key := "delete-snapshot|" + snapshotID
	if s.pending != nil {
		if s.pending.key == key {
			return c.join(call, s.pending)
		}
		return cloud.Operation{}, c.refuse(call, busySnapshot(s))
	}
	o := c.newSnapshotOp(cloud.OpDeleteSnapshot, s.s.SourceDiskID, snapshotID, key)
	o.apply = func() cloud.Disk {
		delete(c.snaps, snapshotID)
		delete(c.snapNames, s.s.Name)
		return cloud.Disk{}
	}
	return c.start(call, &s.pending, o)
}

func (c *Cloud) newSnapshotOp(kind cloud.OpKind, diskID, snapshotID, key string) *operation {
	o := c.newOp(kind, diskID, "", key)
	o.op.SnapshotID = snapshotID
	return o
}

// GetSnapshot reports a snapshot, also one still being taken (Ready
// false); see cloud.Snapshotter.
func (c *Cloud) GetSnapshot(_ context.Context, snapshotID string) (cloud.Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("GetSnapshot", KindGetSnapshot, "", "")
	call.SnapshotID = snapshotID
	if err := take(c.failCalls, KindGetSnapshot); err != nil {
		return cloud.Snapshot{}, c.refuse(call, err)
	}
	s, ok := c.snaps[snapshotID]
	if !ok {
		return cloud.Snapshot{}, c.refuse(call, fmt.Errorf("snapshot %q: %w", snapshotID, cloud.ErrNotFound))
	}
	call.End = c.opts.Now()
	return s.report(), nil
}

// ListSnapshots returns a page of snapshots, also those still being taken;
// see cloud.Snapshotter. The page token is the ID of the last snapshot of
// the previous page.
func (c *Cloud) ListSnapshots(_ context.Context, opts cloud.SnapshotListOptions) (cloud.SnapshotPage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("ListSnapshots", KindListSnapshots, opts.SourceDiskID, "")
	if err := take(c.failCalls, KindListSnapshots); err != nil {
		return cloud.SnapshotPage{}, c.refuse(call, err)
	}
	if opts.PageToken != "" && !snapIDPattern.MatchString(opts.PageToken) {
		return cloud.SnapshotPage{}, c.refuse(call, fmt.Errorf("page token %q: %w", opts.PageToken, cloud.ErrInvalid))
	}
	ids, next, err := listPage(c.snaps, opts.PageToken, opts.MaxResults, func(s *snapshot) bool {
		return opts.SourceDiskID == "" || s.s.SourceDiskID == opts.SourceDiskID
	})
	if err != nil {
		return cloud.SnapshotPage{}, c.refuse(call, err)
	}
	page := cloud.SnapshotPage{NextToken: next}
	for _, id := range ids {
		page.Snapshots = append(page.Snapshots, c.snaps[id].report())
	}
	call.End = c.opts.Now()
	return page, nil
}

func (s *snapshot) report() cloud.Snapshot {
	out := s.s
	out.Tags = maps.Clone(out.Tags)
	return out
}

// source checks the source of a disk to be created in zone with size
// bytes, and returns the content the disk starts with. The caller holds
// c.mu.
func (c *Cloud) source(src *cloud.DiskSource, zone string, size int64) (content, error) {
	switch {
	case src == nil:
		return content{}, nil
	case (src.SnapshotID == "") == (src.DiskID == ""):
		return content{}, fmt.Errorf("disk source %+v: exactly one of a snapshot and a disk: %w", *src, cloud.ErrInvalid)
	case src.SnapshotID != "":
		if !snapIDPattern.MatchString(src.SnapshotID) {
			return content{}, invalidSnapshotID(src.SnapshotID)
		}
		s, ok := c.snaps[src.SnapshotID]
		switch {
		case !ok:
			return content{}, fmt.Errorf("snapshot %s: %w", src.SnapshotID, cloud.ErrNotFound)
		case !s.s.Ready:
			return content{}, fmt.Errorf("snapshot %s is not ready yet: %w", src.SnapshotID, cloud.ErrTransient)
		case s.s.SizeBytes > size:
			return content{}, fmt.Errorf("snapshot %s has %d bytes, more than the disk's %d: %w", src.SnapshotID, s.s.SizeBytes, size, cloud.ErrInvalid)
		}
		return s.content.clone(), nil
	}
	if !diskIDPattern.MatchString(src.DiskID) {
		return content{}, invalidDiskID(src.DiskID)
	}
	d, ok := c.disks[src.DiskID]
	switch {
	case !ok || !d.created:
		return content{}, fmt.Errorf("disk %s: %w", src.DiskID, cloud.ErrNotFound)
	case d.d.Zone != zone:
		return content{}, fmt.Errorf("disk %s is in zone %s, the new disk in %s: %w", src.DiskID, d.d.Zone, zone, cloud.ErrInvalid)
	case d.d.SizeBytes > size:
		return content{}, fmt.Errorf("disk %s has %d bytes, more than the new disk's %d: %w", src.DiskID, d.d.SizeBytes, size, cloud.ErrInvalid)
	}
	return d.content.clone(), nil
}

// sourceKey is a disk source as a key: "" for none.
func sourceKey(src *cloud.DiskSource) string {
	switch {
	case src == nil:
		return ""
	case src.SnapshotID != "" && src.DiskID == "":
		return "snapshot " + src.SnapshotID
	case src.DiskID != "" && src.SnapshotID == "":
		return "disk " + src.DiskID
	}
	return fmt.Sprintf("%+v", *src)
}

func cloneSource(src *cloud.DiskSource) *cloud.DiskSource {
	if src == nil {
		return nil
	}
	out := *src
	return &out
}

func invalidSnapshotID(id string) error {
	return fmt.Errorf("snapshot id %q is not one of this provider's: %w", id, cloud.ErrInvalid)
}

func busySnapshot(s *snapshot) error {
	return fmt.Errorf("snapshot %s is busy with %s operation %s: %w", s.s.ID, s.pending.op.Kind, s.pending.op.ID, cloud.ErrTransient)
}

// blockSize is the unit of the fake's disk content.
const blockSize = 4096

// content is what a disk holds: its written blocks by index; a block not
// there reads as zeros. Blocks are never changed in place (WriteDisk puts
// new ones), so a copy of the map is a copy of the content.
type content struct {
	blocks map[int64][]byte
}

func (ct content) clone() content { return content{blocks: maps.Clone(ct.blocks)} }

// stored is the bytes the content occupies.
func (ct content) stored() int64 { return int64(len(ct.blocks)) * blockSize }

// WriteDisk writes data at offset off of a disk's content, as a node would
// through the disk's device (which the fake does not have). It is a test
// knob: it takes no operation, and works on a disk attached or not. Bytes
// beyond the disk's size are ErrInvalid; an unknown disk, ErrNotFound.
func (c *Cloud) WriteDisk(diskID string, off int64, data []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, err := c.contentOf(diskID, off, len(data))
	if err != nil {
		return err
	}
	if d.content.blocks == nil {
		d.content.blocks = map[int64][]byte{}
	}
	for len(data) > 0 {
		i, at := off/blockSize, off%blockSize
		b := make([]byte, blockSize)
		copy(b, d.content.blocks[i])
		n := copy(b[at:], data)
		d.content.blocks[i] = b
		data, off = data[n:], off+int64(n)
	}
	return nil
}

// ReadDisk reads n bytes at offset off of a disk's content; see WriteDisk.
func (c *Cloud) ReadDisk(diskID string, off int64, n int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, err := c.contentOf(diskID, off, n)
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	for done := 0; done < n; {
		i, at := off/blockSize, off%blockSize
		var k int
		if b, ok := d.content.blocks[i]; ok {
			k = copy(out[done:], b[at:])
		} else {
			k = min(n-done, int(blockSize-at))
		}
		done, off = done+k, off+int64(k)
	}
	return out, nil
}

// contentOf finds a created disk for a content access of n bytes at off.
// The caller holds c.mu.
func (c *Cloud) contentOf(diskID string, off int64, n int) (*disk, error) {
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return nil, fmt.Errorf("disk %q: %w", diskID, cloud.ErrNotFound)
	}
	if off < 0 || n < 0 || off+int64(n) > d.d.SizeBytes {
		return nil, fmt.Errorf("%d bytes at %d of disk %s (%d bytes): %w", n, off, diskID, d.d.SizeBytes, cloud.ErrInvalid)
	}
	return d, nil
}
