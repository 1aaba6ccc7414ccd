package drill

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// snap is what the orchestrator remembers of a snapshot it took.
type snap struct {
	id string
	// data is the data its source volume held when it was taken.
	data []byte
}

// snapshot takes snapshot name of volume vol (CreateSnapshot, retried with
// the same arguments like the snapshotter sidecar does until it answers
// ready to use).
func (c *cell) snapshot(ctx context.Context, name, vol string) error {
	v := c.vols[vol]
	s := &snap{data: v.data}
	err := c.call(ctx, "CreateSnapshot "+name, codes.OK, func(ctx context.Context, cl clients) error {
		resp, err := cl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		if err != nil {
			return err
		}
		if !resp.Snapshot.ReadyToUse || resp.Snapshot.SizeBytes != v.size {
			return fmt.Errorf("snapshot %s of %s: ready %v, %d bytes; want ready, %d bytes", name, vol, resp.Snapshot.ReadyToUse, resp.Snapshot.SizeBytes, v.size)
		}
		s.id = resp.Snapshot.SnapshotId
		return nil
	})
	c.snaps[name] = s
	return err
}

// deleteSnapshot deletes snapshot name.
func (c *cell) deleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, "DeleteSnapshot "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: c.snaps[name].id})
		return err
	})
}

// createFrom creates filesystem volume name of size bytes from a snapshot
// (fromSnap) or a volume: it holds the data its source held.
func (c *cell) createFrom(ctx context.Context, name string, size int64, fromSnap, fromVol string) error {
	size *= c.scale
	v := &volume{size: size, capability: mountCap}
	src := &csi.VolumeContentSource{}
	if fromSnap != "" {
		s := c.snaps[fromSnap]
		v.data = s.data
		src.Type = &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.id}}
	} else {
		sv := c.vols[fromVol]
		v.data = sv.data
		src.Type = &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: sv.id}}
	}
	err := c.call(ctx, "CreateVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		resp, err := cl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap}, VolumeContentSource: src})
		if err == nil {
			v.id = resp.Volume.VolumeId
		}
		return err
	})
	c.vols[name] = v
	return err
}

func takeSnapshot(name, vol string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.snapshot(ctx, name, vol) }
}

func deleteSnapshot(name string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.deleteSnapshot(ctx, name) }
}

func restore(name, snapshot string, size int64) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.createFrom(ctx, name, size, snapshot, "") }
}

func clone(name, vol string, size int64) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.createFrom(ctx, name, size, "", vol) }
}
