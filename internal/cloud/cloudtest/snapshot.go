package cloudtest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
)

// snapshotCases are the contract of cloud.Snapshotter and of
// DiskSpec.Source; a provider that does not implement Snapshotter skips
// them.
var snapshotCases = []contractCase{
	{"SnapshotIsIdempotentByName", testSnapshotIdempotent},
	{"SnapshotNameOfAnotherDiskIsAlreadyExists", testSnapshotAlreadyExists},
	{"ConcurrentSnapshotsOfOneNameMakeOne", testSnapshotConcurrent},
	{"SnapshotUnknownAndMalformed", testSnapshotUnknown},
	{"SnapshotListPagesAndFilters", testSnapshotList},
	{"DiskFromSnapshotHoldsItsContent", testRestore},
	{"DiskFromDiskHoldsItsContent", testClone},
	{"DiskFromSourceIsIdempotentByName", testSourceIdempotent},
	{"DiskFromBadSourceIsRefused", testSourceInvalid},
	{"SnapshotOutlivesItsDisk", testSnapshotOutlivesDisk},
	{"DeleteSnapshotKeepsItsDisks", testDeleteSnapshotKeepsDisks},
	{"SnapshotOperationsResumeByID", testSnapshotResume},
}

// snapshotter is the provider as a Snapshotter; a provider that is not one
// skips the case.
func (h *harness) snapshotter() cloud.Snapshotter {
	h.t.Helper()
	s, ok := h.c.(cloud.Snapshotter)
	if !ok {
		h.t.Skipf("%T takes no snapshots", h.c)
	}
	return s
}

// snapshot takes a snapshot, waits for it and returns it as GetSnapshot
// reports it.
func (h *harness) snapshot(name, diskID string) cloud.Snapshot {
	h.t.Helper()
	op := h.snapOp(h.snapshotter().CreateSnapshot(ctx(h.t), cloud.SnapshotSpec{Name: name, SourceDiskID: diskID}))
	return h.getSnapshot(op.SnapshotID)
}

// snapOp waits for a snapshot operation, failing the test on any error,
// and checks what a snapshot operation returns.
func (h *harness) snapOp(op cloud.Operation, err error) cloud.Operation {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("call: %v", err)
	}
	if op.ID == "" || op.SnapshotID == "" {
		h.t.Fatalf("snapshot call returned an operation without an id or a snapshot id: %+v", op)
	}
	if left := h.do(op, nil); left.ID != "" {
		h.t.Fatalf("a snapshot operation left disk %+v, want the zero Disk", left)
	}
	return op
}

func (h *harness) getSnapshot(id string) cloud.Snapshot {
	h.t.Helper()
	s, err := h.snapshotter().GetSnapshot(ctx(h.t), id)
	if err != nil {
		h.t.Fatalf("GetSnapshot(%s): %v", id, err)
	}
	return s
}

func (h *harness) snapshotGone(id string) {
	h.t.Helper()
	if s, err := h.snapshotter().GetSnapshot(ctx(h.t), id); !errors.Is(err, cloud.ErrNotFound) {
		h.t.Fatalf("GetSnapshot(%s) = (%+v, %v), want ErrNotFound", id, s, err)
	}
}

// createFrom creates a disk from a source and checks that it reports it.
func (h *harness) createFrom(name string, size int64, src cloud.DiskSource) cloud.Disk {
	h.t.Helper()
	d := h.do(h.c.CreateDisk(ctx(h.t), cloud.DiskSpec{Name: name, SizeBytes: size, Source: &src}))
	if d.Source == nil || *d.Source != src {
		h.t.Fatalf("disk %s made from %+v reports source %+v", d.ID, src, d.Source)
	}
	if d.SizeBytes < size {
		h.t.Fatalf("disk %s made from %+v has %d bytes, asked for %d", d.ID, src, d.SizeBytes, size)
	}
	return d
}

// listSnapshots pages through ListSnapshots from opts to the end and
// returns the snapshot IDs in order.
func (h *harness) listSnapshots(opts cloud.SnapshotListOptions) []string {
	h.t.Helper()
	s := h.snapshotter()
	return pageThrough(h.t, fmt.Sprintf("ListSnapshots of disk %q", opts.SourceDiskID), opts.PageToken, opts.MaxResults,
		func(token string) ([]string, string, error) {
			opts.PageToken = token
			page, err := s.ListSnapshots(ctx(h.t), opts)
			ids := make([]string, len(page.Snapshots))
			for i, s := range page.Snapshots {
				ids[i] = s.ID
			}
			return ids, page.NextToken, err
		})
}

