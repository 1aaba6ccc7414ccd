package ops

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// Benchmarks of Submit -> outcome with a no-op executor, against the floor
// of the same machine in the same run: a bare bbolt one-key Update loop.
// Each op is durable (two fsynced commits: accept, then outcome), exactly as
// in a driver. Run: go test -run '^$' -bench . -count 6 ./internal/ops

type noopExec struct{}

func (noopExec) Execute(context.Context, *Exec) (Result, error) { return Result{}, nil }
func (noopExec) Compensate(context.Context, *Exec) error        { return nil }

// BenchmarkBoltUpdateFloor is the physical floor: one bbolt Update putting
// one key, default options, on the same file system.
func BenchmarkBoltUpdateFloor(b *testing.B) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "floor.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err })
	key := make([]byte, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint64(key, uint64(i))
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put(key, key) }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkSubmit measures Submit -> outcome at several concurrencies, with
// 0 and 10,000 other volumes in the store. Each worker owns one volume and
// alternates controller_publish and controller_unpublish, so every
// iteration is one accepted, executed and committed op.
func BenchmarkSubmit(b *testing.B) {
	for _, existing := range []int{0, 10000} {
		for _, conc := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("volumes=%d/conc=%d", existing, conc), func(b *testing.B) {
				benchSubmit(b, existing, conc)
			})
		}
	}
}

func benchSubmit(b *testing.B, existing, conc int) {
	st, err := store.Open(filepath.Join(b.TempDir(), "csid.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	adopt := func(from, to int, prefix string) {
		for lo := from; lo < to; lo += 1000 {
			err := st.Update(func(tx *store.Tx) error {
				for i := lo; i < min(lo+1000, to); i++ {
					v := &store.Volume{ID: fmt.Sprintf("%s-%06d", prefix, i), Name: fmt.Sprintf("%s-name-%06d", prefix, i),
						DiskID: "disk", CapacityBytes: gib, State: fsm.Created, Capability: mountCap, CreatedAt: now}
					if err := tx.Adopt(v, store.HistoryEntry{Time: now, Event: fsm.Create, From: fsm.Absent, To: fsm.Created, Outcome: "adopted"}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	adopt(0, existing, "vol-bg")
	adopt(0, conc, "vol-bench")
	eng := New(Config{Store: st, Executors: allEvents(noopExec{}), NodeID: "node-1", Log: zerolog.Nop()})
	ctx := context.Background()
	if err := eng.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer eng.Close(ctx)

	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			id := fmt.Sprintf("vol-bench-%06d", w)
			for k := 0; next.Add(1) <= int64(b.N); k++ {
				req := publishReq(id, "node-1")
				if k%2 == 1 {
					req = unpublishReq(id)
				}
				if _, err := eng.Submit(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
