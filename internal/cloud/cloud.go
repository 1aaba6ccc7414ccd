// Package cloud is csid's view of a block-storage provider: disks, the nodes
// (instances) they attach to, and the long-running operations that change
// them. It knows nothing of CSI or gRPC.
//
// The provider csid is built for grows a disk only while it is detached:
// ResizeDisk of an attached disk fails with ErrAttached.
//
// Every mutating call returns an Operation at once. The caller persists the
// operation's ID before waiting, so that after a restart it waits on the same
// operation again (WaitOperation) instead of starting a second one. Every
// mutating call is also idempotent, so starting it again is safe too.
//
// Where errors appear: what a provider can tell before it starts (a malformed
// argument, an unknown disk or node, a name taken with another size, an
// attached disk, a full node or zone) is returned by the call itself, and
// then no operation was started. What goes wrong while an operation runs is
// returned by WaitOperation. Callers handle both. A provider keeps finished
// operations for a while, not for ever: WaitOperation of one it has
// forgotten is ErrNotFound, and the caller issues the idempotent call again.
//
// Sizes: a provider rounds a requested size up to its granularity (a real
// cloud rounds to GiB); Disk.SizeBytes is the rounded size, and "the same
// size" below means the same after rounding.
//
// Ids are the provider's: an id that is not of the provider's format is never
// used to look anything up. Lookups (GetDisk, GetSnapshot, WaitOperation)
// report it as ErrNotFound, mutations as ErrInvalid.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Typed errors. Implementations wrap them (fmt.Errorf("...: %w", ErrX)) so
// that callers decide with errors.Is, never by matching message text.
var (
	// ErrNotFound: the disk, snapshot, node or operation does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a disk with this name exists with another size or
	// source (DiskSpec.Source), or a snapshot with this name is of another
	// disk (SnapshotSpec.Name).
	ErrAlreadyExists = errors.New("already exists")
	// ErrAttached: the disk is attached (to another node for AttachDisk;
	// at all for ResizeDisk and DeleteDisk).
	ErrAttached = errors.New("disk is attached")
	// ErrLimitReached: the node has no free attachment slot, or the
	// provider has no capacity left for the disk.
	ErrLimitReached = errors.New("limit reached")
	// ErrInvalid: an argument is malformed (an id that is not one of the
	// provider's, a negative or oversized size, ...).
	ErrInvalid = errors.New("invalid argument")
	// ErrTransient: the provider failed in a way that retrying may cure.
	ErrTransient = errors.New("transient provider error")
	// ErrIdentity: no device on this node could be proven to be the disk
	// (Host.OpenDevice): a device that claims to be it is not, by the
	// identity the provider guarantees.
	ErrIdentity = errors.New("device identity not proven")
	// ErrInUse: the disk's device is held exclusively by something else
	// (a mounted filesystem; a release in progress), so it cannot be
	// opened exclusively (OpenOptions.Exclusive).
	ErrInUse = errors.New("device in use")
)

// Disk is a block-storage disk as the provider reports it.
type Disk struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	SizeBytes int64             `json:"sizeBytes"`
	Zone      string            `json:"zone,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	// AttachedTo is the node the disk is attached to; empty when detached.
	AttachedTo string    `json:"attachedTo,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	// Source is what the disk's content was copied from when it was
	// created (DiskSpec.Source); nil for a disk created empty. The source
	// may be gone since.
	Source *DiskSource `json:"source,omitempty"`
	// Type is the provider's disk type (DiskTyper); empty for a provider
	// without types.
	Type string `json:"type,omitempty"`
}

// DiskSpec describes a disk to create.
type DiskSpec struct {
	// Name is the idempotency key: creating the same name twice with the
	// same size returns the same disk.
	Name      string
	SizeBytes int64
	// Zone is where to create the disk; empty means the provider's default.
	Zone string
	// Tags are kept with the disk and reported by GetDisk and ListDisks;
	// csid stores in them what it needs to rebuild its records.
	Tags map[string]string
	// Source, when set, is what the disk's content is copied from (a
	// Snapshotter's snapshot or another disk), as it was when the snapshot
	// was taken, or when the call was made for a disk. SizeBytes must be
	// at least the source's size (ErrInvalid otherwise); beyond it the
	// disk reads as zeros. A malformed source (neither or both fields set,
	// an id not of the provider's format) is ErrInvalid, an unknown one
	// ErrNotFound, a snapshot not yet Ready ErrTransient. Creating the
	// same name again with another source is ErrAlreadyExists; with the
	// same source it returns the disk even if the source is gone since.
	Source *DiskSource
	// Type is the disk type, one of the provider's DiskTypes (DiskTyper);
	// empty means the provider's default. It is part of the idempotency
	// key: the same name with another type is ErrAlreadyExists. It is
	// set only for a provider with types: the driver refuses a
	// StorageClass's "type" for one without (local and fake ignore it).
	Type string
}

