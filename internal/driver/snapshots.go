package driver

import (
	"context"
	"regexp"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// snapshotIDPattern is the shape of the snapshot ids csid hands out.
var snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{20}$`)

// knownSnapshotID reports whether id has the shape of a csid snapshot id.
// Any other id names no snapshot (NotFound, or success for DeleteSnapshot,
// an empty list for ListSnapshots); it is never used further.
func knownSnapshotID(id string) bool { return snapshotIDPattern.MatchString(id) }

// snapshotCaps are the controller capabilities of a controller whose
// backend takes snapshots.
var snapshotCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
}

// noSnapshots is the answer of a snapshot RPC on a backend without
// snapshots (the capability is not advertised).
func noSnapshots() error {
	return status.Error(codes.Unimplemented, "this csid's backend takes no snapshots")
}

// contentSource reads CreateVolume's volume_content_source: nil for none.
// A source on a backend without snapshots is InvalidArgument; a source
// whose id is not of csid's shape names nothing (NotFound).
func (d *Driver) contentSource(src *csi.VolumeContentSource) (*ops.ContentSource, error) {
	if src == nil {
		return nil, nil
	}
	if !d.cfg.Snapshots {
		return nil, invalid("this csid's backend creates no volumes from snapshots or other volumes")
	}
	switch {
	case src.GetSnapshot() != nil:
		id := src.GetSnapshot().GetSnapshotId()
		if err := required("volume_content_source.snapshot.snapshot_id", id); err != nil {
			return nil, err
		}
		if !knownSnapshotID(id) {
			return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist", id)
		}
		return &ops.ContentSource{SnapshotID: id}, nil
	case src.GetVolume() != nil:
		id := src.GetVolume().GetVolumeId()
		if err := required("volume_content_source.volume.volume_id", id); err != nil {
			return nil, err
		}
		if !knownVolumeID(id) {
			return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
		}
		return &ops.ContentSource{VolumeID: id}, nil
	}
	return nil, invalid("volume_content_source names neither a snapshot nor a volume")
}

// volumeSource is the CSI content source of a volume record.
func volumeSource(src *store.Source) *csi.VolumeContentSource {
	switch {
	case src == nil:
		return nil
	case src.SnapshotID != "":
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: src.SnapshotID}}}
	default:
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.VolumeID}}}
	}
}

// snapshot is the CSI view of a snapshot record. It leaves out the
// optional accessible_topology (the snapshot is accessible from its
// source volume's zone, which CreateSnapshot checks against the requested
// topology): csi-test v5.6.0 compares a reported topology with the
// requested one by reflect.DeepEqual, which a protobuf message's size
// cache makes unequal.
func (d *Driver) snapshot(s *store.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{SnapshotId: s.ID, SourceVolumeId: s.SourceVolumeID, SizeBytes: s.SizeBytes,
		CreationTime: timestamppb.New(s.CutAt), ReadyToUse: s.ReadyToUse}
}

// CreateSnapshot takes a snapshot of a volume, idempotently by name: the
// same name of the same volume answers the same snapshot; of another
// volume, AlreadyExists. It answers once the provider has cut the
// snapshot.
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if !d.cfg.Snapshots {
		return nil, noSnapshots()
	}
	if err := checkName(req.GetName()); err != nil {
		return nil, err
	}
	if err := required("source_volume_id", req.GetSourceVolumeId()); err != nil {
		return nil, err
	}
	if err := checkParameters(req.GetParameters(), nil); err != nil {
		return nil, err
	}
	zones, err := d.zones(req.GetAccessibilityRequirements())
	if err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetSourceVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetSourceVolumeId())
	}
	out, err := d.cfg.Engine.Submit(ctx, ops.Request{Event: fsm.SnapshotCreate, Args: &ops.SnapshotCreateArgs{
		Name: req.GetName(), SourceVolumeID: req.GetSourceVolumeId(), Parameters: req.GetParameters(), Zones: zones}})
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: d.snapshot(&out.Snapshot)}, nil
}

// DeleteSnapshot deletes a snapshot; an unknown snapshot is success.
// Volumes restored from it are not affected.
func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if !d.cfg.Snapshots {
		return nil, noSnapshots()
	}
	if err := required("snapshot_id", req.GetSnapshotId()); err != nil {
		return nil, err
	}
	if !knownSnapshotID(req.GetSnapshotId()) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{SnapshotID: req.GetSnapshotId(), Event: fsm.SnapshotDelete}); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages through the snapshots that are cut, in id order,
// filtered by snapshot id or source volume. A token is the id of the last
// snapshot of the previous page, so deletions between pages never break
// paging; a token that is not a snapshot id is Aborted (start again). An
// unknown snapshot or volume is an empty list.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if !d.cfg.Snapshots {
		return nil, noSnapshots()
	}
	if err := checkPage(req.GetMaxEntries(), req.GetStartingToken(), knownSnapshotID); err != nil {
		return nil, err
	}
	src := req.GetSourceVolumeId()
	if src != "" && !knownVolumeID(src) {
		return &csi.ListSnapshotsResponse{}, nil
	}
	if id := req.GetSnapshotId(); id != "" {
		s, err := d.lookupSnapshot(id)
		if status.Code(err) == codes.NotFound || (err == nil && src != "" && s.SourceVolumeID != src) {
			return &csi.ListSnapshotsResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		return &csi.ListSnapshotsResponse{Entries: []*csi.ListSnapshotsResponse_Entry{{Snapshot: d.snapshot(s)}}}, nil
	}
	snaps, next, err := d.cfg.Engine.ListSnapshots(req.GetStartingToken(), int(req.GetMaxEntries()), src)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for i := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.snapshot(&snaps[i])})
	}
	return resp, nil
}

// GetSnapshot reports one snapshot that is cut; an unknown one (or one
// still being cut, whose id no CreateSnapshot has answered yet) is
// NotFound.
func (d *Driver) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if !d.cfg.Snapshots {
		return nil, noSnapshots()
	}
	if err := required("snapshot_id", req.GetSnapshotId()); err != nil {
		return nil, err
	}
	s, err := d.lookupSnapshot(req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: d.snapshot(s)}, nil
}

// lookupSnapshot reads a snapshot record; an unknown snapshot is NotFound.
func (d *Driver) lookupSnapshot(id string) (*store.Snapshot, error) {
	return lookupRecord("snapshot", id, knownSnapshotID, d.cfg.Engine.Snapshot)
}
