package check

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/view"
)

const (
	root    = "/var/lib/kubelet"
	drvName = "csid.csi.dev"
	staging = root + "/plugins/kubernetes.io/csi/csid.csi.dev/abc/globalmount"
	target  = root + "/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
)

func disk(id, vol, node string) cloud.Disk {
	d := cloud.Disk{ID: id, Name: vol, SizeBytes: 1 << 30, AttachedTo: node}
	if vol != "" {
		d.Tags = map[string]string{effects.TagVolumeID: vol}
	}
	return d
}

// csnap is a provider snapshot csid took as snapshot id of volume vol.
func csnap(cloudID, id, vol string) cloud.Snapshot {
	s := cloud.Snapshot{ID: cloudID, Name: id, SourceDiskID: "disk-2", SizeBytes: 1 << 30, Ready: true}
	if id != "" {
		s.Tags = map[string]string{effects.TagSnapshotID: id, effects.TagSourceVolume: vol}
	}
	return s
}

// healthy is one volume published on node-1 and one created with a
// snapshot, everything in agreement.
func healthy() Input {
	pub := view.Volume{ID: "vol-pub", DiskID: "disk-1", State: fsm.Published, Node: "node-1", StagingPath: staging,
		Targets: []view.Target{{Path: target}}, Generation: 4}
	created := view.Volume{ID: "vol-new", DiskID: "disk-2", State: fsm.Created, Generation: 1}
	return Input{
		Stores: []Store{{Name: "all.sock", Mode: "all", Volumes: []view.Volume{pub, created},
			Snapshots: []view.Snapshot{{ID: "snap-1", State: fsm.Ready, SourceVolumeID: "vol-new", CloudID: "csnap-1", Generation: 1}}}},
		DisksRead:     true,
		Disks:         []cloud.Disk{disk("disk-1", "vol-pub", "node-1"), disk("disk-2", "vol-new", "")},
		SnapshotsRead: true,
		Snapshots:     []cloud.Snapshot{csnap("csnap-1", "snap-1", "vol-new")},
		DevicesRead:   true,
		Devices:       map[string][]string{"disk-1": {"/dev/loop3"}},
		MountsRead:    true,
		Mounts: []Mount{
			{MountPoint: mounter.MountPoint{Device: "/dev/sda1", Path: "/", Type: "ext4"}},
			{MountPoint: mounter.MountPoint{Device: "tmpfs", Path: root + "/pods/uid-9/volumes/kubernetes.io~projected/token", Type: "tmpfs"}},
			{MountPoint: mounter.MountPoint{Device: "/dev/loop3", Path: staging, Type: "ext4"}},
			{MountPoint: mounter.MountPoint{Device: "/dev/loop3", Path: target, Type: "ext4"}, Driver: drvName},
			// kubelet's bind of a sub-path of the published volume.
			{MountPoint: mounter.MountPoint{Device: "/dev/loop3", Path: root + "/pods/uid-1/volume-subpaths/pv-1/app/0", Type: "ext4", Root: "/data"}},
			// another driver's volume
			{MountPoint: mounter.MountPoint{Device: "/dev/nvme1n1", Path: root + "/pods/uid-2/volumes/kubernetes.io~csi/pv-2/mount", Type: "xfs"}, Driver: "ebs.csi.aws.com"},
		},
		HostNodes: []string{"node-1"},
		Kubelets:  []Kubelet{{DriverName: drvName, Root: root}},
	}
}

func kinds(r Report) []Kind {
	var out []Kind
	for _, f := range r.Findings {
		out = append(out, f.Kind)
	}
	return out
}

func TestCleanIsClean(t *testing.T) {
	r := Compare(healthy())
	if !r.Clean() || len(r.Notes) != 0 {
		t.Fatalf("a healthy system: findings %+v, notes %q", r.Findings, r.Notes)
	}
	if r.Checked != (Counts{Volumes: 2, Snapshots: 1, Disks: 2, Devices: 1, Mounts: 3}) {
		t.Errorf("checked %+v", r.Checked)
	}
}

