package driver

import (
	"context"
	"errors"
	"io/fs"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NodeGetCapabilities lists what the node serves.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo reports the node's id, how many volumes it can hold, and its
// zone.
func (d *Driver) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	info, err := d.cfg.Node.Info(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "node info: %v", err)
	}
	resp := &csi.NodeGetInfoResponse{NodeId: info.ID, MaxVolumesPerNode: info.MaxVolumes}
	if d.cfg.Topology && info.Zone != "" {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{d.cfg.TopologyKey: info.Zone}}
	}
	return resp, nil
}

// NodeStageVolume finds the volume's device and, for a filesystem volume,
// formats it if (and only if) it is provably blank, mounts it at the staging
// path and grows the filesystem to the device.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.nodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	c, err := capability(req.GetVolumeCapability(), codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.NodeStage,
		Args: &ops.NodeStageArgs{StagingPath: req.GetStagingTargetPath(), Capability: c, PublishContext: req.GetPublishContext()}}); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume unmounts the staging path. Not staged there, or an
// unknown volume: success.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.nodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.NodeUnstage,
		Args: &ops.NodeUnstageArgs{StagingPath: req.GetStagingTargetPath()}}); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged volume (or, for a raw block
// volume, its device) at the target path, which it creates.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.nodePath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	c, err := capability(req.GetVolumeCapability(), codes.FailedPrecondition)
	if err != nil {
		return nil, err
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.FailedPrecondition, "staging_target_path is required: csid stages volumes (STAGE_UNSTAGE_VOLUME)")
	}
	if err := d.nodePath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := separatePaths(req.GetTargetPath(), req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.NodePublish,
		Args: &ops.NodePublishArgs{TargetPath: req.GetTargetPath(), StagingPath: req.GetStagingTargetPath(),
			ReadOnly: req.GetReadonly(), Capability: c}}); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target and removes it. Not published
// there, or an unknown volume: success.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.nodePath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if _, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.NodeUnpublish,
		Args: &ops.NodeUnpublishArgs{TargetPath: req.GetTargetPath()}}); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports the usage of a volume where it is staged or
// published; anywhere else (or a path that does not exist) is NotFound.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := required("volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	p := req.GetVolumePath()
	_, published := v.Targets[p]
	if !published && (v.Stage == nil || v.Stage.Path != p) {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged or published at %s", v.ID, p)
	}
	st, err := d.cfg.Node.Stats(ctx, p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "%s does not exist", p)
	} else if err != nil {
		return nil, status.Errorf(codes.Internal, "stats of %s: %v", p, err)
	}
	if st.Block {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes}}}, nil
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}

// NodeExpandVolume grows the staged filesystem to its device. A raw block
// volume has nothing to grow.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := required("volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		// NodeExpandVolume's table: capabilities the volume cannot have are
		// InvalidArgument (FailedPrecondition would tell the CO never to
		// retry the expansion).
		if _, err := capability(vc, codes.InvalidArgument); err != nil {
			return nil, err
		}
	}
	if req.GetCapacityRange().GetRequiredBytes() < 0 || req.GetCapacityRange().GetLimitBytes() < 0 {
		return nil, invalid("capacity_range must not be negative")
	}
	if !knownVolumeID(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	out, err := d.cfg.Engine.Submit(ctx, ops.Request{VolumeID: req.GetVolumeId(), Event: fsm.NodeExpand,
		Args: &ops.NodeExpandArgs{VolumePath: req.GetVolumePath(), RequiredBytes: req.GetCapacityRange().GetRequiredBytes()}})
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: out.Volume.CapacityBytes}, nil
}
