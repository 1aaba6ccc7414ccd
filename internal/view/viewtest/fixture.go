// Package viewtest builds a state file with volumes in every situation an
// operator inspects, at fixed times and with fixed ids, through the store's
// own API (no engine, no clock): the fixture of the golden-file tests of
// `csid inspect`.
package viewtest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// T0 is the fixture's first instant; every time in it is T0 plus whole
// seconds.
var T0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// Volume ids of the fixture.
const (
	// Created is detached and idle (CREATED).
	Created = "vol-0000000000000000000a"
	// Published is staged and published on node-1 at two targets, with an
	// expansion queued until it is detached.
	Published = "vol-0000000000000000000b"
	// Failed is CREATED; its controller_publish failed (node full).
	Failed = "vol-0000000000000000000c"
	// Retrying is CREATED with a controller_publish in flight that has
	// failed three times on transient errors and backs off.
	Retrying = "vol-0000000000000000000d"
	// Creating has a create in flight (state ABSENT).
	Creating = "vol-0000000000000000000e"
	// Restored is CREATED, restored from the snapshot Snapshot.
	Restored = "vol-0000000000000000000f"
)

// Snapshot ids of the fixture.
const (
	// Snapshot is READY, taken of Created.
	Snapshot = "snap-0000000000000000000a"
	// Cutting is being taken of Published (its snapshot_create in flight).
	Cutting = "snap-0000000000000000000b"
)

// Staging and target paths of Published.
const (
	StagingPath = "/var/lib/kubelet/plugins/kubernetes.io/csi/csid.csi.dev/4f1c/globalmount"
	TargetA     = "/var/lib/kubelet/pods/1111/volumes/kubernetes.io~csi/pvc-b/mount"
	TargetB     = "/var/lib/kubelet/pods/2222/volumes/kubernetes.io~csi/pvc-b/mount"
)

const gib = 1 << 30

// Build writes the fixture state file at path (which must not exist) and
// closes it.
func Build(path string) error {
	st, err := store.Open(path, store.Options{NoSync: true})
	if err != nil {
		return err
	}
	f := &fixture{st: st}
	f.create(Created, "pvc-a", "disk-000000000000000a", gib, 0, nil)
	f.create(Published, "pvc-b", "disk-000000000000000b", gib, 10, nil)
	f.attach(Published, "node-1", "disk-000000000000000b", 12)
	f.stage(Published, "/dev/loop3", 14)
	f.publish(Published, TargetA, false, 16)
	f.publish(Published, TargetB, true, 18)
	f.queueResize(Published, 2*gib, 20)
	f.create(Failed, "pvc-c", "disk-000000000000000c", 512<<20, 30, nil)
	f.failAttach(Failed, "node-2", 32)
	f.create(Retrying, "pvc-d", "disk-000000000000000d", gib, 40, nil)
	f.retryAttach(Retrying, "node-1", 42)
	f.startCreate(Creating, "pvc-e", 50)
	f.snapshot(Snapshot, "snapshot-a", Created, "disk-000000000000000a", 60, true)
	f.snapshot(Cutting, "snapshot-b", Published, "disk-000000000000000b", 70, false)
	f.create(Restored, "pvc-f", "disk-000000000000000f", gib, 80, &store.Source{SnapshotID: Snapshot, CloudSnapshotID: "csnap-a", SizeBytes: gib})
	if f.err != nil {
		st.Close()
		return f.err
	}
	return st.Close()
}

type fixture struct {
	st  *store.Store
	err error
}

func at(sec int) time.Time { return T0.Add(time.Duration(sec) * time.Second) }

func mustJSON(v any) json.RawMessage {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return raw
}

// step runs one transaction unless an earlier one failed.
func (f *fixture) step(what string, fn func(tx *store.Tx) error) {
	if f.err != nil {
		return
	}
	if err := f.st.Update(fn); err != nil {
		f.err = fmt.Errorf("fixture: %s: %w", what, err)
	}
}

