package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/loopdev"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// open opens a local cloud on dir for the rest of the test. The first call
// for a directory also makes sure that no loop device bound to its images
// outlives the test, whatever happens.
func open(t *testing.T, dir string, opts Options) *Cloud {
	t.Helper()
	c, err := Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newDir returns a fresh state directory whose loop devices are released
// and whose invariants are checked when the test ends.
func newDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	t.Cleanup(func() {
		releaseAll(t, dir)
		if !t.Failed() {
			checkInvariants(t, dir)
		}
	})
	return dir
}

// releaseAll releases every loop device bound to an image under dir.
func releaseAll(t *testing.T, dir string) {
	devs, err := loopdev.List()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	disks := filepath.Join(dir, disksDir)
	if real, err := filepath.EvalSymlinks(disks); err == nil {
		disks = real
	}
	for _, d := range devs {
		if filepath.Dir(d.BackingFile) != disks {
			continue
		}
		fid, err := loopdev.Backing(d.Path)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			continue
		}
		if err := loopdev.Release(context.Background(), d.Path, fid); err != nil {
			t.Errorf("cleanup: leaked %s: %v", d.Path, err)
		}
	}
}

// checkInvariants holds a state directory to what a crash or a bug must
// never break: every attached disk has its image; an image is at least as
// large as its disk;
// outside of a lock no image lacks a record and no temporary file lingers
// (Open removes them, so this check opens the directory first); every
// attachment names a registered node within its limit; every operation
// record is readable.
func checkInvariants(t *testing.T, dir string) {
	t.Helper()
	c, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Errorf("invariants: open: %v", err)
		return
	}
	defer c.Close()
	s := c.s
	checkJournals(t, s)
	entries, err := os.ReadDir(s.disks)
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	records, images := map[string]bool{}, map[string]int64{}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, tmpPrefix):
			t.Errorf("invariants: temporary file %s survived Open", name)
		case strings.HasSuffix(name, recSuffix):
			records[strings.TrimSuffix(name, recSuffix)] = true
		case strings.HasSuffix(name, imageSuffix):
			fi, err := e.Info()
			if err != nil {
				t.Errorf("invariants: %v", err)
				continue
			}
			images[strings.TrimSuffix(name, imageSuffix)] = fi.Size()
		default:
			t.Errorf("invariants: stray file %s", name)
		}
	}
	nodes, err := s.readNodes()
	if err != nil {
		t.Errorf("invariants: nodes: %v", err)
	}
	attached := map[string]int{}
	for id := range records {
		did, ok := parseDiskID(id)
		if !ok {
			t.Errorf("invariants: record with a malformed id %q", id)
			continue
		}
		d, err := s.readDisk(did)
		if err != nil {
			t.Errorf("invariants: %v", err)
			continue
		}
		size, ok := images[id]
		if !ok && d.AttachedTo != "" {
			t.Errorf("invariants: disk %s is attached and has no image", id)
		} else if ok && size < d.SizeBytes {
			t.Errorf("invariants: disk %s image has %d bytes, record %d", id, size, d.SizeBytes)
		}
		if d.AttachedTo != "" {
			if _, ok := nodes[d.AttachedTo]; !ok {
				t.Errorf("invariants: disk %s attached to unregistered node %q", id, d.AttachedTo)
			}
			attached[d.AttachedTo]++
		}
	}
	for id := range images {
		if !records[id] {
			t.Errorf("invariants: image %s has no record and survived Open", id)
		}
	}
	checkIndexes(t, s, records)
	checkSnapshots(t, s)
	for node, n := range attached {
		if max := nodes[node].MaxAttachments; max > 0 && n > max {
			t.Errorf("invariants: node %s holds %d disks, limit %d", node, n, max)
		}
	}
	ops, err := os.ReadDir(s.ops)
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	for _, e := range ops {
		name, ok := strings.CutSuffix(e.Name(), logSuffix)
		if _, idOK := parseOpID(name); !ok || !idOK {
			t.Errorf("invariants: stray file ops/%s", e.Name())
			continue
		}
		raw, err := os.ReadFile(filepath.Join(s.ops, e.Name()))
		if err != nil {
			t.Errorf("invariants: %v", err)
			continue
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
			if strings.Contains(line, "\x00") {
				// After a crash of the machine: the log's new size
				// reached the device and not its new lines (not
				// fsynced: forgotten operations).
				continue
			}
			var rec opRecord
			if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Version != recordVersion {
				t.Errorf("invariants: ops/%s line %d: %v", e.Name(), i+1, err)
			} else if _, err := s.readOp(opID(rec.Op.ID)); err != nil {
				t.Errorf("invariants: operation %s: %v", rec.Op.ID, err)
			}
		}
	}
}

