// Package fake is an in-memory cloud.Cloud for the tests, benchmarks and
// drills of the engine. It keeps the contract of package cloud (the same
// contract suite runs against it and against the local backend) and adds
// knobs a real provider does not have:
//
//   - latency per operation kind: an operation completes that long after
//     the call that started it, and WaitOperation blocks until then;
//   - holds: operations of a kind do not complete until the test lets them,
//     to observe the provider (and its callers) mid-operation without
//     racing a timer;
//   - failures: the next N calls of a kind fail before doing anything
//     (FailCalls), or start an operation that then fails (FailOperations),
//     or do their work but lose the reply (DropReplies);
//   - attach limits per node, capacity per zone, several zones;
//   - a call log with the start and end time of every operation, so a test
//     can prove an order ("no attach started before the resize finished");
//   - disk content, in memory (WriteDisk, ReadDisk), so that a test can see
//     what a snapshot or a clone copied.
//
// It takes snapshots and makes disks from them and from other disks
// (cloud.Snapshotter, snapshot.go): a snapshot copies its disk's content
// when the call is made, and is reported with Ready false until its
// operation completes.
//
// It is deterministic: ids are counters, and with no latency every
// operation has finished when the call that started it returns. A disk with
// an operation in flight accepts the same call again (the caller joins the
// operation) and refuses any other mutation with ErrTransient, as real
// providers refuse to modify a volume that is busy.
//
// A Cloud is safe for concurrent use.
package fake

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/csid-dev/csid/internal/cloud"
)

// Kinds of the read calls, for FailCalls. Mutating calls use the
// cloud.Op* kinds.
const (
	KindGetDisk   cloud.OpKind = "get"
	KindListDisks cloud.OpKind = "list"
	KindGetNode   cloud.OpKind = "node"
	// KindGetSnapshot and KindListSnapshots are GetSnapshot and
	// ListSnapshots.
	KindGetSnapshot   cloud.OpKind = "get-snapshot"
	KindListSnapshots cloud.OpKind = "list-snapshots"
)

