package driver

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// noZones is a controller backend without topology.
type noZones struct{}

func (noZones) Capacity(context.Context, string) (int64, error) { return 1 << 40, nil }
func (noZones) Zones() []string                                 { return nil }
func (noZones) MaxVolumeBytes() int64                           { return 1 << 40 }

// TestSnapshotsOnlyWhereTheBackendTakesThem: a controller whose backend
// takes no snapshots (Config.Snapshots false) advertises neither snapshots
// nor clones, answers the snapshot RPCs Unimplemented and a CreateVolume
// with a content source InvalidArgument, before anything reaches its
// engine (a real one, on a real state file, without snapshot executors:
// it records no op); with Snapshots it advertises all four capabilities.
func TestSnapshotsOnlyWhereTheBackendTakesThem(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "csid.db"), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng := ops.New(ops.Config{Store: st, Executors: map[fsm.Event]ops.Executor{}, Log: zerolog.Nop()})
	ctx := context.Background()
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(ctx) })
	caps := func(snapshots bool) map[csi.ControllerServiceCapability_RPC_Type]bool {
		d, err := New(Config{Mode: ModeController, Engine: eng, Controller: noZones{}, Snapshots: snapshots})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := d.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[csi.ControllerServiceCapability_RPC_Type]bool{}
		for _, c := range resp.Capabilities {
			out[c.GetRpc().GetType()] = true
		}
		return out
	}
	without, with := caps(false), caps(true)
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	} {
		if without[c] || !with[c] {
			t.Errorf("%s: advertised %v without snapshots, %v with", c, without[c], with[c])
		}
	}

	d, err := New(Config{Mode: ModeController, Engine: eng, Controller: noZones{}})
	if err != nil {
		t.Fatal(err)
	}
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for what, call := range map[string]func() error{
		"CreateSnapshot": func() error {
			_, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "vol-00000000000000000000"})
			return err
		},
		"DeleteSnapshot": func() error {
			_, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snap-00000000000000000000"})
			return err
		},
		"ListSnapshots": func() error { _, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{}); return err },
		"GetSnapshot": func() error {
			_, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "snap-00000000000000000000"})
			return err
		},
	} {
		if code := status.Code(call()); code != codes.Unimplemented {
			t.Errorf("%s without snapshots: %s, want Unimplemented", what, code)
		}
	}
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{mount},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "vol-00000000000000000000"}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a clone without snapshots: %v, want InvalidArgument", err)
	}
	_ = st.View(func(tx *store.Tx) error {
		return tx.ForEachOp(func(op *store.Op) bool { t.Errorf("an op was recorded: %+v", op); return true })
	})
}
