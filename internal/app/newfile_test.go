package app_test

import (
	"context"
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/rs/zerolog"
)

// TestNewStateFileAndTheCloudsWitness: a first start on a fresh directory
// starts as before. A csid of another driver name sharing the cloud is not
// refused for the first one's disks, and does not take them even when asked
// to rebuild. The first csid, its file lost, is refused, and starts with
// --rebuild-from-cloud with its volumes back.
func TestNewStateFileAndTheCloudsWitness(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	dir := apptest.ShortTempDir(t)
	first := app.Options{Cloud: "fake", Fake: f, StateDir: dir, Mode: driver.ModeAll, Endpoint: "unix://" + dir + "/csi.sock", NodeID: "node-1", Log: zerolog.Nop()}
	in := apptest.Start(t, first) // a fresh directory: no question asked
	c := apptest.Dial(t, in.Socket)
	ctx := context.Background()
	var ids []string
	for _, name := range []string{"pvc-a", "pvc-b"} {
		ids = append(ids, apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(1 << 20),
			VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})).Must(t).Volume.VolumeId)
	}

	// Each on a new file of its own: without the flag, a refusal fails
	// the start (apptest.Start); with it, a rebuild takes nothing.
	for _, rebuild := range []bool{false, true} {
		other := app.Options{Cloud: "fake", Fake: f, StateDir: apptest.ShortTempDir(t), Mode: driver.ModeController,
			DriverName: "other.csi.dev", RebuildFromCloud: rebuild, Log: zerolog.Nop()}
		o := apptest.Start(t, other)
		if n := len(apptest.R(apptest.Dial(t, o.Socket).ListVolumes(ctx, &csi.ListVolumesRequest{})).Must(t).Entries); n != 0 {
			t.Errorf("a csid of another driver name (--rebuild-from-cloud %v) took %d of the first one's volumes", rebuild, n)
		}
		o.Stop(t)
	}

	in.Stop(t)
	file := app.StateFile(first.StateDir, driver.ModeAll)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	wantRefusedNewFile(t, refused(t, first), file, "of volume vol-")
	first.RebuildFromCloud = true
	in = apptest.Start(t, first)
	c = apptest.Dial(t, in.Socket)
	for _, id := range ids {
		apptest.R(c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})).Must(t)
	}
}
