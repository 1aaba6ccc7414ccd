package drill

import (
	"context"

	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud/local"
)

// Backend is a cloud the drill runs csid on instead of the local backend
// in each cell's state directory (the default): a provider's API fake,
// with a node simulator that stands loop devices in for its disks.
type Backend struct {
	// Name names it in the drill's errors.
	Name string
	// Open makes the cloud of one cell (or census), whose state directory
	// is dir: a new one for each, as the local backend's is. It lives
	// across the cell's restarts of csid, as a cloud does.
	Open func(ctx context.Context, dir string) (*CellCloud, error)
	// Scale multiplies the scenarios' sizes (1 when 0): a provider that
	// rounds sizes up to GiB runs them at GiB scale, so that a volume
	// expanded is a disk grown.
	Scale int64
}

// CellCloud is the cloud of one cell.
type CellCloud struct {
	// Args are the flags `csid serve` needs for it: --cloud and the
	// provider's (the drill adds --node-id NodeID).
	Args []string
	// Inspect reads the provider's disks and this host's devices of them,
	// for the leak checks once csid has stopped.
	Inspect func(ctx context.Context) (check.Cloud, error)
	// ImagePath is the file holding a disk's content, which e2fsck reads
	// once the disk is detached.
	ImagePath func(diskID string) (string, error)
	// Close releases it, after the cell's checks.
	Close func() error
}

// localCloud is the default: the local backend in the cell's state dir.
func localCloud(dir string) *CellCloud {
	return &CellCloud{
		Inspect: func(context.Context) (check.Cloud, error) { return local.OpenInspector(dir) },
		ImagePath: func(diskID string) (string, error) {
			in, err := local.OpenInspector(dir)
			if err != nil {
				return "", err
			}
			return in.ImagePath(diskID), nil
		},
		Close: func() error { return nil },
	}
}

// openCloud makes the cloud of a cell in dir: the configured backend's, or
// the local one.
func (cfg *Config) openCloud(ctx context.Context, dir string) (*CellCloud, error) {
	if cfg.Backend == nil {
		return localCloud(dir), nil
	}
	return cfg.Backend.Open(ctx, dir)
}

// scale is the factor of the scenarios' sizes.
func (cfg *Config) scale() int64 {
	if cfg.Backend == nil || cfg.Backend.Scale <= 0 {
		return 1
	}
	return cfg.Backend.Scale
}