func TestEachFinding(t *testing.T) {
	cases := []struct {
		name   string
		change func(in *Input)
		want   []Kind
		says   string // in the finding's problem
	}{
		{"a disk no record names", func(in *Input) { in.Disks = append(in.Disks, disk("disk-9", "vol-gone", "")) },
			[]Kind{DiskWithoutVolume}, "disk-9"},
		{"a disk csid did not make", func(in *Input) { in.Disks = append(in.Disks, disk("disk-9", "", "")) },
			[]Kind{DiskWithoutVolume}, "no csid record"},
		{"a record whose disk is gone", func(in *Input) { in.Disks = in.Disks[:1] },
			[]Kind{VolumeWithoutDisk}, "vol-new"},
		{"an attachment the record does not know", func(in *Input) { in.Disks[1].AttachedTo = "node-2" },
			[]Kind{AttachmentUnknown}, "attached to node-2"},
		{"attached elsewhere", func(in *Input) { in.Disks[0].AttachedTo = "node-2" },
			[]Kind{AttachmentUnknown}, "attached to node-1 (PUBLISHED)"},
		{"a detach the record does not know", func(in *Input) { in.Disks[0].AttachedTo = "" },
			[]Kind{AttachmentMissing}, "detached"},
		{"a loop device of a detached disk", func(in *Input) { in.Devices["disk-2"] = []string{"/dev/loop7"} },
			[]Kind{LoopDeviceUnaccounted}, "/dev/loop7"},
		{"a loop device of a deleted disk", func(in *Input) { in.Devices["disk-8"] = []string{"/dev/loop8"} },
			[]Kind{LoopDeviceUnaccounted}, "/dev/loop8"},
		{"a second loop device of an attached disk", func(in *Input) { in.Devices["disk-1"] = append(in.Devices["disk-1"], "/dev/loop9") },
			[]Kind{LoopDeviceUnaccounted}, "second loop device"},
		{"a tmpfs in csid's staging directory", func(in *Input) {
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "tmpfs", Type: "tmpfs", Path: root + "/plugins/kubernetes.io/csi/csid.csi.dev/zzz/globalmount"}})
		}, []Kind{MountUnaccounted}, "zzz"},
		{"a stale target of csid's driver", func(in *Input) {
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "/dev/loop3", Type: "ext4", Path: root + "/pods/uid-5/volumes/kubernetes.io~csi/pv-1/mount"}, Driver: drvName})
		}, []Kind{MountUnaccounted}, "uid-5"},
		{"csid's device mounted by hand", func(in *Input) {
			in.Devices["disk-2"] = []string{"/dev/loop7"}
			in.Stores[0].Volumes[1].State, in.Stores[0].Volumes[1].Node = fsm.NodeReady, "node-1"
			in.Disks[1].AttachedTo = "node-1"
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "/dev/loop7", Type: "ext4", Path: "/mnt"}})
		}, []Kind{MountUnaccounted}, "/mnt"},
		{"a raw block volume's device bound by hand", func(in *Input) {
			in.Devices["disk-2"] = []string{"/dev/loop7"}
			in.Stores[0].Volumes[1].State, in.Stores[0].Volumes[1].Node = fsm.NodeReady, "node-1"
			in.Disks[1].AttachedTo = "node-1"
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "udev", Type: "devtmpfs", Root: "/loop7", Path: "/tmp/x"}})
		}, []Kind{MountUnaccounted}, "/dev/loop7"},
		{"a target that is a mount of another disk's device", func(in *Input) {
			otherAttached(in)
			in.Mounts[3].Device = "/dev/loop7"
		}, []Kind{DeviceMismatch}, "target path " + target + ", and that path is a mount of /dev/loop7, which is bound to disk disk-2 (volume vol-new)"},
		{"a staging path with another filesystem mounted", func(in *Input) {
			in.Mounts[2].Device, in.Mounts[2].Type = "tmpfs", "tmpfs"
		}, []Kind{DeviceMismatch}, "staging path " + staging + ", and that path is a mount of tmpfs"},
		{"a raw block target bound to a device of no disk", func(in *Input) {
			v := &in.Stores[0].Volumes[0]
			v.AccessType, v.StagingPath = "block", root+"/plugins/kubernetes.io/csi/volumeDevices/staging/pv-1"
			in.Mounts = slices.Delete(in.Mounts, 2, 5) // no filesystem of it is mounted
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "udev", Type: "devtmpfs", Root: "/loop4", Path: target}})
		}, []Kind{DeviceMismatch}, "mount of /dev/loop4 (devtmpfs from udev), not of its disk disk-1"},
		{"a record's device bound to another disk", func(in *Input) {
			otherAttached(in)
			in.Stores[0].Volumes[0].Device = "/dev/loop7"
		}, []Kind{DeviceMismatch}, "staged from /dev/loop7 as its record says, and /dev/loop7 is bound to disk disk-2 (volume vol-new); its disk's device is now /dev/loop3"},
		{"a snapshot no record names", func(in *Input) { in.Snapshots = append(in.Snapshots, csnap("csnap-9", "snap-gone", "vol-new")) },
			[]Kind{SnapshotWithoutRecord}, "csnap-9"},
		{"a snapshot csid did not take", func(in *Input) { in.Snapshots = append(in.Snapshots, csnap("csnap-9", "", "")) },
			[]Kind{SnapshotWithoutRecord}, "no csid record"},
		{"a record whose snapshot is gone", func(in *Input) { in.Snapshots = nil },
			[]Kind{RecordWithoutSnapshot}, "csnap-1"},
		{"a filesystem left frozen", func(in *Input) {
			in.Freezes = []Freeze{{DiskID: "disk-1", MountPoints: []string{staging}, Since: time.Unix(1e9, 0)}}
		}, []Kind{FilesystemFrozen}, "froze the filesystem of disk disk-1 (mounted at " + staging},
		{"a staging path with nothing mounted", func(in *Input) { in.Mounts = slices.Delete(in.Mounts, 2, 3) },
			[]Kind{MountMissing}, "staging path"},
		{"a target with nothing mounted", func(in *Input) { in.Mounts = slices.Delete(in.Mounts, 3, 4) },
			[]Kind{MountMissing}, "target path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := healthy()
			c.change(&in)
			r := Compare(in)
			if !slices.Equal(kinds(r), c.want) {
				t.Fatalf("found %v, want %v: %+v", kinds(r), c.want, r.Findings)
			}
			f := r.Findings[0]
			if !strings.Contains(f.Problem, c.says) {
				t.Errorf("problem %q does not say %q", f.Problem, c.says)
			}
			if f.Cause == "" || f.Action == "" {
				t.Errorf("a finding without cause or action: %+v", f)
			}
		})
	}
}

