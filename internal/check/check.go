// Package check compares what csid's records say with what the cloud and
// the host show, and explains each disagreement: what differs, its likely
// cause, and what to do. `csid check` gathers the inputs (the records
// through the admin socket or a state file, the disks from the cloud, the
// loop devices and the mount table from the host) and prints the report;
// the crash-recovery drills use Compare to prove that nothing leaked.
//
// Compare is pure: it reads only its Input and changes nothing. A volume
// with an op in flight, or whose record changed while the inputs were
// gathered, is left out of the comparison (its records, disk, devices and
// mounts may be between two states); Report.Notes says so.
//
// # Findings (Finding.Kind), in the order reports list them
//
//	record-damaged           a record of csid's state file fails its checksum: csid does not act on it
//	device-mismatch          a volume's staging or target path is a mount of another device than its disk's,
//	                         or the device its record names is bound to another disk
//	disk-without-volume      the cloud has a disk no record names
//	volume-without-disk      a record names a disk the cloud does not have
//	attachment-unknown       the cloud has a disk attached to a node the record does not say
//	attachment-missing       a record says attached, the cloud says the disk is detached
//	loop-device-unaccounted  a loop device of the state directory's disks that no attached volume explains
//	mount-unaccounted        a mount of csid's (in its kubelet directories, or of its devices) that no record explains
//	mount-missing            a record says staged or published at a path where nothing is mounted
//	snapshot-without-record  the provider has a snapshot no record names
//	record-without-snapshot  a record names a provider snapshot the provider does not have
//	filesystem-frozen        a freeze record of the local backend that no snapshot or clone in flight explains
package check

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/view"
)

// Kind names a kind of finding; the names are stable (tools match them).
type Kind string

// Kinds of findings, in the order reports list them.
const (
	RecordDamaged         Kind = "record-damaged"
	DeviceMismatch        Kind = "device-mismatch"
	DiskWithoutVolume     Kind = "disk-without-volume"
	VolumeWithoutDisk     Kind = "volume-without-disk"
	AttachmentUnknown     Kind = "attachment-unknown"
	AttachmentMissing     Kind = "attachment-missing"
	LoopDeviceUnaccounted Kind = "loop-device-unaccounted"
	MountUnaccounted      Kind = "mount-unaccounted"
	MountMissing          Kind = "mount-missing"
	SnapshotWithoutRecord Kind = "snapshot-without-record"
	RecordWithoutSnapshot Kind = "record-without-snapshot"
	FilesystemFrozen      Kind = "filesystem-frozen"
)

// Kinds lists every kind, in report order.
var Kinds = []Kind{RecordDamaged, DeviceMismatch, DiskWithoutVolume, VolumeWithoutDisk, AttachmentUnknown, AttachmentMissing,
	LoopDeviceUnaccounted, MountUnaccounted, MountMissing, SnapshotWithoutRecord, RecordWithoutSnapshot, FilesystemFrozen}

