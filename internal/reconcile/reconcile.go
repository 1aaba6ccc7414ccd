// Package reconcile brings csid's records in line with reality at start-up,
// before the driver answers ready:
//
//   - Held: whether a new state file (missing or empty at start) replaces
//     one that was lost: the cloud still has disks this csid made (for a
//     node, disks attached to it). The caller refuses to start unless the
//     operator asked for a rebuild.
//   - Rebuild: a controller's state file with no records at all is rebuilt
//     from the cloud, when the operator asks: every disk csid created
//     carries its volume id, name, capability, parameters, content source
//     and driver name as tags, and the cloud says where it is attached;
//     every snapshot csid took carries its snapshot id, name, source
//     volume, parameters and driver name.
//   - Node: the host's mounts are the truth about what is staged and
//     published. A record whose mounts are gone (the node rebooted) is
//     rolled back, so that kubelet's next NodeStageVolume mounts again
//     instead of being told it is done; a csid device mounted on this node
//     that no record explains (the node's state file was lost) is adopted,
//     so NodeUnpublishVolume and NodeUnstageVolume clean it up. Only mounts
//     at paths the record names, or at kubelet's staging and target paths
//     for this driver and volume (internal/kubelet), are adopted: an
//     operator's bind mount elsewhere is no target of csid's (csid check
//     reports it), and adopting it would refuse kubelet's NodeUnstage for
//     ever.
//
// Each correction is written with a history note that says what was found.
// Volumes with an op in flight are left to that op (recovery resumes it).
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/kubelet"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
)

