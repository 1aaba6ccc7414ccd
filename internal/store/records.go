package store

import (
	"encoding/json"
	"maps"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
)

// Capability is how a volume is accessed, free of CSI types.
type Capability struct {
	// AccessType is "mount" or "block".
	AccessType string `json:"accessType"`
	// FsType is the filesystem of a mount volume ("" = the driver default).
	FsType string `json:"fsType,omitempty"`
	// MountFlags are extra mount options of a mount volume.
	MountFlags []string `json:"mountFlags,omitempty"`
	// AccessMode is the CSI access mode name (e.g. SINGLE_NODE_WRITER).
	AccessMode string `json:"accessMode,omitempty"`
}

// Attachment is a volume's controller-side publication to a node.
type Attachment struct {
	Node           string            `json:"node"`
	ReadOnly       bool              `json:"readOnly,omitempty"`
	Fingerprint    string            `json:"fingerprint"`
	PublishContext map[string]string `json:"publishContext,omitempty"`
}

// Stage is a volume's staging on its node.
type Stage struct {
	Path        string `json:"path"`
	Fingerprint string `json:"fingerprint"`
	// Device is the block device the volume was staged from.
	Device string `json:"device,omitempty"`
}

// Target is one published target path of a volume.
type Target struct {
	ReadOnly    bool   `json:"readOnly,omitempty"`
	Fingerprint string `json:"fingerprint"`
}

// Source is what a volume's content was copied from when it was created
// (CSI's volume_content_source): a snapshot or another volume, named by
// csid's ids as the CO gave them, with the provider's ids they stood for
// when the create was accepted.
type Source struct {
	// SnapshotID or VolumeID: exactly one is set.
	SnapshotID string `json:"snapshotID,omitempty"`
	VolumeID   string `json:"volumeID,omitempty"`
	// CloudSnapshotID is the provider's id of the snapshot; DiskID that of
	// the source volume's disk.
	CloudSnapshotID string `json:"cloudSnapshotID,omitempty"`
	DiskID          string `json:"diskID,omitempty"`
	// SizeBytes is the source's size: the smallest the volume can be.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// Same reports whether s and o name the same source (both nil, or the same
// snapshot or volume).
func (s *Source) Same(o *Source) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.SnapshotID == o.SnapshotID && s.VolumeID == o.VolumeID
}

// String names the source as a CO would: "snapshot snap-..." or "volume
// vol-...", "" for none.
func (s *Source) String() string {
	switch {
	case s == nil:
		return ""
	case s.SnapshotID != "":
		return "snapshot " + s.SnapshotID
	default:
		return "volume " + s.VolumeID
	}
}

// Volume is the stored record of one volume. Its State is a state of the
// lifecycle (internal/fsm); the record changes only together with an op and
// a history entry (Tx.Accept, Tx.Finish) or by reconciliation (Tx.Adopt).
type Volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name,omitempty"`
	DiskID        string            `json:"diskID,omitempty"`
	CapacityBytes int64             `json:"capacityBytes"`
	Zone          string            `json:"zone,omitempty"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	Capability    Capability        `json:"capability"`
	State         fsm.State         `json:"state"`
	Attachment    *Attachment       `json:"attachment,omitempty"`
	Stage         *Stage            `json:"stage,omitempty"`
	Targets       map[string]Target `json:"targets,omitempty"`
	// Source is what the volume was created from; nil for an empty volume.
	Source *Source `json:"source,omitempty"`
	// ActiveOp is the sequence number of the op queued or running on the
	// volume; 0 when none. At most one op is active per volume. It is kept
	// in the small active bucket, not in the record, so that accepting an
	// op never rewrites the volume (Tx.Volume fills it in).
	ActiveOp uint64 `json:"-"`
	// Generation counts the transitions the volume has gone through.
	Generation uint64 `json:"generation"`
	// LastOp is the last op that finished on the volume. Retention never
	// prunes it, so the volume's history always explains its state.
	LastOp    uint64    `json:"lastOp,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Node returns the node the volume is attached to, or "".
func (v *Volume) Node() string {
	if v.Attachment == nil {
		return ""
	}
	return v.Attachment.Node
}

// OpStatus is where an op is in its life.
type OpStatus string

// Op statuses. Queued and Compensating ops are active: recovery resumes them.
const (
	OpQueued       OpStatus = "queued"
	OpCompensating OpStatus = "compensating"
	OpSucceeded    OpStatus = "succeeded"
	OpFailed       OpStatus = "failed"
)

// Active reports whether an op with this status still has work to do.
func (s OpStatus) Active() bool { return s == OpQueued || s == OpCompensating }