// Limits.
const (
	// Granularity is the size unit: sizes round up to a multiple of it.
	Granularity = 1 << 20
	// MaxDiskBytes is the largest disk.
	MaxDiskBytes = 64 << 40
	// MaxNameBytes is the longest disk name.
	MaxNameBytes = 256
	// MaxIDBytes is the longest node id.
	MaxIDBytes = 128
	// DefaultPageSize is the ListDisks page size when none is asked for;
	// MaxPageSize caps it.
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// DevicePrefix is where the fake Host says disks appear: DevicePrefix + disk
// ID. Nothing is created there.
const DevicePrefix = "/dev/csid-fake/"

var (
	diskIDPattern = regexp.MustCompile(`^disk-[0-9a-f]{16}$`)
	opIDPattern   = regexp.MustCompile(`^op-[0-9a-f]{16}$`)
)

// Options configure a Cloud. The zero value is a one-zone provider without
// limits.
type Options struct {
	// Zones are the provider's zones; the first is the default. Default:
	// {"zone-a"}.
	Zones []string
	// CapacityBytes is the space of each zone. Default: 1 PiB.
	CapacityBytes int64
	// Now is the clock of the call log and of Disk.CreatedAt. Default:
	// time.Now.
	Now func() time.Time
	// OpRetention is the number of finished operations WaitOperation is
	// sure to still know (it may know up to twice as many). Default: 100000.
	OpRetention int
	// CallLogSize is the number of call log entries kept (the oldest go
	// first). Default: 100000.
	CallLogSize int
}

// Call is one entry of the call log.
type Call struct {
	// Seq numbers calls in the order they started, from 1.
	Seq int
	// Method is the Cloud method called ("AttachDisk", ...).
	Method string
	// Kind is the kind of the operation the call started or joined; for
	// reads, the Kind* constant of the read.
	Kind   cloud.OpKind
	DiskID string
	NodeID string
	// SnapshotID is the snapshot a snapshot call is about.
	SnapshotID string
	// OpID is the operation the call started or joined; "" when none.
	OpID string
	// Start is when the call began. End is when the operation it started or
	// joined finished, or when the call returned if it started none; it is
	// zero while the operation runs.
	Start, End time.Time
	// Err is the call's error, or else the error its operation failed with.
	Err error
}

// Cloud is the fake provider.
type Cloud struct {
	opts Options

	mu        sync.Mutex
	diskSeq   uint64
	opSeq     uint64
	disks     map[string]*disk  // by ID, including disks still being created
	names     map[string]string // name -> disk ID
	snapSeq   uint64
	snaps     map[string]*snapshot // by ID, including snapshots being taken
	snapNames map[string]string    // name -> snapshot ID
	nodes     map[string]cloud.Node
	used      map[string]int64 // bytes per zone, reservations included
	ops       map[string]*operation
	finished  []string // finished operation IDs, oldest first, for pruning
	latency   map[cloud.OpKind]time.Duration
	holds     map[cloud.OpKind]chan struct{}
	failCalls map[cloud.OpKind]*failure
	failOps   map[cloud.OpKind]*failure
	dropReply map[cloud.OpKind]*failure
	calls     []*Call
	callSeq   int
}

type disk struct {
	d cloud.Disk
	// created is false until the create operation has finished.
	created bool
	// pending is the operation in flight on the disk, nil when none.
	pending *operation
	// content is what the disk holds (WriteDisk).
	content content
}

type operation struct {
	op cloud.Operation
	// key identifies the request, so that a repeat call joins it.
	key string
	// apply performs the effect at completion, under c.mu; undo releases
	// what the start reserved when the operation fails instead.
	apply func() cloud.Disk
	undo  func()
	// fail, when set, is the error the operation will fail with.
	fail  error
	calls []*Call
	done  chan struct{}
	disk  cloud.Disk
	err   error
}

type failure struct {
	n   int
	err error
}

var _ cloud.Cloud = (*Cloud)(nil)
var _ cloud.Registrar = (*Cloud)(nil)

// New returns an empty provider.
func New(opts Options) *Cloud {
	if len(opts.Zones) == 0 {
		opts.Zones = []string{"zone-a"}
	}
	opts.Zones = slices.Clone(opts.Zones)
	if opts.CapacityBytes <= 0 {
		opts.CapacityBytes = 1 << 50
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.OpRetention <= 0 {
		opts.OpRetention = 100000
	}
	if opts.CallLogSize <= 0 {
		opts.CallLogSize = 100000
	}
	return &Cloud{
		opts:      opts,
		disks:     map[string]*disk{},
		names:     map[string]string{},
		snaps:     map[string]*snapshot{},
		snapNames: map[string]string{},
		nodes:     map[string]cloud.Node{},
		used:      map[string]int64{},
		ops:       map[string]*operation{},
		latency:   map[cloud.OpKind]time.Duration{},
		holds:     map[cloud.OpKind]chan struct{}{},
		failCalls: map[cloud.OpKind]*failure{},
		failOps:   map[cloud.OpKind]*failure{},
		dropReply: map[cloud.OpKind]*failure{},
	}
}

// SetLatency makes operations of kind complete d after the call that starts
// them (0: at once, the default).
func (c *Cloud) SetLatency(kind cloud.OpKind, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.latency[kind] = d
}

// Hold keeps operations of kind from completing until the returned release
// is called (then they complete, after their latency if any). Calls go on
// being accepted meanwhile. Calling release more than once is harmless;
// not calling it leaves a goroutine per held operation waiting, so tests
// defer it.
func (c *Cloud) Hold(kind cloud.OpKind) (release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.holds[kind]
	if !ok {
		ch = make(chan struct{})
		c.holds[kind] = ch
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.holds[kind] == ch {
				delete(c.holds, kind)
				close(ch)
			}
		})
	}
}

// FailCalls makes the next n calls of kind return err without doing
// anything. For the calls that start operations, this is the provider
// refusing the request; for reads (KindGetDisk, ...), a failed read.
func (c *Cloud) FailCalls(kind cloud.OpKind, n int, err error) {
	c.setFailure(c.failCalls, kind, n, err)
}

// FailOperations makes the next n operations of kind start normally and
// then fail with err, changing nothing: WaitOperation returns err.
func (c *Cloud) FailOperations(kind cloud.OpKind, n int, err error) {
	c.setFailure(c.failOps, kind, n, err)
}