// Content. A disk is written, when the provider lets the suite, at
// offsets that cover its first block, an unaligned span across a block
// boundary and its last block.

func contentOffsets(size int64) []int64 { return []int64{0, mib + 4000, size - 4096} }

// pattern is 4096 bytes that name seed and the offset they are written at.
func pattern(seed string, off int64) []byte {
	line := fmt.Sprintf("%s@%d;", seed, off)
	return bytes.Repeat([]byte(line), 4096/len(line)+1)[:4096]
}

// fill writes seed's pattern to disk id (of size bytes), if the provider
// lets the suite.
func (h *harness) fill(id string, size int64, seed string) {
	h.t.Helper()
	if h.p.WriteDisk == nil {
		return
	}
	for _, off := range contentOffsets(size) {
		h.p.WriteDisk(h.t, id, off, pattern(seed, off))
	}
}

// holds checks that disk id holds seed's pattern as fill wrote it to a disk
// of size bytes, if the provider lets the suite read it.
func (h *harness) holds(id string, size int64, seed string) {
	h.t.Helper()
	if h.p.ReadDisk == nil {
		return
	}
	for _, off := range contentOffsets(size) {
		want := pattern(seed, off)
		if got := h.p.ReadDisk(h.t, id, off, len(want)); !bytes.Equal(got, want) {
			h.t.Fatalf("disk %s at %d holds %.40q..., want %.40q... (%s)", id, off, got, want, seed)
		}
	}
}

// zeros checks that disk id reads as zeros for n bytes at off.
func (h *harness) zeros(id string, off int64, n int) {
	h.t.Helper()
	if h.p.ReadDisk == nil {
		return
	}
	if got := h.p.ReadDisk(h.t, id, off, n); !bytes.Equal(got, make([]byte, n)) {
		h.t.Fatalf("disk %s at %d holds %.40q..., want zeros", id, off, got)
	}
}

func testSnapshotIdempotent(t *testing.T, h *harness) {
	s := h.snapshotter()
	d := h.create("pvc-1", 64*mib)
	spec := cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID, Tags: map[string]string{"csid/snapshot": "snap-1"}}
	op, err := s.CreateSnapshot(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if op.Kind != cloud.OpSnapshot || op.DiskID != d.ID || op.SnapshotID == "" {
		t.Fatalf("snapshot operation = %+v", op)
	}
	h.snapOp(op, nil)
	first := h.getSnapshot(op.SnapshotID)
	if first.ID != op.SnapshotID || first.Name != spec.Name || first.SourceDiskID != d.ID ||
		first.SizeBytes != d.SizeBytes || !first.Ready || first.CreatedAt.IsZero() {
		t.Fatalf("GetSnapshot = %+v after taking %+v of %+v", first, spec, d)
	}
	if !maps.Equal(first.Tags, spec.Tags) {
		t.Errorf("tags = %v, want those of the spec", first.Tags)
	}
	again := h.snapOp(s.CreateSnapshot(ctx(t), spec))
	if again.SnapshotID != first.ID {
		t.Fatalf("repeat snapshot made %s, want %s", again.SnapshotID, first.ID)
	}
	if ids := h.listSnapshots(cloud.SnapshotListOptions{}); !slices.Equal(ids, []string{first.ID}) {
		t.Fatalf("ListSnapshots = %v, want only %s", ids, first.ID)
	}
	// Another name is another snapshot of the same disk.
	if other := h.snapshot("snap-2", d.ID); other.ID == first.ID {
		t.Fatalf("snapshots of two names share the id %s", other.ID)
	}
}