// checkJournals: after Open, every journal left is a live process's (it
// holds the journal's lock): Open replayed or settled the others.
func checkJournals(t *testing.T, s *state) {
	t.Helper()
	files, err := s.journals()
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	for _, f := range files {
		fd, err := unix.Open(f.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // checkpointed meanwhile
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			t.Errorf("invariants: journal %s of a gone process survived Open", f.path)
		}
		unix.Close(fd)
	}
}

func TestContract(t *testing.T) {
	cloudtest.Run(t, func(t *testing.T) cloudtest.Provider {
		dir := newDir(t)
		c := open(t, dir, Options{})
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

// writeImage writes data at off of a detached disk's image, as a node
// writes through its loop device; a disk without an image yet gets one of
// its size, as its first attach would make it.
func writeImage(t *testing.T, c *Cloud, id string, off int64, data []byte) {
	t.Helper()
	f := openImage(t, c, id)
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

// openImage opens a disk's image for writing, making it (of the disk's
// size) if the disk has none yet.
func openImage(t testing.TB, c *Cloud, id string) *os.File {
	t.Helper()
	d, err := c.GetDisk(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(c.s.imagePath(diskID(id)), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() < d.SizeBytes {
		if err == nil {
			err = f.Truncate(d.SizeBytes)
		}
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
	}
	return f
}

// readImage reads n bytes at off of a disk's image (zeros past its end, or
// without an image).
func readImage(t *testing.T, c *Cloud, id string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(c.s.imagePath(diskID(id)))
	if errors.Is(err, os.ErrNotExist) {
		return make([]byte, n)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b
}

// Every way an id can point outside the disks directory is refused before
// any path is built: each bad id has a planted record where a path join
// would find it, and none is read, changed or removed.
func TestMalformedIDsNeverReachAPath(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	ctx := context.Background()
	if err := c.RegisterNode(ctx, cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	bad := []string{
		"",
		".",
		"..",
		"../trap",
		"../../trap",
		"sub/trap",
		"/abs/trap",
		"disk-0123456789abcdef/../../trap",
		"./disk-0123456789abcdef",
		"disk-0123456789ABCDEF",            // upper case
		"disk-0123456789abcde",             // short
		"disk-0123456789abcdef0",           // long
		"disk-0123456789abcdef\x00",        // NUL
		"disk-" + strings.Repeat("0", 124), // 129 bytes
		strings.Repeat("a", 129),
	}
	planted := map[string][]byte{}
	for _, id := range bad {
		if id == "" || strings.ContainsRune(id, 0) {
			continue
		}
		for _, path := range []string{
			filepath.Join(c.s.disks, id+recSuffix),
			filepath.Join(c.s.ops, id+recSuffix),
		} {
			if !strings.HasPrefix(path, filepath.Dir(dir)) || len(filepath.Base(path)) > 255 {
				continue // outside the test's directory: nothing to plant
			}
			raw := fmt.Appendf(nil, `{"version":1,"disk":{"id":%q,"name":"trap","sizeBytes":1048576},"op":{"id":%q}}`, id, id)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			planted[path] = raw
		}
	}
	if len(planted) < 10 {
		t.Fatalf("planted only %d traps", len(planted))
	}
	for _, id := range bad {
		if _, err := c.GetDisk(ctx, id); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("GetDisk(%q): %v, want ErrNotFound", id, err)
		}
		if _, err := c.WaitOperation(ctx, id); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("WaitOperation(%q): %v, want ErrNotFound", id, err)
		}
		if _, err := devicePath(ctx, c.Host("node-a"), id); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("OpenDevice(%q): %v, want ErrNotFound", id, err)
		}
		for name, call := range map[string]func() (cloud.Operation, error){
			"DeleteDisk": func() (cloud.Operation, error) { return c.DeleteDisk(ctx, id) },
			"AttachDisk": func() (cloud.Operation, error) { return c.AttachDisk(ctx, id, "node-a") },
			"DetachDisk": func() (cloud.Operation, error) { return c.DetachDisk(ctx, id, "node-a") },
			"ResizeDisk": func() (cloud.Operation, error) { return c.ResizeDisk(ctx, id, gib) },
		} {
			if _, err := call(); !errors.Is(err, cloud.ErrInvalid) {
				t.Errorf("%s(%q): %v, want ErrInvalid", name, id, err)
			}
		}
		if _, err := c.ListDisks(ctx, cloud.ListOptions{PageToken: id}); id != "" && !errors.Is(err, cloud.ErrInvalid) {
			t.Errorf("ListDisks(token %q): %v, want ErrInvalid", id, err)
		}
	}
	for path, raw := range planted {
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(raw) {
			t.Errorf("trap %s was touched: %q, %v", path, got, err)
		}
		// Leave the state directory clean for the invariants.
		os.Remove(path)
		for d := filepath.Dir(path); strings.HasPrefix(d, c.s.disks+"/") || strings.HasPrefix(d, c.s.ops+"/"); d = filepath.Dir(d) {
			os.Remove(d)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", "../x", "node\n", strings.Repeat("n", 129)} {
		if err := c.RegisterNode(ctx, cloud.Node{ID: id}); !errors.Is(err, cloud.ErrInvalid) {
			t.Errorf("RegisterNode(%q): %v, want ErrInvalid", id, err)
		}
	}
}

func TestIDsAreWellFormedAndSortByTime(t *testing.T) {
	for range 100 {
		if id := newDiskID(); !diskIDPattern.MatchString(string(id)) {
			t.Fatalf("newDiskID() = %q", id)
		}
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	a, b := newOpID(t0), newOpID(t0.Add(time.Nanosecond))
	if !opIDPattern.MatchString(string(a)) || !(a < b) {
		t.Fatalf("op ids %q, %q: want well-formed and ordered by time", a, b)
	}
	if got := opTime(a); !got.Equal(t0) {
		t.Fatalf("opTime = %v, want %v", got, t0)
	}
}

// The controller and the node process each open the state directory; the
// flock, not a mutex, keeps them from racing. Two clients of one directory
// stand in for the two processes here (flock locks are per open file).
func TestTwoClientsCreateOneDisk(t *testing.T) {
	dir := newDir(t)
	a, b := open(t, dir, Options{}), open(t, dir, Options{})
	var wg sync.WaitGroup
	ids := make([]string, 16)
	errs := make([]error, 16)
	for i := range ids {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib})
			if err == nil {
				var d cloud.Disk
				d, err = c.WaitOperation(context.Background(), op.ID)
				ids[i] = d.ID
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("create %d: %q, %v; want %q", i, ids[i], errs[i], ids[0])
		}
	}
	page, err := a.ListDisks(context.Background(), cloud.ListOptions{})
	if err != nil || len(page.Disks) != 1 {
		t.Fatalf("ListDisks = %+v, %v; want one disk", page, err)
	}
}

func TestLockHonoursContext(t *testing.T) {
	dir := newDir(t)
	a, b := open(t, dir, Options{}), open(t, dir, Options{})
	unlock, err := a.s.lock(context.Background(), nameKey(nameHash("pvc-1")))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.CreateDisk(ctx, cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib}); !errors.Is(err, context.Canceled) {
		t.Fatalf("create while another client holds the lock: %v, want context.Canceled", err)
	}
}

func TestOpenCleansUpAfterACrash(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	d := create(t, c, "pvc-1", gib)
	c.Close()

	// What a crash can leave: a temporary image, a temporary record, a
	// temporary freeze record, a temporary snapshot record, an image whose
	// record was never written.
	orphan := filepath.Join(dir, disksDir, "disk-00000000000000aa"+imageSuffix)
	freeze := filepath.Join(dir, frozenDir, tmpPrefix+"disk-00000000000000cc"+recSuffix+"-0123456789abcdef")
	snap := filepath.Join(dir, snapshotsDir, tmpPrefix+"snap-00000000000000dd"+recSuffix+"-0123456789abcdef")
	for _, path := range []string{
		freeze,
		snap,
		filepath.Join(dir, disksDir, tmpPrefix+"disk-00000000000000bb-123"),
		filepath.Join(dir, disksDir, tmpPrefix+"456"),
		filepath.Join(dir, opsDir, tmpPrefix+"789"),
		filepath.Join(dir, tmpPrefix+"nodes"),
		orphan,
	} {
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c = open(t, dir, Options{})
	for _, path := range []string{orphan, freeze, snap} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s survived Open: %v", path, err)
		}
	}
	page, err := c.ListDisks(context.Background(), cloud.ListOptions{})
	if err != nil || len(page.Disks) != 1 || page.Disks[0].ID != d.ID {
		t.Fatalf("ListDisks = %+v, %v; want only %s", page, err, d.ID)
	}
	if got, err := c.GetDisk(context.Background(), d.ID); err != nil || got.SizeBytes != gib {
		t.Fatalf("the whole disk was damaged by the cleanup: %+v, %v", got, err)
	}
}

func TestOpenRefusesAnotherLayout(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, formatFile), []byte("csid-local 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), dir, Options{}); err == nil || !strings.Contains(err.Error(), "csid-local 9") {
		t.Fatalf("Open of a layout-9 directory: %v, want a refusal naming it", err)
	}
	if _, err := OpenInspector(dir); err == nil || errors.Is(err, ErrNoState) || !strings.Contains(err.Error(), "csid-local 9") {
		t.Fatalf("OpenInspector of a layout-9 directory: %v, want a refusal naming it", err)
	}
	if _, err := OpenInspector(t.TempDir()); !errors.Is(err, ErrNoState) {
		t.Fatalf("OpenInspector of an empty directory: %v, want ErrNoState", err)
	}
}

func TestOperationsArePruned(t *testing.T) {
	dir := newDir(t)
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	// A log a record: pruned record by record, as layout 1 pruned files.
	opts := Options{OpKeep: 3, OpRetention: time.Hour, now: clock, opsPerLog: 1}
	c := open(t, dir, opts)
	var ops []cloud.Operation
	for i := range 5 {
		op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: fmt.Sprintf("pvc-%d", i), SizeBytes: mib})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
		now = now.Add(time.Second)
	}
	// A log's age is its last append (its modification time): as the
	// test's clock had it.
	logs, err := filepath.Glob(filepath.Join(dir, opsDir, "*"+logSuffix))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		at := opTime(opID(strings.TrimSuffix(filepath.Base(l), logSuffix)))
		if err := os.Chtimes(l, at, at); err != nil {
			t.Fatal(err)
		}
	}
	// Young records are kept, however many.
	c = open(t, dir, opts)
	for _, op := range ops {
		if _, err := c.WaitOperation(context.Background(), op.ID); err != nil {
			t.Fatalf("young operation %s: %v", op.ID, err)
		}
	}
	// Old ones go, but never the newest OpKeep.
	now = now.Add(2 * time.Hour)
	c = open(t, dir, opts)
	for i, op := range ops {
		_, err := c.WaitOperation(context.Background(), op.ID)
		if kept := i >= len(ops)-3; kept != (err == nil) {
			t.Errorf("operation %d (%s): %v; kept=%v wanted", i, op.ID, err, kept)
		}
		if err != nil && !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("pruned operation %d: %v, want ErrNotFound", i, err)
		}
	}
}