// DropReplies makes the next n calls of kind do their work (the operation
// starts and completes as usual) but return err instead of the operation,
// as when a reply is lost on the way: the caller must find out by calling
// again.
func (c *Cloud) DropReplies(kind cloud.OpKind, n int, err error) {
	c.setFailure(c.dropReply, kind, n, err)
}

func (c *Cloud) setFailure(m map[cloud.OpKind]*failure, kind cloud.OpKind, n int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= 0 || err == nil {
		delete(m, kind)
		return
	}
	m[kind] = &failure{n: n, err: err}
}

// take consumes one injected failure of kind, if any.
func take(m map[cloud.OpKind]*failure, kind cloud.OpKind) error {
	f := m[kind]
	if f == nil {
		return nil
	}
	f.n--
	if f.n <= 0 {
		delete(m, kind)
	}
	return f.err
}

// AddNode makes a node known, or updates it. A node without a zone is in
// the default zone; an unknown zone is ErrInvalid.
func (c *Cloud) AddNode(node cloud.Node) error {
	if node.ID == "" || len(node.ID) > MaxIDBytes {
		return fmt.Errorf("node id %q: empty or longer than %d bytes: %w", node.ID, MaxIDBytes, cloud.ErrInvalid)
	}
	if node.MaxAttachments < 0 {
		return fmt.Errorf("node %s: negative attach limit: %w", node.ID, cloud.ErrInvalid)
	}
	zone, err := c.zone(node.Zone)
	if err != nil {
		return err
	}
	node.Zone = zone
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[node.ID] = node
	return nil
}

// RegisterNode is AddNode, for callers that know only cloud.Registrar.
func (c *Cloud) RegisterNode(_ context.Context, node cloud.Node) error {
	return c.AddNode(node)
}

// Calls returns a copy of the call log (the last Options.CallLogSize calls),
// oldest first.
func (c *Cloud) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	log := c.calls
	if len(log) > c.opts.CallLogSize {
		log = log[len(log)-c.opts.CallLogSize:]
	}
	out := make([]Call, len(log))
	for i, call := range log {
		out[i] = *call
	}
	return out
}

func (c *Cloud) zone(z string) (string, error) {
	if z == "" {
		return c.opts.Zones[0], nil
	}
	if !slices.Contains(c.opts.Zones, z) {
		return "", fmt.Errorf("zone %q: the provider has %v: %w", z, c.opts.Zones, cloud.ErrInvalid)
	}
	return z, nil
}

// begin logs a call; the caller holds c.mu.
func (c *Cloud) begin(method string, kind cloud.OpKind, diskID, nodeID string) *Call {
	c.callSeq++
	call := &Call{Seq: c.callSeq, Method: method, Kind: kind, DiskID: diskID, NodeID: nodeID, Start: c.opts.Now()}
	if len(c.calls) >= 2*c.opts.CallLogSize {
		// Trim in halves, so that a long run pays O(1) per call.
		c.calls = slices.Clone(c.calls[len(c.calls)-c.opts.CallLogSize:])
	}
	c.calls = append(c.calls, call)
	return call
}

// beginChange logs the call of a change to disk diskID and refuses it, as
// logged, when a failure is set for its kind or the id is malformed. The
// caller holds c.mu.
func (c *Cloud) beginChange(method string, kind cloud.OpKind, diskID, nodeID string) (*Call, error) {
	call := c.begin(method, kind, diskID, nodeID)
	if err := take(c.failCalls, kind); err != nil {
		return call, c.refuse(call, err)
	}
	if !diskIDPattern.MatchString(diskID) {
		return call, c.refuse(call, invalidDiskID(diskID))
	}
	return call, nil
}

// refuse ends a call that started no operation; the caller holds c.mu.
func (c *Cloud) refuse(call *Call, err error) error {
	call.End = c.opts.Now()
	call.Err = err
	return err
}