func testSnapshotAlreadyExists(t *testing.T, h *harness) {
	d1 := h.create("pvc-1", 64*mib)
	d2 := h.create("pvc-2", 64*mib)
	first := h.snapshot("snap-1", d1.ID)
	op, err := h.snapshotter().CreateSnapshot(ctx(t), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d2.ID})
	h.refused("the snapshot name on another disk", op, err, cloud.ErrAlreadyExists)
	if got := h.getSnapshot(first.ID); got.SourceDiskID != d1.ID {
		t.Fatalf("the refused snapshot changed %+v", got)
	}
	if ids := h.listSnapshots(cloud.SnapshotListOptions{SourceDiskID: d2.ID}); len(ids) != 0 {
		t.Fatalf("the refused snapshot left %v", ids)
	}
}

func testSnapshotConcurrent(t *testing.T, h *harness) {
	s := h.snapshotter()
	d := h.create("pvc-1", 64*mib)
	const n = 8
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			op, err := s.CreateSnapshot(ctx(t), cloud.SnapshotSpec{Name: "snap-race", SourceDiskID: d.ID})
			if err == nil {
				_, err = h.c.WaitOperation(ctx(t), op.ID)
			}
			ids[i], errs[i] = op.SnapshotID, err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("snapshot %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("concurrent snapshots of one name made %v", ids)
		}
	}
	if got := h.listSnapshots(cloud.SnapshotListOptions{}); !slices.Equal(got, ids[:1]) {
		t.Fatalf("ListSnapshots = %v, want only %s", got, ids[0])
	}
}

func testSnapshotUnknown(t *testing.T, h *harness) {
	s := h.snapshotter()
	d := h.create("pvc-1", 64*mib)
	gone := h.create("pvc-gone", 64*mib)
	h.do(h.c.DeleteDisk(ctx(t), gone.ID))
	deleted := h.snapshot("snap-gone", d.ID)
	h.snapOp(s.DeleteSnapshot(ctx(t), deleted.ID))
	h.snapshotGone(deleted.ID)

	op, err := s.CreateSnapshot(ctx(t), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: gone.ID})
	h.refused("a snapshot of an unknown disk", op, err, cloud.ErrNotFound)
	for _, spec := range []cloud.SnapshotSpec{
		{Name: "", SourceDiskID: d.ID},
		{Name: "snap-1", SourceDiskID: ""},
		{Name: "snap-1", SourceDiskID: "../" + d.ID},
		{Name: "snap-1", SourceDiskID: d.ID + "/.."},
	} {
		op, err := s.CreateSnapshot(ctx(t), spec)
		h.refused(fmt.Sprintf("CreateSnapshot(%+v)", spec), op, err, cloud.ErrInvalid)
	}
	// Deleting a snapshot that is gone is success, and so is waiting on it
	// again.
	del := h.snapOp(s.DeleteSnapshot(ctx(t), deleted.ID))
	h.snapOp(del, nil)
	for _, bad := range []string{"", "snap", "../" + deleted.ID, deleted.ID + "/..", deleted.ID + "0", "/etc/passwd", d.ID} {
		if got, err := s.GetSnapshot(ctx(t), bad); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("GetSnapshot(%q) = %+v, %v; want ErrNotFound", bad, got, err)
		}
		if bad == d.ID {
			continue // a disk id may well be of a snapshot id's format
		}
		op, err := s.DeleteSnapshot(ctx(t), bad)
		h.refused(fmt.Sprintf("DeleteSnapshot(%q)", bad), op, err, cloud.ErrInvalid)
	}
	if ids := h.listSnapshots(cloud.SnapshotListOptions{}); len(ids) != 0 {
		t.Fatalf("refused calls left snapshots: %v", ids)
	}
}

