// Package driver serves CSI (spec v1.13): the Identity, Controller and Node
// services. Handlers translate; they never act: each validates its request
// (InvalidArgument first, before any lookup), submits a transition to the
// operation engine, waits for the outcome within its context, and answers
// from the volume record. gRPC codes come from the engine's errors (chosen
// in one place, internal/ops) or from validation here.
//
// The driver never calls the cloud or the mounter; the read-only questions
// it needs answered (capacity, node limits, filesystem usage) go through the
// small Backend interfaces the caller provides.
package driver

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DefaultName is csid's default driver name (the CSIDriver object's name).
const DefaultName = "csid.csi.dev"

// Topology keys: the one segment csid reports and reads, the zone.
const (
	// TopologyKey is csid's own key, for backends whose zones are csid's
	// (the local backend, the fake).
	TopologyKey = "topology.csid.dev/zone"
	// ZoneTopologyKey is Kubernetes' well-known zone label, for a cloud
	// whose zones are the ones its nodes are labelled with.
	ZoneTopologyKey = "topology.kubernetes.io/zone"
)

// Mode says which services a csid process serves.
type Mode string

// Modes.
const (
	ModeAll        Mode = "all"
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
)

// Controller reports what the controller needs from the cloud.
type ControllerBackend interface {
	// Capacity is the bytes available for new volumes in a zone ("" for
	// the default).
	Capacity(ctx context.Context, zone string) (int64, error)
	// Zones lists the backend's zones; nil when it has no topology.
	Zones() []string
	// MaxVolumeBytes is the largest volume the backend can hold: a larger
	// size is OutOfRange, refused before anything is created, grown or
	// queued.
	MaxVolumeBytes() int64
}

// NodeInfo is what a node reports about itself.
type NodeInfo struct {
	ID string
	// MaxVolumes is the number of volumes the node can hold; 0 = unknown.
	MaxVolumes int64
	// Zone is the node's zone ("" without topology).
	Zone string
}

// VolumeStats is the usage of a staged or published volume.
type VolumeStats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
	// Block: only TotalBytes is meaningful.
	Block bool
}

// NodeBackend reports what the node service needs from the host.
type NodeBackend interface {
	Info(ctx context.Context) (NodeInfo, error)
	// Stats reports the usage at path; a path that does not exist is an
	// error wrapping fs.ErrNotExist.
	Stats(ctx context.Context, path string) (VolumeStats, error)
}

// Engine is the part of the operation engine the driver uses.
type Engine interface {
	Submit(ctx context.Context, req ops.Request) (ops.Outcome, error)
	Volume(id string) (*store.Volume, error)
	ListVolumes(after string, max int) ([]store.Volume, string, error)
	Snapshot(id string) (*store.Snapshot, error)
	ListSnapshots(after string, max int, sourceVolumeID string) ([]store.Snapshot, string, error)
	Ready() bool
}

// Config configures a Driver.
type Config struct {
	Name    string
	Version string
	Mode    Mode
	Engine  Engine
	// Controller is required in modes all and controller.
	Controller ControllerBackend
	// Node is required in modes all and node.
	Node NodeBackend
	// Topology: the backend has zones; csid advertises
	// VOLUME_ACCESSIBILITY_CONSTRAINTS.
	Topology bool
	// TopologyKey is the segment that names a zone; empty means
	// TopologyKey (csid's own).
	TopologyKey string
	// Snapshots: the backend takes snapshots and creates disks from
	// snapshots and other disks (cloud.Snapshotter), whatever the mode; a
	// controller advertises CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS,
	// GET_SNAPSHOT and CLONE_VOLUME, and serves them.
	Snapshots bool
	// DiskTypes are the provider's disk types (cloud.DiskTyper): a
	// StorageClass may name one with the parameter "type"; without any,
	// the parameter is refused.
	DiskTypes []string
	// KubeletRoot, when set, is kubelet's root directory: every staging
	// and target path of a node request must lie under it
	// (InvalidArgument otherwise). Empty: any absolute path (all-in-one,
	// the sanity suite). A volume path (NodeGetVolumeStats,
	// NodeExpandVolume) is not checked against it: it must be one of the
	// volume's recorded staging and target paths (NotFound otherwise),
	// which were.
	// Either way no symbolic link in a path is ever followed (the mounter
	// refuses them).
	KubeletRoot string
}

// Driver implements the CSI services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg Config
}

// New builds a Driver.
func New(cfg Config) (*Driver, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.TopologyKey == "" {
		cfg.TopologyKey = TopologyKey
	}
	switch cfg.Mode {
	case ModeAll, ModeController, ModeNode:
	default:
		return nil, fmt.Errorf("unknown mode %q (all, controller or node)", cfg.Mode)
	}
	if cfg.Mode != ModeNode && cfg.Controller == nil {
		return nil, fmt.Errorf("mode %s needs a controller backend", cfg.Mode)
	}
	if cfg.Mode != ModeController && cfg.Node == nil {
		return nil, fmt.Errorf("mode %s needs a node backend", cfg.Mode)
	}
	if r := cfg.KubeletRoot; r != "" && (!filepath.IsAbs(r) || filepath.Clean(r) != r || r == "/") {
		return nil, fmt.Errorf("kubelet root %q: want an absolute, clean path other than /", r)
	}
	return &Driver{cfg: cfg}, nil
}

// Register adds the services of the driver's mode to a gRPC server.
func (d *Driver) Register(s *grpc.Server) {
	csi.RegisterIdentityServer(s, d)
	if d.cfg.Mode != ModeNode {
		csi.RegisterControllerServer(s, d)
	}
	if d.cfg.Mode != ModeController {
		csi.RegisterNodeServer(s, d)
	}
}

// GetPluginInfo answers at once, also before recovery has finished.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.Name, VendorVersion: d.cfg.Version}, nil
}

// GetPluginCapabilities reports the same set in every mode (the CSI rule for
// one deployment): a controller service, topology when the backend has
// zones (and snapshot topology when it also takes snapshots), and offline
// volume expansion.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_OFFLINE}}},
	}
	if d.cfg.Topology {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}})
	}
	if d.cfg.Topology && d.cfg.Snapshots {
		// A snapshot is accessible from its source volume's zone, and
		// CreateSnapshot honours accessibility_requirements.
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is OK and ready once the engine has resumed every op left from an
// earlier run; before that it is OK but not ready (the sidecars wait).
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(d.cfg.Engine.Ready())}, nil
}