// CreateDisk starts creating a disk; see cloud.Cloud. The disk exists (for
// GetDisk and ListDisks) once the operation has finished; a repeat call
// meanwhile joins the operation.
func (c *Cloud) CreateDisk(_ context.Context, spec cloud.DiskSpec) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("CreateDisk", cloud.OpCreate, "", "")
	if err := take(c.failCalls, cloud.OpCreate); err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	size, err := checkSize(spec.SizeBytes)
	if err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	if spec.Name == "" || len(spec.Name) > MaxNameBytes || !utf8.ValidString(spec.Name) {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk name %q: empty, longer than %d bytes or not UTF-8: %w", spec.Name, MaxNameBytes, cloud.ErrInvalid))
	}
	zone, err := c.zone(spec.Zone)
	if err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	key := fmt.Sprintf("create|%s|%d|%s|%s", spec.Name, size, zone, sourceKey(spec.Source))
	if id, ok := c.names[spec.Name]; ok {
		d := c.disks[id]
		call.DiskID = id
		if d.d.SizeBytes != size || d.d.Zone != zone {
			return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk name %q is taken by %s (%d bytes in %s): %w", spec.Name, id, d.d.SizeBytes, d.d.Zone, cloud.ErrAlreadyExists))
		}
		if sourceKey(d.d.Source) != sourceKey(spec.Source) {
			return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk name %q is taken by %s, made from %s: %w", spec.Name, id, sourceKey(d.d.Source), cloud.ErrAlreadyExists))
		}
		if !d.created {
			return c.join(call, d.pending)
		}
		return c.finishedOp(call, cloud.OpCreate, id, "", d.d)
	}
	from, err := c.source(spec.Source, zone, size)
	if err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	if c.used[zone]+size > c.opts.CapacityBytes {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("zone %s has %d bytes free, disk needs %d: %w", zone, c.opts.CapacityBytes-c.used[zone], size, cloud.ErrLimitReached))
	}
	c.diskSeq++
	id := fmt.Sprintf("disk-%016x", c.diskSeq)
	call.DiskID = id
	d := &disk{d: cloud.Disk{
		ID: id, Name: spec.Name, SizeBytes: size, Zone: zone,
		Tags: maps.Clone(spec.Tags), CreatedAt: c.opts.Now(), Source: cloneSource(spec.Source),
	}, content: from}
	c.disks[id] = d
	c.names[spec.Name] = id
	c.used[zone] += size
	o := c.newOp(cloud.OpCreate, id, "", key)
	o.apply = func() cloud.Disk { d.created = true; return d.d }
	o.undo = func() {
		delete(c.disks, id)
		delete(c.names, spec.Name)
		c.used[zone] -= size
	}
	return c.start(call, &d.pending, o)
}

// DeleteDisk starts deleting a disk; see cloud.Cloud. The disk is gone once
// the operation has finished.
func (c *Cloud) DeleteDisk(_ context.Context, diskID string) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, err := c.beginChange("DeleteDisk", cloud.OpDelete, diskID, "")
	if err != nil {
		return cloud.Operation{}, err
	}
	d, ok := c.disks[diskID]
	if !ok {
		return c.finishedOp(call, cloud.OpDelete, diskID, "", cloud.Disk{})
	}
	key := "delete|" + diskID
	if d.pending != nil {
		if d.pending.key == key {
			return c.join(call, d.pending)
		}
		return cloud.Operation{}, c.refuse(call, busy(d))
	}
	if d.d.AttachedTo != "" {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s is attached to %s: %w", diskID, d.d.AttachedTo, cloud.ErrAttached))
	}
	o := c.newOp(cloud.OpDelete, diskID, "", key)
	o.apply = func() cloud.Disk {
		delete(c.disks, diskID)
		delete(c.names, d.d.Name)
		c.used[d.d.Zone] -= d.d.SizeBytes
		return cloud.Disk{}
	}
	return c.start(call, &d.pending, o)
}

