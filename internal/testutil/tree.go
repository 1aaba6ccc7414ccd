package testutil

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Tree describes what is under each of roots, without following a
// symbolic link: every entry's type, a regular file's content (its size
// and sha256 when longer than 64 bytes, as a disk image is), a link's
// destination. A root that does not exist adds nothing. Two trees taken
// around a call, compared with Changes, tell whether it changed anything.
func Tree(t testing.TB, roots ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				to, err := os.Readlink(p)
				out[p] = "link to " + to
				return err
			case d.Type().IsRegular():
				raw, err := os.ReadFile(p)
				if len(raw) > 64 {
					out[p] = fmt.Sprintf("file of %d bytes, sha256 %x", len(raw), sha256.Sum256(raw))
				} else {
					out[p] = fmt.Sprintf("file %q", raw)
				}
				return err
			}
			out[p] = d.Type().String()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Changes lists, sorted, how after differs from before (two Trees, or
// any such descriptions of paths): what is gone, what differs, what
// appeared.
func Changes(before, after map[string]string) []string {
	var out []string
	for p, b := range before {
		if a, ok := after[p]; !ok {
			out = append(out, fmt.Sprintf("%s is gone (was %s)", p, b))
		} else if a != b {
			out = append(out, fmt.Sprintf("%s is %s (was %s)", p, a, b))
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			out = append(out, fmt.Sprintf("%s appeared (%s)", p, a))
		}
	}
	slices.Sort(out)
	return out
}
