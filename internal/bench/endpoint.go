package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// endpoint is a driver the run measures: the one under test or, with
// Config.Baseline, the one it is compared with, measured in the same run.
// Each has its own connection, capabilities, node and journal.
type endpoint struct {
	addr     string
	baseline bool
	conn     *grpc.ClientConn
	csi      client
	caps     caps
	nodeID   string
	vc       *csi.VolumeCapability
	header   journalHeader // the creation arguments, also of the journal
	jrnl     *journal
	info     Target // for the report
	// ids holds every volume id the run created on this endpoint (guarded
	// by runner.mu): ListVolumes reports ids, and ids of two drivers may
	// coincide.
	ids map[string]bool
}

// client speaks CSI.
type client struct {
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

// caps is what the driver advertises, as far as the bench cares.
type caps struct {
	controller, createDelete, publish, list bool
	node, stage                             bool
	topology                                bool
}

func (c caps) names() []string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{c.controller, "CONTROLLER_SERVICE"}, {c.topology, "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
		{c.createDelete, "CREATE_DELETE_VOLUME"}, {c.publish, "PUBLISH_UNPUBLISH_VOLUME"}, {c.list, "LIST_VOLUMES"},
		{c.node, "NODE_SERVICE"}, {c.stage, "STAGE_UNSTAGE_VOLUME"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	return out
}

// grpcTarget turns an endpoint into a gRPC target.
func grpcTarget(endpoint string) string {
	if strings.HasPrefix(endpoint, "/") {
		return "unix://" + endpoint
	}
	return endpoint
}

// dial connects to the driver at addr (gRPC connects lazily: discover's
// first call tells whether it answers).
func dial(addr string, baseline bool) (*endpoint, error) {
	conn, err := grpc.NewClient(grpcTarget(addr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", addr, err)
	}
	return &endpoint{addr: addr, baseline: baseline, conn: conn, ids: map[string]bool{},
		csi: client{csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)}}, nil
}

// role names the endpoint in messages.
func (ep *endpoint) role() string {
	if ep.baseline {
		return "baseline " + ep.addr
	}
	return ep.addr
}

// discover asks the driver who it is and what it serves, and the node's id
// and topology. nodeID, if set, is the node to publish to instead of
// NodeGetInfo's.
func (ep *endpoint) discover(ctx context.Context, cfg *Config, nodeID string) error {
	info, err := ep.csi.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("GetPluginInfo on %s: %w", ep.role(), err)
	}
	pc, err := ep.csi.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return fmt.Errorf("GetPluginCapabilities on %s: %w", ep.role(), err)
	}
	for _, c := range pc.GetCapabilities() {
		switch c.GetService().GetType() {
		case csi.PluginCapability_Service_CONTROLLER_SERVICE:
			ep.caps.controller = true
		case csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
			ep.caps.topology = true
		}
	}
	if err := ep.discoverController(ctx); err != nil {
		return err
	}
	topology, err := ep.discoverNode(ctx, nodeID)
	if err != nil {
		return err
	}
	ep.header = journalHeader{Endpoint: ep.addr, NodeID: ep.nodeID, Topology: topology, SizeBytes: cfg.SizeBytes,
		AccessType: cfg.AccessType, FsType: cfg.FsType, Parameters: cfg.Parameters, PID: os.Getpid()}
	ep.vc = capability(ep.header)
	ep.info = Target{Endpoint: ep.addr, Driver: info.GetName(), Version: info.GetVendorVersion(),
		NodeID: ep.nodeID, Capabilities: ep.caps.names()}
	if ep.caps.list {
		ids, err := ep.listIDs(ctx, cfg.Timeout)
		if err != nil {
			return err
		}
		ep.info.VolumesBefore = len(ids)
	}
	return nil
}

// discoverController reads the controller's capabilities, if it serves any.
func (ep *endpoint) discoverController(ctx context.Context) error {
	cc, err := ep.csi.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if status.Code(err) == codes.Unimplemented {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ControllerGetCapabilities on %s: %w", ep.role(), err)
	}
	for _, c := range cc.GetCapabilities() {
		switch c.GetRpc().GetType() {
		case csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME:
			ep.caps.createDelete = true
		case csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME:
			ep.caps.publish = true
		case csi.ControllerServiceCapability_RPC_LIST_VOLUMES:
			ep.caps.list = true
		}
	}
	return nil
}

// discoverNode reads the node's capabilities, id and topology, if it
// serves the Node service; nodeID, if set, replaces the id.
func (ep *endpoint) discoverNode(ctx context.Context, nodeID string) (topology map[string]string, err error) {
	ep.nodeID = nodeID
	nc, err := ep.csi.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if status.Code(err) == codes.Unimplemented {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("NodeGetCapabilities on %s: %w", ep.role(), err)
	}
	ep.caps.node = true
	for _, c := range nc.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			ep.caps.stage = true
		}
	}
	ni, err := ep.csi.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("NodeGetInfo on %s: %w", ep.role(), err)
	}
	if ep.nodeID == "" {
		ep.nodeID = ni.GetNodeId()
	}
	if ep.caps.topology {
		topology = ni.GetAccessibleTopology().GetSegments()
	}
	return topology, nil
}

// checkPhases refuses phases the driver cannot serve.
func (ep *endpoint) checkPhases(phases []Phase) error {
	for _, p := range phases {
		if p != PhaseProbe && !ep.caps.createDelete {
			return fmt.Errorf("phase %s needs CREATE_DELETE_VOLUME, which %s does not advertise", p, ep.role())
		}
		if p == PhaseLifecycle && !ep.caps.node {
			return fmt.Errorf("phase lifecycle needs the Node service, which %s does not serve", ep.role())
		}
	}
	return nil
}

// capability is the volume capability of a run.
func capability(h journalHeader) *csi.VolumeCapability {
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if h.AccessType == "block" {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: h.FsType}}
	}
	return vc
}

// createRequest is the CreateVolume of a volume: the same for a run and
// for whoever cleans up after it (CreateVolume is idempotent by name only
// for identical arguments).
func createRequest(name string, h journalHeader) *csi.CreateVolumeRequest {
	req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: h.SizeBytes},
		VolumeCapabilities: []*csi.VolumeCapability{capability(h)}, Parameters: h.Parameters}
	if len(h.Topology) > 0 {
		t := &csi.Topology{Segments: h.Topology}
		req.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{t}, Preferred: []*csi.Topology{t}}
	}
	return req
}

// listIDs pages through ListVolumes, each page within timeout.
func (ep *endpoint) listIDs(ctx context.Context, timeout time.Duration) ([]string, error) {
	var ids []string
	token := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := ep.csi.ListVolumes(cctx, &csi.ListVolumesRequest{MaxEntries: 1000, StartingToken: token})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ListVolumes on %s: %w", ep.role(), err)
		}
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolume().GetVolumeId())
		}
		if token = resp.GetNextToken(); token == "" {
			return ids, nil
		}
	}
}