// OpKind names what an operation does.
type OpKind string

// Operation kinds.
const (
	OpCreate OpKind = "create"
	OpDelete OpKind = "delete"
	OpAttach OpKind = "attach"
	OpDetach OpKind = "detach"
	OpResize OpKind = "resize"
	OpTag    OpKind = "tag"
)

// Operation is a long-running provider operation.
type Operation struct {
	// ID is stable for the life of the operation and survives restarts of
	// both csid and the provider.
	ID     string `json:"id"`
	Kind   OpKind `json:"kind"`
	DiskID string `json:"diskID"`
	NodeID string `json:"nodeID,omitempty"`
	// SnapshotID is the snapshot a snapshot operation makes or deletes.
	SnapshotID string `json:"snapshotID,omitempty"`
	// Done says the operation had already finished when the call that
	// started (or joined) it returned: WaitOperation answers at once, and a
	// caller need not record the id, since repeating the idempotent call
	// after a crash finds the work done. A provider whose operations take
	// time leaves it false.
	Done bool `json:"done,omitempty"`
}

// ListOptions pages through ListDisks.
type ListOptions struct {
	// PageToken is "" for the first page, else a previous NextToken.
	PageToken string
	// MaxResults is the page size; 0 means the provider's default.
	MaxResults int
}

// DiskPage is one page of ListDisks, ordered by disk ID.
type DiskPage struct {
	Disks []Disk
	// NextToken is "" on the last page.
	NextToken string
}

// Node is an instance that disks attach to.
type Node struct {
	ID   string `json:"id"`
	Zone string `json:"zone,omitempty"`
	// MaxAttachments is the number of disks the node can hold; 0 means no
	// limit is known.
	MaxAttachments int `json:"maxAttachments,omitempty"`
}

// Cloud is the control plane of a block-storage provider.
type Cloud interface {
	// CreateDisk starts creating a disk. Repeat calls with the same name and
	// size return an operation that yields the same disk; the same name with
	// another size fails with ErrAlreadyExists. A crash of the provider at
	// any point never leaves a half-created disk that looks whole.
	CreateDisk(ctx context.Context, spec DiskSpec) (Operation, error)
	// DeleteDisk starts deleting a disk. A disk that does not exist is
	// success (the operation completes at once). An attached disk fails
	// with ErrAttached.
	DeleteDisk(ctx context.Context, diskID string) (Operation, error)
	// GetDisk reports a disk, or ErrNotFound.
	GetDisk(ctx context.Context, diskID string) (Disk, error)
	// ListDisks returns one page of disks ordered by ID. A token that names a
	// disk deleted since is not an error. A malformed token, or a negative
	// MaxResults, is ErrInvalid.
	ListDisks(ctx context.Context, opts ListOptions) (DiskPage, error)
	// AttachDisk starts attaching a disk to a node. Attaching to the node it
	// is already attached to is success; to another node, ErrAttached; an
	// unknown disk or node, ErrNotFound; a full node, ErrLimitReached.
	AttachDisk(ctx context.Context, diskID, nodeID string) (Operation, error)
	// DetachDisk starts detaching a disk from a node. A disk that is not
	// attached to that node (or does not exist) is success.
	DetachDisk(ctx context.Context, diskID, nodeID string) (Operation, error)
	// ResizeDisk starts growing a detached disk to sizeBytes. A disk already
	// at least that large is success (nothing is shrunk); an attached disk
	// fails with ErrAttached (offline-only provider); a size that is not
	// positive, or beyond the provider's maximum, is ErrInvalid.
	ResizeDisk(ctx context.Context, diskID string, sizeBytes int64) (Operation, error)
	// UpdateDiskTags starts setting tags on a disk: each tag is set to its
	// value, a tag whose value is empty is removed, and the disk's other
	// tags are kept. It works on a disk attached or not. Repeating it is
	// success (a disk whose tags are already so completes at once). An
	// unknown disk is ErrNotFound; an empty tag name, ErrInvalid.
	UpdateDiskTags(ctx context.Context, diskID string, tags map[string]string) (Operation, error)
	// WaitOperation blocks until the operation has finished (or ctx ends,
	// then ctx's error) and returns the disk as the operation left it, or the
	// typed error it failed with. For a finished delete it returns the zero
	// Disk. An unknown operation ID is ErrNotFound. It may be called any
	// number of times, also after a restart.
	WaitOperation(ctx context.Context, opID string) (Disk, error)
	// GetNode reports a node, or ErrNotFound.
	GetNode(ctx context.Context, nodeID string) (Node, error)
	// Capacity reports the bytes available for new disks in a zone ("" for
	// the default zone). A zone the provider does not have is ErrInvalid.
	Capacity(ctx context.Context, zone string) (int64, error)
	// Zones lists the provider's zones; a provider without topology returns
	// nil.
	Zones() []string
	// MaxDiskBytes is the largest disk the provider makes or grows a disk
	// to; a larger size is ErrInvalid.
	MaxDiskBytes() int64
}