var mountCap = store.Capability{AccessType: "mount", FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER"}

// transition accepts an op on volume id at sec and finishes it 1s later
// with change applied to the volume (when ok) or failed with code/msg.
func (f *fixture) transition(id string, e fsm.Event, g fsm.Guard, to fsm.State, args any, sec int,
	change func(v *store.Volume), result any, code, msg string) {
	f.step(string(e)+" "+id, func(tx *store.Tx) error {
		v, err := tx.Volume(id)
		if err != nil || v == nil {
			return fmt.Errorf("volume %s: %v", id, err)
		}
		op := &store.Op{Event: e, Guard: g, From: v.State, To: to, Args: mustJSON(args), Fingerprint: "fp-" + string(e), CreatedAt: at(sec)}
		if err := tx.Accept(v, op); err != nil {
			return err
		}
		op.FinishedAt = at(sec + 1)
		if code != "" {
			op.Status, op.Code, op.Message = store.OpFailed, code, msg
			return tx.Finish(v, op)
		}
		op.Status = store.OpSucceeded
		if result != nil {
			op.Result = mustJSON(result)
		}
		change(v)
		v.State, v.Generation, v.UpdatedAt = to, v.Generation+1, at(sec+1)
		return tx.Finish(v, op)
	})
}

func (f *fixture) create(id, name, disk string, size int64, sec int, src *store.Source) {
	f.step("create "+id, func(tx *store.Tx) error {
		v := &store.Volume{ID: id, Name: name, State: fsm.Absent, Capability: mountCap, Source: src,
			Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": name, "csi.storage.k8s.io/pvc/namespace": "default"},
			CreatedAt:  at(sec), UpdatedAt: at(sec)}
		args := map[string]any{"name": name, "sizeBytes": size, "capability": mountCap}
		op := &store.Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created, Args: mustJSON(args), Fingerprint: "fp-create", CreatedAt: at(sec)}
		if err := tx.Accept(v, op); err != nil {
			return err
		}
		op.Status, op.FinishedAt = store.OpSucceeded, at(sec+1)
		op.Checkpoints = map[string]string{"cloud-op": "op-create-" + id[len(id)-1:]}
		op.Result = mustJSON(map[string]any{"diskID": disk, "capacityBytes": size, "zone": "local"})
		v.State, v.DiskID, v.CapacityBytes, v.Zone, v.Generation, v.UpdatedAt = fsm.Created, disk, size, "local", 1, at(sec+1)
		return tx.Finish(v, op)
	})
}

// snapshot takes snapshot id of volume vol at sec; cut finishes it (READY)
// 1s later, else it stays in flight.
func (f *fixture) snapshot(id, name, vol, disk string, sec int, cut bool) {
	f.step("snapshot "+id, func(tx *store.Tx) error {
		s := &store.Snapshot{ID: id, Name: name, SourceVolumeID: vol, SourceDiskID: disk, Zone: "local", State: fsm.Absent,
			CreatedAt: at(sec), UpdatedAt: at(sec)}
		args := map[string]any{"name": name, "sourceVolumeID": vol}
		op := &store.Op{Event: fsm.SnapshotCreate, From: fsm.Absent, To: fsm.Ready, Args: mustJSON(args), Fingerprint: "fp-snapshot", CreatedAt: at(sec)}
		if err := tx.AcceptSnapshot(s, op); err != nil || !cut {
			return err
		}
		op.Status, op.FinishedAt = store.OpSucceeded, at(sec+1)
		op.Checkpoints = map[string]string{"cloud-op": "op-snapshot-" + id[len(id)-1:], "cloud-snapshot": "csnap-" + id[len(id)-1:]}
		op.Result = mustJSON(map[string]any{"cloudSnapshotID": "csnap-" + id[len(id)-1:], "capacityBytes": gib, "readyToUse": true})
		s.State, s.CloudID, s.SizeBytes, s.ReadyToUse, s.CutAt, s.Generation, s.UpdatedAt = fsm.Ready, "csnap-"+id[len(id)-1:], gib, true, at(sec), 1, at(sec+1)
		return tx.FinishSnapshot(s, op)
	})
}

