package local

import (
	"bytes"
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

// The point in time of a snapshot (issue 17, point 3): a writer appends
// numbered records to a file on a filesystem on a disk, mounted on this
// machine; a snapshot is taken while it writes; the disk restored from the
// snapshot holds a filesystem that fsck accepts as it is (e2fsck -f -n,
// xfs_repair -n), and, mounted, a file that is a prefix of the writes:
// every record whole and in order, at least those written before the
// snapshot began, at most those written when it returned. Each filesystem
// is tested with the state directory on the machine's file system (a
// sparse copy, here ext4) and on xfs (a reflink).
func TestSnapshotIsPointInTime(t *testing.T) {
	testutil.RequireRoot(t)
	for _, state := range []string{"ext4", "xfs"} {
		for _, fsType := range []string{"ext4", "xfs"} {
			t.Run("state-on-"+state+"/"+fsType, func(t *testing.T) {
				base := t.TempDir()
				if state == "xfs" {
					base = testutil.MountFS(t, "xfs", 2<<30)
				} else if fsTypeOf(t, base) != "ext4" {
					t.Skipf("%s is not on ext4", base)
				}
				dir := stateIn(t, base)
				c := open(t, dir, Options{})
				if c.reflink != (state == "xfs") {
					t.Fatalf("reflink = %v on %s", c.reflink, state)
				}
				pointInTime(t, c, fsType)
			})
		}
	}
}

func fsTypeOf(t *testing.T, dir string) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	}
	return fmt.Sprintf("%#x", st.Type)
}

func pointInTime(t *testing.T, c *Cloud, fsType string) {
	ctx := context.Background()
	size := map[string]int64{"ext4": 64 * mib, "xfs": 320 * mib}[fsType]
	d := create(t, c, "pvc-1", size)
	mnt, _ := mountDisk(t, c, d, fsType)
	w := startWriter(t, filepath.Join(mnt, "log"))
	w.waitFor(t, 500)
	before := w.written()
	op, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-1", SourceDiskID: d.ID})
	after := w.written()
	if isFrozen(t, mnt) {
		thawDir(t, mnt)
		t.Fatalf("%s is frozen after the snapshot", mnt)
	}
	w.waitFor(t, after+500) // the writer goes on after it
	w.stop(t)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("records written before the snapshot: %d, when it returned: %d, in all: %d", before, after, w.written())

	restored := createFrom(t, c, "restored", size, cloud.DiskSource{SnapshotID: op.SnapshotID})
	if _, err := c.AttachDisk(ctx, restored.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	dev, err := devicePath(ctx, c.Host("node-a"), restored.ID)
	if err != nil {
		t.Fatal(err)
	}
	into := filepath.Join(t.TempDir(), "restored")
	run(t, "mkdir", into)
	// nouuid: the source, of the same UUID, is mounted.
	opts := map[string]string{"ext4": "ro", "xfs": "ro,nouuid"}[fsType]
	fsck := map[string][]string{"ext4": {"e2fsck", "-f", "-n", dev}, "xfs": {"xfs_repair", "-n", dev}}[fsType]
	if fsType == "xfs" {
		// A frozen xfs dirties its log last, by design, so that the log
		// recovery of a copy recomputes its lazy superblock counters;
		// xfs_repair refuses to look at a filesystem whose log is
		// dirty. The first mount of the restored volume (NodeStage's)
		// replays it: so here.
		run(t, "mount", "-t", fsType, "-o", "nouuid", dev, into)
		if err := unix.Unmount(into, 0); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(fsck[0], fsck[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v on the restored disk: %v\n%s", fsck, err, out)
	}
	run(t, "mount", "-t", fsType, "-o", opts, dev, into)
	defer func() {
		if err := unix.Unmount(into, 0); err != nil {
			t.Errorf("unmount %s: %v", into, err)
		}
	}()
	log, err := os.ReadFile(filepath.Join(into, "log"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := checkPrefix(log)
	if err != nil {
		t.Fatalf("the restored log: %v", err)
	}
	t.Logf("the restored log holds %d records", n)
	if n < before || n > after {
		t.Fatalf("the restored log holds %d records; %d were written before the snapshot began, %d when it returned", n, before, after)
	}
}

// Records are recordSize bytes, each written by one write(2).
const recordSize = 64

func record(i int) []byte {
	r := fmt.Appendf(nil, "record %09d ", i)
	r = append(r, bytes.Repeat([]byte{'a' + byte(i%26)}, recordSize-len(r)-1)...)
	return append(r, '\n')
}

// checkPrefix checks that log is records 0, 1, ... whole and in order, and
// returns how many.
func checkPrefix(log []byte) (int, error) {
	if len(log)%recordSize != 0 {
		return 0, fmt.Errorf("%d bytes: a record is cut short", len(log))
	}
	n := len(log) / recordSize
	for i := range n {
		if got := log[i*recordSize : (i+1)*recordSize]; !bytes.Equal(got, record(i)) {
			return 0, fmt.Errorf("record %d is %q, want %q", i, got, record(i))
		}
	}
	return n, nil
}

// writer appends records to a file until stopped.
type writer struct {
	mu    sync.Mutex
	cond  *sync.Cond
	n     int
	err   error
	quit  bool
	ended chan struct{}
}

func startWriter(t *testing.T, path string) *writer {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{ended: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		defer close(w.ended)
		defer f.Close()
		for i := 0; ; i++ {
			_, err := f.Write(record(i))
			w.mu.Lock()
			if err == nil {
				w.n++
			}
			w.err = err
			stop := w.quit || err != nil
			w.cond.Broadcast()
			w.mu.Unlock()
			if stop {
				return
			}
		}
	}()
	return w
}

// waitFor waits until n records are written.
func (w *writer) waitFor(t *testing.T, n int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.n < n && w.err == nil {
		w.cond.Wait()
	}
	if w.err != nil {
		t.Fatalf("the writer: %v", w.err)
	}
}

func (w *writer) written() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *writer) stop(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	w.quit = true
	w.mu.Unlock()
	<-w.ended
	if w.err != nil && !errors.Is(w.err, os.ErrClosed) {
		t.Fatalf("the writer: %v", w.err)
	}
}
