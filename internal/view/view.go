// Package view is what csid's records look like to an operator: a volume,
// an op, a deferred resize and a history line, with documented JSON field
// names that stay stable across releases (the store's own layout may
// change; these do not without a new API version).
//
// The admin endpoint (internal/admin, served by `csid serve` on its admin
// socket under /v1/) and `csid inspect --db` both build their answers here,
// from one read-only store transaction, so a live driver and a copy of its
// state file give byte-identical answers. Nothing in this package writes.
//
// # JSON fields (API v1)
//
// Sizes are exact bytes; times are RFC 3339 in UTC with nanoseconds; a
// field that does not apply is left out (never null), except the lists of
// a list document, which are always present ([] when empty).
//
// Volume (GET /v1/volumes/{id}; the items of GET /v1/volumes, without
// history):
//
//	id              volume id (the PV's spec.csi.volumeHandle)
//	name            the CO's name for it (CreateVolume's name: the PV name)
//	state           ABSENT (a create in flight), CREATED, NODE_READY, VOL_READY, PUBLISHED
//	diskID          the cloud disk
//	capacityBytes   size as recorded (the cloud's rounded size)
//	zone            the disk's zone
//	accessType      mount or block
//	fsType          filesystem of a mount volume ("" = the driver default)
//	mountFlags      extra mount options
//	accessMode      CSI access mode, e.g. SINGLE_NODE_WRITER
//	parameters      StorageClass parameters given at creation
//	node            the node it is attached to ("" = detached)
//	readOnly        attached read-only
//	publishContext  what ControllerPublish returned to the CO
//	stagingPath     where it is staged on its node (VOL_READY, PUBLISHED)
//	device          the block device it was staged from
//	targets         published target paths: [{path, readOnly}], sorted by path
//	source          what it was created from: {snapshotID} or {volumeID}
//	generation      transitions the volume has gone through
//	createdAt       when the record was made
//	updatedAt       when the record last changed
//	pendingOp       the op queued or running on it (an Op), if any
//	resize          its deferred resize (a Resize), if any
//	lastOp          the last op that finished on it (an Op): why the last
//	                change failed, if it did
//	history         (GET /v1/volumes/{id} only) how it got here: HistoryLines,
//	                oldest first
//	damage          why csid does not act on this volume: a record it needs (the
//	                volume's own, its active-op entry, its pending op, its resize)
//	                is damaged; its RPCs answer DataLoss. A volume whose own record
//	                is damaged has only id and damage
//
// Op (GET /v1/ops/{seq}; the items of GET /v1/ops):
//
//	seq             the op's sequence number ("op #12"); history lines name it
//	volumeID        the volume it changes (a volume's op)
//	snapshotID      the snapshot it changes (a snapshot's op)
//	event           create, controller_publish, node_stage, node_publish,
//	                node_unpublish, node_unstage, controller_unpublish, delete,
//	                expand, node_expand; snapshot_create, snapshot_delete
//	guard           the row of the lifecycle table it took (e.g. "last target")
//	from, to        the states it moves the volume between
//	status          queued (waiting for or running its effect; also while it
//	                backs off between attempts), compensating (undoing a failed
//	                or cancelled forward op), succeeded, failed
//	generation      the volume generation it was planned against
//	attempts        failed attempts so far (retried with backoff)
//	lastError       the error of the last failed attempt
//	nextAttemptAt   when the next attempt is due, while it backs off
//	code, message   a failed op's gRPC code name and message (what the CO got)
//	args            the request's arguments, as the engine recorded them
//	result          what a succeeded op produced (disk id, device, ...)
//	checkpoints     progress it must not repeat after a restart (e.g. the
//	                cloud operation it waits on)
//	createdAt       when it was accepted
//	finishedAt      when it succeeded or failed
//
// Resize (the items of GET /v1/resizes; a Volume's resize):
//
//	volumeID        the volume
//	status          queued (waits for the volume to be detached and idle) or
//	                running (an expand op grows the disk)
//	targetBytes     the size asked for (the largest of the requests merged)
//	currentBytes    the volume's recorded size
//	volumeState     the volume's state
//	node            the node it is attached to: the resize waits for the
//	                detach from it
//	op              the expand op, while running
//	attempts        failed attempts of the expand
//	lastError       why the last attempt failed
//	queuedAt        when the first request was queued
//	updatedAt       when the entry last changed
//	nextAttemptAt   when it is retried, after transient failures
//
// Snapshot (GET /v1/snapshots/{id}; the items of GET /v1/snapshots,
// without history):
//
//	id              snapshot id (the VolumeSnapshotContent's snapshotHandle)
//	name            the CO's name for it (CreateSnapshot's name)
//	state           ABSENT (being cut: its snapshot_create in flight) or READY
//	sourceVolumeID  the volume it was taken of (which may be gone since)
//	sourceDiskID    that volume's disk
//	cloudID         the provider's snapshot
//	sizeBytes       the source's size when it was cut: the smallest volume it restores to
//	readyToUse      the provider says it can be restored from
//	zone            where it is accessible from (its source's zone)
//	parameters      VolumeSnapshotClass parameters given at creation
//	cutAt           when the provider cut it (CSI's creation_time)
//	generation, createdAt, updatedAt, pendingOp, lastOp, history, damage
//	                as a Volume's
//
// HistoryLine (a Volume's or a Snapshot's history):
//
//	time            when it happened
//	event, guard    what happened (see Op)
//	from, to        the states before and after (equal for a failed op: the
//	                volume stayed where it was)
//	op              the op that made the change; absent for notes (a resize
//	                queued, a volume adopted, a resize dropped)
//	generation      the volume's generation after the line
//	outcome         "ok", "failed: <message>", or what a note says
//
// DamagedRecord (the items of GET /v1/damaged):
//
//	record          where it is: bucket/key (volumes/<id>, names/<name>, ops/<seq>,
//	                active/<id>, resize/<id>, history/<id>#<n>, snapshots/<id>,
//	                snapnames/<name>)
//	bucket, key     the same, apart
//	volumeID        the volume it belongs to, when known
//	snapshotID      the snapshot it belongs to, when known
//	problem         what is wrong: "fails its checksum", "does not decode: ..."
//	message         the whole sentence
//
// Lists: GET /v1/volumes is {"volumes": [Volume...]} in id order; GET
// /v1/ops is {"ops": [Op...]}, newest first; GET /v1/resizes is
// {"resizes": [Resize...]} in volume id order; GET /v1/snapshots is
// {"snapshots": [Snapshot...]} in id order; GET /v1/damaged is
// {"records": [DamagedRecord...]}. GET /v1/info is an Info.
package view

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
)