// A failure while an operation runs is kept with its type: after a
// restart, WaitOperation still says ErrLimitReached, not just a message.
func TestRecordedErrorsKeepTheirType(t *testing.T) {
	for _, want := range []error{cloud.ErrNotFound, cloud.ErrAlreadyExists, cloud.ErrAttached, cloud.ErrLimitReached, cloud.ErrInvalid, cloud.ErrTransient} {
		got := recordErr(fmt.Errorf("it went wrong: %w", want)).replay()
		if !errors.Is(got, want) || got.Error() != "it went wrong: "+want.Error() {
			t.Errorf("replayed %v: %v", want, got)
		}
	}
	if got := recordErr(errors.New("plain")).replay(); got.Error() != "plain" {
		t.Errorf("replayed a plain error: %v", got)
	}
	dir := newDir(t)
	c := open(t, dir, Options{})
	// An operation that failed while running, recorded as CreateDisk
	// records one (running out of space for real needs a full file system).
	unlock, err := c.s.lock(context.Background(), diskKey("disk-00000000000000cc"))
	if err != nil {
		t.Fatal(err)
	}
	op, err := c.record(cloud.OpCreate, diskID("disk-00000000000000cc"), "", c.opts.now(), nil, fmt.Errorf("disk full: %w", cloud.ErrLimitReached))
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	c = open(t, dir, Options{})
	if _, err := c.WaitOperation(context.Background(), op.ID); !errors.Is(err, cloud.ErrLimitReached) {
		t.Fatalf("WaitOperation after a restart: %v, want ErrLimitReached", err)
	}
}

