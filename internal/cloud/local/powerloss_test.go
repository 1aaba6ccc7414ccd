package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/testutil"
)

// A crash of the machine keeps what every call that returned did, on a
// file system without a journal (ext4 made with -O ^has_journal, as some
// cloud images' root file systems are), where nothing is durable unless
// csid made it so. The state directory lives on such an ext4 on a loop
// device; the crash is a copy of the device's backing file, taken the
// moment the calls have returned: it holds what reached the device and
// nothing the kernel still held in memory. e2fsck repairs the copy as it
// would at the next boot, and the state directory on it must hold every
// disk created and not deleted (found again by its name, with its tags),
// the image of each attached disk, and none of the deleted disks, once
// the first Open of the next boot has replayed the journals (journal.go).
func TestMachineCrashKeepsWhatReturned(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	mnt := testutil.MountFS(t, "ext4", 256*mib, "-O", "^has_journal")
	image := filepath.Join(filepath.Dir(mnt), "ext4.img") // where MountFS made it
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the file system's image: %v", err)
	}
	// A journal file takes 16 intents: the calls below cross checkpoints.
	c := open(t, filepath.Join(mnt, "state"), Options{journalIntents: 16})
	if c.s.orderedMeta {
		t.Fatal("an ext4 without a journal is taken for one that orders its metadata")
	}
	if err := c.RegisterNode(ctx, cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}

	type want struct {
		id       string
		size     int64
		attached bool
		tag      string
		source   *cloud.DiskSource
	}
	live, deleted := map[string]want{}, map[string]string{}
	for i := range 24 {
		name := fmt.Sprintf("pvc-%d", i)
		d := create(t, c, name, 8*mib)
		live[name] = want{id: d.ID, size: d.SizeBytes}
	}
	for i := range 24 {
		name := fmt.Sprintf("pvc-%d", i)
		w := live[name]
		switch i % 4 {
		case 0:
			if _, err := c.DeleteDisk(ctx, w.id); err != nil {
				t.Fatal(err)
			}
			delete(live, name)
			deleted[name] = w.id
		case 1:
			if _, err := c.AttachDisk(ctx, w.id, "node-a"); err != nil {
				t.Fatal(err)
			}
			w.attached = true
		case 2:
			if _, err := c.UpdateDiskTags(ctx, w.id, map[string]string{"csid.dev/volume-id": name}); err != nil {
				t.Fatal(err)
			}
			w.tag = name
		case 3:
			if _, err := c.ResizeDisk(ctx, w.id, 16*mib); err != nil {
				t.Fatal(err)
			}
			w.size = 16 * mib
		}
		if i%4 != 0 {
			live[name] = w
		}
	}

	// Creates and deletes at once, as csid's engine makes them: they
	// share the journal's commits and recycle each other's record files.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				name := fmt.Sprintf("par-%d-%d", w, i)
				op, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: name, SizeBytes: 8 * mib})
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					if _, err := c.DeleteDisk(ctx, op.DiskID); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				if i%2 == 0 {
					deleted[name] = op.DiskID
				} else {
					live[name] = want{id: op.DiskID, size: 8 * mib}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	// A snapshot of each attached disk, with data, and a disk made from
	// each: copies made unnamed, then named (linkFile).
	snaps, clones := map[string]string{}, map[string]int64{}
	for name, w := range live {
		if !w.attached {
			continue
		}
		writeImage(t, c, w.id, 0, []byte("data of "+name))
		op, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-" + name, SourceDiskID: w.id})
		if err == nil {
			_, err = c.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
		snap := op.SnapshotID
		snaps[snap] = name
		source := &cloud.DiskSource{SnapshotID: snap}
		op, err = c.CreateDisk(ctx, cloud.DiskSpec{Name: "clone-" + name, SizeBytes: w.size, Source: source})
		if err == nil {
			_, err = c.WaitOperation(ctx, op.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
		clones[op.DiskID] = w.size
		live["clone-"+name] = want{id: op.DiskID, size: w.size, source: source}
	}

	// The crash: the device as it is now.
	crashed := filepath.Join(t.TempDir(), "crashed.img")
	if out, err := exec.Command("cp", "--sparse=always", image, crashed).CombinedOutput(); err != nil {
		t.Fatalf("copy the device: %v: %s", err, out)
	}
	// The next boot: e2fsck repairs what it finds (exit 1: it fixed
	// something; 4 and up: it could not).
	out, err := exec.Command("e2fsck", "-fy", crashed).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && (!errors.As(err, &exit) || exit.ExitCode() >= 4) {
		t.Fatalf("e2fsck: %v: %s", err, out)
	}
	t.Logf("e2fsck after the crash:\n%s", out)
	after := filepath.Join(t.TempDir(), "after")
	if err := os.Mkdir(after, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop,nosuid,nodev", crashed, after).CombinedOutput(); err != nil {
		t.Fatalf("mount the crashed copy: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(after, 0); err != nil {
			t.Errorf("unmount %s: %v", after, err)
		}
	})

	dir := filepath.Join(after, "state")
	// The next boot: its first Open replays the journals the crashed one
	// left (another boot's id is what tells it).
	c2 := open(t, dir, Options{bootID: "the next boot"})
	checkInvariants(t, dir)
	for name, w := range live {
		d, err := c2.GetDisk(ctx, w.id)
		if err != nil {
			t.Errorf("disk %s (%s) after the crash: %v", w.id, name, err)
			continue
		}
		if d.Name != name || d.SizeBytes != w.size || (d.AttachedTo == "node-a") != w.attached || (w.tag != "" && d.Tags["csid.dev/volume-id"] != w.tag) {
			t.Errorf("disk %s after the crash: %+v, want %s of %d bytes, attached %v, tag %q", w.id, d, name, w.size, w.attached, w.tag)
		}
		if w.attached {
			fi, err := os.Lstat(c2.s.imagePath(diskID(w.id)))
			if err != nil || fi.Size() != w.size {
				t.Errorf("image of the attached disk %s after the crash: %v, %v", w.id, fi, err)
			}
		}
		// A repeated create finds it by its name.
		op, err := c2.CreateDisk(ctx, cloud.DiskSpec{Name: name, SizeBytes: w.size, Source: w.source})
		if err != nil || op.DiskID != w.id {
			t.Errorf("create %s again after the crash: %+v, %v; want disk %s", name, op, err, w.id)
		}
	}
	for snap, name := range snaps {
		if _, err := c2.GetSnapshot(ctx, snap); err != nil {
			t.Errorf("snapshot %s of %s after the crash: %v", snap, name, err)
		}
	}
	for clone, size := range clones {
		if fi, err := os.Lstat(c2.s.imagePath(diskID(clone))); err != nil || fi.Size() != size {
			t.Errorf("image of the clone %s after the crash: %v, %v; want %d bytes", clone, fi, err, size)
		}
	}
	for name, id := range deleted {
		if _, err := c2.GetDisk(ctx, id); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("deleted disk %s (%s) after the crash: %v, want not found", id, name, err)
		}
		// Its name is free: a name entry that came back is stale, and
		// says so (its file, recycled since, never names another disk).
		if op, err := c2.CreateDisk(ctx, cloud.DiskSpec{Name: name, SizeBytes: 8 * mib}); err != nil || op.DiskID == id {
			t.Errorf("create the deleted %s again after the crash: %+v, %v; want a new disk", name, op, err)
		}
	}
}
