package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/testutil"
)

// checkSnapshots holds the snapshots of a state directory, after Open, to
// the invariants: every snapshot record has its image, as large as the
// snapshot, and its name entry; no image or name entry lacks a record; no
// freeze record is left.
func checkSnapshots(t *testing.T, s *state) {
	t.Helper()
	entries, err := os.ReadDir(s.snapshots())
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	records, images := map[snapID]bool{}, map[snapID]int64{}
	for _, e := range entries {
		name := e.Name()
		if base, ok := strings.CutSuffix(name, recSuffix); ok {
			records[snapID(base)] = true
		} else if base, ok := strings.CutSuffix(name, imageSuffix); ok {
			fi, err := e.Info()
			if err != nil {
				t.Errorf("invariants: %v", err)
				continue
			}
			images[snapID(base)] = fi.Size()
		} else {
			t.Errorf("invariants: stray file snapshots/%s", name)
		}
	}
	for id := range records {
		snap, err := s.readSnapshot(id)
		if err != nil {
			t.Errorf("invariants: %v", err)
			continue
		}
		if size, ok := images[id]; !ok || size != snap.SizeBytes {
			t.Errorf("invariants: snapshot %s of %d bytes has an image of %d (present: %v)", id, snap.SizeBytes, size, ok)
		}
		if got, ok, err := s.snapshotNamed(nameHash(snap.Name)); err != nil || !ok || got != id {
			t.Errorf("invariants: snapshot %s (%q) has no name entry: %q, %v", id, snap.Name, got, err)
		}
	}
	for id := range images {
		if !records[id] {
			t.Errorf("invariants: snapshot image %s has no record and survived Open", id)
		}
	}
	names, err := os.ReadDir(s.snapNames())
	if err != nil {
		t.Errorf("invariants: %v", err)
	}
	if len(names) != len(records) {
		t.Errorf("invariants: %d snapshot name entries for %d snapshots", len(names), len(records))
	}
	if frozen, err := os.ReadDir(s.frozen()); err != nil || len(frozen) != 0 {
		t.Errorf("invariants: freeze records %v left after Open (%v)", frozen, err)
	}
}

// stateIn returns a fresh state directory under base (a file system of
// the test's), with newDir's cleanup.
func stateIn(t *testing.T, base string) string {
	t.Helper()
	dir := filepath.Join(base, "state")
	t.Cleanup(func() {
		releaseAll(t, dir)
		if !t.Failed() {
			checkInvariants(t, dir)
		}
	})
	return dir
}

// The contract again, with the state directory on xfs: snapshots and
// clones are reflinks there.
func TestContractWithReflinks(t *testing.T) {
	base := testutil.MountFS(t, "xfs", 8<<30) // sparse; cases make disks of up to 2 GiB
	cloudtest.Run(t, func(t *testing.T) cloudtest.Provider {
		sub, err := os.MkdirTemp(base, "case-")
		if err != nil {
			t.Fatal(err)
		}
		dir := stateIn(t, sub)
		c := open(t, dir, Options{})
		if !c.reflink {
			t.Fatalf("xfs at %s: no reflinks", base)
		}
		return cloudtest.Provider{
			Cloud:         c,
			Reopen:        func(t *testing.T) cloud.Cloud { return open(t, dir, Options{}) },
			Host:          func(t *testing.T, node string) cloud.Host { return c.Host(node) },
			HostNeedsRoot: true,
			WriteDisk:     func(t *testing.T, id string, off int64, data []byte) { writeImage(t, c, id, off, data) },
			ReadDisk:      func(t *testing.T, id string, off int64, n int) []byte { return readImage(t, c, id, off, n) },
		}
	})
}

func TestReflinksAreToldByTheFileSystem(t *testing.T) {
	for _, fs := range []struct {
		name, fsType string
		opts         []string
		want         bool
	}{
		{"ext4", "ext4", nil, false},
		{"xfs", "xfs", nil, true},
		{"xfs-without-reflink", "xfs", []string{"-m", "reflink=0"}, false},
	} {
		t.Run(fs.name, func(t *testing.T) {
			dir := stateIn(t, testutil.MountFS(t, fs.fsType, 300<<20, fs.opts...))
			if c := open(t, dir, Options{}); c.reflink != fs.want {
				t.Fatalf("reflink = %v on %s, want %v", c.reflink, fs.name, fs.want)
			}
		})
	}
}

