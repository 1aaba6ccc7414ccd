package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
)

// Benchmarks of the record path (encode, checksum, decode, decode cache),
// without fsync so that the CPU cost shows: go test -run '^$' -bench .
// -count 6 ./internal/store

// benchStore opens a store (no fsync) holding n volumes, each with one
// finished op.
func benchStore(b *testing.B, n int) *Store {
	b.Helper()
	s, err := Open(filepath.Join(b.TempDir(), "csid.db"), Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	now := time.Now()
	for lo := 0; lo < n; lo += 1000 {
		err := s.Update(func(tx *Tx) error {
			for i := lo; i < min(lo+1000, n); i++ {
				v := &Volume{ID: fmt.Sprintf("vol-%06d", i), Name: fmt.Sprintf("pvc-%06d", i), DiskID: "disk-0123456789abcdef",
					CapacityBytes: 1 << 30, State: fsm.Absent, Parameters: map[string]string{"type": "ssd"},
					Capability: Capability{AccessType: "mount", FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER"}, CreatedAt: now, UpdatedAt: now}
				if err := tx.Accept(v, &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created, CreatedAt: now}); err != nil {
					return err
				}
				op, err := tx.Op(v.ActiveOp)
				if err != nil {
					return err
				}
				op.Status, op.FinishedAt = OpSucceeded, now
				v.State, v.Generation = fsm.Created, 1
				if err := tx.Finish(v, op); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkVolumeRead reads one volume record: from the decode cache (the
// hot path: a volume with ops in flight), in a file of 1,000 volumes (so
// that its buckets have pages of their own, as in a driver's), and by a
// scan of 10,000 records that decodes each (ns/op is per record).
func BenchmarkVolumeRead(b *testing.B) {
	b.Run("cached", func(b *testing.B) {
		s := benchStore(b, 1000)
		b.ResetTimer()
		for b.Loop() {
			if err := s.View(func(tx *Tx) error { _, err := tx.Volume("vol-000500"); return err }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		s := benchStore(b, 10000)
		b.ResetTimer()
		n := 0
		for b.Loop() {
			if err := s.View(func(tx *Tx) error {
				return tx.ForEachVolume("", func(*Volume) bool { n++; return true })
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
	})
}

// BenchmarkTransition is one transition as the engine commits it, without
// fsync: accept an op (op record, active index) in one commit, then finish
// it (op, volume, active index) in the next; publish and unpublish in turn.
func BenchmarkTransition(b *testing.B) {
	s := benchStore(b, 1)
	now := time.Now()
	steps := []*Op{
		{Event: fsm.ControllerPublish, From: fsm.Created, To: fsm.NodeReady, Args: []byte(`{"node":"node-1"}`)},
		{Event: fsm.ControllerUnpublish, From: fsm.NodeReady, To: fsm.Created, Args: []byte(`{"node":"node-1"}`)},
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		var seq uint64
		step := steps[i%2]
		i++
		err := s.Update(func(tx *Tx) error {
			v, err := tx.Volume("vol-000000")
			if err != nil {
				return err
			}
			op := *step
			op.CreatedAt = now
			if err := tx.Accept(v, &op); err != nil {
				return err
			}
			seq = op.Seq
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		err = s.Update(func(tx *Tx) error {
			v, err := tx.Volume("vol-000000")
			if err != nil {
				return err
			}
			op, err := tx.Op(seq)
			if err != nil {
				return err
			}
			op.Status, op.FinishedAt = OpSucceeded, now
			v.State = op.To
			v.Generation++
			v.UpdatedAt = now
			return tx.Finish(v, op)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