// otherAttached attaches vol-new to node-1, with its device /dev/loop7.
func otherAttached(in *Input) {
	in.Devices["disk-2"] = []string{"/dev/loop7"}
	in.Stores[0].Volumes[1].State, in.Stores[0].Volumes[1].Node = fsm.NodeReady, "node-1"
	in.Disks[1].AttachedTo = "node-1"
}

// TestInFlightIsLeftOut: a volume with an op in flight, or whose record
// changed while the inputs were read, is not reported, and the notes say so.
func TestInFlightIsLeftOut(t *testing.T) {
	in := healthy()
	in.Disks[1].AttachedTo = "node-1" // controller_publish in flight
	in.Stores[0].Volumes[1].PendingOp = &view.Op{Seq: 7, Event: fsm.ControllerPublish, Status: view.StatusQueued}
	in.Disks = append(in.Disks, disk("disk-3", "vol-creating", "")) // create in flight
	in.Stores[0].Volumes = append(in.Stores[0].Volumes, view.Volume{ID: "vol-creating", State: fsm.Absent,
		PendingOp: &view.Op{Seq: 8, Event: fsm.Create, Status: view.StatusQueued}})
	in.Mounts = slices.Delete(in.Mounts, 3, 4) // an unpublish that changed the record meanwhile
	in.Changing = map[string]bool{"vol-pub": true}
	// A snapshot being cut: the provider has it, its record has no cloud
	// id yet; one being deleted: its record is READY, the provider's is gone.
	in.Snapshots = append(in.Snapshots, csnap("csnap-2", "snap-cutting", "vol-new"))
	// Its freeze is the cut's, in flight.
	in.Freezes = []Freeze{{DiskID: "disk-2", MountPoints: []string{"/mnt/x"}}}
	in.Stores[0].Snapshots = append(in.Stores[0].Snapshots,
		view.Snapshot{ID: "snap-cutting", State: fsm.Absent, SourceDiskID: "disk-2", PendingOp: &view.Op{Seq: 9, Event: fsm.SnapshotCreate, Status: view.StatusQueued}},
		view.Snapshot{ID: "snap-deleting", State: fsm.Ready, CloudID: "csnap-3", PendingOp: &view.Op{Seq: 10, Event: fsm.SnapshotDelete, Status: view.StatusQueued}})
	r := Compare(in)
	if !r.Clean() {
		t.Fatalf("findings about volumes in flight: %+v", r.Findings)
	}
	if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "vol-new (op #7 controller_publish in flight)") || !strings.Contains(r.Notes[0], "vol-pub (changed") {
		t.Errorf("notes %q", r.Notes)
	}
}

