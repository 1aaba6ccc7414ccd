package ops

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Request asks the engine for one transition of one volume, or of one
// snapshot (the snapshot lifecycle's events, fsm.Event.OfSnapshot).
type Request struct {
	// VolumeID is the volume; empty for create (the engine assigns it)
	// and for a snapshot's events.
	VolumeID string
	// SnapshotID is the snapshot of a snapshot_delete; empty otherwise
	// (snapshot_create: the engine assigns it).
	SnapshotID string
	Event      fsm.Event
	// Args is a pointer to the event's argument struct (*CreateArgs for
	// create, and so on; nil for delete and snapshot_delete).
	Args any
}

// subject is the volume or snapshot the request is about, for messages.
func (r Request) subject() string {
	if r.Event.OfSnapshot() {
		return "snapshot " + r.SnapshotID
	}
	return "volume " + r.VolumeID
}

// ParamDiskType is the StorageClass parameter that names the disk type, on
// a provider whose disks have types (cloud.DiskTyper); csid refuses it
// elsewhere.
const ParamDiskType = "type"

// CreateArgs are the arguments of create.
type CreateArgs struct {
	// Name is the CO's name for the volume: the idempotency key.
	Name string `json:"name"`
	// SizeBytes is the size to create, chosen by the caller within
	// [RequiredBytes, LimitBytes].
	SizeBytes     int64 `json:"sizeBytes"`
	RequiredBytes int64 `json:"requiredBytes,omitempty"`
	// LimitBytes is 0 when unlimited.
	LimitBytes int64             `json:"limitBytes,omitempty"`
	Parameters map[string]string `json:"parameters,omitempty"`
	Capability store.Capability  `json:"capability"`
	// Zones are the zones the volume may be created in, in order of
	// preference; empty means the provider's default.
	Zones []string `json:"zones,omitempty"`
	// Source, when set, is what the volume's content is copied from (CSI's
	// volume_content_source); part of the name's idempotency: the same
	// name with another source is AlreadyExists. When the caller asked for
	// no size (RequiredBytes and LimitBytes 0), the volume takes the
	// source's; a size below the source's is raised to it within
	// LimitBytes (OutOfRange beyond).
	Source *ContentSource `json:"source,omitempty"`
}

// ContentSource names what a new volume is copied from: exactly one of a
// snapshot and a volume, by csid's ids.
type ContentSource struct {
	SnapshotID string `json:"snapshotID,omitempty"`
	VolumeID   string `json:"volumeID,omitempty"`
}