// AttachDisk starts attaching a disk to a node; see cloud.Cloud. An attach
// in flight counts against the node's limit.
func (c *Cloud) AttachDisk(_ context.Context, diskID, nodeID string) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, err := c.beginChange("AttachDisk", cloud.OpAttach, diskID, nodeID)
	if err != nil {
		return cloud.Operation{}, err
	}
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s: %w", diskID, cloud.ErrNotFound))
	}
	node, ok := c.nodes[nodeID]
	if !ok {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("node %q: %w", nodeID, cloud.ErrNotFound))
	}
	key := "attach|" + diskID + "|" + nodeID
	if d.pending != nil {
		if d.pending.key == key {
			return c.join(call, d.pending)
		}
		return cloud.Operation{}, c.refuse(call, busy(d))
	}
	switch d.d.AttachedTo {
	case nodeID:
		return c.finishedOp(call, cloud.OpAttach, diskID, nodeID, d.d)
	case "":
	default:
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s is attached to %s: %w", diskID, d.d.AttachedTo, cloud.ErrAttached))
	}
	if node.Zone != d.d.Zone {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s is in zone %s, node %s in %s: %w", diskID, d.d.Zone, nodeID, node.Zone, cloud.ErrInvalid))
	}
	if node.MaxAttachments > 0 && c.attachedTo(nodeID) >= node.MaxAttachments {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("node %s holds %d disks: %w", nodeID, node.MaxAttachments, cloud.ErrLimitReached))
	}
	o := c.newOp(cloud.OpAttach, diskID, nodeID, key)
	o.apply = func() cloud.Disk { d.d.AttachedTo = nodeID; return d.d }
	return c.start(call, &d.pending, o)
}

// attachedTo counts the disks attached, or being attached, to a node.
func (c *Cloud) attachedTo(nodeID string) int {
	n := 0
	for _, d := range c.disks {
		if d.d.AttachedTo == nodeID || (d.pending != nil && d.pending.op.Kind == cloud.OpAttach && d.pending.op.NodeID == nodeID) {
			n++
		}
	}
	return n
}

// DetachDisk starts detaching a disk from a node; see cloud.Cloud.
func (c *Cloud) DetachDisk(_ context.Context, diskID, nodeID string) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, err := c.beginChange("DetachDisk", cloud.OpDetach, diskID, nodeID)
	if err != nil {
		return cloud.Operation{}, err
	}
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return c.finishedOp(call, cloud.OpDetach, diskID, nodeID, cloud.Disk{})
	}
	key := "detach|" + diskID + "|" + nodeID
	if d.pending != nil {
		if d.pending.key == key {
			return c.join(call, d.pending)
		}
		return cloud.Operation{}, c.refuse(call, busy(d))
	}
	if d.d.AttachedTo != nodeID {
		return c.finishedOp(call, cloud.OpDetach, diskID, nodeID, d.d)
	}
	o := c.newOp(cloud.OpDetach, diskID, nodeID, key)
	o.apply = func() cloud.Disk { d.d.AttachedTo = ""; return d.d }
	return c.start(call, &d.pending, o)
}

// ResizeDisk starts growing a detached disk; see cloud.Cloud.
func (c *Cloud) ResizeDisk(_ context.Context, diskID string, sizeBytes int64) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, err := c.beginChange("ResizeDisk", cloud.OpResize, diskID, "")
	if err != nil {
		return cloud.Operation{}, err
	}
	size, err := checkSize(sizeBytes)
	if err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s: %w", diskID, cloud.ErrNotFound))
	}
	key := fmt.Sprintf("resize|%s|%d", diskID, size)
	if d.pending != nil {
		if d.pending.key == key {
			return c.join(call, d.pending)
		}
		return cloud.Operation{}, c.refuse(call, busy(d))
	}
	if d.d.AttachedTo != "" {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s is attached to %s and this provider resizes detached disks only: %w", diskID, d.d.AttachedTo, cloud.ErrAttached))
	}
	if size <= d.d.SizeBytes {
		return c.finishedOp(call, cloud.OpResize, diskID, "", d.d)
	}
	grow := size - d.d.SizeBytes
	zone := d.d.Zone
	if c.used[zone]+grow > c.opts.CapacityBytes {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("zone %s has %d bytes free, growing %s needs %d: %w", zone, c.opts.CapacityBytes-c.used[zone], diskID, grow, cloud.ErrLimitReached))
	}
	c.used[zone] += grow
	o := c.newOp(cloud.OpResize, diskID, "", key)
	o.apply = func() cloud.Disk { d.d.SizeBytes = size; return d.d }
	o.undo = func() { c.used[zone] -= grow }
	return c.start(call, &d.pending, o)
}

