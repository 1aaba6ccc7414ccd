package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A deleted disk's record file becomes a new record, rewritten in place:
// a create after deletes allocates no inode. Spares are taken oldest
// first. A replaced record's file becomes a spare too, once its disk is
// deleted (its first record stays as its name entry until then).
func TestDeletedRecordsAreRecycled(t *testing.T) {
	ctx := context.Background()
	c := open(t, newDir(t), Options{})
	var disks []cloud.Disk
	for i := range 5 {
		disks = append(disks, create(t, c, fmt.Sprintf("pvc-%d", i), 8*mib))
	}
	var deleted []uint64
	for _, d := range disks {
		deleted = append(deleted, inode(t, c.s.recordPath(diskID(d.ID))))
		if _, err := c.DeleteDisk(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	b := create(t, c, "pvc-b", 8*mib)
	if got := inode(t, c.s.recordPath(diskID(b.ID))); got != deleted[0] {
		t.Fatalf("the new record is inode %d, want the oldest spare, %d (of %v)", got, deleted[0], deleted)
	}
	if got, err := c.GetDisk(ctx, b.ID); err != nil || got.Name != "pvc-b" {
		t.Fatalf("the recycled record reads %+v, %v", got, err)
	}

	if _, err := c.UpdateDiskTags(ctx, b.ID, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	files := []uint64{deleted[0], inode(t, c.s.recordPath(diskID(b.ID)))}
	if files[1] == files[0] {
		t.Fatalf("the replaced record kept its inode %d", files[0])
	}
	if _, err := c.DeleteDisk(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(c.s.spares.dir)
	if err != nil {
		t.Fatal(err)
	}
	spared := map[uint64]bool{}
	for _, e := range entries {
		spared[inode(t, filepath.Join(c.s.spares.dir, e.Name()))] = true
	}
	for _, ino := range files {
		if !spared[ino] {
			t.Errorf("b's file %d is no spare (spares: %v)", ino, spared)
		}
	}
}

// A file in spare/ with another link (after a crash of the machine, a
// record whose move out of spare/ was not durable is linked from both) is
// never rewritten: a create passes it over.
func TestSpareWithAnotherLinkIsLeftAlone(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	live := create(t, c, "pvc-live", 8*mib)
	path := c.s.recordPath(diskID(live.ID))
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, filepath.Join(dir, spareDir, "0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	c.Close()

	c = open(t, dir, Options{})
	d := create(t, c, "pvc-new", 8*mib)
	if inode(t, c.s.recordPath(diskID(d.ID))) == inode(t, path) {
		t.Fatal("the new record was written into the live record's file")
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != string(before) {
		t.Fatalf("the live record changed: %q, %v; was %q", after, err, before)
	}
	if _, err := os.Lstat(filepath.Join(dir, spareDir, "0123456789abcdef")); !os.IsNotExist(err) {
		t.Fatalf("the spare name of the live record: %v, want it removed", err)
	}
}

// BenchmarkCreateDelete measures create+delete pairs on local.Cloud
// alone, in a fresh directory and in one where 10,000 disks were created
// and deleted just before (on a file system without a journal, ext4 then
// avoids reusing their inodes for minutes: spare.go), with the CPU time
// of the process per pair. It runs in the state directory's usual place,
// the system's temporary directory.
func BenchmarkCreateDelete(b *testing.B) {
	for _, churned := range []int{0, 10000} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("deleted=%d/workers=%d", churned, workers), func(b *testing.B) {
				benchmarkCreateDelete(b, churned, workers)
			})
		}
	}
}

func benchmarkCreateDelete(b *testing.B, churned, workers int) {
	ctx := context.Background()
	c, err := Open(ctx, filepath.Join(b.TempDir(), "state"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	tags := map[string]string{"csid.dev/volume-id": "pvc-0", "csid.dev/capability": `{"mount":{"fs_type":"ext4"},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}`}
	ids := make([]string, 0, churned)
	for i := range churned {
		op, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: fmt.Sprintf("old-%d", i), SizeBytes: mib, Tags: tags})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, op.DiskID)
	}
	for _, id := range ids {
		if _, err := c.DeleteDisk(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0, start := cpuTime(), time.Now()
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				op, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: fmt.Sprintf("pvc-%d", i), SizeBytes: mib, Tags: tags})
				if err == nil {
					_, err = c.DeleteDisk(ctx, op.DiskID)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pair")
}

// cpuTime is the CPU time this process has used, in user and system mode.
func cpuTime() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