// Host is the node side of a provider: what a node plugin needs to use the
// disks attached to the node it runs on.
type Host interface {
	// NodeID is the node this host is.
	NodeID() string
	// OpenDevice opens the block device of a disk attached to this node,
	// waiting for it to appear, and proves on the open descriptor that it
	// is that disk, by an identity the provider guarantees (not by a path:
	// device names are reused as disks come and go). The proof holds until
	// Close: while the descriptor is open the device cannot be given to
	// another disk, so its Path names the proven disk for every use the
	// caller makes of it meanwhile (format, mount, bind, grow).
	//
	// A disk not attached to this node is ErrNotFound. A device that does
	// not prove to be the disk (opts.Hint, or one looked up that changed
	// before it was opened) is dropped and the disk's device looked up
	// again; when none proves to be it, ErrIdentity. Repeat calls open the
	// same device; after a restart of csid it is found again, never
	// duplicated.
	OpenDevice(ctx context.Context, diskID string, opts OpenOptions) (*Device, error)
	// Devices lists the devices this host has materialised for disks, keyed
	// by disk ID (for inspection and leak checks).
	Devices(ctx context.Context) (map[string]string, error)
}

// OpenOptions shape Host.OpenDevice.
type OpenOptions struct {
	// Hint is a device path remembered earlier (a record's). It is tried
	// first and never trusted: it is used only if it proves to be the disk.
	Hint string
	// Exclusive opens the device exclusively (O_EXCL): nothing can mount
	// a filesystem on it, or release it, until Close; one already held
	// that way (mounted as a filesystem, being released) is ErrInUse. For
	// uses that mount no filesystem: a raw block volume's bind.
	Exclusive bool
}

// Device is the block device of a disk attached to this node, open and
// proven to be that disk (Host.OpenDevice). Close it when the operation
// that uses it is done.
type Device struct {
	// Disk is the disk as the provider reports it: its id, size and tags.
	Disk Disk
	// Path is the device node, e.g. /dev/loop3 (never a symbolic link).
	// It names the proven disk while the Device is open.
	Path string
	// Number is the device number (major and minor) of the open device.
	Number uint64
	close  func() error
}

// NewDevice returns a Device that close releases (providers' Hosts make
// them).
func NewDevice(disk Disk, path string, number uint64, close func() error) *Device {
	return &Device{Disk: disk, Path: path, Number: number, close: close}
}

// Close releases the device; after it, Path proves nothing.
func (d *Device) Close() error {
	if d == nil || d.close == nil {
		return nil
	}
	c := d.close
	d.close = nil
	return c()
}

// Registrar is implemented by providers where a node announces itself (the
// local backend): a node process registers at start-up, with its attach limit.
type Registrar interface {
	// RegisterNode records the node, or updates its zone and attach limit
	// when it is already known (a repeat call with the same node is a
	// no-op). A zone the provider does not have is ErrInvalid.
	RegisterNode(ctx context.Context, node Node) error
}

// DiskTyper is implemented by providers whose disks have types (a
// StorageClass names one with its "type" parameter).
type DiskTyper interface {
	// DiskTypes lists the types a DiskSpec may name.
	DiskTypes() []string
}

// AttachedGrower is implemented by providers that say whether they grow
// an attached disk. One that does not implement it, or answers false,
// grows only detached disks: ResizeDisk of an attached disk is
// ErrAttached. csid does not consult it yet: its engine queues the resize
// of every attached volume for its detach, whatever the provider answers
// (docs/cloud.md).
type AttachedGrower interface {
	// GrowsAttached reports whether ResizeDisk grows an attached disk.
	GrowsAttached() bool
}

