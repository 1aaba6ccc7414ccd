package kubelet

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

const (
	driver = "csid.csi.dev"
	vol    = "vol-0123456789abcdef0123"
)

func sha(id string) string {
	s := sha256.Sum256([]byte(id))
	return hex.EncodeToString(s[:])
}

// TestLayout: kubelet's staging and target paths of this driver's volume
// are recognised; the same shapes for another volume or driver, without
// kubelet's vol_data.json, through a link to it, outside the root, or any
// other path, are not.
func TestLayout(t *testing.T) {
	root := t.TempDir()
	l := Layout{Root: root, Driver: driver}
	volData := func(dir, drv, id string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o750); err != nil {
			t.Fatal(err)
		}
		raw := fmt.Sprintf(`{"driverName":%q,"volumeHandle":%q}`, drv, id)
		if err := os.WriteFile(filepath.Join(root, dir, "vol_data.json"), []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	volData("pods/uid-1/volumes/kubernetes.io~csi/pv-1", driver, vol)
	volData("pods/uid-2/volumes/kubernetes.io~csi/pv-2", "other.csi.dev", vol)
	volData("pods/uid-3/volumes/kubernetes.io~csi/pv-3", driver, "vol-other")
	volData("plugins/kubernetes.io/csi/pv/pv-1", driver, vol)
	volData("plugins/kubernetes.io/csi/volumeDevices/pv-b/data", driver, vol)
	volData("elsewhere", driver, vol)
	if err := os.MkdirAll(filepath.Join(root, "pods/uid-4/volumes/kubernetes.io~csi/pv-4"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "elsewhere/vol_data.json"), filepath.Join(root, "pods/uid-4/volumes/kubernetes.io~csi/pv-4/vol_data.json")); err != nil {
		t.Fatal(err)
	}
	j := func(p ...string) string { return filepath.Join(append([]string{root}, p...)...) }
	cases := []struct {
		path                  string
		staging, target, blck bool
	}{
		{j("plugins/kubernetes.io/csi", driver, sha(vol), "globalmount"), true, false, false},
		{j("plugins/kubernetes.io/csi", driver, sha("vol-other"), "globalmount"), false, false, false},
		{j("plugins/kubernetes.io/csi", "other.csi.dev", sha(vol), "globalmount"), false, false, false},
		{j("plugins/kubernetes.io/csi/pv/pv-1/globalmount"), true, false, false},
		{j("plugins/kubernetes.io/csi/pv/pv-9/globalmount"), false, false, false},
		{j("pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"), false, true, false},
		{j("pods/uid-2/volumes/kubernetes.io~csi/pv-2/mount"), false, false, false},
		{j("pods/uid-3/volumes/kubernetes.io~csi/pv-3/mount"), false, false, false},
		{j("pods/uid-4/volumes/kubernetes.io~csi/pv-4/mount"), false, false, false},
		{j("pods/uid-1/volume-subpaths/pv-1/app/0"), false, false, false},
		{j("pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount/x"), false, false, false},
		{j("plugins/kubernetes.io/csi/volumeDevices/publish/pv-b/uid-1"), false, false, true},
		{j("plugins/kubernetes.io/csi/volumeDevices/publish/pv-b"), false, false, true},
		{j("plugins/kubernetes.io/csi/volumeDevices/publish/pv-c/uid-1"), false, false, false},
		{j("plugins/kubernetes.io/csi/volumeDevices/staging/pv-b"), false, false, false},
		{j("elsewhere/mount"), false, false, false},
		{"/mnt/globalmount", false, false, false},
	}
	for _, c := range cases {
		if got := l.Staging(c.path, vol); got != c.staging {
			t.Errorf("Staging(%s) = %v", c.path, got)
		}
		if got := l.Target(c.path, vol, false); got != c.target {
			t.Errorf("Target(%s) = %v", c.path, got)
		}
		if got := l.Target(c.path, vol, true); got != c.blck {
			t.Errorf("Target(%s, block) = %v", c.path, got)
		}
	}
	// Without a root, nothing matches: not even the shapes below "", a
	// relative path.
	noRoot := Layout{Driver: driver}
	rel := func(p string) string { return p[len(root)+1:] }
	if noRoot.Staging(rel(cases[0].path), vol) || noRoot.Target(rel(cases[5].path), vol, false) || noRoot.Target(rel(cases[11].path), vol, true) {
		t.Error("a layout without a root matches")
	}
}
