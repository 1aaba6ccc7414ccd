package app_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
)

// flip flips one bit of a record of a stopped csid's state file, with
// bbolt, as a bad block would: the first byte of the value that starts at
// the first occurrence of at ("" for its first byte). key picks the record
// (a key's prefix for a history note).
func flip(t *testing.T, path, bucket string, key []byte, at string, bit byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		k, v := b.Cursor().Seek(key)
		if k == nil || !bytes.HasPrefix(k, key) {
			return fmt.Errorf("no record %s/%q", bucket, key)
		}
		v = bytes.Clone(v)
		i := bytes.Index(v, []byte(at))
		if i < 0 {
			return fmt.Errorf("%s/%q holds no %q", bucket, k, at)
		}
		v[i] ^= bit
		return b.Put(bytes.Clone(k), v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDamagedRecordIsNeverActedOn flips one bit in a record of each kind
// of a real state file of a stopped csid, restarts it on the file, and
// checks that csid starts and serves, that each damaged record's volume
// (or name) answers DataLoss naming the record while the other volumes
// work, that `csid inspect volumes` lists every volume and marks the
// damaged ones, and that `csid check` reports every damaged record with
// the action to take.
//
//   - pvc-a: attached, with a resize queued: its resize record is flipped;
//   - pvc-b: its volume record, capacity 67108864 -> 77108864 (the issue);
//   - pvc-c: its attach in flight when csid stopped: its op record;
//   - pvc-d: a note of its history (only history is lost: it works);
//   - pvc-e: its name index entry (CreateVolume by that name).
func TestDamagedRecordIsNeverActedOn(t *testing.T) {
	dir := apptest.ShortTempDir(t)
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	opts := app.Options{Cloud: "fake", Fake: f, StateDir: dir, ShutdownTimeout: time.Second, Log: zerolog.Nop()}
	in := apptest.Start(t, opts)
	c := apptest.Dial(t, in.Socket)
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	ids := map[string]string{}
	for _, name := range []string{"pvc-a", "pvc-b", "pvc-c", "pvc-d", "pvc-e"} {
		ids[name] = apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(64 << 20),
			VolumeCapabilities: []*csi.VolumeCapability{vc}})).Must(t).Volume.VolumeId
	}
	a, b, cc, d := ids["pvc-a"], ids["pvc-b"], ids["pvc-c"], ids["pvc-d"]
	apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: a, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: a, CapacityRange: capRange(128 << 20), VolumeCapability: vc})
	wantCode(t, err, codes.FailedPrecondition, "queued")
	// pvc-d's resize waits for its detach (a note in its history), then runs.
	apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: d, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: d, CapacityRange: capRange(96 << 20), VolumeCapability: vc})
	wantCode(t, err, codes.FailedPrecondition, "queued")
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: d, NodeId: "node-1"})).Must(t)
	release := f.Hold(cloud.OpAttach)
	defer release()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.ControllerPublishVolume(short, &csi.ControllerPublishVolumeRequest{VolumeId: cc, NodeId: "node-1", VolumeCapability: vc})
	cancel()
	if err == nil {
		t.Fatal("the held attach answered OK")
	}
	op := inspectVolume(t, dir, driver.ModeAll, cc).PendingOp
	if op == nil {
		t.Fatalf("volume %s has no pending op", cc)
	}
	pending := op.Seq
	in.Stop(t) // the attach of pvc-c stays queued for the next start
	release()  // the cloud finishes it on its own

	path := app.StateFile(dir, driver.ModeAll)
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, pending)
	flip(t, path, "resize", []byte(a), "134217728", 0x01)
	flip(t, path, "volumes", []byte(b), "67108864", 0x01)
	flip(t, path, "ops", seq, "controller_publish", 0x02)
	flip(t, path, "history", append([]byte(d), 0), "", 0x04)
	flip(t, path, "names", []byte("pvc-e"), "", 0x08)
	callsBefore := len(f.Calls())

	in = apptest.Start(t, opts) // starts and answers ready
	c = apptest.Dial(t, in.Socket)
	_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: b, CapacityRange: capRange(70_000_000), VolumeCapability: vc})
	wantCode(t, err, codes.DataLoss, "volumes/"+b, "fails its checksum")
	_, err = c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: b})
	wantCode(t, err, codes.DataLoss, "volumes/"+b)
	_, err = c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: a, NodeId: "node-1"})
	wantCode(t, err, codes.DataLoss, "resize/"+a)
	_, err = c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: cc, NodeId: "node-1", VolumeCapability: vc})
	wantCode(t, err, codes.DataLoss, fmt.Sprintf("ops/%d", pending))
	_, err = c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-e", CapacityRange: capRange(64 << 20), VolumeCapabilities: []*csi.VolumeCapability{vc}})
	wantCode(t, err, codes.DataLoss, "names/pvc-e")
	for _, call := range f.Calls()[callsBefore:] {
		if call.Kind != fake.KindGetNode { // readiness probes its node
			t.Errorf("the cloud was called for a damaged volume: %+v", call)
		}
	}

	// The healthy volume, whose only damage is a line of history, works.
	apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: d, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: d, NodeId: "node-1"})).Must(t)
	if v := apptest.R(c.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: d})).Must(t).Volume; v.CapacityBytes != 96<<20 {
		t.Errorf("pvc-d is %d bytes, want its resize to 96 MiB", v.CapacityBytes)
	}
	var listed []string
	for _, e := range apptest.R(c.ListVolumes(ctx, &csi.ListVolumesRequest{})).Must(t).Entries {
		listed = append(listed, e.Volume.VolumeId)
	}
	if slices.Contains(listed, b) || !slices.Contains(listed, ids["pvc-e"]) {
		t.Errorf("ListVolumes lists %v: the damaged %s must be left out, the others listed", listed, b)
	}

	// What csid inspect volumes and csid check read, through the admin socket.
	src := admin.NewClient(app.AdminSocketPath(dir, driver.ModeAll), 5*time.Second)
	defer src.Close()
	vols, err := src.Volumes(ctx, view.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	marked := map[string]bool{}
	for _, v := range vols.Volumes {
		marked[v.ID] = v.Damage != ""
	}
	want := map[string]bool{a: true, b: true, cc: true, d: false, ids["pvc-e"]: false}
	if len(marked) != len(want) {
		t.Errorf("csid inspect volumes lists %v, want %v", marked, want)
	}
	for id, dmg := range want {
		if m, ok := marked[id]; !ok || m != dmg {
			t.Errorf("csid inspect volumes: %s listed %v, marked damaged %v; want marked %v", id, ok, m, dmg)
		}
	}
	in2, err := check.Gather(ctx, check.Sources{Records: []check.RecordSource{{Name: "csid", Mode: "all", Source: src}}})
	if err != nil {
		t.Fatal(err)
	}
	rep := check.Compare(in2)
	var found []string
	for _, fd := range rep.Findings {
		if fd.Kind == check.RecordDamaged {
			found = append(found, fd.Record)
			if fd.Cause == "" || fd.Action == "" {
				t.Errorf("finding without cause or action: %+v", fd)
			}
			if strings.HasPrefix(fd.Record, "history/") != strings.Contains(fd.Action, "only history is lost") {
				t.Errorf("%s: action %q", fd.Record, fd.Action)
			}
		}
	}
	slices.Sort(found)
	wantFound := []string{fmt.Sprintf("history/%s#0", d), "names/pvc-e", fmt.Sprintf("ops/%d", pending), "resize/" + a, "volumes/" + b}
	slices.Sort(wantFound)
	if !slices.Equal(found, wantFound) {
		t.Errorf("csid check reports damaged records %v, want %v", found, wantFound)
	}
}