// UpdateDiskTags sets and removes tags of a disk; see cloud.Cloud. Like
// every operation it takes the latency, holds and failures set for its
// kind (cloud.OpTag).
func (c *Cloud) UpdateDiskTags(_ context.Context, diskID string, tags map[string]string) (cloud.Operation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call, err := c.beginChange("UpdateDiskTags", cloud.OpTag, diskID, "")
	if err != nil {
		return cloud.Operation{}, err
	}
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return cloud.Operation{}, c.refuse(call, fmt.Errorf("disk %s: %w", diskID, cloud.ErrNotFound))
	}
	_, changed, err := cloud.MergeTags(d.d.Tags, tags)
	if err != nil {
		return cloud.Operation{}, c.refuse(call, err)
	}
	var key strings.Builder
	key.WriteString("tag|" + diskID)
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		fmt.Fprintf(&key, "|%q=%q", k, tags[k])
	}
	if d.pending != nil {
		if d.pending.key == key.String() {
			return c.join(call, d.pending)
		}
		return cloud.Operation{}, c.refuse(call, busy(d))
	}
	if !changed {
		return c.finishedOp(call, cloud.OpTag, diskID, "", d.d)
	}
	o := c.newOp(cloud.OpTag, diskID, "", key.String())
	o.apply = func() cloud.Disk {
		// Applied to the tags the disk has when the operation completes.
		d.d.Tags, _, _ = cloud.MergeTags(d.d.Tags, tags)
		return d.d
	}
	return c.start(call, &d.pending, o)
}

func (c *Cloud) newOp(kind cloud.OpKind, diskID, nodeID, key string) *operation {
	c.opSeq++
	return &operation{
		op:   cloud.Operation{ID: fmt.Sprintf("op-%016x", c.opSeq), Kind: kind, DiskID: diskID, NodeID: nodeID},
		key:  key,
		done: make(chan struct{}),
	}
}

// start puts o in flight on what slot is the pending operation of (a disk
// or a snapshot), and completes it now or after the latency of its kind;
// the caller holds c.mu.
func (c *Cloud) start(call *Call, slot **operation, o *operation) (cloud.Operation, error) {
	kind := o.op.Kind
	o.fail = take(c.failOps, kind)
	*slot = o
	c.ops[o.op.ID] = o
	lost := take(c.dropReply, kind)
	call.OpID = o.op.ID
	o.calls = append(o.calls, call)
	finish := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.complete(slot, o)
	}
	lat := c.latency[kind]
	switch hold := c.holds[kind]; {
	case hold != nil:
		go func() {
			<-hold
			if lat > 0 {
				time.AfterFunc(lat, finish)
				return
			}
			finish()
		}()
	case lat > 0:
		time.AfterFunc(lat, finish)
	default:
		c.complete(slot, o)
	}
	if lost != nil {
		call.Err = lost
		return cloud.Operation{}, lost
	}
	op := o.op
	select {
	case <-o.done:
		op.Done = true
	default:
	}
	return op, nil
}

// complete finishes o, the pending operation of slot; the caller holds
// c.mu.
func (c *Cloud) complete(slot **operation, o *operation) {
	if o.fail != nil {
		if o.undo != nil {
			o.undo()
		}
		o.err = o.fail
	} else {
		o.disk = o.apply()
		o.disk.Tags = maps.Clone(o.disk.Tags)
	}
	*slot = nil
	o.apply, o.undo = nil, nil
	end := c.opts.Now()
	for _, call := range o.calls {
		call.End = end
		if call.Err == nil {
			call.Err = o.err
		}
	}
	o.calls = nil
	close(o.done)
	c.retire(o.op.ID)
}

// join makes call wait on the operation already in flight.
func (c *Cloud) join(call *Call, o *operation) (cloud.Operation, error) {
	call.OpID = o.op.ID
	o.calls = append(o.calls, call)
	return o.op, nil
}

// finishedOp records an operation that has nothing to do: it is finished
// when the call returns.
func (c *Cloud) finishedOp(call *Call, kind cloud.OpKind, diskID, nodeID string, left cloud.Disk) (cloud.Operation, error) {
	return c.finish(call, c.newOp(kind, diskID, nodeID, ""), left)
}

// finish records o as finished when the call returns, leaving left.
func (c *Cloud) finish(call *Call, o *operation, left cloud.Disk) (cloud.Operation, error) {
	o.disk = left
	o.disk.Tags = maps.Clone(left.Tags)
	c.ops[o.op.ID] = o
	call.OpID = o.op.ID
	call.End = c.opts.Now()
	close(o.done)
	c.retire(o.op.ID)
	op := o.op
	op.Done = true
	return op, nil
}

