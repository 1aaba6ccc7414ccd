package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// floorDB is the bare bbolt file of the floor: what one durable commit
// costs on the file system, with nothing of csid around it.
type floorDB struct {
	db   *bolt.DB
	path string
	seq  uint64
}

var floorBucket = []byte("floor")

// openFloor makes the floor's bbolt file in the run's scratch directory.
func openFloor(scratch string) (*floorDB, error) {
	path := filepath.Join(scratch, scratchDB)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		return nil, fmt.Errorf("floor file: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(floorBucket); return err }); err != nil {
		db.Close()
		os.Remove(path)
		return nil, fmt.Errorf("floor file: %w", err)
	}
	return &floorDB{db: db, path: path}, nil
}

// commit is one bare bbolt Update putting one key (default options: it
// fsyncs), as BenchmarkBoltUpdateFloor in internal/ops.
func (f *floorDB) commit() error {
	f.seq++
	key := binary.BigEndian.AppendUint64(nil, f.seq)
	return f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(floorBucket).Put(key, key) })
}

func (f *floorDB) close() {
	f.db.Close()
	os.Remove(f.path)
}

// floor measures, at concurrency 1 and interleaved sample by sample so the
// machine's drifting load hits both alike, the round trip of Probe on the
// endpoint and a bare bbolt commit.
func (r *runner) floor(ctx context.Context, round int, db *floorDB) Result {
	res := Result{Phase: string(PhaseFloor), Round: round, Concurrency: 1, Unit: "Probe+bbolt.Update", Count: r.cfg.FloorSamples}
	return r.floorSamples(ctx, res, fmt.Sprintf("round %d floor", round), func(s *samples) error {
		err := r.call(ctx, s, "Probe", func(ctx context.Context) error {
			_, err := r.eps[0].csi.Probe(ctx, &csi.ProbeRequest{})
			return err
		})
		t := time.Now()
		berr := db.commit()
		s.add("bbolt.Update", time.Since(t), berr != nil)
		return errors.Join(err, berr)
	})
}

// floorSamples takes res.Count samples of a floor, one after the other,
// until ctx ends, and returns res with their figures: sample records its
// times in s and returns its error. A failed sample is counted and its
// error noted; one cut short by ctx ending is neither.
func (r *runner) floorSamples(ctx context.Context, res Result, label string, sample func(s *samples) error) Result {
	s := newSamples()
	r.prog.begin(label, res.Count)
	start := time.Now()
	var t tally
	for t.done < res.Count && ctx.Err() == nil {
		if !t.count(ctx, r, label, sample(s)) {
			break // interrupted
		}
		r.prog.step()
	}
	t.elapsed = time.Since(start)
	r.prog.end()
	return t.result(res, s)
}

// fsType names the file system of dir (for the report: a floor on tmpfs
// says nothing about a state file on disk).
func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return ""
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4" // also ext2 and ext3: one magic
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}
