package app_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// malformed is one row of TestMalformedRequests: a request (its RPC is the
// one that takes that request type), the code csid must answer, and a
// substring of the message, so that the message names the field or the
// problem. For OK rows, check (if set) inspects the response.
type malformed struct {
	name  string
	req   proto.Message
	code  codes.Code
	msg   string
	check func(t *testing.T, resp proto.Message)
}

// TestMalformedRequests sends malformed requests to every RPC of the
// Identity, Controller and Node services of a real csid (local backend):
// missing ids, unknown ids, relative and ".." paths, unsupported
// capabilities, oversized names, huge and negative sizes. Each must get the
// code of the CSI spec (csi-spec-digest.md, sections 1, 2 and 7.5) with a
// message naming the problem. Afterwards nothing may have been created,
// attached or mounted: the local cloud has no disk, the host no loop device
// of the state dir and no mount under it, and no path a request named
// exists.
func TestMalformedRequests(t *testing.T) {
	testutil.RequireRoot(t)
	in := apptest.Start(t, app.Options{Cloud: "local", Log: zerolog.Nop()})
	h := newHostView(t, in.Dir)
	c := apptest.Dial(t, in.Socket)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// outside is a directory outside the state dir; every absolute path
	// the requests name lies in it (or resolves into it), and it must still
	// be empty at the end.
	outside := apptest.ShortTempDir(t)
	// rel is the first element of every relative path the requests name;
	// relative to csid's working directory (this process's), it must never
	// appear.
	rel := "csid-malformed-" + randomHex(4)
	// escape is where an absolute path with ".." would land above outside.
	escape := filepath.Join(filepath.Dir(outside), "csid-escape-"+randomHex(4))

	// A real volume, never published: rows about known volumes use it.
	vc := mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	realVol, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "malformed-real",
		VolumeCapabilities: []*csi.VolumeCapability{vc}, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}})
	if err != nil {
		t.Fatal(err)
	}
	realID := realVol.GetVolume().GetVolumeId()
	var created []string // volumes the OK rows of CreateVolume made
	rows := malformedRows(malformedFixture{realID: realID, vc: vc, outside: outside, rel: rel, escape: escape,
		created: func(id string) { created = append(created, id) }})

	methods := csiMethods(t)
	covered := map[string]bool{}
	for _, row := range rows {
		m, ok := methods[row.req.ProtoReflect().Descriptor().FullName()]
		if !ok {
			t.Fatalf("row %q: no CSI RPC takes a %T", row.name, row.req)
		}
		covered[m.name] = true
		t.Run(m.short+"/"+row.name, func(t *testing.T) {
			resp := m.newResponse()
			err := c.Conn.Invoke(ctx, m.name, row.req, resp)
			st := status.Convert(err)
			if st.Code() != row.code {
				t.Fatalf("%s: got %s (%q), want %s", m.short, st.Code(), st.Message(), row.code)
			}
			if err != nil && !strings.Contains(st.Message(), row.msg) {
				t.Errorf("%s: message %q does not contain %q", m.short, st.Message(), row.msg)
			}
			if err != nil && len(st.Details()) > 0 {
				t.Errorf("%s: status carries details %v; the spec wants none", m.short, st.Details())
			}
			if err == nil && row.check != nil {
				row.check(t, resp)
			}
		})
	}
	for name := range methods {
		if m := methods[name]; !covered[m.name] {
			t.Errorf("no malformed request for %s", m.name)
		}
	}

	// The real volume is as it was made: no malformed request grew or
	// attached it.
	for _, d := range h.disks(t) {
		if d.Tags[effects.TagVolumeID] == realID && (d.SizeBytes != 64*mib || d.AttachedTo != "") {
			t.Errorf("volume %s's disk %s has %d bytes and is attached to %q; want %d bytes, detached",
				realID, d.ID, d.SizeBytes, d.AttachedTo, 64*mib)
		}
	}

	// The volumes that legitimately exist go, and nothing may be left.
	for _, id := range append(created, realID) {
		if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume %s: %v", id, err)
		}
	}
	if disks := h.disks(t); len(disks) != 0 {
		t.Errorf("disks left in the local cloud: %+v", disks)
	}
	if loops := h.loops(t); len(loops) != 0 {
		t.Errorf("loop devices bound to the state dir's images: %+v", loops)
	}
	if devs := h.hostDevices(t); len(devs) != 0 {
		t.Errorf("the host reports devices: %v", devs)
	}
	if m := mountsUnder(t, h.dir); len(m) != 0 {
		t.Errorf("mounts under the state dir: %q", m)
	}
	if m := mountsUnder(t, outside); len(m) != 0 {
		t.Errorf("mounts under %s: %q", outside, m)
	}
	if entries, err := os.ReadDir(outside); err != nil || len(entries) != 0 {
		t.Errorf("%s holds %v (%v); no request may create anything there", outside, entries, err)
	}
	for _, p := range []string{rel, escape} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			os.RemoveAll(p)
			t.Errorf("%s exists (%v); no request may create it", p, err)
		}
	}
}

