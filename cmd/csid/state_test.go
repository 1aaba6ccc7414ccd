package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/store"
	bolt "go.etcd.io/bbolt"
)

// TestStateBackupWhileServingAndRestore: csid state backup, through the
// admin socket of a csid that goes on creating volumes meanwhile, writes a
// copy that is consistent (every record passes its checksum, every volume
// has its ops) and holds at least the volumes made before it began; a
// stopped csid's file is backed up with --db; the copy restored in place
// of the file serves those volumes. An existing file is never overwritten.
func TestStateBackupWhileServingAndRestore(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	opts := app.Options{Cloud: "fake", Fake: f}
	in := apptest.Start(t, opts)
	c := apptest.Dial(t, in.Socket)
	ctx := context.Background()
	create := func(name string) error {
		_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})
		return err
	}
	for i := range 50 {
		if err := create(fmt.Sprintf("before-%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Writes go on while the backup is taken.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var during atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := create(fmt.Sprintf("during-%03d", i)); err != nil {
				t.Error(err)
				return
			}
			during.Add(1)
		}
	}()
	backupFile := filepath.Join(t.TempDir(), "backup.db")
	code, stdout, stderr := cli(t, "state", "backup", "--state-dir", in.Dir, "--to", backupFile)
	close(stop)
	wg.Wait()
	if code != 0 || !strings.Contains(stdout, "the copy reads back") {
		t.Fatalf("csid state backup: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("%s(%d volumes created while csid ran)", stdout, during.Load())
	n := countVolumes(t, backupFile)
	if n < 50 || n > 50+int(during.Load()) {
		t.Fatalf("the copy holds %d volumes; want 50 made before it, and no more than the %d made during it", n, during.Load())
	}
	if code, stdout, stderr = cli(t, "state", "verify", "--db", backupFile); code != 0 || !strings.Contains(stdout, "sound") {
		t.Fatalf("csid state verify of the copy: exit %d\n%s%s", code, stdout, stderr)
	}
	// An existing file is refused, not overwritten.
	if code, _, stderr = cli(t, "state", "backup", "--state-dir", in.Dir, "--to", backupFile); code != 1 || !strings.Contains(stderr, "does not overwrite") {
		t.Fatalf("a backup onto an existing file: exit %d: %s", code, stderr)
	}

	// Restore: stop csid, put the copy in place of the file, start csid.
	in.Stop(t)
	file := app.StateFile(in.Dir, driver.ModeAll)
	stoppedCopy := filepath.Join(t.TempDir(), "stopped.db")
	if code, stdout, stderr = cli(t, "state", "backup", "--db", file, "--to", stoppedCopy); code != 0 {
		t.Fatalf("csid state backup --db: exit %d\n%s%s", code, stdout, stderr)
	}
	if got := countVolumes(t, stoppedCopy); got != 50+int(during.Load()) {
		t.Fatalf("the copy of the stopped csid's file holds %d volumes, want %d", got, 50+during.Load())
	}
	if err := os.Rename(file, file+".old"); err != nil {
		t.Fatal(err)
	}
	copyFile(t, backupFile, file)
	opts.StateDir = in.Dir
	in = apptest.Start(t, opts)
	c = apptest.Dial(t, in.Socket)
	listed := apptest.R(c.ListVolumes(ctx, &csi.ListVolumesRequest{})).Must(t).Entries
	if len(listed) < n {
		t.Fatalf("csid restored from the copy lists %d volumes, want the copy's %d", len(listed), n)
	}
	if err := create("after-restore"); err != nil {
		t.Fatal(err)
	}
}

// countVolumes counts the created volumes of a state file (those whose
// create has finished), checking that every volume's op is there.
func countVolumes(t *testing.T, path string) int {
	t.Helper()
	st, err := store.OpenReadOnly(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := 0
	err = st.View(func(tx *store.Tx) error {
		err := tx.ForEachVolume("", func(v *store.Volume) bool {
			seq := v.LastOp
			if v.ActiveOp != 0 {
				seq = v.ActiveOp // a create the copy caught in flight
			}
			if op, err := tx.Op(seq); err != nil || op == nil {
				t.Errorf("volume %s in the copy: its op %d: %v", v.ID, seq, err)
			}
			if v.ActiveOp == 0 {
				n++
			}
			return true
		})
		if len(tx.Skipped()) > 0 {
			t.Errorf("damaged records in the copy: %v", tx.Skipped())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStateVerifyListsDamagedRecords: csid state verify --db lists a record
// whose bit was flipped, with its volume, and exits 1; a file cut short is
// refused with the reason.
func TestStateVerifyListsDamagedRecords(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	in := apptest.Start(t, app.Options{Cloud: "fake", Fake: f})
	c := apptest.Dial(t, in.Socket)
	id := apptest.R(c.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-a", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})).Must(t).Volume.VolumeId
	in.Stop(t)
	file := app.StateFile(in.Dir, driver.ModeAll)
	db, err := bolt.Open(file, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("volumes"))
		v := append([]byte(nil), b.Get([]byte(id))...)
		v[10] ^= 1
		return b.Put([]byte(id), v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := cli(t, "state", "verify", "--db", file)
	if code != 1 || !strings.Contains(stdout, "volumes/"+id) || !strings.Contains(stdout, "fails its checksum") {
		t.Fatalf("csid state verify of a flipped record: exit %d\n%s%s", code, stdout, stderr)
	}
	raw, _ := os.ReadFile(file)
	if err := os.WriteFile(file, raw[:8192], 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = cli(t, "state", "verify", "--db", file)
	if code != 1 || !strings.Contains(stderr, "it was truncated") {
		t.Fatalf("csid state verify of a file cut short: exit %d\n%s", code, stderr)
	}
}
