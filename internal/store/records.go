package store

import (
	"encoding/json"
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

// Op is one accepted transition of one volume: its intent, its progress and,
// once finished, its outcome.
type Op struct {
	Seq      uint64    `json:"seq"`
	VolumeID string    `json:"volumeID"`
	Event    fsm.Event `json:"event"`
	Guard    fsm.Guard `json:"guard,omitempty"`
	From     fsm.State `json:"from"`
	To       fsm.State `json:"to"`
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

// HistoryEntry is one line of a volume's history. The line of a transition
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
