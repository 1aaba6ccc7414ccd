package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/testutil"
)

// Changes of different disks take different locks: while one client holds
// a disk's lock (as a slow operation in another process would), another
// client creates, resizes, attaches, detaches and deletes other disks
// without waiting, and an operation on the held disk waits until its
// context ends.
func TestIndependentDisksDoNotWait(t *testing.T) {
	dir := newDir(t)
	a, b := open(t, dir, Options{}), open(t, dir, Options{})
	if err := a.RegisterNode(context.Background(), cloud.Node{ID: "node-a", MaxAttachments: 4}); err != nil {
		t.Fatal(err)
	}
	held := create(t, a, "pvc-held", mib)
	unlock, err := a.s.lock(context.Background(), diskKey(diskID(held.ID)))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	// Nothing below may wait on the held lock: a waiting call would
	// outlive this deadline and fail.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, name := range []string{"pvc-1", "pvc-2", "pvc-3"} {
		var d cloud.Disk
		steps := []func() (cloud.Operation, error){
			func() (cloud.Operation, error) {
				return b.CreateDisk(ctx, cloud.DiskSpec{Name: name, SizeBytes: mib})
			},
			func() (cloud.Operation, error) { return b.ResizeDisk(ctx, d.ID, 2*mib) },
			func() (cloud.Operation, error) { return b.AttachDisk(ctx, d.ID, "node-a") },
			func() (cloud.Operation, error) { return b.DetachDisk(ctx, d.ID, "node-a") },
			func() (cloud.Operation, error) { return b.DeleteDisk(ctx, d.ID) },
		}
		for j, step := range steps {
			op, err := step()
			if err == nil && j == 0 {
				d, err = b.WaitOperation(ctx, op.ID)
			} else if err == nil {
				_, err = b.WaitOperation(ctx, op.ID)
			}
			if err != nil {
				t.Fatalf("disk %d, step %d, beside a held disk: %v", i, j, err)
			}
		}
	}

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.ResizeDisk(short, held.ID, 2*mib); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resize of the held disk: %v, want it to wait until its context ends", err)
	}
	if _, err := b.CreateDisk(ctx, cloud.DiskSpec{Name: "pvc-held", SizeBytes: mib}); err != nil {
		t.Fatalf("create by the held disk's name takes the name's lock, not the disk's: %v", err)
	}
}

// writeLayout1 writes a state directory as csid's layout 1 left it: the
// format marker, records and images, and no indexes.
func writeLayout1(t *testing.T, dir string, nodes map[string]cloud.Node, disks ...cloud.Disk) {
	t.Helper()
	for _, d := range []string{dir, filepath.Join(dir, disksDir), filepath.Join(dir, opsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, v any) {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, formatFile), []byte(format1), 0o600); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dir, nodesFile), nodesRecord{Version: recordVersion, Nodes: nodes})
	for _, d := range disks {
		write(filepath.Join(dir, disksDir, d.ID+recSuffix), diskRecord{Version: recordVersion, Disk: d})
		if err := os.WriteFile(filepath.Join(dir, disksDir, d.ID+imageSuffix), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, disksDir, d.ID+imageSuffix), d.SizeBytes); err != nil {
			t.Fatal(err)
		}
	}
}