// malformedFixture is what the rows refer to.
type malformedFixture struct {
	realID  string
	vc      *csi.VolumeCapability
	outside string
	rel     string
	escape  string
	// created records a volume an OK row of CreateVolume made.
	created func(id string)
}

func malformedRows(f malformedFixture) []malformed {
	const snw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	vc, realID := f.vc, f.realID
	caps := []*csi.VolumeCapability{vc}
	randomID := "vol-" + randomHex(10) // well-formed, unknown
	const fakeID = "fake-vol-id"       // not of csid's shape (sanity's)
	mnmw := mountCapMode("ext4", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	btrfs := mountCapMode("btrfs", snw)
	noMode := &csi.VolumeCapability{AccessType: vc.AccessType}
	unknownMode := mountCapMode("ext4", csi.VolumeCapability_AccessMode_UNKNOWN)
	noType := &csi.VolumeCapability{AccessMode: vc.AccessMode}
	badFlag := &csi.VolumeCapability{AccessMode: vc.AccessMode,
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: []string{"noatime", ""}}}}
	block := blockCap(snw)
	size := func(required, limit int64) *csi.CapacityRange {
		return &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}
	}
	const eib = int64(1) << 60

	staging := filepath.Join(f.outside, "staging")
	target := filepath.Join(f.outside, "pod", "mount")
	relPath := filepath.Join(f.rel, "mount")                        // relative
	dotdot := filepath.Join(f.outside, "pod") + "/../escape"        // stays in outside once cleaned
	dotdotUp := f.outside + "/../" + filepath.Base(f.escape)        // leaves outside
	longPath := "/" + strings.Repeat("p", driver.MaxPathBytes)      // 4097 bytes
	nulPath := filepath.Join(f.outside, "nul") + "\x00" + "/escape" // NUL inside
	name128 := strings.Repeat("n", driver.MaxNameBytes)             // the longest name
	name128utf8 := strings.Repeat("é", driver.MaxNameBytes/2)       // 128 bytes, 64 runes
	name129 := strings.Repeat("n", driver.MaxNameBytes+1)           // one byte too long
	name129utf8 := strings.Repeat("n", driver.MaxNameBytes-1) + "é" // 129 bytes, 128 runes
	params5k := map[string]string{"csi.storage.k8s.io/pvc/name": strings.Repeat("x", 5000)}
	zone := func(z string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{driver.TopologyKey: z}}}}
	}
	createdOK := func(want string) func(t *testing.T, resp proto.Message) {
		return func(t *testing.T, resp proto.Message) {
			v := resp.(*csi.CreateVolumeResponse).GetVolume()
			if v.GetVolumeId() == "" {
				t.Errorf("CreateVolume %s answered no volume id", want)
				return
			}
			f.created(v.GetVolumeId())
		}
	}
	unconfirmed := func(why string) func(t *testing.T, resp proto.Message) {
		return func(t *testing.T, resp proto.Message) {
			r := resp.(*csi.ValidateVolumeCapabilitiesResponse)
			if r.GetConfirmed() != nil || !strings.Contains(r.GetMessage(), why) {
				t.Errorf("ValidateVolumeCapabilities answered %v; want nothing confirmed and a message containing %q", r, why)
			}
		}
	}
	noCapacity := func(t *testing.T, resp proto.Message) {
		if r := resp.(*csi.GetCapacityResponse); r.GetAvailableCapacity() != 0 {
			t.Errorf("GetCapacity answered %v; want no capacity for what csid cannot create", r)
		}
	}
	const IA, NF, FP, OK = codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.OK

	return []malformed{
		// Identity: no request fields, so nothing to malform; a zero
		// request is answered.
		{name: "zero request", req: &csi.GetPluginInfoRequest{}, code: OK},
		{name: "zero request", req: &csi.GetPluginCapabilitiesRequest{}, code: OK},
		{name: "zero request", req: &csi.ProbeRequest{}, code: OK},

		// CreateVolume.
		{name: "no name", req: &csi.CreateVolumeRequest{VolumeCapabilities: caps}, code: IA, msg: "name is required"},
		{name: "129-byte name", req: &csi.CreateVolumeRequest{Name: name129, VolumeCapabilities: caps}, code: IA, msg: "at most 128"},
		{name: "129-byte name of 128 runes", req: &csi.CreateVolumeRequest{Name: name129utf8, VolumeCapabilities: caps}, code: IA, msg: "at most 128"},
		{name: "name with BEL", req: &csi.CreateVolumeRequest{Name: "bad\abell", VolumeCapabilities: caps}, code: IA, msg: "control character U+0007"},
		{name: "name with DEL", req: &csi.CreateVolumeRequest{Name: "bad\x7f", VolumeCapabilities: caps}, code: IA, msg: "control character U+007F"},
		{name: "name with NEL", req: &csi.CreateVolumeRequest{Name: "bad\u0085", VolumeCapabilities: caps}, code: IA, msg: "control character U+0085"},
		{name: "name with newline", req: &csi.CreateVolumeRequest{Name: "bad\nname", VolumeCapabilities: caps}, code: IA, msg: "control character U+000A"},
		{name: "128-byte name", req: &csi.CreateVolumeRequest{Name: name128, VolumeCapabilities: caps}, code: OK, check: createdOK(name128)},
		{name: "128-byte name of 64 runes", req: &csi.CreateVolumeRequest{Name: name128utf8, VolumeCapabilities: caps}, code: OK, check: createdOK(name128utf8)},
		{name: "no capabilities", req: &csi.CreateVolumeRequest{Name: "m-nocaps"}, code: IA, msg: "volume_capabilities is required"},
		{name: "capability without access mode", req: &csi.CreateVolumeRequest{Name: "m-nomode", VolumeCapabilities: []*csi.VolumeCapability{noMode}}, code: IA, msg: "access_mode is required"},
		{name: "capability with mode UNKNOWN", req: &csi.CreateVolumeRequest{Name: "m-unknownmode", VolumeCapabilities: []*csi.VolumeCapability{unknownMode}}, code: IA, msg: "access_mode.mode is required"},
		{name: "capability without access type", req: &csi.CreateVolumeRequest{Name: "m-notype", VolumeCapabilities: []*csi.VolumeCapability{noType}}, code: IA, msg: "block or mount"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.CreateVolumeRequest{Name: "m-mnmw", VolumeCapabilities: []*csi.VolumeCapability{mnmw}}, code: IA, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "MULTI_NODE_MULTI_WRITER after a good one", req: &csi.CreateVolumeRequest{Name: "m-mnmw2", VolumeCapabilities: []*csi.VolumeCapability{vc, mnmw}}, code: IA, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.CreateVolumeRequest{Name: "m-btrfs", VolumeCapabilities: []*csi.VolumeCapability{btrfs}}, code: IA, msg: `"btrfs"`},
		{name: "block and mount", req: &csi.CreateVolumeRequest{Name: "m-both", VolumeCapabilities: []*csi.VolumeCapability{vc, block}}, code: IA, msg: "block or mount"},
		{name: "empty mount flag", req: &csi.CreateVolumeRequest{Name: "m-flag", VolumeCapabilities: []*csi.VolumeCapability{badFlag}}, code: IA, msg: "mount flag"},
		{name: "unknown parameter", req: &csi.CreateVolumeRequest{Name: "m-param", VolumeCapabilities: caps, Parameters: map[string]string{"tier": "gold"}}, code: IA, msg: `unknown parameter "tier"`},
		{name: "parameters over 4 KiB", req: &csi.CreateVolumeRequest{Name: "m-params5k", VolumeCapabilities: caps, Parameters: params5k}, code: IA, msg: "at most 4096"},
		{name: "snapshot source csid never gave", req: &csi.CreateVolumeRequest{Name: "m-snap", VolumeCapabilities: caps, VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-1"}}}}, code: NF, msg: "snapshot snap-1 does not exist"},
		{name: "snapshot source without an id", req: &csi.CreateVolumeRequest{Name: "m-snap", VolumeCapabilities: caps, VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{}}}}, code: IA, msg: "snapshot_id is required"},
		{name: "volume source without an id", req: &csi.CreateVolumeRequest{Name: "m-clone", VolumeCapabilities: caps, VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{}}}}, code: IA, msg: "volume_id is required"},
		{name: "volume source with a path", req: &csi.CreateVolumeRequest{Name: "m-clone", VolumeCapabilities: caps, VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "../" + realID}}}}, code: NF, msg: "does not exist"},
		{name: "empty content source", req: &csi.CreateVolumeRequest{Name: "m-clone", VolumeCapabilities: caps, VolumeContentSource: &csi.VolumeContentSource{}},
			code: IA, msg: "neither a snapshot nor a volume"},
		{name: "mutable parameters", req: &csi.CreateVolumeRequest{Name: "m-mutable", VolumeCapabilities: caps, MutableParameters: map[string]string{"iops": "1000"}}, code: IA, msg: "mutable parameters"},
		{name: "1 EiB", req: &csi.CreateVolumeRequest{Name: "m-eib", VolumeCapabilities: caps, CapacityRange: size(eib, 0)}, code: codes.OutOfRange, msg: "largest volume"},
		{name: "beyond the backend's largest disk", req: &csi.CreateVolumeRequest{Name: "m-9tib", VolumeCapabilities: caps, CapacityRange: size(9<<40, 0)}, code: codes.OutOfRange, msg: "largest volume this backend holds (8796093022208 bytes)"},
		{name: "limit below required", req: &csi.CreateVolumeRequest{Name: "m-range", VolumeCapabilities: caps, CapacityRange: size(2<<30, 1<<30)}, code: codes.OutOfRange, msg: "exceeds"},
		{name: "limit below 1 MiB", req: &csi.CreateVolumeRequest{Name: "m-tiny", VolumeCapabilities: caps, CapacityRange: size(0, 4096)}, code: codes.OutOfRange, msg: "MiB"},
		{name: "xfs under its minimum", req: &csi.CreateVolumeRequest{Name: "m-xfs", VolumeCapabilities: []*csi.VolumeCapability{mountCapMode("xfs", snw)}, CapacityRange: size(0, 100<<20)}, code: codes.OutOfRange, msg: "xfs"},
		{name: "negative required", req: &csi.CreateVolumeRequest{Name: "m-neg", VolumeCapabilities: caps, CapacityRange: size(-1, 0)}, code: IA, msg: "negative"},
		{name: "negative limit", req: &csi.CreateVolumeRequest{Name: "m-neglimit", VolumeCapabilities: caps, CapacityRange: size(0, -1)}, code: IA, msg: "negative"},
		{name: "unknown topology key", req: &csi.CreateVolumeRequest{Name: "m-topo", VolumeCapabilities: caps, AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{"rack": "r1"}}}}}, code: IA, msg: driver.TopologyKey},
		{name: "zone csid does not have", req: &csi.CreateVolumeRequest{Name: "m-zone", VolumeCapabilities: caps, AccessibilityRequirements: zone("nowhere")}, code: codes.ResourceExhausted, msg: "nowhere"},
		{name: "existing name, larger size", req: &csi.CreateVolumeRequest{Name: "malformed-real", VolumeCapabilities: caps, CapacityRange: size(128<<20, 0)}, code: codes.AlreadyExists, msg: realID},
		{name: "existing name, block", req: &csi.CreateVolumeRequest{Name: "malformed-real", VolumeCapabilities: []*csi.VolumeCapability{block}}, code: codes.AlreadyExists, msg: "access type"},

		// DeleteVolume: unknown is success.
		{name: "no volume_id", req: &csi.DeleteVolumeRequest{}, code: IA, msg: "volume_id is required"},
		{name: "unknown volume", req: &csi.DeleteVolumeRequest{VolumeId: randomID}, code: OK},
		{name: "fake-vol-id", req: &csi.DeleteVolumeRequest{VolumeId: fakeID}, code: OK},
		{name: "path as volume_id", req: &csi.DeleteVolumeRequest{VolumeId: "../../" + filepath.Base(f.outside)}, code: OK},

		// ControllerPublishVolume: fields first (random ids), then existence.
		{name: "no volume_id", req: &csi.ControllerPublishVolumeRequest{NodeId: "node-1", VolumeCapability: vc}, code: IA, msg: "volume_id is required"},
		{name: "no node_id", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, VolumeCapability: vc}, code: IA, msg: "node_id is required"},
		{name: "no capability", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, NodeId: "node-1"}, code: IA, msg: "volume_capability is required"},
		{name: "capability without access mode", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, NodeId: "node-1", VolumeCapability: noMode}, code: IA, msg: "access_mode is required"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, NodeId: "node-1", VolumeCapability: mnmw}, code: IA, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, NodeId: "node-1", VolumeCapability: btrfs}, code: IA, msg: `"btrfs"`},
		{name: "readonly", req: &csi.ControllerPublishVolumeRequest{VolumeId: realID, NodeId: "node-1", VolumeCapability: vc, Readonly: true}, code: IA, msg: "read-only"},
		{name: "unknown volume", req: &csi.ControllerPublishVolumeRequest{VolumeId: randomID, NodeId: "node-1", VolumeCapability: vc}, code: NF, msg: randomID},
		{name: "fake-vol-id", req: &csi.ControllerPublishVolumeRequest{VolumeId: fakeID, NodeId: "node-1", VolumeCapability: vc}, code: NF, msg: fakeID},
		{name: "unknown node", req: &csi.ControllerPublishVolumeRequest{VolumeId: realID, NodeId: "fake-node-id", VolumeCapability: vc}, code: NF, msg: "fake-node-id"},
		{name: "block capability of a mount volume", req: &csi.ControllerPublishVolumeRequest{VolumeId: realID, NodeId: "node-1", VolumeCapability: block}, code: IA, msg: "mount volume"},

		// ControllerUnpublishVolume: unknown or not attached is success.
		{name: "no volume_id", req: &csi.ControllerUnpublishVolumeRequest{NodeId: "node-1"}, code: IA, msg: "volume_id is required"},
		{name: "unknown volume", req: &csi.ControllerUnpublishVolumeRequest{VolumeId: randomID, NodeId: "node-1"}, code: OK},
		{name: "fake-vol-id", req: &csi.ControllerUnpublishVolumeRequest{VolumeId: fakeID}, code: OK},
		{name: "not attached to that node", req: &csi.ControllerUnpublishVolumeRequest{VolumeId: realID, NodeId: "fake-node-id"}, code: OK},

		// ValidateVolumeCapabilities: unsupported is an answer, not an error.
		{name: "no volume_id", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: caps}, code: IA, msg: "volume_id is required"},
		{name: "no capabilities", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: randomID}, code: IA, msg: "volume_capabilities is required"},
		{name: "capability without access mode", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: realID, VolumeCapabilities: []*csi.VolumeCapability{noMode}}, code: IA, msg: "access_mode is required"},
		{name: "unknown volume", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: randomID, VolumeCapabilities: caps}, code: NF, msg: randomID},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: realID, VolumeCapabilities: []*csi.VolumeCapability{mnmw}}, code: OK, check: unconfirmed("MULTI_NODE_MULTI_WRITER")},
		{name: "fs_type btrfs", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: realID, VolumeCapabilities: []*csi.VolumeCapability{btrfs}}, code: OK, check: unconfirmed(`"btrfs"`)},
		{name: "block capability of a mount volume", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: realID, VolumeCapabilities: []*csi.VolumeCapability{block}}, code: OK, check: unconfirmed("mount volume")},
		{name: "unknown parameter", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: realID, VolumeCapabilities: caps, Parameters: map[string]string{"tier": "gold"}}, code: OK, check: unconfirmed(`"tier"`)},

		// ListVolumes.
		{name: "garbage starting_token", req: &csi.ListVolumesRequest{StartingToken: "invalid-token"}, code: codes.Aborted, msg: "starting_token"},
		{name: "negative max_entries", req: &csi.ListVolumesRequest{MaxEntries: -1}, code: IA, msg: "max_entries"},
		{name: "token of a deleted volume", req: &csi.ListVolumesRequest{StartingToken: randomID}, code: OK},

		// GetCapacity: what csid cannot create has no capacity.
		{name: "capability without access mode", req: &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{noMode}}, code: IA, msg: "access_mode is required"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{mnmw}}, code: OK, check: noCapacity},
		{name: "unknown topology key", req: &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{"rack": "r1"}}}, code: OK, check: noCapacity},
		{name: "zone csid does not have", req: &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{driver.TopologyKey: "nowhere"}}}, code: OK, check: noCapacity},

		{name: "zero request", req: &csi.ControllerGetCapabilitiesRequest{}, code: OK},

		// ControllerExpandVolume.
		{name: "no volume_id", req: &csi.ControllerExpandVolumeRequest{CapacityRange: size(128<<20, 0)}, code: IA, msg: "volume_id is required"},
		{name: "no capacity_range", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID}, code: IA, msg: "capacity_range is required"},
		{name: "empty capacity_range", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID, CapacityRange: size(0, 0)}, code: IA, msg: "capacity_range is required"},
		{name: "negative required", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID, CapacityRange: size(-1, 0)}, code: IA, msg: "negative"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID, CapacityRange: size(128<<20, 0), VolumeCapability: mnmw}, code: IA, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID, CapacityRange: size(128<<20, 0), VolumeCapability: btrfs}, code: IA, msg: `"btrfs"`},
		{name: "1 EiB", req: &csi.ControllerExpandVolumeRequest{VolumeId: realID, CapacityRange: size(eib, 0)}, code: codes.OutOfRange, msg: "largest volume"},
		{name: "beyond the backend's largest disk", req: &csi.ControllerExpandVolumeRequest{VolumeId: realID, CapacityRange: size(9<<40, 0)}, code: codes.OutOfRange, msg: "largest volume this backend holds"},
		{name: "limit below required", req: &csi.ControllerExpandVolumeRequest{VolumeId: realID, CapacityRange: size(2<<30, 1<<30)}, code: codes.OutOfRange, msg: "exceeds"},
		{name: "limit below the current size", req: &csi.ControllerExpandVolumeRequest{VolumeId: realID, CapacityRange: size(16<<20, 32<<20)}, code: codes.OutOfRange, msg: "shrink"},
		{name: "unknown volume", req: &csi.ControllerExpandVolumeRequest{VolumeId: randomID, CapacityRange: size(128<<20, 0)}, code: NF, msg: randomID},
		{name: "block capability of a mount volume", req: &csi.ControllerExpandVolumeRequest{VolumeId: realID, CapacityRange: size(128<<20, 0), VolumeCapability: block}, code: IA, msg: "mount volume"},

		// ControllerGetVolume.
		{name: "no volume_id", req: &csi.ControllerGetVolumeRequest{}, code: IA, msg: "volume_id is required"},
		{name: "unknown volume", req: &csi.ControllerGetVolumeRequest{VolumeId: randomID}, code: NF, msg: randomID},
		{name: "fake-vol-id", req: &csi.ControllerGetVolumeRequest{VolumeId: fakeID}, code: NF, msg: fakeID},
		{name: "1000-byte volume_id", req: &csi.ControllerGetVolumeRequest{VolumeId: strings.Repeat("v", 1000)}, code: NF, msg: "does not exist"},

		// Snapshots.
		{name: "no name", req: &csi.CreateSnapshotRequest{SourceVolumeId: realID}, code: IA, msg: "name is required"},
		{name: "no source", req: &csi.CreateSnapshotRequest{Name: "m-snap"}, code: IA, msg: "source_volume_id is required"},
		{name: "a source path", req: &csi.CreateSnapshotRequest{Name: "m-snap", SourceVolumeId: "/etc/" + realID}, code: NF, msg: "does not exist"},
		{name: "unknown parameter", req: &csi.CreateSnapshotRequest{Name: "m-snap", SourceVolumeId: realID, Parameters: map[string]string{"tier": "gold"}},
			code: IA, msg: `unknown parameter "tier"`},
		{name: "no snapshot_id", req: &csi.DeleteSnapshotRequest{}, code: IA, msg: "snapshot_id is required"},
		{name: "negative max_entries", req: &csi.ListSnapshotsRequest{MaxEntries: -1}, code: IA, msg: "max_entries"},
		{name: "foreign token", req: &csi.ListSnapshotsRequest{StartingToken: "../x"}, code: codes.Aborted, msg: "starting_token"},
		{name: "no snapshot_id", req: &csi.GetSnapshotRequest{}, code: IA, msg: "snapshot_id is required"},
		{name: "a snapshot path", req: &csi.GetSnapshotRequest{SnapshotId: "../" + randomID}, code: NF, msg: "does not exist"},

		// What csid does not claim is Unimplemented, malformed or not.
		{name: "not claimed", req: &csi.ControllerModifyVolumeRequest{VolumeId: realID, MutableParameters: map[string]string{"XXX_FakeKey": "x"}}, code: codes.Unimplemented, msg: "ControllerModifyVolume"},
		{name: "not claimed", req: &csi.ControllerGetVolumeHealthRequest{}, code: codes.Unimplemented, msg: "ControllerGetVolumeHealth"},
		{name: "not claimed", req: &csi.ControllerListVolumeHealthRequest{StartingToken: "invalid-token"}, code: codes.Unimplemented, msg: "ControllerListVolumeHealth"},

		// NodeStageVolume: unsupported capabilities are FailedPrecondition
		// on the node.
		{name: "no volume_id", req: &csi.NodeStageVolumeRequest{StagingTargetPath: staging, VolumeCapability: vc}, code: IA, msg: "volume_id is required"},
		{name: "no staging_target_path", req: &csi.NodeStageVolumeRequest{VolumeId: randomID, VolumeCapability: vc}, code: IA, msg: "staging_target_path is required"},
		{name: "relative staging_target_path", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: relPath, VolumeCapability: vc}, code: IA, msg: "absolute"},
		{name: "staging_target_path with ..", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: dotdot, VolumeCapability: vc}, code: IA, msg: `".."`},
		{name: "staging_target_path leaving its parent", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: dotdotUp, VolumeCapability: vc}, code: IA, msg: `".."`},
		{name: "staging_target_path with NUL", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: nulPath, VolumeCapability: vc}, code: IA, msg: "NUL"},
		{name: "4097-byte staging_target_path", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: longPath, VolumeCapability: vc}, code: IA, msg: "at most 4096"},
		{name: "no capability", req: &csi.NodeStageVolumeRequest{VolumeId: randomID, StagingTargetPath: staging}, code: IA, msg: "volume_capability is required"},
		{name: "capability without access type", req: &csi.NodeStageVolumeRequest{VolumeId: randomID, StagingTargetPath: staging, VolumeCapability: noType}, code: IA, msg: "block or mount"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: staging, VolumeCapability: mnmw}, code: FP, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: staging, VolumeCapability: btrfs}, code: FP, msg: `"btrfs"`},
		{name: "unknown volume", req: &csi.NodeStageVolumeRequest{VolumeId: randomID, StagingTargetPath: staging, VolumeCapability: vc}, code: NF, msg: randomID},
		{name: "block capability of a mount volume", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: staging, VolumeCapability: block}, code: FP, msg: "mount volume"},
		{name: "volume not published", req: &csi.NodeStageVolumeRequest{VolumeId: realID, StagingTargetPath: staging, VolumeCapability: vc}, code: FP, msg: "ControllerPublishVolume"},

		// NodeUnstageVolume: unknown or not staged is success.
		{name: "no volume_id", req: &csi.NodeUnstageVolumeRequest{StagingTargetPath: staging}, code: IA, msg: "volume_id is required"},
		{name: "no staging_target_path", req: &csi.NodeUnstageVolumeRequest{VolumeId: randomID}, code: IA, msg: "staging_target_path is required"},
		{name: "relative staging_target_path", req: &csi.NodeUnstageVolumeRequest{VolumeId: realID, StagingTargetPath: relPath}, code: IA, msg: "absolute"},
		{name: "staging_target_path with ..", req: &csi.NodeUnstageVolumeRequest{VolumeId: realID, StagingTargetPath: dotdotUp}, code: IA, msg: `".."`},
		{name: "unknown volume", req: &csi.NodeUnstageVolumeRequest{VolumeId: randomID, StagingTargetPath: staging}, code: OK},
		{name: "not staged there", req: &csi.NodeUnstageVolumeRequest{VolumeId: realID, StagingTargetPath: staging}, code: OK},

		// NodePublishVolume.
		{name: "no volume_id", req: &csi.NodePublishVolumeRequest{StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc}, code: IA, msg: "volume_id is required"},
		{name: "no target_path", req: &csi.NodePublishVolumeRequest{VolumeId: randomID, StagingTargetPath: staging, VolumeCapability: vc}, code: IA, msg: "target_path is required"},
		{name: "relative target_path", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: relPath, VolumeCapability: vc}, code: IA, msg: "absolute"},
		{name: "target_path with ..", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: dotdot, VolumeCapability: vc}, code: IA, msg: `".."`},
		{name: "target_path leaving its parent", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: dotdotUp, VolumeCapability: vc}, code: IA, msg: `".."`},
		{name: "no capability", req: &csi.NodePublishVolumeRequest{VolumeId: randomID, StagingTargetPath: staging, TargetPath: target}, code: IA, msg: "volume_capability is required"},
		{name: "no staging_target_path", req: &csi.NodePublishVolumeRequest{VolumeId: realID, TargetPath: target, VolumeCapability: vc}, code: FP, msg: "staging_target_path is required"},
		{name: "relative staging_target_path", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: relPath, TargetPath: target, VolumeCapability: vc}, code: IA, msg: "absolute"},
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mnmw}, code: FP, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: btrfs}, code: FP, msg: `"btrfs"`},
		{name: "unknown volume", req: &csi.NodePublishVolumeRequest{VolumeId: randomID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc}, code: NF, msg: randomID},
		{name: "volume not staged", req: &csi.NodePublishVolumeRequest{VolumeId: realID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc}, code: FP, msg: "NodeStageVolume"},

		// NodeUnpublishVolume: unknown or not published is success.
		{name: "no volume_id", req: &csi.NodeUnpublishVolumeRequest{TargetPath: target}, code: IA, msg: "volume_id is required"},
		{name: "no target_path", req: &csi.NodeUnpublishVolumeRequest{VolumeId: randomID}, code: IA, msg: "target_path is required"},
		{name: "relative target_path", req: &csi.NodeUnpublishVolumeRequest{VolumeId: realID, TargetPath: relPath}, code: IA, msg: "absolute"},
		{name: "target_path leaving its parent", req: &csi.NodeUnpublishVolumeRequest{VolumeId: realID, TargetPath: dotdotUp}, code: IA, msg: `".."`},
		{name: "unknown volume", req: &csi.NodeUnpublishVolumeRequest{VolumeId: randomID, TargetPath: target}, code: OK},
		{name: "not published there", req: &csi.NodeUnpublishVolumeRequest{VolumeId: realID, TargetPath: target}, code: OK},

		// NodeGetVolumeStats: a path where the volume is not is NotFound,
		// relative or not (sanity's "some/path").
		{name: "no volume_id", req: &csi.NodeGetVolumeStatsRequest{VolumePath: target}, code: IA, msg: "volume_id is required"},
		{name: "no volume_path", req: &csi.NodeGetVolumeStatsRequest{VolumeId: randomID}, code: IA, msg: "volume_path is required"},
		{name: "unknown volume", req: &csi.NodeGetVolumeStatsRequest{VolumeId: randomID, VolumePath: "some/path"}, code: NF, msg: randomID},
		{name: "relative volume_path", req: &csi.NodeGetVolumeStatsRequest{VolumeId: realID, VolumePath: "some/path"}, code: NF, msg: "some/path"},
		{name: "volume_path with ..", req: &csi.NodeGetVolumeStatsRequest{VolumeId: realID, VolumePath: dotdotUp}, code: NF, msg: "not staged or published"},
		{name: "volume not there", req: &csi.NodeGetVolumeStatsRequest{VolumeId: realID, VolumePath: target}, code: NF, msg: "not staged or published"},

		// NodeExpandVolume.
		{name: "no volume_id", req: &csi.NodeExpandVolumeRequest{VolumePath: target}, code: IA, msg: "volume_id is required"},
		{name: "no volume_path", req: &csi.NodeExpandVolumeRequest{VolumeId: randomID}, code: IA, msg: "volume_path is required"},
		{name: "negative required", req: &csi.NodeExpandVolumeRequest{VolumeId: realID, VolumePath: target, CapacityRange: size(-1, 0)}, code: IA, msg: "negative"},
		{name: "unknown volume", req: &csi.NodeExpandVolumeRequest{VolumeId: randomID, VolumePath: "some/path"}, code: NF, msg: randomID},
		{name: "relative volume_path", req: &csi.NodeExpandVolumeRequest{VolumeId: realID, VolumePath: "some/path"}, code: NF, msg: "some/path"},
		{name: "volume not there", req: &csi.NodeExpandVolumeRequest{VolumeId: realID, VolumePath: target}, code: NF, msg: "not staged or published"},
		// The spec's NodeExpandVolume table (unlike NodeStage's and
		// NodePublish's) makes "Exceeds capabilities" INVALID_ARGUMENT.
		{name: "MULTI_NODE_MULTI_WRITER", req: &csi.NodeExpandVolumeRequest{VolumeId: realID, VolumePath: target, VolumeCapability: mnmw}, code: IA, msg: "MULTI_NODE_MULTI_WRITER"},
		{name: "fs_type btrfs", req: &csi.NodeExpandVolumeRequest{VolumeId: realID, VolumePath: target, VolumeCapability: btrfs}, code: IA, msg: `"btrfs"`},

		{name: "zero request", req: &csi.NodeGetCapabilitiesRequest{}, code: OK},
		{name: "zero request", req: &csi.NodeGetInfoRequest{}, code: OK},
		{name: "not claimed", req: &csi.NodeGetVolumeHealthRequest{}, code: codes.Unimplemented, msg: "NodeGetVolumeHealth"},
		{name: "not claimed", req: &csi.NodeGetStorageHealthRequest{}, code: codes.Unimplemented, msg: "NodeGetStorageHealth"},
	}
}