func (f *fixture) attach(id, node, disk string, sec int) {
	f.transition(id, fsm.ControllerPublish, "", fsm.NodeReady, map[string]any{"node": node, "capability": mountCap}, sec,
		func(v *store.Volume) {
			v.Attachment = &store.Attachment{Node: node, Fingerprint: "fp-attach", PublishContext: map[string]string{"csid.dev/disk-id": disk}}
		}, nil, "", "")
}

func (f *fixture) stage(id, device string, sec int) {
	f.transition(id, fsm.NodeStage, "", fsm.VolReady, map[string]any{"stagingPath": StagingPath, "capability": mountCap}, sec,
		func(v *store.Volume) {
			v.Stage = &store.Stage{Path: StagingPath, Fingerprint: "fp-stage", Device: device}
		},
		map[string]any{"device": device}, "", "")
}

func (f *fixture) publish(id, target string, ro bool, sec int) {
	f.transition(id, fsm.NodePublish, "", fsm.Published,
		map[string]any{"targetPath": target, "stagingPath": StagingPath, "readOnly": ro, "capability": mountCap}, sec,
		func(v *store.Volume) {
			if v.Targets == nil {
				v.Targets = map[string]store.Target{}
			}
			v.Targets[target] = store.Target{ReadOnly: ro, Fingerprint: "fp-publish"}
		}, nil, "", "")
}

func (f *fixture) queueResize(id string, size int64, sec int) {
	f.step("resize "+id, func(tx *store.Tx) error {
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if err := tx.PutResize(&store.Resize{VolumeID: id, TargetBytes: size, Status: store.ResizeQueued, QueuedAt: at(sec), UpdatedAt: at(sec)}); err != nil {
			return err
		}
		return tx.AddNote(id, store.HistoryEntry{Time: at(sec), Event: fsm.Expand, Guard: fsm.Deferred, From: v.State, To: v.State,
			Generation: v.Generation, Outcome: fmt.Sprintf("queued resize to %d bytes", size)})
	})
}

func (f *fixture) failAttach(id, node string, sec int) {
	f.transition(id, fsm.ControllerPublish, "", fsm.NodeReady, map[string]any{"node": node, "capability": mountCap}, sec, nil, nil,
		"ResourceExhausted", "node node-2 has no free attachment slot (1 of 1 used): limit reached")
}

func (f *fixture) retryAttach(id, node string, sec int) {
	f.step("retry "+id, func(tx *store.Tx) error {
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		op := &store.Op{Event: fsm.ControllerPublish, From: v.State, To: fsm.NodeReady,
			Args: mustJSON(map[string]any{"node": node, "capability": mountCap}), Fingerprint: "fp-attach", CreatedAt: at(sec)}
		if err := tx.Accept(v, op); err != nil {
			return err
		}
		op.Attempts, op.LastError, op.NextAttemptAt = 3, "attach disk-000000000000000d to node-1: transient provider error", at(sec+9)
		op.Checkpoints = map[string]string{"cloud-op": "op-attach-d"}
		return tx.UpdateOp(op)
	})
}

func (f *fixture) startCreate(id, name string, sec int) {
	f.step("start create "+id, func(tx *store.Tx) error {
		v := &store.Volume{ID: id, Name: name, State: fsm.Absent, Capability: mountCap,
			CreatedAt: at(sec), UpdatedAt: at(sec)}
		op := &store.Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created,
			Args: mustJSON(map[string]any{"name": name, "sizeBytes": gib, "capability": mountCap}), Fingerprint: "fp-create", CreatedAt: at(sec)}
		return tx.Accept(v, op)
	})
}