// Reconciler holds what a reconciliation looks at.
type Reconciler struct {
	Store *store.Store
	Cloud cloud.Cloud
	// Host and Mounter are needed for Node only.
	Host    cloud.Host
	Mounter mounter.Mounter
	// Kubelet is kubelet's layout for this node's driver: only mounts at
	// its staging and target paths (or at paths a record names) are
	// adopted. Without a root, only recorded paths are.
	Kubelet kubelet.Layout
	// Forget says the store holds this node's records alone (node mode):
	// Node forgets the volumes it finds nothing of on this host (see
	// ops.Forget).
	Forget bool
	// DriverName is this csid's CSI driver name: disks tagged with
	// another are another csid's, and never counted or rebuilt here.
	DriverName string
	Log        zerolog.Logger
	Now        func() time.Time
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Held returns the disks of this csid in the cloud (those attached to node,
// when node is not ""), up to max (0: all): evidence that this csid held
// volumes before.
func (r *Reconciler) Held(ctx context.Context, node string, max int) ([]cloud.Disk, error) {
	var out []cloud.Disk
	err := r.eachDisk(ctx, func(d cloud.Disk) bool {
		if effects.Made(d, r.DriverName) && (node == "" || d.AttachedTo == node) {
			out = append(out, d)
		}
		return max == 0 || len(out) < max
	})
	return out, err
}

// eachDisk pages through the cloud's disks until fn returns false.
func (r *Reconciler) eachDisk(ctx context.Context, fn func(cloud.Disk) bool) error {
	token := ""
	for {
		page, err := r.Cloud.ListDisks(ctx, cloud.ListOptions{PageToken: token, MaxResults: 500})
		if err != nil {
			return fmt.Errorf("list the cloud's disks: %w", err)
		}
		for _, d := range page.Disks {
			if !fn(d) {
				return nil
			}
		}
		if token = page.NextToken; token == "" {
			return nil
		}
	}
}

// Rebuild rebuilds the volume records from this csid's disks in the cloud,
// when the store holds no record at all (no volume, no op); a store with
// records is left alone. It returns how many it rebuilt.
func (r *Reconciler) Rebuild(ctx context.Context) (int, error) {
	empty := true
	err := r.Store.View(func(tx *store.Tx) error {
		if tx.CountVolumes() > 0 {
			empty = false
			return nil
		}
		if err := tx.ForEachSnapshot("", func(*store.Snapshot) bool { empty = false; return false }); err != nil || !empty {
			return err
		}
		return tx.ForEachOp(func(*store.Op) bool { empty = false; return false })
	})
	if err != nil || !empty {
		return 0, err
	}
	var vols []*store.Volume
	resizeTo := map[string]int64{} // volume id -> the target of its queued resize (the disk's tag)
	err = r.eachDisk(ctx, func(d cloud.Disk) bool {
		if !effects.Made(d, r.DriverName) {
			return true
		}
		v, err := fromDisk(d)
		if err != nil {
			r.Log.Warn().Str("disk", d.ID).Err(err).Msg("disk not rebuilt")
			return true
		}
		vols = append(vols, v)
		if target := effects.ResizeTag(d); target > 0 {
			resizeTo[v.ID] = target
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	snaps, err := r.snapshots(ctx, vols)
	if err != nil {
		return 0, err
	}
	now := r.now()
	err = r.Store.Update(func(tx *store.Tx) error {
		for _, s := range snaps {
			if err := tx.ReconcileSnapshot(s.Clone(), fsm.Rebuild, fsm.NoGuard,
				fmt.Sprintf("rebuilt from the provider's snapshot %s", s.CloudID), now); err != nil {
				return err
			}
		}
		for _, v := range vols {
			v := v.Clone()
			outcome, guard := fmt.Sprintf("rebuilt from the cloud: disk %s", v.DiskID), fsm.Detached
			if n := v.Node(); n != "" {
				outcome, guard = outcome+", attached to "+n, fsm.Attached
			}
			if err := tx.Reconcile(v, fsm.Rebuild, guard, outcome, now); err != nil {
				return err
			}
			if target := resizeTo[v.ID]; target > 0 {
				// The resize queued for the detach, as the disk's tag keeps
				// it: it runs when the volume is detached, as before.
				if err := tx.PutResize(&store.Resize{VolumeID: v.ID, TargetBytes: target, Status: store.ResizeQueued, QueuedAt: now, UpdatedAt: now}); err != nil {
					return err
				}
				if err := tx.AddNote(v.ID, store.HistoryEntry{Time: now, Event: fsm.Expand, Guard: fsm.Deferred, From: v.State, To: v.State,
					Generation: v.Generation, Outcome: fmt.Sprintf("queued resize to %d bytes, rebuilt from the disk's %s tag", target, effects.TagResizeTo)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.Log.Warn().Int("volumes", len(vols)).Int("resizes", len(resizeTo)).Int("snapshots", len(snaps)).
		Msg("volume and snapshot records rebuilt from the cloud (--rebuild-from-cloud)")
	return len(vols), nil
}

// fromDisk rebuilds a volume record from a disk csid created (nil for a
// disk without csid's tags: not csid's).
func fromDisk(d cloud.Disk) (*store.Volume, error) {
	id := d.Tags[effects.TagVolumeID]
	if id == "" {
		return nil, nil
	}
	v := &store.Volume{ID: id, Name: d.Tags[effects.TagName], DiskID: d.ID, CapacityBytes: d.SizeBytes, Zone: d.Zone, State: fsm.Created}
	if err := json.Unmarshal([]byte(d.Tags[effects.TagCapability]), &v.Capability); err != nil {
		return nil, fmt.Errorf("capability tag: %w", err)
	}
	if raw := d.Tags[effects.TagParameters]; raw != "" && raw != "null" {
		if err := json.Unmarshal([]byte(raw), &v.Parameters); err != nil {
			return nil, fmt.Errorf("parameters tag: %w", err)
		}
	}
	if src, ok := strings.CutPrefix(d.Tags[effects.TagSource], "snapshot:"); ok && d.Source != nil {
		v.Source = &store.Source{SnapshotID: src, CloudSnapshotID: d.Source.SnapshotID}
	} else if src, ok := strings.CutPrefix(d.Tags[effects.TagSource], "volume:"); ok && d.Source != nil {
		v.Source = &store.Source{VolumeID: src, DiskID: d.Source.DiskID}
	}
	if d.AttachedTo != "" {
		v.State = fsm.NodeReady
		// The fingerprint of the original publish is unknown: the next
		// ControllerPublishVolume to this node is accepted as its repeat.
		v.Attachment = &store.Attachment{Node: d.AttachedTo, PublishContext: map[string]string{effects.PublishContextDiskID: d.ID}}
	}
	return v, nil
}

// Report says what Node changed.
type Report struct {
	RolledBack []string // volumes whose mounts were gone
	Adopted    []string // volumes found mounted without a record
	Forgotten  []string // volumes with nothing left on this node
}

// Node reconciles this node's records with the host's mount table.
func (r *Reconciler) Node(ctx context.Context) (Report, error) {
	var rep Report
	mounts, err := r.Mounter.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("read the mount table: %w", err)
	}
	devices, err := r.Host.Devices(ctx)
	if err != nil {
		return rep, fmt.Errorf("list this node's devices: %w", err)
	}
	var vols []*store.Volume
	damaged := map[string]bool{} // volumes whose records are damaged: left alone
	err = r.Store.View(func(tx *store.Tx) error {
		err := tx.ForEachVolume("", func(v *store.Volume) bool { vols = append(vols, v); return true })
		for _, d := range tx.Skipped() {
			damaged[d.VolumeID] = true
		}
		return err
	})
	if err != nil {
		return rep, err
	}
	byID := map[string]*store.Volume{}
	for _, v := range vols {
		byID[v.ID] = v
	}
	fixes := r.adoptions(ctx, mounts, devices, byID, damaged)
	for _, f := range fixes {
		rep.Adopted = append(rep.Adopted, f.v.ID)
	}
	for _, v := range vols {
		if v.ActiveOp != 0 || (v.State != fsm.VolReady && v.State != fsm.Published) || slices.Contains(rep.Adopted, v.ID) {
			continue
		}
		if nv, guard, why := dropVanished(v, mounts); nv != nil {
			fixes = append(fixes, fix{v: nv, event: fsm.Rollback, guard: guard, note: why})
			rep.RolledBack = append(rep.RolledBack, v.ID)
		}
	}
	forget := r.Forget && slices.ContainsFunc(vols, func(v *store.Volume) bool { return v.ActiveOp == 0 }) // cheap pre-check
	if len(fixes) == 0 && !forget {
		return rep, nil
	}
	now := r.now()
	var skipped []string
	left := map[string]bool{}
	err = r.Store.Update(func(tx *store.Tx) error {
		skipped = skipped[:0]
		clear(left)
		for _, f := range fixes {
			err := tx.Reconcile(f.v.Clone(), f.event, f.guard, f.note, now)
			if errors.Is(err, fsm.ErrIllegal) {
				// The host shows what no step of the lifecycle explains
				// (staged at another path than the record says): leave
				// the record as it is; `csid check` reports the mount.
				skipped = append(skipped, fmt.Sprintf("%s: %v", f.v.ID, err))
				left[f.v.ID] = true
				continue
			}
			if err != nil {
				return err
			}
		}
		if forget {
			var err error
			rep.Forgotten, err = r.forget(tx, vols, now)
			return err
		}
		return nil
	})
	rep.Adopted = slices.DeleteFunc(rep.Adopted, func(id string) bool { return left[id] })
	rep.RolledBack = slices.DeleteFunc(rep.RolledBack, func(id string) bool { return left[id] })
	if err == nil && len(fixes)+len(rep.Forgotten) > 0 {
		r.Log.Warn().Strs("rolled_back", rep.RolledBack).Strs("adopted", rep.Adopted).Strs("left_alone", skipped).
			Int("forgotten", len(rep.Forgotten)).Msg("node records reconciled with the host's mounts")
	}
	return rep, err
}

// forget drops, in tx, the records of the volumes that have nothing staged
// or published on this node (NODE_READY, after the rollbacks), and returns
// their ids.
func (r *Reconciler) forget(tx *store.Tx, vols []*store.Volume, now time.Time) ([]string, error) {
	var out []string
	for _, v := range vols {
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return nil, err
		}
		if cur == nil {
			continue
		}
		if forgot, err := ops.Forget(tx, cur, "nothing of it on this node at start", now); err != nil {
			return nil, err
		} else if forgot {
			out = append(out, v.ID)
		}
	}
	return out, nil
}

// adoptions returns the records that explain the mounts of this node's
// devices (by disk id) that no record explains, at kubelet's paths or
// those the records name (see kubeletMounts). byID are the records.
func (r *Reconciler) adoptions(ctx context.Context, mounts []mounter.MountPoint, devices map[string]string, byID map[string]*store.Volume, damaged map[string]bool) []fix {
	node := r.Host.NodeID()
	var fixes []fix
	for diskID, dev := range devices {
		if !slices.ContainsFunc(mounts, func(m mounter.MountPoint) bool { return ofDevice(m, dev) }) {
			continue // no mount to explain: no need to ask the cloud
		}
		d, err := r.Cloud.GetDisk(ctx, diskID)
		if err != nil || d.AttachedTo != node || !effects.Made(d, r.DriverName) {
			continue // not ours to explain here: `csid check` reports strays
		}
		v := byID[d.Tags[effects.TagVolumeID]]
		if v != nil && v.ActiveOp != 0 || damaged[d.Tags[effects.TagVolumeID]] {
			continue // left to its op; or its record is damaged: left alone
		}
		stage, targets, others := r.kubeletMounts(mounts, dev, d, v)
		if len(others) > 0 {
			r.Log.Warn().Str("volume", d.Tags[effects.TagVolumeID]).Str("device", dev).Strs("mounts", others).
				Msg("mounts of a volume's device outside kubelet's staging and target paths are not adopted; csid check reports them")
		}
		if (stage == "" && len(targets) == 0) || (stage == "" && !isBlock(v, d) && (v == nil || v.Stage == nil)) {
			continue // nothing of kubelet's, or targets of a filesystem not staged: nothing to adopt
		}
		if v != nil && v.Stage != nil && (v.Stage.Path == stage || stage == "") && coversTargets(v, targets) {
			continue // the record already explains these mounts
		}
		nv := adoptMounts(v, d, dev, stage, targets, node)
		guard := fsm.Staged
		if nv.State == fsm.Published {
			guard = fsm.HasTargets
		}
		fixes = append(fixes, fix{v: nv, event: fsm.Adopt, guard: guard,
			note: fmt.Sprintf("found on the host: %s mounted at %s", dev, strings.Join(append(nonEmpty(stage), targets...), ", "))})
		byID[nv.ID] = nv
	}
	return fixes
}

// fix is a record to write, with the lifecycle step that explains it.
type fix struct {
	v     *store.Volume
	event fsm.Event
	guard fsm.Guard
	note  string
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// ofDevice reports whether m is a mount of dev: its filesystem, or for a
// raw block volume a bind mount of the device node (devtmpfs, root /loopN).
func ofDevice(m mounter.MountPoint, dev string) bool {
	return m.Device == dev || (m.Type == "devtmpfs" && m.Root == "/"+filepath.Base(dev))
}

// isBlock reports whether the volume (its record, or else its disk's
// tags) is a raw block volume.
func isBlock(v *store.Volume, d cloud.Disk) bool {
	if v != nil {
		return v.Capability.AccessType == "block"
	}
	tagged, _ := fromDisk(d)
	return tagged != nil && tagged.Capability.AccessType == "block"
}

// kubeletMounts sorts the mounts of a volume's device: its staging mount
// and targets, at the paths its record names or at kubelet's paths for the
// driver and the volume, and the others, which csid never adopts. A
// filesystem's staging mount and the bind mounts of it look alike in the
// mount table: the path tells them apart. A raw block target is a bind
// mount of the device node; block volumes have no staging mount.
func (r *Reconciler) kubeletMounts(mounts []mounter.MountPoint, dev string, d cloud.Disk, v *store.Volume) (stage string, targets, others []string) {
	id, block := d.Tags[effects.TagVolumeID], isBlock(v, d)
	for _, m := range mounts {
		if !ofDevice(m, dev) || (m.Device == dev) == block {
			continue
		}
		recorded := false
		if v != nil {
			_, recorded = v.Targets[m.Path]
		}
		switch {
		case !block && stage == "" && ((v != nil && v.Stage != nil && v.Stage.Path == m.Path) || r.Kubelet.Staging(m.Path, id)):
			stage = m.Path
		case recorded || r.Kubelet.Target(m.Path, id, block):
			targets = append(targets, m.Path)
		default:
			others = append(others, m.Path)
		}
	}
	return stage, targets, others
}

func coversTargets(v *store.Volume, targets []string) bool {
	for _, t := range targets {
		if _, ok := v.Targets[t]; !ok {
			return false
		}
	}
	return true
}

// adoptMounts builds the record that explains a device's mounts: the
// existing record (if any) with the stage and targets found, or a new one
// from the disk's tags.
func adoptMounts(v *store.Volume, d cloud.Disk, dev, stage string, targets []string, node string) *store.Volume {
	if v == nil {
		v, _ = fromDisk(d)
		if v == nil {
			v = &store.Volume{ID: d.Tags[effects.TagVolumeID], DiskID: d.ID, CapacityBytes: d.SizeBytes}
		}
	} else {
		v = v.Clone()
	}
	if v.Attachment == nil {
		v.Attachment = &store.Attachment{Node: node, PublishContext: map[string]string{effects.PublishContextDiskID: d.ID}}
	}
	if stage != "" || v.Capability.AccessType == "block" {
		v.Stage = &store.Stage{Path: stage, Device: dev}
	}
	if v.Targets == nil {
		v.Targets = map[string]store.Target{}
	}
	for _, t := range targets {
		if _, ok := v.Targets[t]; !ok {
			v.Targets[t] = store.Target{} // fingerprint unknown: any compatible repeat is accepted
		}
	}
	v.State = fsm.VolReady
	if len(v.Targets) > 0 {
		v.State = fsm.Published
	} else {
		v.Targets = nil
	}
	return v
}

// dropVanished returns the record without the mounts the host no longer
// has and the guard of its rollback, or nil when they are all there.
func dropVanished(v *store.Volume, mounts []mounter.MountPoint) (*store.Volume, fsm.Guard, string) {
	mounted := map[string]bool{}
	for _, m := range mounts {
		mounted[m.Path] = true
	}
	nv, guard, why := ops.ForgetUnmounted(v, func(p string) bool { return mounted[p] })
	if nv == nil {
		return nil, "", ""
	}
	return nv, guard, why + " (was the node restarted?)"
}

// snapshots lists the snapshots this csid took that the provider has and
// says are ready, as records to rebuild (none when the cloud takes no
// snapshots). A snapshot is accessible from its source volume's zone,
// when that volume is rebuilt too. A snapshot the provider has not
// finished was being taken when the state file was lost: it is not
// rebuilt (csid check reports it; delete it at the provider).
func (r *Reconciler) snapshots(ctx context.Context, vols []*store.Volume) ([]*store.Snapshot, error) {
	sn, ok := r.Cloud.(cloud.Snapshotter)
	if !ok {
		return nil, nil
	}
	zones := map[string]string{}
	for _, v := range vols {
		zones[v.ID] = v.Zone
	}
	var out []*store.Snapshot
	token := ""
	for {
		page, err := sn.ListSnapshots(ctx, cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{PageToken: token, MaxResults: 500}})
		if err != nil {
			return nil, fmt.Errorf("list the provider's snapshots: %w", err)
		}
		for _, cs := range page.Snapshots {
			if !effects.SnapshotMade(cs, r.DriverName) {
				continue
			}
			if !cs.Ready {
				r.Log.Warn().Str("snapshot", cs.ID).Msg("snapshot not rebuilt: the provider has not finished it")
				continue
			}
			s, err := fromSnapshot(cs)
			if err != nil {
				r.Log.Warn().Str("snapshot", cs.ID).Err(err).Msg("snapshot not rebuilt")
				continue
			}
			s.Zone = zones[s.SourceVolumeID]
			out = append(out, s)
		}
		if token = page.NextToken; token == "" {
			return out, nil
		}
	}
}

// fromSnapshot rebuilds a snapshot record from a snapshot csid took.
func fromSnapshot(cs cloud.Snapshot) (*store.Snapshot, error) {
	s := &store.Snapshot{ID: cs.Tags[effects.TagSnapshotID], Name: cs.Tags[effects.TagName], SourceVolumeID: cs.Tags[effects.TagSourceVolume],
		SourceDiskID: cs.SourceDiskID, CloudID: cs.ID, SizeBytes: cs.SizeBytes, ReadyToUse: cs.Ready, CutAt: cs.CreatedAt, State: fsm.Ready}
	if s.SourceVolumeID == "" {
		return nil, fmt.Errorf("no %s tag", effects.TagSourceVolume)
	}
	if raw := cs.Tags[effects.TagParameters]; raw != "" && raw != "null" {
		if err := json.Unmarshal([]byte(raw), &s.Parameters); err != nil {
			return nil, fmt.Errorf("parameters tag: %w", err)
		}
	}
	return s, nil
}
