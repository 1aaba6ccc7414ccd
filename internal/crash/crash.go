// Package crash holds csid's named crash points: places in the code where a
// crash-recovery drill may kill the process, to prove that nothing is lost
// or leaked when a real crash strikes there.
//
// A point is inert unless armed: Point costs one atomic load. Armed (through
// the CSID_CRASH_AT environment variable or Arm), the process kills itself
// with SIGKILL when it reaches the point — not a panic, so deferred code and
// recovery handlers do not run, exactly as in a real crash, and drills work
// on a release build.
package crash

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Environment variables read by ArmFromEnv.
const (
	// EnvAt arms one point: "name" (fire on the first hit) or "name:N"
	// (fire on the N-th hit).
	EnvAt = "CSID_CRASH_AT"
	// EnvLog names a file to which a point appends its name just before it
	// fires, so a drill can tell which points fired.
	EnvLog = "CSID_CRASH_LOG"
	// EnvCount names a file to which every point reached appends its name,
	// without firing (a drill's census of which points a scenario reaches,
	// and how often).
	EnvCount = "CSID_CRASH_COUNT"
)

// The crash points compiled into csid. Drills iterate over Points.
const (
	OpsQueued              = "ops.queued"
	OpsBeforeEffect        = "ops.before_effect"
	OpsBeforeCommit        = "ops.before_commit"
	CloudAfterCreate       = "cloud.after_create"
	CloudAfterAttach       = "cloud.after_attach"
	CloudAfterSnapshot     = "cloud.after_snapshot"
	NodeAfterLosetup       = "node.after_losetup"
	MounterAfterFormat     = "mounter.after_format"
	MounterAfterMount      = "mounter.after_mount"
	ResizeAfterCloudResize = "resize.after_cloud_resize"
	UnpublishAfterDetach   = "unpublish.after_detach"
	MounterGrowRecorded    = "mounter.grow_recorded"
	MounterResizeRunning   = "mounter.resize_running"
	MounterAfterResize     = "mounter.after_resize"

	// The local backend's own steps (internal/cloud/local).
	LocalCreateLogged   = "local.create_logged"
	LocalCreateNamed    = "local.create_named"
	LocalCreateRecorded = "local.create_recorded"
	LocalDeleteLogged   = "local.delete_logged"
	LocalDeleteRemoved  = "local.delete_removed"
	LocalAttachImage    = "local.attach_image"
	LocalAttachIndexed  = "local.attach_indexed"
	LocalAttachRecorded = "local.attach_recorded"
	LocalDetachReleased = "local.detach_released"
	LocalDetachRecorded = "local.detach_recorded"
	LocalResizeGrown    = "local.resize_grown"
	LocalDeviceBound    = "local.device_bound"

	// The local backend's snapshots and clones (issue 17).
	LocalSnapshotFrozen   = "local.snapshot.frozen"
	LocalSnapshotCopying  = "local.snapshot.copying"
	LocalSnapshotImage    = "local.snapshot.image"
	LocalSnapshotNamed    = "local.snapshot.named"
	LocalSnapshotRecorded = "local.snapshot.recorded"
	LocalSnapshotDeleted  = "local.snapshot.deleted"
	LocalCloneFrozen      = "local.clone.frozen"
	LocalCloneCopying     = "local.clone.copying"
	LocalCloneImage       = "local.clone.image"
)

// Points lists every crash point, with what a crash there means.
var Points = map[string]string{
	OpsQueued:              "an op is durably queued; its effect has not started",
	OpsBeforeEffect:        "a worker is about to perform an op's effect",
	OpsBeforeCommit:        "an op's effect is done; its outcome is not yet committed",
	CloudAfterCreate:       "the cloud has created the disk; csid has not recorded it",
	CloudAfterAttach:       "the cloud has attached the disk; csid has not recorded it",
	CloudAfterSnapshot:     "the cloud has cut the snapshot; csid has not recorded it",
	NodeAfterLosetup:       "the node has a loop device for the disk; nothing is mounted",
	MounterAfterFormat:     "the device has just been formatted; nothing is mounted",
	MounterAfterMount:      "the staging mount exists; csid has not recorded it",
	ResizeAfterCloudResize: "the cloud has grown the disk; csid has not recorded the size",
	UnpublishAfterDetach:   "the cloud has detached the disk; csid still records it attached",
	MounterGrowRecorded:    "an offline growth of a filesystem is recorded; e2fsck and resize2fs have not run",
	MounterResizeRunning:   "resize2fs is growing a filesystem offline; csid's process group dies, resize2fs with it",
	MounterAfterResize:     "resize2fs has grown the filesystem; its growth record is not yet cleared",
	LocalCreateLogged:      "local backend: a create's intent is journaled; nothing else is made",
	LocalCreateNamed:       "local backend: a create's name is indexed; no record",
	LocalCreateRecorded:    "local backend: a created disk's record is in place; the operation is not recorded",
	LocalDeleteLogged:      "local backend: a delete's intent is journaled; the disk is whole",
	LocalDeleteRemoved:     "local backend: a deleted disk's record is gone; its name entry and image remain",
	LocalAttachImage:       "local backend: an attach made the disk's image; the record says detached",
	LocalAttachIndexed:     "local backend: an attachment is indexed under its node; the record says detached",
	LocalAttachRecorded:    "local backend: an attachment is recorded; the operation is not",
	LocalDetachReleased:    "local backend: a detach released the loop device; the record says attached",
	LocalDetachRecorded:    "local backend: a detach is recorded; the attachment entry remains",
	LocalResizeGrown:       "local backend: an image is grown; its record has the old size",
	LocalDeviceBound:       "local backend: the node bound a disk's image to a loop device; nobody has opened it",
	LocalSnapshotFrozen:    "local backend: a snapshot froze the source disk's mounted filesystem (the freeze is recorded); nothing is copied",
	LocalSnapshotCopying:   "local backend: a snapshot's image is partly copied, unnamed; no record",
	LocalSnapshotImage:     "local backend: a snapshot's image is in place; no name entry, no record",
	LocalSnapshotNamed:     "local backend: a snapshot's name is indexed and its image in place; no record",
	LocalSnapshotRecorded:  "local backend: a snapshot's record is in place; the operation is not recorded",
	LocalSnapshotDeleted:   "local backend: a deleted snapshot's record is gone; its name entry and image remain",
	LocalCloneFrozen:       "local backend: a clone froze its source disk's mounted filesystem (the freeze is recorded); nothing is copied",
	LocalCloneCopying:      "local backend: a clone's image is partly copied, unnamed; no record",
	LocalCloneImage:        "local backend: a clone's image is in place; no name entry, no record",
}