// retire notes a finished operation and forgets the oldest beyond the
// retention.
func (c *Cloud) retire(id string) {
	c.finished = append(c.finished, id)
	if len(c.finished) >= 2*c.opts.OpRetention {
		// Forget in halves, so that a long run pays O(1) per operation.
		over := len(c.finished) - c.opts.OpRetention
		for _, old := range c.finished[:over] {
			delete(c.ops, old)
		}
		c.finished = slices.Clone(c.finished[over:])
	}
}

// WaitOperation waits for an operation; see cloud.Cloud.
func (c *Cloud) WaitOperation(ctx context.Context, opID string) (cloud.Disk, error) {
	if !opIDPattern.MatchString(opID) {
		return cloud.Disk{}, fmt.Errorf("operation id %q is not one of this provider's: %w", opID, cloud.ErrNotFound)
	}
	c.mu.Lock()
	o, ok := c.ops[opID]
	c.mu.Unlock()
	if !ok {
		return cloud.Disk{}, fmt.Errorf("operation %s: %w", opID, cloud.ErrNotFound)
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		return cloud.Disk{}, ctx.Err()
	}
	// o.disk and o.err are written before done is closed and never after.
	d := o.disk
	d.Tags = maps.Clone(d.Tags)
	return d, o.err
}

// GetDisk reports a disk; see cloud.Cloud. A disk still being created is
// ErrNotFound.
func (c *Cloud) GetDisk(_ context.Context, diskID string) (cloud.Disk, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("GetDisk", KindGetDisk, diskID, "")
	if err := take(c.failCalls, KindGetDisk); err != nil {
		return cloud.Disk{}, c.refuse(call, err)
	}
	d, ok := c.disks[diskID]
	if !ok || !d.created {
		return cloud.Disk{}, c.refuse(call, fmt.Errorf("disk %q: %w", diskID, cloud.ErrNotFound))
	}
	call.End = c.opts.Now()
	out := d.d
	out.Tags = maps.Clone(out.Tags)
	return out, nil
}

// ListDisks returns a page of disks; see cloud.Cloud. The page token is the
// ID of the last disk of the previous page.
func (c *Cloud) ListDisks(_ context.Context, opts cloud.ListOptions) (cloud.DiskPage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("ListDisks", KindListDisks, "", "")
	if err := take(c.failCalls, KindListDisks); err != nil {
		return cloud.DiskPage{}, c.refuse(call, err)
	}
	if opts.PageToken != "" && !diskIDPattern.MatchString(opts.PageToken) {
		return cloud.DiskPage{}, c.refuse(call, fmt.Errorf("page token %q: %w", opts.PageToken, cloud.ErrInvalid))
	}
	ids, next, err := listPage(c.disks, opts.PageToken, opts.MaxResults, func(d *disk) bool { return d.created })
	if err != nil {
		return cloud.DiskPage{}, c.refuse(call, err)
	}
	page := cloud.DiskPage{NextToken: next}
	for _, id := range ids {
		d := c.disks[id].d
		d.Tags = maps.Clone(d.Tags)
		page.Disks = append(page.Disks, d)
	}
	call.End = c.opts.Now()
	return page, nil
}

// GetNode reports a node; see cloud.Cloud.
func (c *Cloud) GetNode(_ context.Context, nodeID string) (cloud.Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.begin("GetNode", KindGetNode, "", nodeID)
	if err := take(c.failCalls, KindGetNode); err != nil {
		return cloud.Node{}, c.refuse(call, err)
	}
	n, ok := c.nodes[nodeID]
	if !ok {
		return cloud.Node{}, c.refuse(call, fmt.Errorf("node %q: %w", nodeID, cloud.ErrNotFound))
	}
	call.End = c.opts.Now()
	return n, nil
}

// Capacity reports the free bytes of a zone; see cloud.Cloud. Space
// reserved by operations in flight is not free.
func (c *Cloud) Capacity(_ context.Context, zone string) (int64, error) {
	z, err := c.zone(zone)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opts.CapacityBytes - c.used[z], nil
}