// A sparse copy keeps the holes: the snapshot's image has data where the
// disk's has, and holes elsewhere.
func TestSparseCopyKeepsHoles(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	if c.reflink {
		t.Skip("the test's temporary directory has reflinks: no sparse copy to test")
	}
	const size = 256 * mib
	d := create(t, c, "pvc-1", size)
	for _, off := range []int64{0, 100 * mib, size - mib} {
		writeImage(t, c, d.ID, off, bytes.Repeat([]byte{0xa5}, int(mib)))
	}
	snap := takeSnapshot(t, c, "snap-1", d.ID)
	if want := dataMap(t, c.s.imagePath(diskID(d.ID))); !equalMaps(dataMap(t, c.s.snapImagePath(snapID(snap.ID))), want) {
		t.Fatalf("snapshot's data at %v, the disk's at %v", dataMap(t, c.s.snapImagePath(snapID(snap.ID))), want)
	}
	if snap.StoredBytes < 3*mib || snap.StoredBytes > 4*mib {
		t.Fatalf("the snapshot stores %d bytes, want about 3 MiB of %d", snap.StoredBytes, size)
	}
	clone := createFrom(t, c, "clone-1", 2*size, cloud.DiskSource{SnapshotID: snap.ID})
	if got, want := dataMap(t, c.s.imagePath(diskID(clone.ID))), dataMap(t, c.s.imagePath(diskID(d.ID))); !equalMaps(got, want) {
		t.Fatalf("clone's data at %v, the disk's at %v", got, want)
	}
}

// dataMap lists the data extents of the file at path ([start, end) pairs),
// as SEEK_DATA and SEEK_HOLE find them.
func dataMap(t *testing.T, path string) [][2]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]int64
	for off := int64(0); ; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, [2]int64{data, hole})
		off = hole
	}
}