// csiMethod is one unary RPC of the CSI services csid serves.
type csiMethod struct {
	name, short string // "/csi.v1.Node/NodeStageVolume", "NodeStageVolume"
	response    protoreflect.MessageType
}

func (m csiMethod) newResponse() proto.Message { return m.response.New().Interface() }

// csiMethods maps each request type of the Identity, Controller and Node
// services to its RPC (each CSI RPC has a request type of its own).
func csiMethods(t *testing.T) map[protoreflect.FullName]csiMethod {
	t.Helper()
	out := map[protoreflect.FullName]csiMethod{}
	for _, sd := range []grpc.ServiceDesc{csi.Identity_ServiceDesc, csi.Controller_ServiceDesc, csi.Node_ServiceDesc} {
		svc := csi.File_csi_proto.Services().ByName(protoreflect.FullName(sd.ServiceName).Name())
		if svc == nil {
			t.Fatalf("service %s not in csi.proto", sd.ServiceName)
		}
		for i := 0; i < svc.Methods().Len(); i++ {
			md := svc.Methods().Get(i)
			if md.IsStreamingClient() || md.IsStreamingServer() {
				continue
			}
			rt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := out[md.Input().FullName()]; dup {
				t.Fatalf("%s is the request of two RPCs", md.Input().FullName())
			}
			out[md.Input().FullName()] = csiMethod{name: "/" + sd.ServiceName + "/" + string(md.Name()),
				short: string(md.Name()), response: rt}
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
