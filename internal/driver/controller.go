package driver

import (
	"context"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ControllerGetCapabilities lists what the controller serves. It does not
// claim PUBLISH_READONLY (a read-only attachment needs a provider feature
// csid's backends lack); it claims snapshots (CREATE_DELETE_SNAPSHOT,
// LIST_SNAPSHOTS, GET_SNAPSHOT) and clones (CLONE_VOLUME) only when the
// backend takes them (Config.Snapshots).
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	if !d.cfg.Snapshots {
		return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
	}
	for _, t := range snapshotCaps {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume creates a volume, idempotently by name (and content
// source): empty, restored from a snapshot, or cloned from a volume.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkName(req.GetName()); err != nil {
		return nil, err
	}
	c, why, err := capabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, invalid("%s", why)
	}
	if err := checkParameters(req.GetParameters(), d.cfg.DiskTypes); err != nil {
		return nil, err
	}
	src, err := d.contentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	if len(req.GetMutableParameters()) > 0 {
		return nil, invalid("csid has no mutable parameters")
	}
	size, required, limit, err := sizeFor(req.GetCapacityRange(), DefaultVolumeBytes, d.cfg.Controller.MaxVolumeBytes())
	if err != nil {
		return nil, err
	}
	if c.FsType == "xfs" && size < MinXFSBytes {
		if limit > 0 && limit < MinXFSBytes {
			return nil, status.Errorf(codes.OutOfRange, "an xfs volume needs at least %d bytes; the limit is %d", MinXFSBytes, limit)
		}
		size = MinXFSBytes
	}
	zones, err := d.zones(req.GetAccessibilityRequirements())
	if err != nil {
		return nil, err
	}
	out, err := d.cfg.Engine.Submit(ctx, ops.Request{Event: fsm.Create, Args: &ops.CreateArgs{
		Name: req.GetName(), SizeBytes: size, RequiredBytes: required, LimitBytes: limit,
		Parameters: req.GetParameters(), Capability: c, Zones: zones, Source: src}})
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: d.volume(&out.Volume)}, nil
}

// zones reads the zones a volume may be created in from the accessibility
// requirements: the preferred ones first (within the requisite ones, if
// any), then the rest of the requisite ones.
func (d *Driver) zones(tr *csi.TopologyRequirement) ([]string, error) {
	if tr == nil || !d.cfg.Topology {
		return nil, nil
	}
	zoneOf := func(t *csi.Topology) (string, error) {
		z, ok := t.GetSegments()[d.cfg.TopologyKey]
		if !ok || len(t.GetSegments()) != 1 {
			return "", invalid("topology %v: csid knows one segment, %s", t.GetSegments(), d.cfg.TopologyKey)
		}
		return z, nil
	}
	var requisite, out []string
	for _, t := range tr.GetRequisite() {
		z, err := zoneOf(t)
		if err != nil {
			return nil, err
		}
		requisite = append(requisite, z)
	}
	for _, t := range tr.GetPreferred() {
		z, err := zoneOf(t)
		if err != nil {
			return nil, err
		}
		if (len(requisite) == 0 || slices.Contains(requisite, z)) && !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	for _, z := range requisite {
		if !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	return out, nil
}

// volume is the CSI view of a volume record.
func (d *Driver) volume(v *store.Volume) *csi.Volume {
	cv := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, ContentSource: volumeSource(v.Source)}
	if d.cfg.Topology && v.Zone != "" {
		cv.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{d.cfg.TopologyKey: v.Zone}}}
	}
	return cv
}

// DeleteVolume deletes a detached volume; an unknown volume is success.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.Delete}); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume attaches a volume to a node. A volume with a
// resize queued or running is attached only after the resize.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	c, err := capability(req.GetVolumeCapability(), codes.InvalidArgument)
	if err != nil {
		return nil, err
	}
	if req.GetReadonly() {
		return nil, invalid("csid does not attach disks read-only (no PUBLISH_READONLY); publish read-only on the node instead")
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	out, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.ControllerPublish,
		Args: &ops.ControllerPublishArgs{Node: req.GetNodeId(), Capability: c}})
	if err != nil {
		return nil, err
	}
	var pc map[string]string
	if out.Volume.Attachment != nil {
		pc = out.Volume.Attachment.PublishContext
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// ControllerUnpublishVolume detaches a volume (from node_id, or from
// wherever it is). Not attached there, or unknown: success. Its commit starts
// a queued resize.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.ControllerUnpublish,
		Args: &ops.ControllerUnpublishArgs{Node: req.GetNodeId()}}); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities csid supports for the