// Op is one accepted transition of one volume or one snapshot: its intent,
// its progress and, once finished, its outcome.
type Op struct {
	Seq uint64 `json:"seq"`
	// VolumeID is the volume of a volume's op; SnapshotID the snapshot of
	// a snapshot's op (fsm.Event.OfSnapshot). Exactly one is set.
	VolumeID   string    `json:"volumeID,omitempty"`
	SnapshotID string    `json:"snapshotID,omitempty"`
	Event      fsm.Event `json:"event"`
	Guard      fsm.Guard `json:"guard,omitempty"`
	From       fsm.State `json:"from"`
	To         fsm.State `json:"to"`
	// Generation is the volume generation the op was planned against.
	Generation  uint64          `json:"generation"`
	Args        json.RawMessage `json:"args,omitempty"`
	Fingerprint string          `json:"fingerprint,omitempty"`
	Status      OpStatus        `json:"status"`
	Attempts    int             `json:"attempts,omitempty"`
	LastError   string          `json:"lastError,omitempty"`
	// Checkpoints record progress an executor must not repeat after a
	// restart (for example the id of a cloud operation it waits on).
	Checkpoints map[string]string `json:"checkpoints,omitempty"`
	Result      json.RawMessage   `json:"result,omitempty"`
	// Code and Message are the failure of a failed op (Code is a gRPC code
	// name such as "NotFound").
	Code      string    `json:"code,omitempty"`
	Message   string    `json:"message,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// NextAttemptAt is when a retry is due, while the op backs off.
	NextAttemptAt time.Time `json:"nextAttemptAt,omitzero"`
	FinishedAt    time.Time `json:"finishedAt,omitzero"`
}

// Subject is the id of what the op changes: its volume or its snapshot.
func (op *Op) Subject() string {
	if op.SnapshotID != "" {
		return op.SnapshotID
	}
	return op.VolumeID
}

// Lifecycle is the lifecycle table the op's step belongs to.
func (op *Op) Lifecycle() *fsm.Lifecycle {
	if op.SnapshotID != "" {
		return fsm.Snapshots
	}
	return fsm.Volumes
}

// HistoryEntry is one line of a volume's (or a snapshot's) history. The line of a transition
// made by an op is that op's record, read as a line (see Op.HistoryEntry);
// lines without an op (a deferred resize request, an adoption, a dropped
// resize) are stored as notes.
type HistoryEntry struct {
	Time  time.Time `json:"time"`
	Event fsm.Event `json:"event"`
	Guard fsm.Guard `json:"guard,omitempty"`
	From  fsm.State `json:"from"`
	To    fsm.State `json:"to"`
	// OpSeq is the op that made the change; 0 for notes.
	OpSeq uint64 `json:"op,omitempty"`
	// Generation is the volume's generation after the line.
	Generation uint64 `json:"generation"`
	// Outcome is "ok" or "failed: <reason>" for an op; a note says what
	// happened ("queued resize to ...", "adopted: ...").
	Outcome string `json:"outcome"`
}

// HistoryEntry reads a finished op as its volume's history line.
func (op *Op) HistoryEntry() HistoryEntry {
	h := HistoryEntry{Time: op.FinishedAt, Event: op.Event, Guard: op.Guard, From: op.From, To: op.To,
		OpSeq: op.Seq, Generation: op.Generation + 1, Outcome: "ok"}
	if op.Status != OpSucceeded {
		h.To, h.Generation, h.Outcome = op.From, op.Generation, "failed: "+op.Message
	}
	return h
}

// ResizeStatus is where a deferred resize is.
type ResizeStatus string

// Resize statuses.
const (
	// ResizeQueued: waiting for the volume to be detached.
	ResizeQueued ResizeStatus = "queued"
	// ResizeRunning: an expand op is growing the disk.
	ResizeRunning ResizeStatus = "running"
)

// Resize is an entry of the deferred offline-resize queue. While a volume
// has one, it is not attached.
type Resize struct {
	VolumeID      string       `json:"volumeID"`
	TargetBytes   int64        `json:"targetBytes"`
	Status        ResizeStatus `json:"status"`
	Attempts      int          `json:"attempts,omitempty"`
	LastError     string       `json:"lastError,omitempty"`
	QueuedAt      time.Time    `json:"queuedAt"`
	UpdatedAt     time.Time    `json:"updatedAt"`
	NextAttemptAt time.Time    `json:"nextAttemptAt,omitzero"`
}

// Snapshot is the stored record of one snapshot. Its State is a state of
// the snapshot lifecycle (fsm.Snapshots): ABSENT while its snapshot_create
// op is in flight, READY once cut. Like a volume's, the record changes
// only together with an op (Tx.AcceptSnapshot, Tx.FinishSnapshot) or by
// reconciliation with a history note (Tx.ReconcileSnapshot).
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// SourceVolumeID is the volume it was taken of (CSI's
	// source_volume_id); the volume may be gone since.
	SourceVolumeID string `json:"sourceVolumeID"`
	// SourceDiskID is that volume's disk, and Zone its zone: where the
	// snapshot is accessible from.
	SourceDiskID string            `json:"sourceDiskID,omitempty"`
	Zone         string            `json:"zone,omitempty"`
	Parameters   map[string]string `json:"parameters,omitempty"`
	// CloudID is the provider's id of the snapshot, once cut.
	CloudID string `json:"cloudID,omitempty"`
	// SizeBytes is the source's size when it was cut: the smallest volume
	// it restores to.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// ReadyToUse is the provider's word that it can be restored from.
	ReadyToUse bool      `json:"readyToUse,omitempty"`
	State      fsm.State `json:"state"`
	// ActiveOp is the op queued or running on the snapshot (from the
	// active bucket, as a volume's); 0 when none.
	ActiveOp   uint64 `json:"-"`
	Generation uint64 `json:"generation"`
	// LastOp is the last op that finished on the snapshot.
	LastOp uint64 `json:"lastOp,omitempty"`
	// CutAt is when the provider cut it (CSI's creation_time).
	CutAt     time.Time `json:"cutAt,omitzero"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Clone returns a deep copy of the snapshot.
func (s *Snapshot) Clone() *Snapshot {
	c := *s
	c.Parameters = maps.Clone(s.Parameters)
	return &c
}