// SnapshotCreateArgs are the arguments of snapshot_create.
type SnapshotCreateArgs struct {
	// Name is the CO's name for the snapshot: the idempotency key.
	Name string `json:"name"`
	// SourceVolumeID is the volume to snapshot.
	SourceVolumeID string            `json:"sourceVolumeID"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	// Zones, when set, are the zones the snapshot must be accessible from
	// (one of them): the source volume's zone must be one.
	Zones []string `json:"zones,omitempty"`
}

// SnapshotDeleteArgs are the arguments of snapshot_delete (none).
type SnapshotDeleteArgs struct{}

// ControllerPublishArgs are the arguments of controller_publish.
type ControllerPublishArgs struct {
	Node       string           `json:"node"`
	ReadOnly   bool             `json:"readOnly,omitempty"`
	Capability store.Capability `json:"capability"`
}

// ControllerUnpublishArgs are the arguments of controller_unpublish.
type ControllerUnpublishArgs struct {
	// Node is the node to unpublish from; "" means whichever it is on.
	Node string `json:"node,omitempty"`
}

// NodeStageArgs are the arguments of node_stage.
type NodeStageArgs struct {
	StagingPath    string            `json:"stagingPath"`
	Capability     store.Capability  `json:"capability"`
	PublishContext map[string]string `json:"publishContext,omitempty"`
}

// NodeUnstageArgs are the arguments of node_unstage.
type NodeUnstageArgs struct {
	StagingPath string `json:"stagingPath"`
}

// NodePublishArgs are the arguments of node_publish.
type NodePublishArgs struct {
	TargetPath  string           `json:"targetPath"`
	StagingPath string           `json:"stagingPath"`
	ReadOnly    bool             `json:"readOnly,omitempty"`
	Capability  store.Capability `json:"capability"`
}

// NodeUnpublishArgs are the arguments of node_unpublish.
type NodeUnpublishArgs struct {
	TargetPath string `json:"targetPath"`
}

// ExpandArgs are the arguments of expand.
type ExpandArgs struct {
	// RequiredBytes is the size to grow to (at least).
	RequiredBytes int64 `json:"requiredBytes"`
	// LimitBytes is 0 when unlimited; a volume already larger than it
	// would have to shrink, which is refused.
	LimitBytes int64 `json:"limitBytes,omitempty"`
	// AccessType is the access type the CO says the volume has ("" when it
	// does not say); another than the volume's is refused.
	AccessType string `json:"accessType,omitempty"`
}

// NodeExpandArgs are the arguments of node_expand.
type NodeExpandArgs struct {
	// VolumePath is where the volume is staged or published.
	VolumePath    string `json:"volumePath"`
	RequiredBytes int64  `json:"requiredBytes,omitempty"`
}

// DeleteArgs are the arguments of delete (none).
type DeleteArgs struct{}

// argsType checks that a request carries the argument type of its event.
func argsType(e fsm.Event, a any) error {
	ok := false
	switch e {
	case fsm.Create:
		_, ok = a.(*CreateArgs)
	case fsm.Delete:
		ok = a == nil
		if !ok {
			_, ok = a.(*DeleteArgs)
		}
	case fsm.ControllerPublish:
		_, ok = a.(*ControllerPublishArgs)
	case fsm.ControllerUnpublish:
		_, ok = a.(*ControllerUnpublishArgs)
	case fsm.NodeStage:
		_, ok = a.(*NodeStageArgs)
	case fsm.NodeUnstage:
		_, ok = a.(*NodeUnstageArgs)
	case fsm.NodePublish:
		_, ok = a.(*NodePublishArgs)
	case fsm.NodeUnpublish:
		_, ok = a.(*NodeUnpublishArgs)
	case fsm.Expand:
		_, ok = a.(*ExpandArgs)
	case fsm.NodeExpand:
		_, ok = a.(*NodeExpandArgs)
	case fsm.SnapshotCreate:
		_, ok = a.(*SnapshotCreateArgs)
	case fsm.SnapshotDelete:
		ok = a == nil
		if !ok {
			_, ok = a.(*SnapshotDeleteArgs)
		}
	default:
		return fmt.Errorf("ops: unknown event %q", e)
	}
	if !ok {
		return fmt.Errorf("ops: event %s with arguments of type %T", e, a)
	}
	return nil
}

// encodeArgs returns the stored form of the args and their fingerprint.
func encodeArgs(a any) (json.RawMessage, string) {
	if a == nil {
		a = &DeleteArgs{}
	}
	raw, err := json.Marshal(a)
	if err != nil {
		panic(err) // the arg structs marshal by construction
	}
	return raw, fingerprint(raw)
}

func fingerprint(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:12])
}

// capFingerprint identifies a capability for compatibility checks.
func capFingerprint(c store.Capability, extra ...any) string {
	raw, _ := json.Marshal(append([]any{c}, extra...))
	return fingerprint(raw)
}

// DecodeArgs decodes an op's stored arguments.
func DecodeArgs[T any](op *store.Op) (*T, error) {
	v := new(T)
	if len(op.Args) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(op.Args, v); err != nil {
		return nil, fmt.Errorf("op %d: decode %s args: %w", op.Seq, op.Event, err)
	}
	return v, nil
}

// Result is what an executor reports; the engine folds it into the volume
// (or snapshot) record when it commits the op.
type Result struct {
	// DiskID, CapacityBytes and Zone: create (and CapacityBytes: expand;
	// snapshot_create: the snapshot's size).
	DiskID        string `json:"diskID,omitempty"`
	CapacityBytes int64  `json:"capacityBytes,omitempty"`
	Zone          string `json:"zone,omitempty"`
	// CloudSnapshotID, ReadyToUse and CutAt: snapshot_create, the
	// provider's snapshot.
	CloudSnapshotID string    `json:"cloudSnapshotID,omitempty"`
	ReadyToUse      bool      `json:"readyToUse,omitempty"`
	CutAt           time.Time `json:"cutAt,omitzero"`
	// PublishContext: controller_publish.
	PublishContext map[string]string `json:"publishContext,omitempty"`
	// Device: node_stage, and node_publish: the device proven to be the
	// volume's disk (the record keeps it as the next op's first guess).
	Device string `json:"device,omitempty"`
}

// Outcome is what Submit returns on success.
type Outcome struct {
	// Volume is the record as the op left it (or as it was found, for a
	// request that was already satisfied).
	Volume store.Volume
	// Snapshot is the same for a snapshot's request.
	Snapshot store.Snapshot
	// OpSeq is the op that produced the outcome; 0 when the request was
	// already satisfied and no op ran.
	OpSeq uint64
}
