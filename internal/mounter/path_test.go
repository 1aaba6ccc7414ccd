package mounter

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidatePath(t *testing.T) {
	good := []string{
		"/",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/csid.dev/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/globalmount",
		"/dev/loop3",
		"/a/b..c/..d/e..",
		"/with space/and\ttab",
		"/" + strings.Repeat("a", MaxPathBytes-1),
	}
	bad := []string{
		"",
		"relative/path",
		"./here",
		"..",
		"/a/../b",
		"/a/..",
		"/../etc",
		"/a\x00b",
		"/" + strings.Repeat("a", MaxPathBytes),
	}
	for _, p := range good {
		if err := ValidatePath(p); err != nil {
			t.Errorf("ValidatePath(%.40q): %v, want nil", p, err)
		}
	}
	for _, p := range bad {
		if err := ValidatePath(p); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("ValidatePath(%.40q): %v, want ErrInvalidPath", p, err)
		}
	}
}

// Every method refuses a bad path before touching the file system: traps
// are set where the paths lead once ".." is resolved, and none is touched.
// (Needs no root: nothing is ever mounted.)
func TestMethodsRefuseBadPathsBeforeAnyCall(t *testing.T) {
	dir := t.TempDir()
	trapDir := filepath.Join(dir, "trap")
	if err := os.Mkdir(trapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	viaDotDot := filepath.Join(dir, "x") + "/../trap" // names trapDir
	fresh := filepath.Join(dir, "x") + "/../fresh"    // would be created
	good := filepath.Join(dir, "good")

	rec := &recorder{fail: func(name string) error {
		t.Errorf("%s ran for a bad path", name)
		return errors.New("no")
	}}
	m := newLinux(rec.run)
	ctx := context.Background()
	for _, p := range []string{"", "relative", viaDotDot, fresh, "/a\x00"} {
		calls := map[string]error{
			"FormatAndMount(device)": errOf(m.FormatAndMount(ctx, p, good, "ext4", nil, nil)),
			"FormatAndMount(target)": errOf(m.FormatAndMount(ctx, good, p, "ext4", nil, nil)),
			"BindMount(source)":      m.BindMount(ctx, p, good, false),
			"BindMount(target)":      m.BindMount(ctx, good, p, false),
			"BindMountDevice(dev)":   m.BindMountDevice(ctx, p, good, false),
			"BindMountDevice(tgt)":   m.BindMountDevice(ctx, good, p, false),
			"Unmount":                m.Unmount(ctx, p),
		}
		_, calls["IsMounted"] = m.IsMounted(ctx, p)
		_, calls["DeviceOf"] = m.DeviceOf(ctx, p)
		_, calls["Filesystem"] = m.Filesystem(ctx, p)
		_, calls["DeviceSize"] = m.DeviceSize(ctx, p)
		_, calls["GrowFilesystem(device)"] = m.GrowFilesystem(ctx, p, good)
		_, calls["GrowFilesystem(path)"] = m.GrowFilesystem(ctx, good, p)
		_, calls["Stats"] = m.Stats(ctx, p)
		for name, err := range calls {
			if !errors.Is(err, ErrInvalidPath) {
				t.Errorf("%s(%q): %v, want ErrInvalidPath", name, p, err)
			}
		}
	}
	if _, err := os.Stat(trapDir); err != nil {
		t.Fatalf("the trap was removed: %v", err)
	}
	for _, p := range []string{filepath.Join(dir, "fresh"), good, filepath.Join(dir, "x")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was created: %v", p, err)
		}
	}
}
