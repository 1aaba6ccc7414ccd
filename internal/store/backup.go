package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Backup writes a consistent copy of the state file to w, from one read
// transaction (bbolt's Tx.WriteTo): commits go on meanwhile, and the copy
// holds every record as of the moment it began. It returns the bytes
// written. It works on a file removed or replaced under csid (the copy is
// of the file csid has open), not on one cut short.
func (s *Store) Backup(w io.Writer) (n int64, err error) {
	err = s.View(func(tx *Tx) error {
		var err error
		n, err = tx.tx.WriteTo(w)
		return err
	})
	return n, err
}

// WriteFile writes r (a backup) to a new file at path, crash-safely: into
// a temporary file beside it, fsynced, renamed into place, and the
// directory fsynced. An existing file at path is refused, never replaced.
func WriteFile(path string, r io.Reader) (int64, error) {
	dir := filepath.Dir(path)
	if _, err := os.Lstat(path); err == nil {
		return 0, fmt.Errorf("%s exists: csid does not overwrite it; choose another name", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // after a successful link, only the temporary name goes
	n, err := io.Copy(tmp, r)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("write %s: %w", path, err)
	}
	// A link, not a rename: it fails if path appeared meanwhile.
	if err := os.Link(tmp.Name(), path); err != nil {
		return n, fmt.Errorf("put the copy at %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return n, err
	}
	defer d.Close()
	if err := unix.Fsync(int(d.Fd())); err != nil {
		return n, fmt.Errorf("sync %s: %w", dir, err)
	}
	return n, nil
}
