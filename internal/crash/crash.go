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
	NodeAfterLosetup       = "node.after_losetup"
	MounterAfterFormat     = "mounter.after_format"
	MounterAfterMount      = "mounter.after_mount"
	ResizeAfterCloudResize = "resize.after_cloud_resize"
	UnpublishAfterDetach   = "unpublish.after_detach"
)

// Points lists every crash point, with what a crash there means.
var Points = map[string]string{
	OpsQueued:              "an op is durably queued; its effect has not started",
	OpsBeforeEffect:        "a worker is about to perform an op's effect",
	OpsBeforeCommit:        "an op's effect is done; its outcome is not yet committed",
	CloudAfterCreate:       "the cloud has created the disk; csid has not recorded it",
	CloudAfterAttach:       "the cloud has attached the disk; csid has not recorded it",
	NodeAfterLosetup:       "the node has a loop device for the disk; nothing is mounted",
	MounterAfterFormat:     "the device has just been formatted; nothing is mounted",
	MounterAfterMount:      "the staging mount exists; csid has not recorded it",
	ResizeAfterCloudResize: "the cloud has grown the disk; csid has not recorded the size",
	UnpublishAfterDetach:   "the cloud has detached the disk; csid still records it attached",
}

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
func Point(name string) {
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
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return into the code after the point
}