// volume, or explains, without an error, why it does not.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	c, why, err := capabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if why == "" && v.Capability.AccessType != c.AccessType {
		why = unsupported("volume " + v.ID + " is a " + v.Capability.AccessType + " volume")
	}
	if why == "" {
		if err := checkParameters(req.GetParameters(), d.cfg.DiskTypes); err != nil {
			why = unsupported(status.Convert(err).Message())
		}
	}
	if why != "" {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: string(why)}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

// lookup reads a volume record; an unknown volume is NotFound.
func (d *Driver) lookup(id string) (*store.Volume, error) {
	return lookupRecord("volume", id, knownVolumeID, d.cfg.Engine.Volume)
}

// lookupRecord reads the record of a kind ("volume", "snapshot") with get;
// an id not of csid's shape (known) or without a record is NotFound.
func lookupRecord[T any](kind, id string, known func(string) bool, get func(string) (*T, error)) (*T, error) {
	if !known(id) {
		return nil, status.Errorf(codes.NotFound, "%s %s does not exist", kind, id)
	}
	r, err := get(id)
	if err != nil {
		return nil, err // an *ops.Error: DataLoss for a damaged record, else Internal
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "%s %s does not exist", kind, id)
	}
	return r, nil
}

// ListVolumes pages through the volumes in id order. A token is the id of
// the last volume of the previous page, so deletions between pages never
// break paging; a token that is not a volume id is Aborted (start again).
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := checkPage(req.GetMaxEntries(), req.GetStartingToken(), knownVolumeID); err != nil {
		return nil, err
	}
	vols, next, err := d.cfg.Engine.ListVolumes(req.GetStartingToken(), int(req.GetMaxEntries()))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list volumes: %v", err)
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for i := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: d.volume(&vols[i]),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: publishedNodes(&vols[i])}})
	}
	return resp, nil
}

// checkPage checks a list's page request: max_entries must not be
// negative, and a starting token must be one csid gave (an id of the
// listed kind, known); anything else is Aborted: list again from the start.
func checkPage(max int32, token string, known func(string) bool) error {
	if max < 0 {
		return invalid("max_entries must not be negative")
	}
	if token != "" && !known(token) {
		return status.Errorf(codes.Aborted, "starting_token %q is not a token csid gave; list again from the start", token)
	}
	return nil
}

func publishedNodes(v *store.Volume) []string {
	if n := v.Node(); n != "" {
		return []string{n}
	}
	return nil
}

// ControllerGetVolume reports one volume and where it is published.
func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{Volume: d.volume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: publishedNodes(v)}}, nil
}

// GetCapacity reports the free capacity of the zone asked for (the default
// zone without topology).
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	zone := ""
	if t := req.GetAccessibleTopology(); t != nil && d.cfg.Topology {
		z, ok := t.GetSegments()[d.cfg.TopologyKey]
		if !ok || !slices.Contains(d.cfg.Controller.Zones(), z) {
			return &csi.GetCapacityResponse{}, nil // a topology csid does not serve has no capacity here
		}
		zone = z
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, why, err := toCapability(vc); err != nil {
			return nil, err
		} else if why != "" {
			return &csi.GetCapacityResponse{}, nil // no capacity for what csid cannot create
		}
	}
	if checkParameters(req.GetParameters(), d.cfg.DiskTypes) != nil {
		return &csi.GetCapacityResponse{}, nil
	}
	avail, err := d.cfg.Controller.Capacity(ctx, zone)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "capacity of zone %q: %v", zone, err)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail,
		MaximumVolumeSize: wrapperspb.Int64(min(avail/MiB*MiB, d.cfg.Controller.MaxVolumeBytes())),
		MinimumVolumeSize: wrapperspb.Int64(MiB)}, nil
}

// ControllerExpandVolume grows a detached volume, answering only once the
// cloud reports the new size; for an attached volume it queues the resize
// durably and answers FailedPrecondition until the volume is unpublished.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil || (req.GetCapacityRange().GetRequiredBytes() == 0 && req.GetCapacityRange().GetLimitBytes() == 0) {
		return nil, invalid("capacity_range is required")
	}
	var c store.Capability
	if vc := req.GetVolumeCapability(); vc != nil {
		var err error
		if c, err = capability(vc, codes.InvalidArgument); err != nil {
			return nil, err
		}
	}
	size, _, limit, err := sizeFor(req.GetCapacityRange(), 0, d.cfg.Controller.MaxVolumeBytes())
	if err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	out, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.Expand,
		Args: &ops.ExpandArgs{RequiredBytes: size, LimitBytes: limit, AccessType: c.AccessType}})
	if err != nil {
		return nil, err
	}
	// The volume's own access type decides (the engine refused another).
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: out.Volume.CapacityBytes,
		NodeExpansionRequired: out.Volume.Capability.AccessType != "block"}, nil
}