func testSnapshotList(t *testing.T, h *harness) {
	d1 := h.create("pvc-1", 64*mib)
	d2 := h.create("pvc-2", 64*mib)
	var all, of1, of2 []string
	for i := range 7 {
		d, of := d1, &of1
		if i%3 == 2 {
			d, of = d2, &of2
		}
		id := h.snapshot(fmt.Sprintf("snap-%d", i), d.ID).ID
		all, *of = append(all, id), append(*of, id)
	}
	slices.Sort(all)
	slices.Sort(of1)
	slices.Sort(of2)
	for _, size := range []int{0, 1, 2, 3, 7, 8, 100} {
		if got := h.listSnapshots(cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{MaxResults: size}}); !slices.Equal(got, all) {
			t.Fatalf("pages of %d: %v, want %v", size, got, all)
		}
		for _, f := range []struct {
			disk string
			want []string
		}{{d1.ID, of1}, {d2.ID, of2}} {
			got := h.listSnapshots(cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{MaxResults: size}, SourceDiskID: f.disk})
			if !slices.Equal(got, f.want) {
				t.Fatalf("pages of %d of disk %s: %v, want %v", size, f.disk, got, f.want)
			}
		}
	}
	// A token that names a snapshot deleted since: the listing goes on
	// after it.
	page, err := h.snapshotter().ListSnapshots(ctx(t), cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{MaxResults: 3}})
	if err != nil || len(page.Snapshots) != 3 || page.NextToken == "" {
		t.Fatalf("first page of 3: %+v, %v", page, err)
	}
	h.snapOp(h.snapshotter().DeleteSnapshot(ctx(t), page.Snapshots[2].ID))
	rest := h.listSnapshots(cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{PageToken: page.NextToken, MaxResults: 3}})
	if !slices.Equal(rest, all[3:]) {
		t.Fatalf("after a deleted token: %v, want %v", rest, all[3:])
	}
	for _, bad := range []string{"garbage", "../etc/passwd", "snap-/x", all[0] + "x", d1.ID + "x"} {
		_, err := h.snapshotter().ListSnapshots(ctx(t), cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{PageToken: bad}})
		if !errors.Is(err, cloud.ErrInvalid) {
			t.Errorf("ListSnapshots with token %q: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := h.snapshotter().ListSnapshots(ctx(t), cloud.SnapshotListOptions{ListOptions: cloud.ListOptions{MaxResults: -1}}); !errors.Is(err, cloud.ErrInvalid) {
		t.Errorf("ListSnapshots with MaxResults -1: %v, want ErrInvalid", err)
	}
	for _, bad := range []string{"../" + d1.ID, "no-such-disk"} {
		if got := h.listSnapshots(cloud.SnapshotListOptions{SourceDiskID: bad}); len(got) != 0 {
			t.Errorf("ListSnapshots of disk %q: %v, want none", bad, got)
		}
	}
}

// testRestore: a disk made from a snapshot holds the source's content at
// the time of the snapshot, at its size or larger (zeros beyond), and is
// independent of the snapshot and of other disks made from it.
func testRestore(t *testing.T, h *harness) {
	const size = 64 * mib
	d := h.create("pvc-1", size)
	h.fill(d.ID, size, "before")
	snap := h.snapshot("snap-1", d.ID)
	if snap.StoredBytes < 0 || snap.StoredBytes > snap.SizeBytes {
		t.Errorf("snapshot stores %d bytes of %d", snap.StoredBytes, snap.SizeBytes)
	}
	h.fill(d.ID, size, "after")

	same := h.createFrom("restore-same", size, cloud.DiskSource{SnapshotID: snap.ID})
	h.holds(same.ID, size, "before")
	larger := h.createFrom("restore-larger", 2*size, cloud.DiskSource{SnapshotID: snap.ID})
	h.holds(larger.ID, size, "before")
	h.zeros(larger.ID, size, 4096)
	h.zeros(larger.ID, 2*size-4096, 4096)
	// A write to a restored disk reaches neither the snapshot nor its
	// source.
	h.fill(same.ID, size, "restored")
	again := h.createFrom("restore-again", size, cloud.DiskSource{SnapshotID: snap.ID})
	h.holds(again.ID, size, "before")
	h.holds(d.ID, size, "after")
	if got := h.getSnapshot(snap.ID); got.SizeBytes != size || !got.Ready {
		t.Fatalf("the snapshot after its restores: %+v", got)
	}
}