// ErrNotFound: no volume or op with that id.
var ErrNotFound = errors.New("not found")

// Volume is a volume as an operator sees it: its record, the op in flight
// on it, its deferred resize and its last finished op. See the package doc
// for the fields.
type Volume struct {
	ID             string            `json:"id"`
	Name           string            `json:"name,omitempty"`
	State          fsm.State         `json:"state"`
	DiskID         string            `json:"diskID,omitempty"`
	CapacityBytes  int64             `json:"capacityBytes"`
	Zone           string            `json:"zone,omitempty"`
	AccessType     string            `json:"accessType,omitempty"`
	FsType         string            `json:"fsType,omitempty"`
	MountFlags     []string          `json:"mountFlags,omitempty"`
	AccessMode     string            `json:"accessMode,omitempty"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	Node           string            `json:"node,omitempty"`
	ReadOnly       bool              `json:"readOnly,omitempty"`
	PublishContext map[string]string `json:"publishContext,omitempty"`
	StagingPath    string            `json:"stagingPath,omitempty"`
	Device         string            `json:"device,omitempty"`
	Targets        []Target          `json:"targets,omitempty"`
	Source         *ContentSource    `json:"source,omitempty"`
	Generation     uint64            `json:"generation"`
	CreatedAt      time.Time         `json:"createdAt,omitzero"`
	UpdatedAt      time.Time         `json:"updatedAt,omitzero"`
	PendingOp      *Op               `json:"pendingOp,omitempty"`
	Resize         *Resize           `json:"resize,omitempty"`
	LastOp         *Op               `json:"lastOp,omitempty"`
	History        []HistoryLine     `json:"history,omitempty"`
	Damage         string            `json:"damage,omitempty"`
}

// Target is one published target path of a volume.
type Target struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// ContentSource is what a volume was created from: a snapshot or a volume.
type ContentSource struct {
	SnapshotID string `json:"snapshotID,omitempty"`
	VolumeID   string `json:"volumeID,omitempty"`
}

// Snapshot is a snapshot as an operator sees it. See the package doc for
// the fields.
type Snapshot struct {
	ID             string            `json:"id"`
	Name           string            `json:"name,omitempty"`
	State          fsm.State         `json:"state"`
	SourceVolumeID string            `json:"sourceVolumeID,omitempty"`
	SourceDiskID   string            `json:"sourceDiskID,omitempty"`
	CloudID        string            `json:"cloudID,omitempty"`
	SizeBytes      int64             `json:"sizeBytes"`
	ReadyToUse     bool              `json:"readyToUse"`
	Zone           string            `json:"zone,omitempty"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	CutAt          time.Time         `json:"cutAt,omitzero"`
	Generation     uint64            `json:"generation"`
	CreatedAt      time.Time         `json:"createdAt,omitzero"`
	UpdatedAt      time.Time         `json:"updatedAt,omitzero"`
	PendingOp      *Op               `json:"pendingOp,omitempty"`
	LastOp         *Op               `json:"lastOp,omitempty"`
	History        []HistoryLine     `json:"history,omitempty"`
	Damage         string            `json:"damage,omitempty"`
}