func equalMaps(a, b [][2]int64) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func takeSnapshot(t *testing.T, c *Cloud, name, disk string) cloud.Snapshot {
	t.Helper()
	op, err := c.CreateSnapshot(context.Background(), cloud.SnapshotSpec{Name: name, SourceDiskID: disk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(context.Background(), op.ID); err != nil {
		t.Fatal(err)
	}
	snap, err := c.GetSnapshot(context.Background(), op.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func createFrom(t *testing.T, c *Cloud, name string, size int64, src cloud.DiskSource) cloud.Disk {
	t.Helper()
	op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: name, SizeBytes: size, Source: &src})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.WaitOperation(context.Background(), op.ID)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// mountDisk attaches disk d to node-a, formats its loop device as fsType
// and mounts it under the test's temporary directory, until the test ends.
// It returns the mount point and the device.
func mountDisk(t *testing.T, c *Cloud, d cloud.Disk, fsType string) (string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	ctx := context.Background()
	if err := c.RegisterNode(ctx, cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	dev, err := devicePath(ctx, c.Host("node-a"), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	mkfs := map[string][]string{"ext4": {"mkfs.ext4", "-q", "-F"}, "xfs": {"mkfs.xfs", "-q", "-f"}}[fsType]
	run(t, append(mkfs, dev)...)
	run(t, "mkdir", mnt)
	run(t, "mount", "-t", fsType, dev, mnt)
	t.Cleanup(func() {
		if isFrozen(t, mnt) {
			// Thawed here, or the unmount would wait for ever.
			t.Errorf("%s was left frozen", mnt)
			thawDir(t, mnt)
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt, dev
}

func run(t *testing.T, cmd ...string) []byte {
	t.Helper()
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	return out
}

// isFrozen reports whether the filesystem mounted at dir is frozen:
// FIFREEZE refuses one that is (EBUSY); one that is not, the probe freezes
// and thaws at once. It never blocks, as a write to a frozen filesystem
// would.
func isFrozen(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = unix.IoctlSetInt(int(f.Fd()), ioctlFIFREEZE, 0)
	if errors.Is(err, unix.EBUSY) {
		return true
	}
	if err != nil {
		t.Fatalf("FIFREEZE %s: %v", dir, err)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0); err != nil {
		t.Fatalf("FITHAW %s: %v", dir, err)
	}
	return false
}

func thawDir(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0); err != nil {
		t.Errorf("FITHAW %s: %v", dir, err)
	}
}

// writable writes a file to the filesystem at dir and syncs it.
func writable(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "after")
	if err := os.WriteFile(path, []byte("written after the snapshot"), 0o600); err != nil {
		t.Fatalf("write to %s: %v", dir, err)
	}
	f, err := os.Open(path)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		t.Fatalf("sync %s: %v", path, err)
	}
}

// A copy that fails while the source's filesystem is frozen (the state
// directory's file system fills up: a real small file system, filled), or
// panics, thaws it: the filesystem takes writes again, and no freeze
// record is left.
func TestFreezeIsUndoneOnEveryError(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fault := range []string{"state-fs-full", "panic"} {
		t.Run(fault, func(t *testing.T) {
			stateFS := testutil.SmallFS(t, 128*mib)
			dir := stateIn(t, stateFS)
			c := open(t, dir, Options{})
			const size = 40 * mib
			d := create(t, c, "pvc-1", size)
			// Every block of the image written, so that the disk's
			// filesystem never needs a new block of the full state
			// file system (it would fail with an I/O error).
			writeImage(t, c, d.ID, 0, make([]byte, size))
			mnt, _ := mountDisk(t, c, d, "ext4")
			if err := os.WriteFile(filepath.Join(mnt, "data"), bytes.Repeat([]byte("x"), 4<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			var free func()
			hook := func(point string) {
				if point != crash.LocalSnapshotFrozen {
					return
				}
				if !isFrozen(t, mnt) {
					t.Errorf("at %s, %s is not frozen", point, mnt)
				}
				if got := freezes(t, dir); len(got) != 1 || got[0].DiskID != d.ID || !slices.Equal(got[0].MountPoints, []string{mnt}) {
					t.Errorf("frozen, the inspector shows the freezes %+v; want one of %s at %s", got, d.ID, mnt)
				}
				if fault == "panic" {
					panic("injected")
				}
				free = testutil.Fill(t, stateFS, "filler")
			}
			faulty := open(t, dir, Options{crash: hook})
			op, err := func() (op cloud.Operation, err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panic: %v", r)
					}
				}()
				return faulty.CreateSnapshot(context.Background(), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
			}()
			switch fault {
			case "panic":
				if err == nil || !strings.Contains(err.Error(), "injected") {
					t.Fatalf("CreateSnapshot = %+v, %v; want the injected panic", op, err)
				}
			default:
				if err != nil {
					t.Fatalf("CreateSnapshot: %v, want an operation that failed", err)
				}
				if _, err := c.WaitOperation(context.Background(), op.ID); !errors.Is(err, cloud.ErrLimitReached) {
					t.Fatalf("the snapshot on a full file system: %v, want ErrLimitReached", err)
				}
				free()
			}
			if isFrozen(t, mnt) {
				t.Fatalf("%s is frozen after the failed snapshot", mnt)
			}
			if got := freezes(t, dir); len(got) != 0 {
				t.Fatalf("freeze records after the failed snapshot: %+v", got)
			}
			writable(t, mnt)
			if page, err := c.ListSnapshots(context.Background(), cloud.SnapshotListOptions{}); err != nil || len(page.Snapshots) != 0 {
				t.Fatalf("the failed snapshot left %+v, %v", page, err)
			}
			// The disk can be snapshotted now.
			snap := takeSnapshot(t, c, "snap-1", d.ID)
			in, err := OpenInspector(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := in.Snapshots(context.Background()); err != nil || len(got) != 1 || got[0].ID != snap.ID {
				t.Fatalf("the inspector shows the snapshots %+v, %v; want %s", got, err, snap.ID)
			}
		})
	}
}

func freezes(t *testing.T, dir string) []Freeze {
	t.Helper()
	in, err := OpenInspector(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := in.Freezes()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A disk without an image (never attached: its first attach makes it)
// holds zeros: its snapshot and its clones are all holes, of its size.
func TestSnapshotOfADiskWithoutAnImage(t *testing.T) {
	c := open(t, newDir(t), Options{})
	d := create(t, c, "pvc-1", 64*mib)
	if err := os.Remove(c.s.imagePath(diskID(d.ID))); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, c, "snap-1", d.ID)
	if snap.SizeBytes != 64*mib || snap.StoredBytes != 0 {
		t.Fatalf("snapshot of a disk without an image: %+v", snap)
	}
	for _, src := range []cloud.DiskSource{{SnapshotID: snap.ID}, {DiskID: d.ID}} {
		clone := createFrom(t, c, "from-"+sourceKind(src), 128*mib, src)
		fi, err := os.Stat(c.s.imagePath(diskID(clone.ID)))
		if err != nil || fi.Size() != 128*mib || len(dataMap(t, c.s.imagePath(diskID(clone.ID)))) != 0 {
			t.Fatalf("disk made from %+v: image %v, %v; want 128 MiB of holes", src, fi, err)
		}
	}
	// Its record without an image is a disk of zeros since issue 16; it
	// goes here, so that the invariants hold before that too.
	if _, err := c.DeleteDisk(context.Background(), d.ID); err != nil {
		t.Fatal(err)
	}
}

func sourceKind(src cloud.DiskSource) string {
	if src.SnapshotID != "" {
		return "snapshot"
	}
	return "disk"
}

// A disk in use through its loop device with no filesystem mounted where
// csid sees it (here: a raw device) is copied by a reflink, or not at all.
func TestSnapshotOfADiskInUseNeedsReflinks(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run("state-on-"+fsType, func(t *testing.T) {
			dir := stateIn(t, testutil.MountFS(t, fsType, 300*mib))
			c := open(t, dir, Options{})
			d := create(t, c, "pvc-1", 16*mib)
			writeImage(t, c, d.ID, 0, []byte("raw"))
			if err := c.RegisterNode(context.Background(), cloud.Node{ID: "node-a"}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.AttachDisk(context.Background(), d.ID, "node-a"); err != nil {
				t.Fatal(err)
			}
			if _, err := devicePath(context.Background(), c.Host("node-a"), d.ID); err != nil {
				t.Fatal(err)
			}
			snap, err := c.CreateSnapshot(context.Background(), cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
			clone, cerr := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "clone-1", SizeBytes: 16 * mib, Source: &cloud.DiskSource{DiskID: d.ID}})
			if !c.reflink {
				if !errors.Is(err, cloud.ErrNotSupported) || !errors.Is(cerr, cloud.ErrNotSupported) {
					t.Fatalf("snapshot and clone of a raw device in use without reflinks: %v, %v; want ErrNotSupported", err, cerr)
				}
				if page, _ := c.ListSnapshots(context.Background(), cloud.SnapshotListOptions{}); len(page.Snapshots) != 0 {
					t.Fatalf("the refused snapshot left %+v", page.Snapshots)
				}
				if disks := listed(t, c); len(disks) != 1 {
					t.Fatalf("the refused clone left %+v", disks)
				}
				return
			}
			if err != nil || cerr != nil {
				t.Fatalf("snapshot and clone of a raw device in use with reflinks: %v, %v", err, cerr)
			}
			if got := readSnapImage(t, c, snap.SnapshotID, 0, 3); string(got) != "raw" {
				t.Fatalf("the snapshot holds %q", got)
			}
			if got := readImage(t, c, clone.DiskID, 0, 3); string(got) != "raw" {
				t.Fatalf("the clone holds %q", got)
			}
		})
	}
}

func readSnapImage(t *testing.T, c *Cloud, id string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(c.s.snapImagePath(snapID(id)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// The crash points of snapshots and clones, for TestCrashPoints: a kill at
// each leaves nothing a repeated call does not complete or Open remove;
// a kill while the source's filesystem is frozen leaves it frozen until
// the state directory is opened again, and no longer.
func init() {
	crashCases = append(crashCases,
		crashCase{point: crash.LocalSnapshotCopying, setup: diskWithData, call: snapshotCrashDisk, check: oneSnapshot},
		crashCase{point: crash.LocalSnapshotImage, setup: diskWithData, call: snapshotCrashDisk, check: oneSnapshot},
		crashCase{point: crash.LocalSnapshotNamed, setup: diskWithData, call: snapshotCrashDisk, check: oneSnapshot},
		crashCase{point: crash.LocalSnapshotRecorded, setup: diskWithData, call: snapshotCrashDisk, check: oneSnapshot},
		crashCase{point: crash.LocalSnapshotDeleted, setup: diskAndSnapshot, call: deleteCrashSnapshot, check: noSnapshots},
		crashCase{point: crash.LocalCloneCopying, setup: diskWithData, call: cloneCrashDisk, check: oneClone},
		crashCase{point: crash.LocalCloneImage, setup: diskWithData, call: cloneCrashDisk, check: oneClone},
		crashCase{point: crash.LocalSnapshotFrozen, setup: mountedCrashDisk, call: snapshotCrashDisk, check: thawedAnd(oneSnapshot), afterKill: stillFrozen},
		crashCase{point: crash.LocalCloneFrozen, setup: mountedCrashDisk, call: cloneCrashDisk, check: thawedAnd(oneClone), afterKill: stillFrozen},
	)
}

// crashData is what the crash cases' disk holds.
var crashData = []byte("the disk's content before the crash")

func diskWithData(t *testing.T, c *Cloud) string {
	id := detachedDisk(t, c)
	writeImage(t, c, id, mib, crashData)
	return id
}

// diskAndSnapshot returns "<disk>/<snapshot>".
func diskAndSnapshot(t *testing.T, c *Cloud) string {
	id := diskWithData(t, c)
	return id + "/" + takeSnapshot(t, c, "snap-crash", id).ID
}

// crashMounts are the mount points of the crash cases' disks, by disk:
// the setup runs in the parent, which checks them after the kill.
var crashMounts sync.Map

func crashMount(disk string) string {
	mnt, _ := crashMounts.Load(disk)
	s, _ := mnt.(string)
	return s
}

func mountedCrashDisk(t *testing.T, c *Cloud) string {
	id := detachedDisk(t, c)
	mnt, _ := mountDisk(t, c, cloud.Disk{ID: id}, "ext4")
	if err := os.WriteFile(filepath.Join(mnt, "data"), crashData, 0o600); err != nil {
		t.Fatal(err)
	}
	crashMounts.Store(id, mnt)
	return id
}

func snapshotCrashDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-crash", SourceDiskID: disk})
}

func deleteCrashSnapshot(ctx context.Context, c *Cloud, both string) (cloud.Operation, error) {
	_, snap, _ := strings.Cut(both, "/")
	return c.DeleteSnapshot(ctx, snap)
}

func cloneCrashDisk(ctx context.Context, c *Cloud, disk string) (cloud.Operation, error) {
	return c.CreateDisk(ctx, cloud.DiskSpec{Name: "clone-crash", SizeBytes: 128 * mib, Source: &cloud.DiskSource{DiskID: disk}})
}

func oneSnapshot(t *testing.T, c *Cloud, disk string) {
	page, err := c.ListSnapshots(context.Background(), cloud.SnapshotListOptions{})
	if err != nil || len(page.Snapshots) != 1 {
		t.Fatalf("after the crash and the retry: %+v, %v; want one snapshot", page, err)
	}
	snap := page.Snapshots[0]
	if snap.Name != "snap-crash" || snap.SourceDiskID != disk || snap.SizeBytes != 64*mib || !snap.Ready {
		t.Fatalf("after the crash and the retry: %+v", snap)
	}
	if crashMount(disk) == "" {
		if got := readSnapImage(t, c, snap.ID, mib, len(crashData)); !bytes.Equal(got, crashData) {
			t.Fatalf("the snapshot holds %q, want %q", got, crashData)
		}
	}
}

func noSnapshots(t *testing.T, c *Cloud, both string) {
	disk, snap, _ := strings.Cut(both, "/")
	if _, err := c.GetSnapshot(context.Background(), snap); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("after the crash and the retry: GetSnapshot = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(c.s.snapImagePath(snapID(snap))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image of the deleted snapshot: %v", err)
	}
	if got := readImage(t, c, disk, mib, len(crashData)); !bytes.Equal(got, crashData) {
		t.Fatalf("the disk holds %q after its snapshot's deletion", got)
	}
}

func oneClone(t *testing.T, c *Cloud, disk string) {
	disks := listed(t, c)
	var clones []cloud.Disk
	for _, d := range disks {
		if d.Name == "clone-crash" {
			clones = append(clones, d)
		}
	}
	if len(disks) != 2 || len(clones) != 1 || clones[0].SizeBytes != 128*mib || clones[0].Source == nil || clones[0].Source.DiskID != disk {
		t.Fatalf("after the crash and the retry: %+v; want the disk and one clone of it", disks)
	}
	if crashMount(disk) == "" {
		if got := readImage(t, c, clones[0].ID, mib, len(crashData)); !bytes.Equal(got, crashData) {
			t.Fatalf("the clone holds %q, want %q", got, crashData)
		}
	}
}

// stillFrozen: the kill left the filesystem frozen (what the next Open
// must undo).
func stillFrozen(t *testing.T, disk string) {
	if !isFrozen(t, crashMount(disk)) {
		t.Fatalf("killed while frozen, but %s is not frozen: the test proves nothing", crashMount(disk))
	}
}

// thawedAnd checks that the filesystem the killed copy froze takes writes
// again, then check.
func thawedAnd(check func(t *testing.T, c *Cloud, disk string)) func(t *testing.T, c *Cloud, disk string) {
	return func(t *testing.T, c *Cloud, disk string) {
		if isFrozen(t, crashMount(disk)) {
			t.Fatalf("%s is still frozen", crashMount(disk))
		}
		writable(t, crashMount(disk))
		check(t, c, disk)
	}
}
