// Package hostscrub releases what csid may have left in the kernel under a
// directory: mounts below it, and loop devices bound to files inside it. The
// drill uses it for a cell that failed or was interrupted, and tests use it
// so that a failing test does not leave the machine polluted for the next.
package hostscrub

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/mounter"
)

// Scrub unmounts every mount below dir (the latest mounted first, so that a
// mount goes before the one it sits on) and releases every loop device
// bound to a regular file inside dir. It is best effort: it reports
// nothing, and leaves what it cannot release.
func Scrub(ctx context.Context, dir string) {
	dir = filepath.Clean(dir)
	m := mounter.New()
	if mounts, err := m.List(ctx); err == nil {
		for i := len(mounts) - 1; i >= 0; i-- {
			if strings.HasPrefix(mounts[i].Path, dir+"/") {
				_ = m.Unmount(ctx, mounts[i].Path)
			}
		}
	}
	devs, err := loopdev.List()
	if err != nil || len(devs) == 0 {
		return
	}
	files := map[loopdev.FileID]bool{}
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				if id, err := loopdev.IDOf(fi); err == nil {
					files[id] = true
				}
			}
		}
		return nil
	})
	for _, dev := range devs {
		if id, err := loopdev.Backing(dev.Path); err == nil && files[id] {
			_ = loopdev.Release(ctx, dev.Path, id)
		}
	}
}
