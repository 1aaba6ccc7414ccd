package check

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/kubelet"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/view"
)

// RecordSource is one csid's records: a live csid's admin socket or a state
// file (any view.Source), and its mode.
type RecordSource struct {
	Name   string
	Mode   string
	Source view.Source
	// Kubelet is the kubelet directory the csid works in, as it says (a
	// live csid's admin Info); nil when it does not say (a state file),
	// and the Sources' DriverName and KubeletRoot stand in.
	Kubelet *Kubelet
}

// Kubelet is where kubelet keeps the mounts of one csid's volumes: the
// directories it makes for the CSI driver DriverName under its root
// directory. A mount there is that csid's, whether or not a record
// explains it; a mount under another root, or for another driver, is not.
type Kubelet struct {
	DriverName string `json:"driverName"`
	Root       string `json:"root"`
}

// under reports whether path lies in directory dir.
func under(dir, path string) bool { return strings.HasPrefix(path, filepath.Clean(dir)+"/") }

// underAny reports whether path lies in the root directory of one of the
// kubelets.
func underAny(kubelets []Kubelet, path string) bool {
	return slices.ContainsFunc(kubelets, func(k Kubelet) bool { return under(k.Root, path) })
}

// Cloud is what Gather reads of the cloud and the machine's loop devices;
// *local.Inspector is one.
type Cloud interface {
	Disks(ctx context.Context) ([]cloud.Disk, error)
	LoopDevices(ctx context.Context) (map[string][]string, error)
}

// SnapshotLister reads the provider's snapshots. A Cloud that is one is
// read for them too (the local backend's inspector, when it takes
// snapshots).
type SnapshotLister interface {
	Snapshots(ctx context.Context) ([]cloud.Snapshot, error)
}

// MountLister reads the host's mount table; mounter.New() is one.
type MountLister interface {
	List(ctx context.Context) ([]mounter.MountPoint, error)
}

// Sources say where Gather reads. A nil Cloud or Mounts is not read, and
// Compare's notes say why (CloudNotRead, MountsNotRead).
type Sources struct {
	Records                     []RecordSource
	Cloud                       Cloud
	Mounts                      MountLister
	CloudNotRead, MountsNotRead string
	Notes                       []string
	HostNodes                   []string
	// Freezes, if set, reads the local backend's freeze records.
	Freezes func() ([]Freeze, error)
	// DriverName and KubeletRoot stand in for a record source that does
	// not say its own (Kubelet nil); an empty KubeletRoot: none.
	DriverName  string
	KubeletRoot string
}