// testClone: a disk made from a disk holds its content at the time of the
// call, and the two are independent after.
func testClone(t *testing.T, h *harness) {
	h.snapshotter() // a provider without snapshots makes no disk from a disk either
	const size = 64 * mib
	d := h.create("pvc-1", size)
	h.fill(d.ID, size, "source")
	clone := h.createFrom("clone-1", size, cloud.DiskSource{DiskID: d.ID})
	h.holds(clone.ID, size, "source")
	larger := h.createFrom("clone-larger", 3*size, cloud.DiskSource{DiskID: d.ID})
	h.holds(larger.ID, size, "source")
	h.zeros(larger.ID, 3*size-4096, 4096)
	h.fill(d.ID, size, "changed")
	h.holds(clone.ID, size, "source")
	h.fill(clone.ID, size, "clone")
	h.holds(d.ID, size, "changed")
	// The clone is a disk like any other: it can be snapshotted and
	// deleted, and its source deleted first.
	h.do(h.c.DeleteDisk(ctx(t), d.ID))
	h.holds(clone.ID, size, "clone")
	if s := h.snapshot("snap-of-clone", clone.ID); s.SourceDiskID != clone.ID {
		t.Fatalf("snapshot of the clone: %+v", s)
	}
	h.do(h.c.DeleteDisk(ctx(t), clone.ID))
	h.gone(clone.ID)
}

func testSourceIdempotent(t *testing.T, h *harness) {
	d := h.create("pvc-1", 64*mib)
	d2 := h.create("pvc-2", 64*mib)
	snap := h.snapshot("snap-1", d.ID)
	snap2 := h.snapshot("snap-2", d.ID)
	for _, src := range []cloud.DiskSource{{SnapshotID: snap.ID}, {DiskID: d.ID}} {
		name := "from-" + sourceName(src)
		first := h.createFrom(name, 64*mib, src)
		if again := h.createFrom(name, 64*mib, src); again.ID != first.ID {
			t.Fatalf("repeat create from %+v made %s, want %s", src, again.ID, first.ID)
		}
		// The same name with another source, or with none, is taken.
		for _, other := range []*cloud.DiskSource{nil, {SnapshotID: snap2.ID}, {DiskID: d2.ID}} {
			op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: name, SizeBytes: 64 * mib, Source: other})
			h.refused(fmt.Sprintf("create %q from %+v after one from %+v", name, other, src), op, err, cloud.ErrAlreadyExists)
		}
	}
	// A disk made without a source is not one made from one.
	op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-2", SizeBytes: 64 * mib, Source: &cloud.DiskSource{DiskID: d.ID}})
	h.refused("create of an empty disk's name from a source", op, err, cloud.ErrAlreadyExists)
	// Once made, the disk is found by its name even after its source is
	// gone.
	from := h.createFrom("from-gone", 64*mib, cloud.DiskSource{SnapshotID: snap2.ID})
	h.snapOp(h.snapshotter().DeleteSnapshot(ctx(t), snap2.ID))
	if again := h.createFrom("from-gone", 64*mib, cloud.DiskSource{SnapshotID: snap2.ID}); again.ID != from.ID {
		t.Fatalf("repeat create from a deleted snapshot made %s, want %s", again.ID, from.ID)
	}
}

func sourceName(src cloud.DiskSource) string {
	if src.SnapshotID != "" {
		return "snapshot"
	}
	return "disk"
}

func testSourceInvalid(t *testing.T, h *harness) {
	d := h.create("pvc-1", 64*mib)
	snap := h.snapshot("snap-1", d.ID)
	goneDisk := h.create("pvc-gone", 64*mib)
	h.do(h.c.DeleteDisk(ctx(t), goneDisk.ID))
	goneSnap := h.snapshot("snap-gone", d.ID)
	h.snapOp(h.snapshotter().DeleteSnapshot(ctx(t), goneSnap.ID))
	for _, c := range []struct {
		src  cloud.DiskSource
		size int64
		want error
	}{
		{cloud.DiskSource{}, 64 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{SnapshotID: snap.ID, DiskID: d.ID}, 64 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{SnapshotID: "../" + snap.ID}, 64 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{DiskID: d.ID + "/.."}, 64 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{SnapshotID: snap.ID}, 32 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{DiskID: d.ID}, 32 * mib, cloud.ErrInvalid},
		{cloud.DiskSource{SnapshotID: goneSnap.ID}, 64 * mib, cloud.ErrNotFound},
		{cloud.DiskSource{DiskID: goneDisk.ID}, 64 * mib, cloud.ErrNotFound},
	} {
		src := c.src
		op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-new", SizeBytes: c.size, Source: &src})
		h.refused(fmt.Sprintf("create of %d bytes from %+v", c.size, src), op, err, c.want)
	}
	if ids := h.listAll(0); !slices.Equal(ids, []string{d.ID}) {
		t.Fatalf("refused creates left disks: %v, want only %s", ids, d.ID)
	}
}

