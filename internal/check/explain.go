package check

import (
	"fmt"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/view"
)

// pvLookup is how an operator finds the PV of a volume id.
func pvLookup(volumeID string) string {
	return fmt.Sprintf(`kubectl get pv -o jsonpath='{range .items[?(@.spec.csi.volumeHandle=="%s")]}{.metadata.name}{"\n"}{end}'`, volumeID)
}

// recordDamaged explains a record that fails its checksum, in the records
// of store; blocking says csid does not act on its volume (or name) because
// of it, rather than only having lost a line of history.
func recordDamaged(store string, d view.DamagedRecord, blocking bool) Finding {
	f := Finding{Kind: RecordDamaged, Volume: d.VolumeID, Record: d.Record,
		Problem: fmt.Sprintf("%s, in %s", d.Message, store),
		Cause: "the state file was changed outside csid: a failing disk or controller, a bad block, a lost write, or another program writing to the file; " +
			"csid seals every record with a checksum when it writes it"}
	restore := "Restore the state file from a backup taken after the volume's last change (stop csid, check the copy with `csid state verify --db <copy>`, " +
		"put it in place of the file, start csid); without one, stop csid, move the state file aside and start it with --rebuild-from-cloud: " +
		"a controller rebuilds its records from the disks' tags (queued resizes included), a node from the host's mounts (docs/operations.md, \"A damaged record\")"
	switch {
	case d.Bucket == "names":
		f.Action = fmt.Sprintf("csid does not know which volume the name %q was given to: a CreateVolume with that name answers DataLoss. %s", d.Key, restore)
	case blocking:
		f.Action = fmt.Sprintf("csid does not act on volume %s: its RPCs answer DataLoss, and an op it had in flight is not resumed. %s", d.VolumeID, restore)
	default:
		f.Action = "only history is lost: csid acts on nothing in this record, and the volume works; csid inspect volume leaves the line out. " +
			"Nothing to do (restoring a backup brings the line back)"
	}
	return f
}

func diskWithoutVolume(d cloud.Disk, owner string) Finding {
	f := Finding{Kind: DiskWithoutVolume, Disk: d.ID, Volume: owner, Node: d.AttachedTo,
		Problem: fmt.Sprintf("the cloud has %s, and no csid record names it", diskWords(d))}
	if owner == "" {
		f.Cause = "it has no csid.dev/volume-id tag, so csid did not create it: a disk made by hand or by another tool in the same account or state directory"
		f.Action = "if nothing of yours uses it, delete it with the cloud's own tools (for the local backend: with csid stopped, remove disks/" + d.ID + ".json, then disks/" + d.ID + ".img, in the state directory); csid never deletes a disk it has no record of"
		return f
	}
	f.Cause = fmt.Sprintf("csid created it for volume %s, which has no record: a CreateVolume that crashed after the disk was made and was never retried (the claim was deleted meanwhile), a failed create whose clean-up failed too, or a state file that was lost or restored from an older copy", owner)
	f.Action = fmt.Sprintf("find out whether a PV names the volume: %s. If one does, its record was lost: keep the disk; restore the controller's state file from a backup (a controller started on a new state file with --rebuild-from-cloud rebuilds every record from the cloud; one that has records does not). If none does, it is a leak: delete the disk with the cloud's own tools (for the local backend: with csid stopped, remove disks/%s.json, then disks/%s.img, in the state directory)", pvLookup(owner), d.ID, d.ID)
	if d.AttachedTo != "" {
		f.Action += "; detach it from " + d.AttachedTo + " first"
	}
	return f
}

func volumeWithoutDisk(v view.Volume) Finding {
	return Finding{Kind: VolumeWithoutDisk, Volume: v.ID, Disk: v.DiskID, Node: v.Node,
		Problem: fmt.Sprintf("volume %s (%s) records disk %s, and the cloud has no such disk", v.ID, v.State, v.DiskID),
		Cause:   "the disk was deleted outside csid (the cloud's console or another tool; for the local backend, its files removed by hand), or csid check reads another cloud or state directory than the driver uses",
		Action: fmt.Sprintf("first make sure csid check reads the driver's state directory (--state-dir). If the disk is really gone, so is its data: pods using the volume cannot start. "+
			"Delete the claim and its PV (%s): DeleteVolume of a missing disk succeeds and removes the record; a published volume must be unpublished first (delete its pods)", pvLookup(v.ID)),
	}
}

