package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/csid-dev/csid/internal/hostscrub"
)

// A run's floors work in a scratch directory of its own in
// Config.FloorDir, csid-bench-<run id>: the bbolt file of the floor, and
// the image of the mkfs+mount floor with the directory it is mounted on.
// The journal of the endpoint under test records the directory before it
// is made, so that the next run cleans up after a run killed in the middle
// of a sample (its image bound to a loop device and mounted); a run that
// ends removes it itself.
const (
	scratchPrefix = "csid-bench-"
	scratchDB     = "floor.db"
	scratchImage  = "image"
	scratchMount  = "mnt"
)

// scratchName is the form of a scratch directory's name: a journal naming
// anything else is not followed.
var scratchName = regexp.MustCompile(`^csid-bench-[0-9a-f]{8}$`)

// makeScratch records the run's scratch directory in the journal of the
// endpoint under test, then makes it.
func (r *runner) makeScratch(id string) (string, error) {
	dir := filepath.Join(r.cfg.FloorDir, scratchPrefix+id)
	if err := r.eps[0].jrnl.write(journalLine{Scratch: dir}); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("floor directory: %w", err)
	}
	return dir, nil
}

// removeScratch removes a scratch directory and what the floors left in
// it, entry by entry (never recursively: a mount left by a failed unmount
// makes it fail rather than delete the mounted filesystem's contents).
func removeScratch(dir string) error {
	var errs []error
	for _, path := range []string{filepath.Join(dir, scratchDB), filepath.Join(dir, scratchImage), filepath.Join(dir, scratchMount), dir} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the floors' directory %s: %w", dir, err)
	}
	return nil
}

// recoverScratch undoes what a killed run left in its scratch directory:
// the mount of the floor's image and its loop device (every mount below
// the directory, every loop device bound to a file in it), then the
// entries the floors make. A path not of the scratch form, or that is not
// a directory (a symbolic link), is refused.
func recoverScratch(ctx context.Context, dir string) error {
	if !filepath.IsAbs(dir) || !scratchName.MatchString(filepath.Base(dir)) {
		return fmt.Errorf("journal names %q as a floors' directory: not one", dir)
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: not a directory, left alone", dir)
	}
	hostscrub.Scrub(ctx, dir)
	return removeScratch(dir)
}
