// Package kubelet knows where kubelet keeps the mounts of a CSI driver's
// volumes (kubernetes pkg/volume/csi), so that csid can tell the staging
// and target paths kubelet gave it from any other mount of the same
// device: an operator's bind mount, a sub-path kubelet binds for a
// container, another driver's volume.
//
// Under kubelet's root directory (default /var/lib/kubelet):
//
//	plugins/kubernetes.io/csi/<driver>/<sha256 of the volume id>/globalmount  a filesystem's staging path (Kubernetes 1.24 and later)
//	plugins/kubernetes.io/csi/pv/<pv>/globalmount                               the same before 1.24
//	pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount                          a filesystem's target
//	plugins/kubernetes.io/csi/volumeDevices/staging/<pv>                        a raw block volume's staging directory (never a mount)
//	plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>              a raw block volume's target (.../publish/<pv> before 1.20)
//
// Beside a filesystem's staging and target directories kubelet writes a
// vol_data.json naming the driver and the volume id (for raw block volumes
// in plugins/kubernetes.io/csi/volumeDevices/<pv>/data/); where the path
// itself does not name both, the file must.
package kubelet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Layout is kubelet's directory layout for one CSI driver.
type Layout struct {
	// Root is kubelet's root directory; "" matches nothing.
	Root string
	// Driver is the CSI driver's name.
	Driver string
}

// VolData is what kubelet's vol_data.json says of a volume.
type VolData struct {
	DriverName   string `json:"driverName"`
	VolumeHandle string `json:"volumeHandle"`
}

// csi is kubelet's directory of CSI plugins.
func (l Layout) csi() string { return filepath.Join(l.Root, "plugins", "kubernetes.io", "csi") }

// rel returns the elements of path below dir, or nil when path is not
// strictly below it.
func rel(dir, path string) []string {
	path = filepath.Clean(path)
	r, ok := strings.CutPrefix(path, filepath.Clean(dir)+"/")
	if !ok || r == "" {
		return nil
	}
	return strings.Split(r, "/")
}

// Staging reports whether path is where kubelet stages the filesystem
// volume volumeID of the driver.
func (l Layout) Staging(path, volumeID string) bool {
	if l.Root == "" {
		return false
	}
	e := rel(l.csi(), path)
	if len(e) != 3 || e[2] != "globalmount" {
		return false
	}
	switch {
	case e[0] == l.Driver:
		sum := sha256.Sum256([]byte(volumeID))
		return e[1] == hex.EncodeToString(sum[:])
	case e[0] == "pv":
		return l.names(filepath.Dir(path), volumeID)
	}
	return false
}

// Target reports whether path is where kubelet publishes the volume
// volumeID of the driver for a pod: a filesystem's mount directory, or a
// raw block volume's file (block).
func (l Layout) Target(path, volumeID string, block bool) bool {
	if l.Root == "" {
		return false
	}
	if !block {
		e := rel(filepath.Join(l.Root, "pods"), path)
		return len(e) == 5 && e[1] == "volumes" && e[2] == "kubernetes.io~csi" && e[4] == "mount" &&
			l.names(filepath.Dir(path), volumeID)
	}
	e := rel(filepath.Join(l.csi(), "volumeDevices", "publish"), path)
	if len(e) != 1 && len(e) != 2 {
		return false
	}
	return l.names(filepath.Join(l.csi(), "volumeDevices", e[0], "data"), volumeID)
}

// names reports whether the vol_data.json kubelet keeps in dir names the
// driver and the volume.
func (l Layout) names(dir, volumeID string) bool {
	d, err := ReadVolData(filepath.Join(dir, "vol_data.json"))
	return err == nil && d.DriverName == l.Driver && d.VolumeHandle == volumeID
}

// ReadVolData reads a vol_data.json, not following a symbolic link to it.
func ReadVolData(path string) (VolData, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return VolData{}, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return VolData{}, err
	}
	var d VolData
	return d, json.Unmarshal(raw, &d)
}
