package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
)

// ErrNoState: a directory holds no state of the local backend.
var ErrNoState = errors.New("not a state directory of the local backend")

// Inspector reads a state directory of the local backend without changing
// anything, for `csid check`: unlike Open, it creates nothing, takes no
// lock and leaves what a crash left behind where it is. It is safe beside
// running csid processes on the same directory (records are replaced
// atomically, so each is read whole).
type Inspector struct {
	c *Cloud
}

// OpenInspector opens the existing state directory dir for reading. A
// directory without the local backend's format marker is ErrNoState; one
// of another layout version is an error.
func OpenInspector(dir string) (*Inspector, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", dir, err)
	}
	err = readFormat(abs)
	if errors.Is(err, errFormat1) {
		err = nil // its records read the same; Open migrates it
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no %s file: %w", abs, formatFile, ErrNoState)
	}
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", abs, err)
	}
	return &Inspector{c: &Cloud{s: newState(abs), opts: Options{Zone: DefaultZone}}}, nil
}

// Dir is the state directory (absolute, symlinks resolved).
func (i *Inspector) Dir() string { return i.c.s.dir }

// Disks returns every disk, in id order, as ListDisks reports them.
func (i *Inspector) Disks(ctx context.Context) ([]cloud.Disk, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	disks, err := i.c.s.allDisks()
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
	}
	return disks, nil
}

// LoopDevices lists the loop devices on this machine bound to images of
// this state directory (of every node: devices are the machine's), by disk
// id, each disk's in device-number order. Unlike Host.Devices it keeps
// every device of a disk: a second one bound to the same image is a leak
// that csid check must see.
func (i *Inspector) LoopDevices(ctx context.Context) (map[string][]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return i.c.boundDevices()
}

// ImagePath is where the image of a disk id of this directory is, or ""
// for an id that is not one of this backend's (tests bind images by hand).
func (i *Inspector) ImagePath(diskID string) string {
	id, ok := parseDiskID(diskID)
	if !ok {
		return ""
	}
	return i.c.s.imagePath(id)
}

// Nodes returns the ids of the nodes registered in this directory, sorted:
// they all run on this machine, as the backend's disks are files here.
func (i *Inspector) Nodes() ([]string, error) {
	nodes, err := i.c.s.readNodes()
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
	}
	return slices.Sorted(maps.Keys(nodes)), nil
}

// Snapshots returns every snapshot, in id order, as ListSnapshots reports
// them.
func (i *Inspector) Snapshots(ctx context.Context) ([]cloud.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := i.c.s.snapshotIDs()
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
	}
	snaps := make([]cloud.Snapshot, 0, len(ids))
	for _, id := range ids {
		snap, err := i.c.s.readSnapshot(id)
		if errors.Is(err, cloud.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
		}
		snaps = append(snaps, snap)
	}
	return snaps, nil
}

// Freeze is a filesystem freeze of a snapshot or a clone of a disk that
// is in progress, or that a killed csid left (Open thaws those).
type Freeze struct {
	DiskID string
	// MountPoints are where the frozen filesystems were mounted, as the
	// freezing process saw them.
	MountPoints []string
	Since       time.Time
}

// Freezes lists the freeze records of the state directory: a filesystem
// that may be frozen. A record that outlives the snapshot that wrote it is
// a finding for csid check.
func (i *Inspector) Freezes() ([]Freeze, error) {
	ids, err := recordIDs(i.c.s.frozen(), parseDiskID)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
	}
	var out []Freeze
	for _, id := range ids {
		rec, ok, err := i.c.s.readFreeze(id)
		if err != nil {
			return nil, fmt.Errorf("local cloud %s: %w", i.c.s.dir, err)
		}
		if !ok {
			continue
		}
		f := Freeze{DiskID: rec.DiskID, Since: rec.Since}
		for _, m := range rec.Mounts {
			f.MountPoints = append(f.MountPoints, m.Path)
		}
		out = append(out, f)
	}
	return out, nil
}