// Finding is one disagreement between records, cloud and host.
type Finding struct {
	Kind Kind `json:"kind"`
	// Volume, Snapshot, Disk, Node, Device, Path and Record are what the
	// finding is about (those that apply).
	Volume   string `json:"volume,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	Disk     string `json:"disk,omitempty"`
	Node     string `json:"node,omitempty"`
	Device   string `json:"device,omitempty"`
	Path     string `json:"path,omitempty"`
	// Record is a damaged record: bucket/key in the state file.
	Record string `json:"record,omitempty"`
	// Problem says what disagrees, Cause what most likely led there, Action
	// what to do about it.
	Problem string `json:"problem"`
	Cause   string `json:"cause"`
	Action  string `json:"action"`
}

// Store is the records of one csid process.
type Store struct {
	// Name says where they come from (a socket or a state file).
	Name string `json:"name"`
	// Mode is the csid's mode: "all", "controller" or "node" ("" is read
	// as "all"). Controller records (all, controller) say which disks
	// exist and where they are attached; node records (all, node) say what
	// is staged and published.
	Mode    string        `json:"mode"`
	Volumes []view.Volume `json:"-"`
	// Snapshots are a controller's snapshot records.
	Snapshots []view.Snapshot `json:"-"`
	// Damaged are the records that fail their checksum.
	Damaged []view.DamagedRecord `json:"-"`
}

func (s *Store) controller() bool { return s.Mode != "node" }
func (s *Store) node() bool       { return s.Mode != "controller" }

// Mount is a mount table entry and the CSI driver kubelet's vol_data.json
// beside it names ("" when there is none).
type Mount struct {
	mounter.MountPoint
	Driver string
}

// Input is everything Compare compares. A nil Disks (with DisksRead false)
// or an unread host leaves those comparisons out, with a note.
type Input struct {
	Stores []Store
	// DisksRead says whether Disks is the cloud's list of disks.
	DisksRead bool
	Disks     []cloud.Disk
	// SnapshotsRead says whether Snapshots is the provider's list of
	// snapshots (a cloud that takes none has none to read).
	SnapshotsRead bool
	Snapshots     []cloud.Snapshot
	// Freezes are the local backend's freeze records (Sources.Freezes):
	// filesystems a snapshot or clone froze for its copy.
	Freezes []Freeze
	// DevicesRead says whether Devices holds the host's loop devices of
	// the cloud's disks: by disk id, each disk's in device-number order
	// (csid uses the first; a second one is a leak).
	DevicesRead bool
	Devices     map[string][]string
	// MountsRead says whether Mounts is the host's mount table.
	MountsRead bool
	Mounts     []Mount
	// CloudNotRead and MountsNotRead say why the cloud (its disks and the
	// loop devices) or the mount table were not read, for the notes (""
	// gives a generic note).
	CloudNotRead, MountsNotRead string
	// HostNodes are the nodes whose devices and mounts are on this host.
	HostNodes []string
	// Kubelets are the kubelet directories of the csids read (see
	// Kubelet): mounts in them are csid's; mounts in any other kubelet
	// directory (another csid's, another driver's) are not compared.
	Kubelets []Kubelet
	// Unseen are recorded staging and target paths whose directory does
	// not exist on this host (another mount namespace: a pod that does not
	// see the node's kubelet directory): nothing can be said of their
	// mounts, so they are named in a note, not reported missing.
	Unseen map[string]bool
	// Notes are the gatherer's, reported first.
	Notes []string
	// Changing names volumes and snapshots whose records changed while
	// the inputs were gathered (see Changed).
	Changing map[string]bool
}

// Report is what Compare found.
type Report struct {
	Findings []Finding `json:"findings"`
	// Notes say what was not compared, and why.
	Notes []string `json:"notes,omitempty"`
	// Checked counts what was compared.
	Checked Counts `json:"checked"`
}

// Counts are the sizes of the inputs.
type Counts struct {
	Volumes   int `json:"volumes"`
	Snapshots int `json:"snapshots,omitempty"`
	Disks     int `json:"disks"`
	Devices   int `json:"loopDevices"`
	Mounts    int `json:"mounts"`
}

// Clean reports whether nothing was found.
func (r *Report) Clean() bool { return len(r.Findings) == 0 }

// attached are the states in which a volume is attached to its node.
func attached(s fsm.State) bool { return s == fsm.NodeReady || s == fsm.VolReady || s == fsm.Published }

// staged are the states in which a volume is mounted at its staging path.
func staged(s fsm.State) bool { return s == fsm.VolReady || s == fsm.Published }

type comparison struct {
	in    Input
	out   Report
	host  map[string]bool
	ctrl  map[string]view.Volume   // controller records by volume id
	nodes []view.Volume            // node records
	all   map[string][]view.Volume // every record by disk id
	skip  map[string]string        // volumes left out, and why
	haveC bool                     // some store holds controller records
	haveN bool                     // some store holds node records
}

// Compare compares records, cloud and host; see the package doc.
func Compare(in Input) Report {
	c := &comparison{in: in, host: map[string]bool{}, ctrl: map[string]view.Volume{}, all: map[string][]view.Volume{}, skip: map[string]string{}}
	c.out.Findings = []Finding{}
	c.out.Notes = append(c.out.Notes, in.Notes...)
	for _, n := range in.HostNodes {
		c.host[n] = true
	}
	ids := map[string]bool{}
	for _, s := range in.Stores {
		c.haveC = c.haveC || s.controller()
		c.haveN = c.haveN || s.node()
		for _, v := range s.Volumes {
			ids[v.ID] = true
			if v.Damage != "" {
				c.skip[v.ID] = "its records are damaged"
			} else if v.PendingOp != nil {
				c.skip[v.ID] = fmt.Sprintf("op #%d %s in flight", v.PendingOp.Seq, v.PendingOp.Event)
			} else if in.Changing[v.ID] {
				c.skip[v.ID] = "changed while check ran"
			}
			if s.controller() {
				c.ctrl[v.ID] = v
			}
			if s.node() {
				c.nodes = append(c.nodes, v)
			}
			if v.DiskID != "" {
				c.all[v.DiskID] = append(c.all[v.DiskID], v)
			}
		}
	}
	for id := range in.Changing {
		if !ids[id] {
			c.skip[id] = "changed while check ran"
		}
	}
	c.out.Checked = Counts{Volumes: len(ids), Disks: len(in.Disks)}
	for _, devs := range in.Devices {
		c.out.Checked.Devices += len(devs)
	}

	if len(in.Stores) == 0 {
		c.note("no csid records were read: nothing to compare")
		return c.out
	}
	c.damaged()
	c.disks()
	c.snapshots()
	c.freezes()
	c.devices()
	c.mounts()
	c.identities()
	if len(c.skip) > 0 {
		var parts []string
		for _, id := range slices.Sorted(maps.Keys(c.skip)) {
			parts = append(parts, id+" ("+c.skip[id]+")")
		}
		c.note("left out, as their records, disks and mounts may be between two states: " + strings.Join(parts, ", "))
	}
	slices.SortStableFunc(c.out.Findings, func(a, b Finding) int {
		if d := cmp.Compare(slices.Index(Kinds, a.Kind), slices.Index(Kinds, b.Kind)); d != 0 {
			return d
		}
		return cmp.Or(cmp.Compare(a.Volume, b.Volume), cmp.Compare(a.Snapshot, b.Snapshot), cmp.Compare(a.Disk, b.Disk),
			cmp.Compare(a.Device, b.Device), cmp.Compare(a.Path, b.Path))
	})
	return c.out
}

// damaged reports the records that fail their checksum.
func (c *comparison) damaged() {
	for _, s := range c.in.Stores {
		blocked := map[string]bool{}
		for _, v := range s.Volumes {
			blocked[v.ID] = v.Damage != ""
		}
		for _, d := range s.Damaged {
			c.add(recordDamaged(s.Name, d, blocked[d.VolumeID] || d.Bucket == "names"))
		}
	}
}

// onHost reports whether a node's devices and mounts are on this host
// (every node is, when the host's nodes are not known).
func (c *comparison) onHost(node string) bool { return len(c.host) == 0 || c.host[node] }

func (c *comparison) note(s string) { c.out.Notes = append(c.out.Notes, s) }

func (c *comparison) add(f Finding) { c.out.Findings = append(c.out.Findings, f) }

// skipped reports whether any of the volumes is left out.
func (c *comparison) skipped(ids ...string) bool {
	for _, id := range ids {
		if _, ok := c.skip[id]; ok {
			return true
		}
	}
	return false
}

func diskWords(d cloud.Disk) string {
	where := "detached"
	if d.AttachedTo != "" {
		where = "attached to " + d.AttachedTo
	}
	name := ""
	if d.Name != "" {
		name = fmt.Sprintf("name %q, ", d.Name)
	}
	return fmt.Sprintf("disk %s (%s%d bytes, %s)", d.ID, name, d.SizeBytes, where)
}

// disks compares the cloud's disks with the controller records.
func (c *comparison) disks() {
	switch {
	case !c.in.DisksRead:
		c.note(cmp.Or(c.in.CloudNotRead, "the cloud was not read: disks and attachments are not compared"))
		return
	case !c.haveC:
		c.note("no controller records were read (only a node's): disks and attachments are not compared; run csid check where the controller's admin socket or state file is, or pass it with --socket or --db")
		return
	}
	byDisk := map[string]view.Volume{}
	for _, v := range c.ctrl {
		if v.DiskID != "" {
			byDisk[v.DiskID] = v
		}
	}
	inCloud := map[string]cloud.Disk{}
	for _, d := range c.in.Disks {
		inCloud[d.ID] = d
		v, ok := byDisk[d.ID]
		if !ok {
			owner := d.Tags[effects.TagVolumeID]
			if owner != "" && c.skipped(owner) {
				continue // being created (or deleted) right now
			}
			c.add(diskWithoutVolume(d, owner))
			continue
		}
		if c.skipped(v.ID) {
			continue
		}
		recNode := ""
		if attached(v.State) {
			recNode = v.Node
		}
		switch {
		case d.AttachedTo != "" && d.AttachedTo != recNode:
			c.add(attachmentUnknown(v, d, recNode))
		case recNode != "" && d.AttachedTo == "":
			c.add(attachmentMissing(v, d))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.ctrl)) {
		v := c.ctrl[id]
		if v.DiskID == "" || v.State == fsm.Absent || c.skipped(v.ID) {
			continue
		}
		if _, ok := inCloud[v.DiskID]; !ok {
			c.add(volumeWithoutDisk(v))
		}
	}
}

// devices compares the host's loop devices with the records.
func (c *comparison) devices() {
	if !c.in.DevicesRead {
		if c.in.DisksRead || c.in.CloudNotRead == "" {
			c.note("the host's loop devices were not read: they are not compared")
		}
		return
	}
	disks := map[string]cloud.Disk{}
	for _, d := range c.in.Disks {
		disks[d.ID] = d
	}
	for _, diskID := range slices.Sorted(maps.Keys(c.in.Devices)) {
		recs := c.all[diskID]
		var ids []string
		accounted := false
		for _, v := range recs {
			ids = append(ids, v.ID)
			accounted = accounted || (attached(v.State) && c.onHost(v.Node))
		}
		if d, ok := disks[diskID]; ok && d.Tags[effects.TagVolumeID] != "" {
			ids = append(ids, d.Tags[effects.TagVolumeID])
		}
		if c.skipped(ids...) {
			continue
		}
		d, inCloud := disks[diskID]
		devs := c.in.Devices[diskID]
		for i, dev := range devs {
			switch {
			case accounted && i == 0:
			case accounted:
				c.add(loopDeviceDuplicate(diskID, dev, devs[0], recs))
			default:
				c.add(loopDeviceUnaccounted(diskID, dev, recs, d, inCloud && c.in.DisksRead, c.in.DisksRead))
			}
		}
	}
}

// mounts compares the host's mount table with the node records.
func (c *comparison) mounts() {
	if !c.in.MountsRead {
		c.note(cmp.Or(c.in.MountsNotRead, "the host's mount table was not read: mounts are not compared"))
		return
	}
	if !c.haveN {
		c.note("no node records were read (only a controller's): mounts are not compared; run csid check in the node plugin's pod")
		return
	}
	recorded, inFlight := c.recordedPaths()
	csidDevices, stagedDevices := c.csidDevices()
	mounted := map[string]Mount{}
	csidMounts := 0
	for _, m := range c.in.Mounts {
		mounted[m.Path] = m
		dev := mountDevice(m.MountPoint)
		_, fromCSID := csidDevices[dev]
		owned := c.ownedPath(m)
		if !owned && !fromCSID {
			if _, ok := recorded[m.Path]; !ok {
				continue // not csid's
			}
		}
		csidMounts++
		if _, ok := recorded[m.Path]; ok || inFlight[m.Path] {
			continue
		}
		if !owned && stagedDevices[dev] && underAny(c.in.Kubelets, m.Path) {
			continue
		}
		c.add(mountUnaccounted(m, dev, owned, csidDevices[dev]))
	}
	c.out.Checked.Mounts = csidMounts
	c.missingMounts(recorded, mounted)
}

// recordedPaths are the staging and target paths the node records of this
// host say are mounted, and those of volumes with an op in flight (left to
// the op).
func (c *comparison) recordedPaths() (recorded map[string]view.Volume, inFlight map[string]bool) {
	recorded, inFlight = map[string]view.Volume{}, map[string]bool{}
	for _, v := range c.nodes {
		if !c.onHost(v.Node) {
			continue
		}
		if _, ok := c.skip[v.ID]; ok {
			for _, p := range pendingPaths(v.PendingOp) {
				inFlight[p] = true
			}
			if v.StagingPath != "" {
				inFlight[v.StagingPath] = true
			}
			for _, t := range v.Targets {
				inFlight[t.Path] = true
			}
			continue
		}
		if staged(v.State) && v.StagingPath != "" && v.AccessType != "block" {
			// A raw block volume's staging path is kubelet's directory,
			// never a mount.
			recorded[v.StagingPath] = v
		}
		if v.State == fsm.Published {
			for _, t := range v.Targets {
				recorded[t.Path] = v
			}
		}
	}
	return recorded, inFlight
}

// csidDevices maps csid's devices on this host to their disks, and says
// which are of volumes staged here: kubelet bind-mounts their filesystems
// elsewhere in its directory too (sub-paths, block device maps), which is
// its to do; a mount of them outside kubelet's directory is nobody's (an
// operator's bind mount).
func (c *comparison) csidDevices() (disks map[string]string, stagedHere map[string]bool) {
	disks, stagedHere = map[string]string{}, map[string]bool{}
	for diskID, devs := range c.in.Devices {
		for _, dev := range devs {
			disks[dev] = diskID
			for _, v := range c.all[diskID] {
				if staged(v.State) && c.onHost(v.Node) {
					stagedHere[dev] = true
				}
			}
		}
	}
	return disks, stagedHere
}

// missingMounts reports the recorded paths the host has no mount at.
func (c *comparison) missingMounts(recorded map[string]view.Volume, mounted map[string]Mount) {
	var unseen []string
	for _, p := range slices.Sorted(maps.Keys(recorded)) {
		if _, ok := mounted[p]; ok {
			continue
		}
		if c.in.Unseen[p] {
			unseen = append(unseen, p)
			continue
		}
		c.add(mountMissing(recorded[p], p))
	}
	if len(unseen) > 0 {
		c.note(fmt.Sprintf("recorded paths whose directory is not on this host were not compared (run csid check where the node's mounts are: in the node plugin's pod): %s", strings.Join(unseen, ", ")))
	}
}

// identities compares the devices behind this host's node records with
// their disks: the mount at a volume's staging path and at each of its
// targets must be of a loop device bound to its disk's image, and the
// device its record says it was staged from must not be bound to another
// disk's. (A device number is reused once its disk lets it go: a device
// path in a record, or a bind of a device node, can come to show another
// disk.)
func (c *comparison) identities() {
	if !c.in.DevicesRead || !c.haveN {
		return // devices() and mounts() say why in their notes
	}
	owner, _ := c.csidDevices() // device -> the disk bound to it
	top := map[string]Mount{}   // the top mount at each path
	for _, m := range c.in.Mounts {
		top[m.Path] = m
	}
	for _, v := range c.nodes {
		if !c.onHost(v.Node) || c.skipped(v.ID) || !staged(v.State) || v.DiskID == "" {
			continue
		}
		paths := []string{}
		if v.AccessType != "block" && v.StagingPath != "" {
			paths = append(paths, v.StagingPath)
		}
		for _, t := range v.Targets {
			paths = append(paths, t.Path)
		}
		for _, p := range paths {
			m, ok := top[p]
			if !ok {
				continue // mount-missing, when the mount table was read
			}
			if dev := mountDevice(m.MountPoint); !slices.Contains(c.in.Devices[v.DiskID], dev) {
				c.add(mountOfAnotherDevice(v, p, m, dev, c.diskWords(owner[dev])))
			}
		}
		if o, ok := owner[v.Device]; ok && o != v.DiskID {
			c.add(recordOfAnotherDevice(v, c.diskWords(o), c.in.Devices[v.DiskID]))
		}
	}
}

// diskWords names a disk of this host's devices and the volume it carries
// ("" for none).
func (c *comparison) diskWords(diskID string) string {
	if diskID == "" {
		return ""
	}
	for _, d := range c.in.Disks {
		if d.ID == diskID && d.Tags[effects.TagVolumeID] != "" {
			return fmt.Sprintf("disk %s (volume %s)", diskID, d.Tags[effects.TagVolumeID])
		}
	}
	return "disk " + diskID
}

// ownedPath reports whether a mount is in a directory kubelet made for the
// driver of a csid read, under that csid's kubelet root: under
// plugins/kubernetes.io/csi/<driver>/, or beside a vol_data.json that names
// the driver.
func (c *comparison) ownedPath(m Mount) bool {
	return slices.ContainsFunc(c.in.Kubelets, func(k Kubelet) bool {
		plugin := filepath.Join(k.Root, "plugins", "kubernetes.io", "csi", k.DriverName)
		return under(k.Root, m.Path) && (m.Driver == k.DriverName || under(plugin, m.Path))
	})
}

// mountDevice is the block device a mount is of: its source, or for a
// bind mount of a device node (a raw block volume) the node it binds (from
// the host's /dev, a devtmpfs, or a container's, a tmpfs).
func mountDevice(m mounter.MountPoint) string {
	if (m.Type == "devtmpfs" || m.Type == "tmpfs") && strings.HasPrefix(m.Root, "/loop") {
		return "/dev" + m.Root
	}
	return m.Device
}

// pendingPaths are the staging and target paths an op's arguments name.
func pendingPaths(op *view.Op) []string {
	if op == nil || len(op.Args) == 0 {
		return nil
	}
	var a struct {
		StagingPath string `json:"stagingPath"`
		TargetPath  string `json:"targetPath"`
		VolumePath  string `json:"volumePath"`
	}
	if err := json.Unmarshal(op.Args, &a); err != nil {
		return nil
	}
	var out []string
	for _, p := range []string{a.StagingPath, a.TargetPath, a.VolumePath} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Changed returns the volumes and snapshots whose records differ between
// two readings of the same stores (state, generation, op in flight,
// presence): their disks, devices, mounts and provider snapshots may have
// been read between two states.
func Changed(before, after []Store) map[string]bool {
	type mark struct {
		state fsm.State
		gen   uint64
		op    uint64
	}
	markOf := func(state fsm.State, gen uint64, pending *view.Op) mark {
		m := mark{state: state, gen: gen}
		if pending != nil {
			m.op = pending.Seq
		}
		return m
	}
	read := func(stores []Store) map[string]mark {
		out := map[string]mark{}
		for _, s := range stores {
			for _, v := range s.Volumes {
				out[s.Name+"\x00"+v.ID] = markOf(v.State, v.Generation, v.PendingOp)
			}
			for _, sn := range s.Snapshots {
				out[s.Name+"\x00"+sn.ID] = markOf(sn.State, sn.Generation, sn.PendingOp)
			}
		}
		return out
	}
	b, a := read(before), read(after)
	out := map[string]bool{}
	for k, m := range b {
		if a[k] != m {
			out[k[strings.IndexByte(k, 0)+1:]] = true
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			out[k[strings.IndexByte(k, 0)+1:]] = true
		}
	}
	return out
}

// snapshots compares the provider's snapshots with the controller's
// snapshot records. A snapshot with an op in flight (being cut or
// deleted), or whose record changed while check ran, is left out.
func (c *comparison) snapshots() {
	var recs []view.Snapshot
	for _, s := range c.in.Stores {
		recs = append(recs, s.Snapshots...)
	}
	c.out.Checked.Snapshots = len(recs)
	if !c.in.SnapshotsRead {
		if len(recs) > 0 {
			c.note("the provider's snapshots were not read: snapshot records are not compared with them")
		}
		return
	}
	byCloud, byID := map[string]view.Snapshot{}, map[string]view.Snapshot{}
	for _, s := range recs {
		byID[s.ID] = s
		if s.CloudID != "" {
			byCloud[s.CloudID] = s
		}
	}
	busy := func(id string) bool {
		s, ok := byID[id]
		return c.in.Changing[id] || (ok && (s.PendingOp != nil || s.Damage != ""))
	}
	have := map[string]bool{}
	for _, cs := range c.in.Snapshots {
		have[cs.ID] = true
		owner := cs.Tags[effects.TagSnapshotID]
		if _, ok := byCloud[cs.ID]; ok || (owner != "" && busy(owner)) {
			continue
		}
		c.add(snapshotWithoutRecord(cs, owner))
	}
	for _, s := range recs {
		if s.State != fsm.Ready || s.CloudID == "" || busy(s.ID) || have[s.CloudID] {
			continue
		}
		c.add(recordWithoutSnapshot(s))
	}
}

// Freeze is a freeze record of the local backend: the filesystems of a
// disk that a snapshot or a clone froze for its copy.
type Freeze struct {
	DiskID      string    `json:"diskID"`
	MountPoints []string  `json:"mountPoints,omitempty"`
	Since       time.Time `json:"since"`
}

// freezes reports the freeze records that no snapshot or clone in flight
// explains: a csid killed while it copied a disk with its filesystem
// frozen (csid thaws it when it opens its state directory again).
func (c *comparison) freezes() {
	busy := map[string]bool{} // disks a snapshot or clone in flight copies
	for _, s := range c.in.Stores {
		for _, sn := range s.Snapshots {
			if sn.PendingOp != nil {
				busy[sn.SourceDiskID] = true
			}
		}
		for _, v := range s.Volumes {
			if v.PendingOp != nil && v.Source != nil && v.Source.VolumeID != "" {
				busy[c.ctrl[v.Source.VolumeID].DiskID] = true
			}
		}
	}
	for _, f := range c.in.Freezes {
		if !busy[f.DiskID] {
			c.add(filesystemFrozen(f))
		}
	}
}