// Kubelets returns the kubelet directories of the csids s reads that keep
// node records (a controller's are no node's): each source's own, or the
// stand-ins for one that does not say. A csid without a kubelet root
// (all-in-one without --kubelet-root) has none.
func (s Sources) Kubelets() []Kubelet {
	var out []Kubelet
	for _, r := range s.Records {
		if r.Mode == "controller" {
			continue
		}
		k := Kubelet{DriverName: s.DriverName, Root: s.KubeletRoot}
		if r.Kubelet != nil {
			k = *r.Kubelet
		}
		if k.Root != "" && k.DriverName != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// Gather reads the inputs of Compare. The records are read twice, before
// and after the cloud and the host, and the volumes whose records changed
// in between are marked Changing: what was read of them may straddle a
// transition.
func Gather(ctx context.Context, s Sources) (Input, error) {
	in := Input{HostNodes: s.HostNodes, CloudNotRead: s.CloudNotRead, MountsNotRead: s.MountsNotRead, Notes: s.Notes}
	for _, k := range s.Kubelets() {
		if _, err := os.Stat(k.Root); err != nil {
			in.Notes = append(in.Notes, fmt.Sprintf("kubelet's root %s is not here (%v): its directories were not searched for stray mounts; "+
				"csid's recorded paths and the mounts of its devices were compared (in Kubernetes, run csid check in the node plugin's pod)", k.Root, errors.Unwrap(err)))
			continue
		}
		in.Kubelets = append(in.Kubelets, k)
	}
	before, err := readRecords(ctx, s.Records, false)
	if err != nil {
		return Input{}, err
	}
	if s.Cloud != nil {
		if in.Disks, err = s.Cloud.Disks(ctx); err != nil {
			return Input{}, fmt.Errorf("read the cloud's disks: %w", err)
		}
		if in.Devices, err = s.Cloud.LoopDevices(ctx); err != nil {
			return Input{}, fmt.Errorf("read the loop devices: %w", err)
		}
		in.DisksRead, in.DevicesRead = true, true
		if s.Freezes != nil {
			if in.Freezes, err = s.Freezes(); err != nil {
				return Input{}, fmt.Errorf("read the freeze records: %w", err)
			}
		}
		if sl, ok := s.Cloud.(SnapshotLister); ok {
			if in.Snapshots, err = sl.Snapshots(ctx); err != nil {
				return Input{}, fmt.Errorf("read the provider's snapshots: %w", err)
			}
			in.SnapshotsRead = true
		}
	}
	if s.Mounts != nil {
		mps, err := s.Mounts.List(ctx)
		if err != nil {
			return Input{}, fmt.Errorf("read the mount table: %w", err)
		}
		in.Mounts, in.MountsRead = withVolData(mps, in.Kubelets), true
	}
	if in.Stores, err = readRecords(ctx, s.Records, true); err != nil {
		return Input{}, err
	}
	in.Changing = Changed(before, in.Stores)
	if in.MountsRead {
		in.Unseen = unseen(in.Stores)
	}
	return in, nil
}

// unseen returns the recorded staging and target paths whose directory
// does not exist here.
func unseen(stores []Store) map[string]bool {
	out := map[string]bool{}
	for _, s := range stores {
		for _, v := range s.Volumes {
			paths := []string{v.StagingPath}
			for _, t := range v.Targets {
				paths = append(paths, t.Path)
			}
			for _, p := range paths {
				if p == "" {
					continue
				}
				if _, err := os.Stat(filepath.Dir(p)); err != nil {
					out[p] = true
				}
			}
		}
	}
	return out
}

// readRecords reads the volumes of every source and, with damaged, checks
// every record of each (a scan of the whole file).
func readRecords(ctx context.Context, srcs []RecordSource, damaged bool) ([]Store, error) {
	out := make([]Store, 0, len(srcs))
	for _, src := range srcs {
		l, err := src.Source.Volumes(ctx, view.VolumeFilter{})
		if err != nil {
			return nil, fmt.Errorf("read the records of %s: %w", src.Name, err)
		}
		st := Store{Name: src.Name, Mode: src.Mode, Volumes: l.Volumes}
		if st.controller() {
			sl, err := src.Source.Snapshots(ctx)
			if err != nil {
				return nil, fmt.Errorf("read the snapshot records of %s: %w", src.Name, err)
			}
			st.Snapshots = sl.Snapshots
		}
		if damaged {
			d, err := src.Source.Damaged(ctx)
			if err != nil {
				return nil, fmt.Errorf("check the records of %s: %w", src.Name, err)
			}
			st.Damaged = d.Records
		}
		out = append(out, st)
	}
	return out, nil
}

// withVolData annotates the mounts under the kubelet roots with the driver
// named by the vol_data.json kubelet keeps beside a CSI volume's mount
// point (pods/<uid>/volumes/kubernetes.io~csi/<pv>/vol_data.json beside
// .../mount, and the staging directory's beside .../globalmount).
func withVolData(mps []mounter.MountPoint, kubelets []Kubelet) []Mount {
	out := make([]Mount, len(mps))
	for i, mp := range mps {
		out[i].MountPoint = mp
		if !underAny(kubelets, mp.Path) {
			continue
		}
		if base := filepath.Base(mp.Path); base != "mount" && base != "globalmount" {
			continue
		}
		out[i].Driver = volDataDriver(filepath.Join(filepath.Dir(mp.Path), "vol_data.json"))
	}
	return out
}

// volDataDriver reads the driver name of a kubelet vol_data.json; "" when
// there is none or it cannot be read.
func volDataDriver(path string) string {
	d, err := kubelet.ReadVolData(path) // never through a link, size-capped
	if err != nil {
		return ""
	}
	return d.DriverName
}

// LocalFreezes reads the freeze records of a local backend's inspector,
// for Sources.Freezes.
func LocalFreezes(insp *local.Inspector) func() ([]Freeze, error) {
	return func() ([]Freeze, error) {
		recs, err := insp.Freezes()
		if err != nil {
			return nil, err
		}
		out := make([]Freeze, len(recs))
		for i, r := range recs {
			out[i] = Freeze{DiskID: r.DiskID, MountPoints: r.MountPoints, Since: r.Since}
		}
		return out, nil
	}
}