// A directory of layout 1 is migrated at Open: its disks are found by name
// and counted against their node's limit exactly as before.
func TestOpenMigratesLayout1(t *testing.T) {
	dir := newDir(t)
	nodes := map[string]cloud.Node{"node-a": {ID: "node-a", Zone: DefaultZone, MaxAttachments: 2}}
	old := []cloud.Disk{
		{ID: "disk-00000000000000a1", Name: "pvc-1", SizeBytes: mib, Zone: DefaultZone, AttachedTo: "node-a"},
		{ID: "disk-00000000000000a2", Name: "pvc-2", SizeBytes: mib, Zone: DefaultZone},
	}
	writeLayout1(t, dir, nodes, old...)

	c := open(t, dir, Options{})
	if raw, err := os.ReadFile(filepath.Join(dir, formatFile)); err != nil || string(raw) != formatMagic {
		t.Fatalf("format after Open: %q, %v; want %q", raw, err, formatMagic)
	}
	if got := create(t, c, "pvc-1", mib); got.ID != old[0].ID {
		t.Fatalf("create of an existing name after the migration: %s, want %s", got.ID, old[0].ID)
	}
	if _, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-2", SizeBytes: 2 * mib}); !errors.Is(err, cloud.ErrAlreadyExists) {
		t.Fatalf("create of an existing name with another size: %v, want ErrAlreadyExists", err)
	}
	third := create(t, c, "pvc-3", mib)
	for _, id := range []string{old[1].ID, third.ID} {
		op, err := c.AttachDisk(context.Background(), id, "node-a")
		if err == nil {
			_, err = c.WaitOperation(context.Background(), op.ID)
		}
		if id == old[1].ID && err != nil {
			t.Fatalf("attach of the second disk: %v", err)
		}
		if id == third.ID && !errors.Is(err, cloud.ErrLimitReached) {
			t.Fatalf("attach of a third disk to a node with limit 2 holding two: %v, want ErrLimitReached", err)
		}
	}
}