// TestUnseenPaths: a recorded path whose directory this host does not have
// (another mount namespace) is named in a note, not reported missing.
func TestUnseenPaths(t *testing.T) {
	in := healthy()
	in.Mounts = in.Mounts[:2] // neither the staging path nor the target is mounted
	in.Unseen = map[string]bool{staging: true, target: true}
	r := Compare(in)
	if !r.Clean() || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], target) {
		t.Errorf("unseen paths: %+v %q", r.Findings, r.Notes)
	}
}

// TestPartialInputs: what was not read is not compared, and said so.
func TestPartialInputs(t *testing.T) {
	in := healthy()
	in.Stores[0].Mode = "node"
	in.Disks = nil // would be two findings with controller records
	r := Compare(in)
	if !r.Clean() || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "no controller records") {
		t.Errorf("node records only: %+v %q", r.Findings, r.Notes)
	}

	in = healthy()
	in.Stores[0].Mode = "controller"
	in.Mounts = nil
	r = Compare(in)
	if !r.Clean() || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "no node records") {
		t.Errorf("controller records only: %+v %q", r.Findings, r.Notes)
	}

	in = healthy()
	in.DisksRead, in.DevicesRead, in.MountsRead = false, false, false
	if r = Compare(in); !r.Clean() || len(r.Notes) != 3 {
		t.Errorf("nothing read but records: %+v %q", r.Findings, r.Notes)
	}
	if r = Compare(Input{}); !r.Clean() || len(r.Notes) != 1 {
		t.Errorf("nothing at all: %+v %q", r.Findings, r.Notes)
	}
}

// TestSplitShape: a controller and a node process on one machine (two
// stores): the controller's NODE_READY and the node's PUBLISHED records of
// one volume agree with the cloud and the host.
func TestSplitShape(t *testing.T) {
	in := healthy()
	all := in.Stores[0].Volumes
	ctrl := []view.Volume{all[1], all[0]}
	ctrl[1].State, ctrl[1].StagingPath, ctrl[1].Targets = fsm.NodeReady, "", nil
	in.Stores = []Store{{Name: "controller.sock", Mode: "controller", Volumes: ctrl, Snapshots: in.Stores[0].Snapshots},
		{Name: "node.sock", Mode: "node", Volumes: all[:1]}}
	if r := Compare(in); !r.Clean() || len(r.Notes) != 0 {
		t.Fatalf("split shape: %+v %q", r.Findings, r.Notes)
	}
}

func TestChanged(t *testing.T) {
	v := func(id string, gen uint64, op uint64) view.Volume {
		out := view.Volume{ID: id, Generation: gen, State: fsm.Created}
		if op != 0 {
			out.PendingOp = &view.Op{Seq: op}
		}
		return out
	}
	before := []Store{{Name: "a", Volumes: []view.Volume{v("same", 1, 0), v("moved", 1, 0), v("busy", 1, 0), v("gone", 1, 0)},
		Snapshots: []view.Snapshot{{ID: "snap-same", State: fsm.Ready, Generation: 1}, {ID: "snap-cut", State: fsm.Absent}}}}
	after := []Store{{Name: "a", Volumes: []view.Volume{v("same", 1, 0), v("moved", 2, 0), v("busy", 1, 5), v("new", 1, 0)},
		Snapshots: []view.Snapshot{{ID: "snap-same", State: fsm.Ready, Generation: 1}, {ID: "snap-cut", State: fsm.Ready, Generation: 1}}}}
	got := Changed(before, after)
	want := map[string]bool{"moved": true, "busy": true, "gone": true, "new": true, "snap-cut": true}
	if len(got) != len(want) {
		t.Fatalf("changed %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Errorf("changed %v lacks %s", got, k)
		}
	}
}