// checkIndexes holds the indexes to the records, after Open: every disk has
// its name entry and, when attached, its attachment entry; no entry is
// stale.
func checkIndexes(t *testing.T, s *state, records map[string]bool) {
	t.Helper()
	names, err := os.ReadDir(s.names)
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	named := map[diskID]bool{}
	for _, e := range names {
		id, ok, err := s.named(e.Name())
		if err != nil || !ok {
			t.Errorf("invariants: name entry %s: %v", e.Name(), err)
			continue
		}
		d, err := s.readDisk(id)
		if err != nil || nameHash(d.Name) != e.Name() {
			t.Errorf("invariants: stale name entry %s -> %s (%+v, %v)", e.Name(), id, d, err)
		}
		named[id] = true
	}
	for id := range records {
		if !named[diskID(id)] {
			t.Errorf("invariants: disk %s has no name entry", id)
		}
		d, err := s.readDisk(diskID(id))
		if err == nil && d.AttachedTo != "" {
			if _, err := os.Lstat(filepath.Join(s.nodeDir(nodeHash(d.AttachedTo)), id)); err != nil {
				t.Errorf("invariants: disk %s attached to %s has no attachment entry: %v", id, d.AttachedTo, err)
			}
		}
	}
	nodes, err := os.ReadDir(s.attached)
	if err != nil {
		t.Errorf("invariants: %v", err)
		return
	}
	for _, n := range nodes {
		ids, err := s.attachments(n.Name())
		if err != nil {
			t.Errorf("invariants: %v", err)
		}
		for _, id := range ids {
			if stale, err := s.notAttachedTo(id, n.Name()); err != nil || stale {
				t.Errorf("invariants: stale attachment entry %s/%s (%v)", n.Name(), id, err)
			}
		}
	}
}

func create(t *testing.T, c *Cloud, name string, size int64) cloud.Disk {
	t.Helper()
	op, err := c.CreateDisk(context.Background(), cloud.DiskSpec{Name: name, SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.WaitOperation(context.Background(), op.ID)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
