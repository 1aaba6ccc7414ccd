package mounter

import (
	"fmt"
	"path/filepath"
	"strings"
)

// MaxPathBytes is the longest path accepted (PATH_MAX). Kubelet's staging
// and target paths run past 128 bytes, so paths get the kernel's limit, not
// the one of ids.
const MaxPathBytes = 4096

// ValidatePath checks a path before any file system call is made with it:
// it must be absolute and no longer than MaxPathBytes, and may contain
// neither a ".." element nor a NUL byte. Anything else is ErrInvalidPath.
// Every Mounter method validates its paths so; the fake does the same.
func ValidatePath(path string) error {
	switch {
	case path == "":
		return fmt.Errorf("empty path: %w", ErrInvalidPath)
	case len(path) > MaxPathBytes:
		return fmt.Errorf("path of %d bytes, more than %d: %w", len(path), MaxPathBytes, ErrInvalidPath)
	case strings.ContainsRune(path, 0):
		return fmt.Errorf("path %q contains a NUL byte: %w", path, ErrInvalidPath)
	case !filepath.IsAbs(path):
		return fmt.Errorf("path %q is relative: %w", path, ErrInvalidPath)
	}
	for _, elem := range strings.Split(path, "/") {
		if elem == ".." {
			return fmt.Errorf("path %q contains '..': %w", path, ErrInvalidPath)
		}
	}
	return nil
}

// ValidatePaths checks each of paths with ValidatePath and returns the first
// error.
func ValidatePaths(paths ...string) error {
	for _, p := range paths {
		if err := ValidatePath(p); err != nil {
			return err
		}
	}
	return nil
}