// MaxDiskBytes is the largest disk; see cloud.Cloud.
func (c *Cloud) MaxDiskBytes() int64 { return MaxDiskBytes }

// Zones lists the provider's zones, the default first.
func (c *Cloud) Zones() []string {
	return slices.Clone(c.opts.Zones)
}

// Host returns the node side of nodeID. The node need not be known yet.
func (c *Cloud) Host(nodeID string) cloud.Host {
	return &host{c: c, node: nodeID}
}

type host struct {
	c    *Cloud
	node string
}

func (h *host) NodeID() string { return h.node }

// OpenDevice returns the device DevicePrefix + diskID of a disk attached
// to this node (the attach operation finished), else ErrNotFound; see
// cloud.Host. It never waits, and proves nothing: the fake's devices are
// names, nothing is opened, and its identity is the disk id itself (the
// hint is ignored, Exclusive holds nothing). Its Number is the disk's
// sequence number.
func (h *host) OpenDevice(_ context.Context, diskID string, _ cloud.OpenOptions) (*cloud.Device, error) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	d, ok := h.c.disks[diskID]
	if !ok || !d.created || d.d.AttachedTo != h.node {
		return nil, fmt.Errorf("disk %q is not attached to node %s: %w", diskID, h.node, cloud.ErrNotFound)
	}
	n, _ := strconv.ParseUint(strings.TrimPrefix(diskID, "disk-"), 16, 64)
	disk := d.d
	disk.Tags = maps.Clone(disk.Tags)
	return cloud.NewDevice(disk, DevicePrefix+diskID, n, nil), nil
}

// Devices lists the disks attached to this node and their device paths.
func (h *host) Devices(context.Context) (map[string]string, error) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	out := map[string]string{}
	for id, d := range h.c.disks {
		if d.created && d.d.AttachedTo == h.node {
			out[id] = DevicePrefix + id
		}
	}
	return out, nil
}

func checkSize(size int64) (int64, error) {
	if size <= 0 || size > MaxDiskBytes {
		return 0, fmt.Errorf("size %d: must be between 1 and %d bytes: %w", size, int64(MaxDiskBytes), cloud.ErrInvalid)
	}
	return (size + Granularity - 1) / Granularity * Granularity, nil
}

// listPage selects the ids of m that keep accepts and that sort after
// token, in order, and cuts a page of at most max of them (see pageSize);
// next is the token of the page after it, "" on the last page.
func listPage[T any](m map[string]T, token string, max int, keep func(T) bool) (ids []string, next string, err error) {
	limit, err := pageSize(max)
	if err != nil {
		return nil, "", err
	}
	for id, v := range m {
		if id > token && keep(v) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) > limit {
		return ids[:limit], ids[limit-1], nil
	}
	return ids, "", nil
}

func pageSize(n int) (int, error) {
	switch {
	case n < 0:
		return 0, fmt.Errorf("page size %d: %w", n, cloud.ErrInvalid)
	case n == 0:
		return DefaultPageSize, nil
	default:
		return min(n, MaxPageSize), nil
	}
}

func invalidDiskID(id string) error {
	return fmt.Errorf("disk id %q is not one of this provider's: %w", id, cloud.ErrInvalid)
}

func busy(d *disk) error {
	return fmt.Errorf("disk %s is busy with %s operation %s: %w", d.d.ID, d.pending.op.Kind, d.pending.op.ID, cloud.ErrTransient)
}

// String describes the provider's state, for test failure messages.
func (c *Cloud) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(c.disks)) {
		d := c.disks[id]
		fmt.Fprintf(&b, "%s name=%q size=%d attached=%q created=%v", id, d.d.Name, d.d.SizeBytes, d.d.AttachedTo, d.created)
		if d.pending != nil {
			fmt.Fprintf(&b, " pending=%s", d.pending.op.ID)
		}
		b.WriteByte('\n')
	}
	for _, id := range slices.Sorted(maps.Keys(c.snaps)) {
		s := c.snaps[id]
		fmt.Fprintf(&b, "%s name=%q source=%s size=%d ready=%v", id, s.s.Name, s.s.SourceDiskID, s.s.SizeBytes, s.s.Ready)
		if s.pending != nil {
			fmt.Fprintf(&b, " pending=%s", s.pending.op.ID)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