// A process of layout 1 takes the layout lock exclusively for each
// change; a process of this layout opening meanwhile waits for it, and
// gives up when its context ends.
func TestOpenWaitsForALayout1Process(t *testing.T) {
	dir := newDir(t)
	writeLayout1(t, dir, nil)
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Open(ctx, dir, Options{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open while a layout-1 process holds the lock: %v, want it to wait", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	open(t, dir, Options{})
}

// A crash between an attachment's entry and its record leaves a stale
// entry; at the node's limit, it is found stale and does not count.
func TestStaleAttachmentDoesNotCount(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a", MaxAttachments: 1}); err != nil {
		t.Fatal(err)
	}
	ghost, real := create(t, c, "pvc-ghost", mib), create(t, c, "pvc-real", mib)
	if err := c.s.indexAttachment(nodeHash("node-a"), diskID(ghost.ID)); err != nil {
		t.Fatal(err)
	}
	op, err := c.AttachDisk(context.Background(), real.ID, "node-a")
	if err == nil {
		_, err = c.WaitOperation(context.Background(), op.ID)
	}
	if err != nil {
		t.Fatalf("attach beside a stale entry: %v", err)
	}
	if _, err := c.AttachDisk(context.Background(), ghost.ID, "node-a"); !errors.Is(err, cloud.ErrLimitReached) {
		t.Fatalf("attach beyond the limit: %v, want ErrLimitReached", err)
	}
}

// An operation log's last line cut short by a kill is passed over: the
// operations before it are still answered, by another process too.
func TestCutOperationLogLineIsPassedOver(t *testing.T) {
	dir := newDir(t)
	a := open(t, dir, Options{})
	op, err := a.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: mib})
	if err != nil {
		t.Fatal(err)
	}
	logs, err := filepath.Glob(filepath.Join(dir, opsDir, "*"+logSuffix))
	if err != nil || len(logs) != 1 {
		t.Fatalf("logs: %v, %v", logs, err)
	}
	f, err := os.OpenFile(logs[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"version":1,"op":{"id":"op-`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b := open(t, dir, Options{})
	if d, err := b.WaitOperation(context.Background(), op.ID); err != nil || d.Name != "pvc-1" {
		t.Fatalf("another process's operation before a cut line: %+v, %v", d, err)
	}
	// The invariants check reads every line: this one is the test's.
	if err := os.Truncate(logs[0], int64(len(mustRead(t, logs[0])))-int64(len(`{"version":1,"op":{"id":"op-`))); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The state directory's file system decides whether earlier steps ride on
// the record's fsync: xfs and a journalled ext4 journal their metadata in
// order; tmpfs, ext2 and an ext4 without a journal do not (every step is
// fsynced there).
func TestOrderedMetadataIsToldByTheFileSystem(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		fs      string
		mkfs    []string
		ordered bool
	}{
		{"ext4", nil, true},
		{"ext4", []string{"-O", "^has_journal"}, false},
		{"xfs", nil, true},
		{"ext2", nil, false},
		{"tmpfs", nil, false},
	} {
		t.Run(tc.fs+strings.Join(tc.mkfs, ""), func(t *testing.T) {
			dir := testutil.MountFS(t, tc.fs, 320<<20, tc.mkfs...)
			got, err := ordersMetadata(dir)
			if err != nil || got != tc.ordered {
				t.Fatalf("ordersMetadata on %s %v = %v, %v; want %v", tc.fs, tc.mkfs, got, err, tc.ordered)
			}
		})
	}
}

// A process that has not appended to its operation log for a while starts
// another, so that it never appends to a log another process pruned as old.
func TestIdleOperationLogIsNotAppendedTo(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	create(t, c, "pvc-1", mib)
	c.s.oplog.mu.Lock()
	c.s.oplog.last = c.s.oplog.last.Add(-2 * c.s.oplog.maxIdle)
	c.s.oplog.mu.Unlock()
	create(t, c, "pvc-2", mib)
	logs, err := filepath.Glob(filepath.Join(dir, opsDir, "*"+logSuffix))
	if err != nil || len(logs) != 2 {
		t.Fatalf("logs after an idle spell: %v, %v; want two", logs, err)
	}
}

// A disk whose record was replaced since its create (here by a change of
// tags) has a name entry that is no longer the record's file: its delete
// must still find the entry its own and remove it.
func TestDeleteRemovesTheNameEntryOfAReplacedRecord(t *testing.T) {
	c := open(t, newDir(t), Options{})
	ctx := context.Background()
	d := create(t, c, "pvc-tagged", gib)
	op, err := c.UpdateDiskTags(ctx, d.ID, map[string]string{"team": "storage"})
	if err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	entry := c.s.namePath(nameHash(d.Name))
	var rec, ent unix.Stat_t
	if err := errors.Join(unix.Lstat(c.s.recordPath(diskID(d.ID)), &rec), unix.Lstat(entry, &ent)); err != nil {
		t.Fatal(err)
	}
	if rec.Ino == ent.Ino {
		t.Fatalf("the tag change left the record's file in place: the test needs a replaced record")
	}
	mustDelete(t, c, d.ID)
	if _, err := os.Lstat(entry); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("name entry %s after the delete: %v, want none", entry, err)
	}
}

// Another process may delete a disk this one created, and create one of
// the same name: what this process remembers of the name must not stand
// in for the records.
func TestDeleteSeesAnotherProcess(t *testing.T) {
	dir := newDir(t)
	a, b := open(t, dir, Options{}), open(t, dir, Options{})
	first := create(t, a, "pvc-shared", gib)
	mustDelete(t, b, first.ID)
	mustDelete(t, a, first.ID) // gone stays gone
	second := create(t, b, "pvc-shared", 2*gib)
	mustDelete(t, a, second.ID)
	if _, err := b.s.readDisk(diskID(second.ID)); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("disk %s after a's delete: %v, want ErrNotFound", second.ID, err)
	}
	if _, ok, err := a.s.named(nameHash("pvc-shared")); ok || err != nil {
		t.Fatalf("name entry of pvc-shared after the deletes: %v, %v; want none", ok, err)
	}
	third := create(t, a, "pvc-shared", 3*gib)
	if third.ID == first.ID || third.ID == second.ID {
		t.Fatalf("create after the deletes returned an old disk %s", third.ID)
	}
}

func mustDelete(t *testing.T, c *Cloud, id string) {
	t.Helper()
	op, err := c.DeleteDisk(context.Background(), id)
	if err == nil {
		_, err = c.WaitOperation(context.Background(), op.ID)
	}
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
}