// testSnapshotOutlivesDisk: deleting a disk deletes none of its snapshots;
// they are listed by the disk's id and restore its content.
func testSnapshotOutlivesDisk(t *testing.T, h *harness) {
	const size = 64 * mib
	d := h.create("pvc-1", size)
	h.fill(d.ID, size, "kept")
	snap := h.snapshot("snap-1", d.ID)
	h.do(h.c.DeleteDisk(ctx(t), d.ID))
	h.gone(d.ID)
	if got := h.getSnapshot(snap.ID); got.SourceDiskID != d.ID || !got.Ready || got.SizeBytes != size {
		t.Fatalf("the snapshot after its disk's deletion: %+v", got)
	}
	if ids := h.listSnapshots(cloud.SnapshotListOptions{SourceDiskID: d.ID}); !slices.Equal(ids, []string{snap.ID}) {
		t.Fatalf("snapshots of the deleted disk: %v, want %s", ids, snap.ID)
	}
	restored := h.createFrom("restore", size, cloud.DiskSource{SnapshotID: snap.ID})
	h.holds(restored.ID, size, "kept")
	// A snapshot of the same name on a new disk is still another disk's.
	d2 := h.create("pvc-1", size)
	op, err := h.snapshotter().CreateSnapshot(ctx(t), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d2.ID})
	h.refused("the name of a deleted disk's snapshot on a new disk", op, err, cloud.ErrAlreadyExists)
}

// testDeleteSnapshotKeepsDisks: deleting a snapshot changes no disk made
// from it, and frees its name.
func testDeleteSnapshotKeepsDisks(t *testing.T, h *harness) {
	const size = 64 * mib
	d := h.create("pvc-1", size)
	h.fill(d.ID, size, "snap")
	snap := h.snapshot("snap-1", d.ID)
	restored := h.createFrom("restore", size, cloud.DiskSource{SnapshotID: snap.ID})
	del, err := h.snapshotter().DeleteSnapshot(ctx(t), snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	if del.Kind != cloud.OpDeleteSnapshot || del.SnapshotID != snap.ID {
		t.Fatalf("delete operation = %+v", del)
	}
	h.snapOp(del, nil)
	h.snapshotGone(snap.ID)
	if ids := h.listSnapshots(cloud.SnapshotListOptions{}); len(ids) != 0 {
		t.Fatalf("ListSnapshots after the delete = %v", ids)
	}
	h.holds(restored.ID, size, "snap")
	h.holds(d.ID, size, "snap")
	if again := h.snapshot("snap-1", d.ID); again.ID == snap.ID {
		t.Fatalf("a new snapshot of a deleted one's name reuses the id %s", snap.ID)
	}
}

// testSnapshotResume: snapshot operations are waited on after a restart
// of the client, as disk operations are.
func testSnapshotResume(t *testing.T, h *harness) {
	const size = 64 * mib
	d := h.create("pvc-1", size)
	h.fill(d.ID, size, "resumed")
	create, err := h.snapshotter().CreateSnapshot(ctx(t), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
	if err != nil {
		t.Fatal(err)
	}
	h.c = h.p.Reopen(t)
	h.snapOp(create, nil)
	if s := h.getSnapshot(create.SnapshotID); !s.Ready {
		t.Fatalf("after the resumed wait: %+v", s)
	}
	restore, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "restore", SizeBytes: size, Source: &cloud.DiskSource{SnapshotID: create.SnapshotID}})
	if err != nil {
		t.Fatal(err)
	}
	h.c = h.p.Reopen(t)
	restored := h.do(restore, nil)
	if restored.ID != restore.DiskID || restored.Source == nil || restored.Source.SnapshotID != create.SnapshotID {
		t.Fatalf("resumed restore = %+v, want disk %s from %s", restored, restore.DiskID, create.SnapshotID)
	}
	h.holds(restored.ID, size, "resumed")
	del, err := h.snapshotter().DeleteSnapshot(ctx(t), create.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	h.c = h.p.Reopen(t)
	h.snapOp(del, nil)
	h.snapshotGone(create.SnapshotID)
	// Waiting again on the snapshot gives the same answer after its
	// deletion.
	h.snapOp(create, nil)
}