func attachmentUnknown(v view.Volume, d cloud.Disk, recNode string) Finding {
	says := fmt.Sprintf("not attached (%s)", v.State)
	if recNode != "" {
		says = fmt.Sprintf("attached to %s (%s)", recNode, v.State)
	}
	return Finding{Kind: AttachmentUnknown, Volume: v.ID, Disk: d.ID, Node: d.AttachedTo,
		Problem: fmt.Sprintf("the cloud has disk %s of volume %s attached to %s, and csid's record says %s", d.ID, v.ID, d.AttachedTo, says),
		Cause:   "an attach made outside csid (the cloud's console or another tool), a ControllerPublishVolume whose attach went through but whose op failed and whose clean-up failed too, or a state file restored from an older copy",
		Action: fmt.Sprintf("if Kubernetes wants the volume on %s (kubectl get volumeattachments | grep %s), nothing to do: the attacher's next ControllerPublishVolume records the attachment (attaching an attached disk is a no-op). "+
			"If not, detach it with the cloud's own tools; while it is attached csid cannot grow it, delete it, or attach it elsewhere", d.AttachedTo, v.ID),
	}
}

func attachmentMissing(v view.Volume, d cloud.Disk) Finding {
	return Finding{Kind: AttachmentMissing, Volume: v.ID, Disk: d.ID, Node: v.Node,
		Problem: fmt.Sprintf("csid's record says volume %s is attached to %s (%s), and the cloud has disk %s detached", v.ID, v.Node, v.State, d.ID),
		Cause:   "a detach made outside csid (the cloud's console or another tool), or the node was deleted or replaced (clouds detach the disks of a deleted instance)",
		Action: fmt.Sprintf("pods on %s cannot use the volume. Delete them (kubectl get pods -A -o wide | grep %s): kubelet then unpublishes and unstages, the attacher's ControllerUnpublishVolume brings the record back to CREATED "+
			"(detaching a detached disk succeeds), and the next pod's ControllerPublishVolume attaches it again", v.Node, v.Node),
	}
}

func loopDeviceUnaccounted(diskID, dev string, recs []view.Volume, d cloud.Disk, inCloud, cloudRead bool) Finding {
	f := Finding{Kind: LoopDeviceUnaccounted, Disk: diskID, Device: dev,
		Problem: fmt.Sprintf("%s is bound to the image of disk %s, and no volume record has that disk attached to a node of this machine", dev, diskID)}
	var states []string
	for _, v := range recs {
		f.Volume = v.ID
		states = append(states, fmt.Sprintf("volume %s is %s", v.ID, v.State))
	}
	switch {
	case cloudRead && !inCloud:
		f.Cause = "the disk no longer exists (deleted outside csid while the device stayed bound, or a crash between the release and the delete): the device keeps the deleted image's space in use"
	case inCloud && d.AttachedTo != "":
		f.Node = d.AttachedTo
		f.Cause = fmt.Sprintf("the cloud has the disk attached to %s, and no record does: see the attachment finding for the disk", d.AttachedTo)
	case len(recs) > 0:
		f.Cause = strings.Join(states, "; ") + ": a detach that did not release the device (a crash between the cloud's detach and the release), or a device bound by hand (losetup)"
	default:
		f.Cause = "no record names the disk: a device bound by hand (losetup), or left by a volume whose record is gone"
	}
	f.Action = fmt.Sprintf("check that nothing has it mounted or open (findmnt %s; fuser -vm %s). If nothing does, release it: losetup -d %s. If something does, find out what before touching it", dev, dev, dev)
	return f
}