// MergeTags returns have with tags applied as UpdateDiskTags says (a
// value sets its tag, an empty value removes it), and whether that
// changes anything. have is not modified. An empty tag name is ErrInvalid.
func MergeTags(have, tags map[string]string) (map[string]string, bool, error) {
	out := make(map[string]string, len(have)+len(tags))
	for k, v := range have {
		out[k] = v
	}
	changed := false
	for k, v := range tags {
		if k == "" {
			return nil, false, fmt.Errorf("a tag with an empty name: %w", ErrInvalid)
		}
		old, ok := out[k]
		switch {
		case v == "" && ok:
			delete(out, k)
			changed = true
		case v != "" && (!ok || old != v):
			out[k] = v
			changed = true
		}
	}
	if len(out) == 0 {
		out = nil
	}
	return out, changed, nil
}

// Snapshot operation kinds.
const (
	OpSnapshot       OpKind = "snapshot"
	OpDeleteSnapshot OpKind = "delete-snapshot"
)

// ErrNotSupported: the provider cannot do this at all (a snapshot of an
// attached disk where it has no way to make one consistent, say). Retrying
// does not help.
var ErrNotSupported = errors.New("not supported by the provider")

// Snapshot is a point-in-time copy of a disk as the provider reports it.
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// SourceDiskID is the disk it was taken of; the disk may be gone since.
	SourceDiskID string `json:"sourceDiskID"`
	// SizeBytes is the source disk's size when the snapshot was taken: the
	// smallest disk it can be restored to.
	SizeBytes int64 `json:"sizeBytes"`
	// StoredBytes is what the snapshot occupies (holes not counted); 0 when
	// the provider does not say.
	StoredBytes int64             `json:"storedBytes,omitempty"`
	Tags        map[string]string `json:"tags,omitempty"`
	CreatedAt   time.Time         `json:"createdAt"`
	// Ready says the snapshot can be restored from. A snapshot still being
	// taken is reported (GetSnapshot, ListSnapshots) with Ready false.
	Ready bool `json:"ready"`
}

// SnapshotSpec describes a snapshot to take.
type SnapshotSpec struct {
	// Name is the idempotency key: the same name of the same disk returns
	// the same snapshot; of another disk, ErrAlreadyExists.
	Name         string
	SourceDiskID string
	Tags         map[string]string
}

// SnapshotListOptions pages through ListSnapshots.
type SnapshotListOptions struct {
	ListOptions
	// SourceDiskID, when set, lists only the snapshots of that disk.
	SourceDiskID string
}

// SnapshotPage is one page of ListSnapshots, ordered by snapshot ID.
type SnapshotPage struct {
	Snapshots []Snapshot
	// NextToken is "" on the last page.
	NextToken string
}

// DiskSource is what a new disk's content comes from (DiskSpec.Source):
// exactly one of its fields is set.
type DiskSource struct {
	SnapshotID string `json:"snapshotID,omitempty"`
	DiskID     string `json:"diskID,omitempty"`
}

// Snapshotter is implemented by providers that take snapshots of disks and
// create disks from snapshots and from other disks (DiskSpec.Source). Its
// contract is the Cloud's: every mutating call returns an Operation at once
// (Operation.SnapshotID names the snapshot), is idempotent by name, and is
// waited on with WaitOperation, which returns the zero Disk for snapshot
// operations (read the snapshot with GetSnapshot). A snapshot is
// independent of its source disk once taken: it outlives the disk's
// deletion, and deleting the disk leaves it whole.
type Snapshotter interface {
	// CreateSnapshot starts taking a snapshot. An unknown source disk is
	// ErrNotFound; a name taken by a snapshot of another disk,
	// ErrAlreadyExists; an attached disk the provider cannot snapshot
	// consistently, ErrNotSupported.
	CreateSnapshot(ctx context.Context, spec SnapshotSpec) (Operation, error)
	// DeleteSnapshot starts deleting a snapshot. One that does not exist is
	// success. Disks created from it are not affected.
	DeleteSnapshot(ctx context.Context, snapshotID string) (Operation, error)
	// GetSnapshot reports a snapshot, or ErrNotFound.
	GetSnapshot(ctx context.Context, snapshotID string) (Snapshot, error)
	// ListSnapshots returns one page of snapshots ordered by ID, with the
	// token rules of ListDisks. A SourceDiskID that is not of the
	// provider's format matches no snapshot.
	ListSnapshots(ctx context.Context, opts SnapshotListOptions) (SnapshotPage, error)
}