// SnapshotList is the answer of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// Op is one accepted transition of one volume or snapshot: intent,
// progress and outcome. See the package doc for the fields.
type Op struct {
	Seq           uint64            `json:"seq"`
	VolumeID      string            `json:"volumeID,omitempty"`
	SnapshotID    string            `json:"snapshotID,omitempty"`
	Event         fsm.Event         `json:"event"`
	Guard         fsm.Guard         `json:"guard,omitempty"`
	From          fsm.State         `json:"from"`
	To            fsm.State         `json:"to"`
	Status        string            `json:"status"`
	Generation    uint64            `json:"generation"`
	Attempts      int               `json:"attempts,omitempty"`
	LastError     string            `json:"lastError,omitempty"`
	NextAttemptAt time.Time         `json:"nextAttemptAt,omitzero"`
	Code          string            `json:"code,omitempty"`
	Message       string            `json:"message,omitempty"`
	Args          json.RawMessage   `json:"args,omitempty"`
	Result        json.RawMessage   `json:"result,omitempty"`
	Checkpoints   map[string]string `json:"checkpoints,omitempty"`
	CreatedAt     time.Time         `json:"createdAt,omitzero"`
	FinishedAt    time.Time         `json:"finishedAt,omitzero"`
}

// Op statuses (Op.Status).
const (
	StatusQueued       = "queued"
	StatusCompensating = "compensating"
	StatusSucceeded    = "succeeded"
	StatusFailed       = "failed"
)

// Pending reports whether the op still has work to do (queued or
// compensating).
func (o *Op) Pending() bool { return o.Status == StatusQueued || o.Status == StatusCompensating }

// Resize is an entry of the deferred offline-resize queue. See the package
// doc for the fields.
type Resize struct {
	VolumeID      string    `json:"volumeID"`
	Status        string    `json:"status"`
	TargetBytes   int64     `json:"targetBytes"`
	CurrentBytes  int64     `json:"currentBytes"`
	VolumeState   fsm.State `json:"volumeState,omitempty"`
	Node          string    `json:"node,omitempty"`
	OpSeq         uint64    `json:"op,omitempty"`
	Attempts      int       `json:"attempts,omitempty"`
	LastError     string    `json:"lastError,omitempty"`
	QueuedAt      time.Time `json:"queuedAt,omitzero"`
	UpdatedAt     time.Time `json:"updatedAt,omitzero"`
	NextAttemptAt time.Time `json:"nextAttemptAt,omitzero"`
}

// Resize statuses (Resize.Status).
const (
	ResizeQueued  = "queued"
	ResizeRunning = "running"
)

// HistoryLine is one line of a volume's history. See the package doc for
// the fields.
type HistoryLine struct {
	Time       time.Time `json:"time"`
	Event      fsm.Event `json:"event"`
	Guard      fsm.Guard `json:"guard,omitempty"`
	From       fsm.State `json:"from"`
	To         fsm.State `json:"to"`
	Op         uint64    `json:"op,omitempty"`
	Generation uint64    `json:"generation"`
	Outcome    string    `json:"outcome"`
}

// VolumeList is the answer of GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// OpList is the answer of GET /v1/ops.
type OpList struct {
	Ops []Op `json:"ops"`
}

// ResizeList is the answer of GET /v1/resizes.
type ResizeList struct {
	Resizes []Resize `json:"resizes"`
}

// DamagedRecord is a record that fails its checksum or its decoding. See
// the package doc for the fields.
type DamagedRecord struct {
	Record     string `json:"record"`
	Bucket     string `json:"bucket"`
	Key        string `json:"key"`
	VolumeID   string `json:"volumeID,omitempty"`
	SnapshotID string `json:"snapshotID,omitempty"`
	Problem    string `json:"problem"`
	Message    string `json:"message"`
}

// DamageList is the answer of GET /v1/damaged.
type DamageList struct {
	Records []DamagedRecord `json:"records"`
}

// Info says which csid a source is (GET /v1/info).
type Info struct {
	// Mode is the services the csid serves: all, controller or node; ""
	// when unknown (a state file with an unusual name).
	Mode string `json:"mode"`
	// NodeID is the node a node or all-in-one csid serves.
	NodeID string `json:"nodeID,omitempty"`
	// StateFile is the state file's path.
	StateFile string `json:"stateFile"`
	// Schema is the state file's schema version.
	Schema int `json:"schema"`
	// PID and Version describe a live csid (absent for a state file).
	PID     int    `json:"pid,omitempty"`
	Version string `json:"version,omitempty"`
	// DriverName is a live csid's CSI driver name, and KubeletRoot the
	// kubelet directory a node or all-in-one csid is confined to ("" for
	// none): where kubelet keeps its volumes' mounts.
	DriverName  string `json:"driverName,omitempty"`
	KubeletRoot string `json:"kubeletRoot,omitempty"`
}

// VolumeFilter selects volumes; zero fields select all.
type VolumeFilter struct {
	State fsm.State
	Node  string
}

// OpSelect selects ops by status.
type OpSelect string

// Op selections.
const (
	OpsAll     OpSelect = "all"
	OpsPending OpSelect = "pending"
	OpsFailed  OpSelect = "failed"
)

// OpFilter selects ops; zero fields select all.
type OpFilter struct {
	Status     OpSelect
	VolumeID   string
	SnapshotID string
	// Limit caps the number of ops returned, newest first (0: no limit).
	Limit int
}