func loopDeviceDuplicate(diskID, dev, first string, recs []view.Volume) Finding {
	f := Finding{Kind: LoopDeviceUnaccounted, Disk: diskID, Device: dev,
		Problem: fmt.Sprintf("%s is a second loop device bound to the image of disk %s, beside %s, which csid uses", dev, diskID, first)}
	for _, v := range recs {
		f.Volume, f.Node = v.ID, v.Node
	}
	f.Cause = "a device bound by hand (losetup), or a bug: csid binds one device per disk, under the backend's lock; writes through two devices of one image corrupt the filesystem"
	f.Action = fmt.Sprintf("check that nothing has %s mounted or open (findmnt %s; fuser -vm %s), then release it: losetup -d %s; never release %s while the volume is in use", dev, dev, dev, dev, first)
	return f
}

func mountUnaccounted(m Mount, dev string, owned bool, diskID string) Finding {
	f := Finding{Kind: MountUnaccounted, Path: m.Path, Device: dev, Disk: diskID}
	why := "of csid's device " + dev
	if diskID != "" {
		why += " (disk " + diskID + ")"
	}
	if owned {
		why = "in a directory kubelet made for csid's volumes"
	}
	f.Problem = fmt.Sprintf("%s is mounted (%s from %s), %s, and no volume record has it as a staging or target path", m.Path, m.Type, m.Device, why)
	f.Cause = "a NodeStageVolume or NodePublishVolume whose mount went through but whose op failed and whose clean-up failed too, an unstage or unpublish answered from a record that was lost or cleared (so nothing was unmounted), or a mount made by hand"
	f.Action = fmt.Sprintf("make sure no running pod uses it (a target path names its pod's UID: kubelet's pods/<uid>/...; kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.uid} {.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}'). If none does, unmount it: umount %s", m.Path)
	return f
}

func mountMissing(v view.Volume, path string) Finding {
	what := "target"
	if path == v.StagingPath {
		what = "staging"
	}
	return Finding{Kind: MountMissing, Volume: v.ID, Disk: v.DiskID, Node: v.Node, Path: path,
		Problem: fmt.Sprintf("volume %s is %s on %s with %s path %s, and nothing is mounted there", v.ID, v.State, v.Node, what, path),
		Cause:   "an unmount outside csid since it started (by hand, or by another tool); a reboot is repaired by csid itself when it starts, before it answers ready",
		Action: fmt.Sprintf("pods using the volume see an empty directory, not the volume. Delete (or restart) the pods that use it on %s: kubelet's next "+
			"NodeStageVolume and NodePublishVolume find the mount gone, csid rolls its record back (the history says \"reconciled: no longer mounted\") "+
			"and mounts the volume again. Restarting csid's node plugin repairs the record too", v.Node),
	}
}

func mountOfAnotherDevice(v view.Volume, path string, m Mount, dev, other string) Finding {
	what := "target"
	if path == v.StagingPath {
		what = "staging"
	}
	shows := fmt.Sprintf("%s (%s from %s)", dev, m.Type, m.Device)
	if other != "" {
		shows = fmt.Sprintf("%s, which is bound to %s", dev, other)
	}
	return Finding{Kind: DeviceMismatch, Volume: v.ID, Disk: v.DiskID, Node: v.Node, Path: path, Device: dev,
		Problem: fmt.Sprintf("volume %s is %s on %s with %s path %s, and that path is a mount of %s, not of its disk %s", v.ID, v.State, v.Node, what, path, shows, v.DiskID),
		Cause: "the volume's disk was detached while the path was bound to its device (a force detach, or a detach outside csid) and the device was given to another disk, " +
			"or the mount was replaced by hand; csid binds and mounts only a device it has proven to be the volume's disk, and refuses to answer a repeated NodePublishVolume from such a mount",
		Action: fmt.Sprintf("the pods using %s do not see volume %s: they read and write what is mounted there. Stop them now (a target path names its pod's UID: kubelet's pods/<uid>/...), "+
			"then unmount the path (umount %s) so kubelet's next NodeStageVolume or NodePublishVolume mounts the volume's own disk (attached again by ControllerPublishVolume if it was detached)", path, v.ID, path),
	}
}