// TestScopedToTheCsidsRead: a staged raw block volume (its staging path is
// kubelet's directory, never a mount) is clean; mounts in another csid's
// kubelet directory, or for another driver in this one, are not compared;
// the same mount in the kubelet directory of a csid read is.
func TestScopedToTheCsidsRead(t *testing.T) {
	const (
		blockStaging = root + "/plugins/kubernetes.io/csi/volumeDevices/staging/pv-b"
		blockTarget  = root + "/plugins/kubernetes.io/csi/volumeDevices/publish/pv-b/uid-3"
		other        = "/srv/other-kubelet"
		elsewhere    = other + "/plugins/kubernetes.io/csi/" + drvName + "/x/globalmount"
	)
	withBlock := func(in *Input) {
		in.Stores[0].Volumes = append(in.Stores[0].Volumes, view.Volume{ID: "vol-blk", DiskID: "disk-3", State: fsm.Published,
			AccessType: "block", Node: "node-1", StagingPath: blockStaging, Targets: []view.Target{{Path: blockTarget}}, Generation: 4})
		in.Disks = append(in.Disks, disk("disk-3", "vol-blk", "node-1"))
		in.Devices["disk-3"] = []string{"/dev/loop4"}
		in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "udev", Type: "devtmpfs", Root: "/loop4", Path: blockTarget}})
	}
	tmpfsAt := func(p string) func(in *Input) {
		return func(in *Input) {
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "tmpfs", Type: "tmpfs", Path: p}})
		}
	}
	cases := []struct {
		name   string
		change []func(in *Input)
		want   []Kind
	}{
		{"a staged and published raw block volume", []func(*Input){withBlock}, nil},
		{"a mount in another csid's kubelet directory", []func(*Input){tmpfsAt(elsewhere)}, nil},
		{"a mount for another driver", []func(*Input){tmpfsAt(root + "/plugins/kubernetes.io/csi/other.csi.dev/x/globalmount")}, nil},
		{"an operator's bind of a staged volume outside kubelet's directory", []func(*Input){func(in *Input) {
			in.Mounts = append(in.Mounts, Mount{MountPoint: mounter.MountPoint{Device: "/dev/loop3", Type: "ext4", Path: "/mnt/backup"}})
		}}, []Kind{MountUnaccounted}},
		{"the same mount in a kubelet directory of a csid read", []func(*Input){tmpfsAt(elsewhere), func(in *Input) {
			in.Kubelets = append(in.Kubelets, Kubelet{DriverName: drvName, Root: other})
		}}, []Kind{MountUnaccounted}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := healthy()
			for _, ch := range c.change {
				ch(&in)
			}
			if got := kinds(Compare(in)); !slices.Equal(got, c.want) {
				t.Fatalf("found %v, want %v", got, c.want)
			}
		})
	}
}

// TestKubeletsOfTheSources: each csid read gives its own kubelet directory;
// one that does not say (a state file) gets the stand-ins; a controller's
// records name none, and a csid without a kubelet root has none.
func TestKubeletsOfTheSources(t *testing.T) {
	s := Sources{DriverName: drvName, KubeletRoot: root, Records: []RecordSource{
		{Name: "node.sock", Mode: "node", Kubelet: &Kubelet{DriverName: "other.csi.dev", Root: "/srv/k"}},
		{Name: "all.sock", Mode: "all", Kubelet: &Kubelet{DriverName: drvName}},
		{Name: "controller.sock", Mode: "controller", Kubelet: &Kubelet{DriverName: drvName, Root: "/srv/c"}},
		{Name: "node.db", Mode: "node"},
	}}
	want := []Kubelet{{DriverName: "other.csi.dev", Root: "/srv/k"}, {DriverName: drvName, Root: root}}
	if got := s.Kubelets(); !slices.Equal(got, want) {
		t.Fatalf("Kubelets() = %+v, want %+v", got, want)
	}
}