// GroupPoints are the points at which a crash kills csid's whole process
// group, the host tools it runs included, as the death of a container
// does. Armed, they need csid to lead its process group.
var GroupPoints = map[string]bool{MounterResizeRunning: true}

type arming struct {
	name string
	hit  int64 // fire on this hit (1-based)
	n    atomic.Int64
	log  string
	// count, when set, makes every point append its name here instead.
	count *os.File
	mu    sync.Mutex
}

var armed atomic.Pointer[arming]

// Arm arms one point by spec ("name" or "name:N"); "" disarms. logPath, if
// not empty, receives the point's name when it fires.
func Arm(spec, logPath string) error {
	if spec == "" {
		armed.Store(nil)
		return nil
	}
	name, hit := spec, int64(1)
	if i := strings.LastIndexByte(spec, ':'); i >= 0 {
		n, err := strconv.ParseInt(spec[i+1:], 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("crash point %q: hit count must be a positive integer", spec)
		}
		name, hit = spec[:i], n
	}
	if _, ok := Points[name]; !ok {
		return fmt.Errorf("unknown crash point %q", name)
	}
	if GroupPoints[name] && syscall.Getpgrp() != os.Getpid() {
		return fmt.Errorf("crash point %q kills csid's process group, and csid does not lead its own: start it as a group leader (setsid), as a container does", name)
	}
	armed.Store(&arming{name: name, hit: hit, log: logPath})
	return nil
}

// Count makes every point append its name to the file at path instead of
// firing; "" stops counting.
func Count(path string) error {
	if path == "" {
		armed.Store(nil)
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("crash point census: %w", err)
	}
	armed.Store(&arming{count: f})
	return nil
}

// ArmFromEnv arms the point named by CSID_CRASH_AT, if set, or starts a
// census into the file named by CSID_CRASH_COUNT.
func ArmFromEnv() error {
	if p := os.Getenv(EnvCount); p != "" {
		return Count(p)
	}
	return Arm(os.Getenv(EnvAt), os.Getenv(EnvLog))
}

// Point marks a crash point. Unarmed, it does nothing.
func Point(name string) { point(name, false) }

// WritesBeforeFiring is how many write system calls a host tool has made
// when an armed PointWhileWriting fires: enough for resize2fs to have begun
// rewriting a filesystem's metadata (its first writes only mark the
// superblock), few enough that it has not finished growing the drill's
// volumes (about 290 writes).
const WritesBeforeFiring = 32

// PointWhileWriting marks a point of GroupPoints reached while the host
// tool with process id pid runs (csid's child, in its process group).
// Armed, it fires once the tool has made WritesBeforeFiring write system
// calls (it watches /proc/<pid>/io every 50 µs), killing the group,
// the tool with it, in the middle of its work. Unarmed, it costs what Point
// costs. Call stop when the tool has exited.
func PointWhileWriting(name string, pid int) (stop func()) {
	a := armed.Load()
	if a == nil || a.count == nil && a.name != name {
		return func() {}
	}
	if a.count != nil {
		point(name, true) // a census counts the tool's run
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		// resize2fs grows a small filesystem in a few milliseconds, a
		// few microseconds a write: look often.
		tick := time.NewTicker(50 * time.Microsecond)
		defer tick.Stop()
		for {
			if writeCalls(pid) >= WritesBeforeFiring {
				point(name, true)
				return
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done) }
}

// writeCalls is the number of write system calls process pid has made
// (0 when unknown).
func writeCalls(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// point fires name if it is armed: SIGKILL to this process, or to its
// process group.
func point(name string, group bool) {
	a := armed.Load()
	if a == nil {
		return
	}
	if a.count != nil {
		a.mu.Lock()
		fmt.Fprintln(a.count, name)
		a.mu.Unlock()
		return
	}
	if a.name != name {
		return
	}
	if a.n.Add(1) != a.hit {
		return
	}
	if a.log != "" {
		if f, err := os.OpenFile(a.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			fmt.Fprintln(f, name)
			f.Sync()
			f.Close()
		}
	}
	pid := os.Getpid()
	if group {
		pid = 0 // kill(2): every process in the caller's group
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return into the code after the point
}