func recordOfAnotherDevice(v view.Volume, other string, own []string) Finding {
	where := "its disk has no device on this host: it is not attached here"
	if len(own) > 0 {
		where = "its disk's device is now " + strings.Join(own, ", ")
	}
	return Finding{Kind: DeviceMismatch, Volume: v.ID, Disk: v.DiskID, Node: v.Node, Device: v.Device,
		Problem: fmt.Sprintf("volume %s is %s on %s, staged from %s as its record says, and %s is bound to %s; %s", v.ID, v.State, v.Node, v.Device, v.Device, other, where),
		Cause:   "the volume's disk was detached behind the node's back (a force detach, or one outside csid) while it was staged, and the device was given to another disk",
		Action: fmt.Sprintf("csid never uses a recorded device without proving it is the volume's disk: NodePublishVolume and a repeated NodeStageVolume of %s answer FailedPrecondition while its disk is not attached here, "+
			"and bind its own device once it is (ControllerPublishVolume attaches it again). To clear the record, delete the volume's pods on %s so kubelet unstages it", v.ID, v.Node),
	}
}

func snapshotWithoutRecord(s cloud.Snapshot, owner string) Finding {
	f := Finding{Kind: SnapshotWithoutRecord, Snapshot: owner, Volume: s.Tags[effects.TagSourceVolume], Disk: s.SourceDiskID,
		Problem: fmt.Sprintf("the provider has snapshot %s (name %q, of disk %s, %d bytes), and no csid record names it", s.ID, s.Name, s.SourceDiskID, s.SizeBytes)}
	if owner == "" {
		f.Cause = "it has no csid.dev/snapshot-id tag, so csid did not take it: a snapshot made by hand or by another tool"
		f.Action = "if nothing of yours needs it, delete it with the provider's own tools; csid never deletes a snapshot it has no record of"
		return f
	}
	f.Cause = fmt.Sprintf("csid took it as snapshot %s, which has no record: a CreateSnapshot that crashed after the provider cut it and was never retried (the VolumeSnapshot was deleted meanwhile), a failed snapshot whose clean-up failed too, or a state file that was lost or restored from an older copy", owner)
	f.Action = fmt.Sprintf("find out whether a VolumeSnapshotContent names it: kubectl get volumesnapshotcontent -o jsonpath='{range .items[?(@.status.snapshotHandle==\"%s\")]}{.metadata.name}{\"\\n\"}{end}'. "+
		"If one does, its record was lost: keep it; restore the controller's state file from a backup (or start the controller on a new state file with --rebuild-from-cloud, which rebuilds snapshot records from the provider's tags). "+
		"If none does, it is a leak: delete it with the provider's own tools", owner)
	return f
}

func recordWithoutSnapshot(s view.Snapshot) Finding {
	return Finding{Kind: RecordWithoutSnapshot, Snapshot: s.ID, Volume: s.SourceVolumeID,
		Problem: fmt.Sprintf("snapshot %s (of volume %s) records the provider's snapshot %s, and the provider has no such snapshot", s.ID, s.SourceVolumeID, s.CloudID),
		Cause:   "the snapshot was deleted outside csid (the provider's tools; for the local backend, its files removed by hand), or csid check reads another provider or state directory than the driver uses",
		Action: "first make sure csid check reads the driver's state directory (--state-dir). If the snapshot is really gone, so is its data: restoring from it fails. " +
			"Delete the VolumeSnapshot (DeleteSnapshot of a missing snapshot succeeds and removes the record); a repeated CreateSnapshot of the same name takes a new one"}
}

func filesystemFrozen(f Freeze) Finding {
	where := "its mount point"
	if len(f.MountPoints) > 0 {
		where = strings.Join(f.MountPoints, ", ")
	}
	return Finding{Kind: FilesystemFrozen, Disk: f.DiskID, Path: strings.Join(f.MountPoints, ", "),
		Problem: fmt.Sprintf("the local backend recorded at %s that it froze the filesystem of disk %s (mounted at %s) for a snapshot or a clone, and no snapshot or clone of it is in flight",
			f.Since.UTC().Format(time.RFC3339), f.DiskID, where),
		Cause: "csid was killed while it copied the disk with its filesystem frozen: writes to the volume hang until the filesystem is thawed",
		Action: fmt.Sprintf("start csid (or restart it): it thaws such a filesystem when it opens its state directory, and removes the record. "+
			"If csid cannot start, thaw it by hand: fsfreeze -u %s", where)}
}
