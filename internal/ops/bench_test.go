package ops

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
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
	eng := newBenchEngine(b, existing, conc)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; next.Add(1) <= int64(b.N); k++ {
				if err := toggle(eng, w, k); err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// newBenchEngine opens a store with `existing` idle volumes plus `workers`
// volumes for the benchmark's workers, and starts an engine on it.
func newBenchEngine(b *testing.B, existing, workers int) *Engine {
	st, err := store.Open(filepath.Join(b.TempDir(), "csid.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	now := time.Now()
	adopt := func(from, to int, prefix string) {
		for lo := from; lo < to; lo += 1000 {
			err := st.Update(func(tx *store.Tx) error {
				for i := lo; i < min(lo+1000, to); i++ {
					v := &store.Volume{ID: fmt.Sprintf("%s-%06d", prefix, i), Name: fmt.Sprintf("%s-name-%06d", prefix, i),
						DiskID: "disk", CapacityBytes: gib, State: fsm.Created, Capability: mountCap, CreatedAt: now}
					if err := tx.Reconcile(v, fsm.Rebuild, fsm.Detached, "a benchmark's idle volume", now); err != nil {
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
	adopt(0, workers, "vol-bench")
	eng := New(Config{Store: st, Executors: allEvents(noopExec{}), NodeID: "node-1", Log: zerolog.Nop()})
	if err := eng.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close(context.Background()) })
	return eng
}

// toggle is worker w's k-th op: publish, then unpublish, alternately.
func toggle(eng *Engine, w, k int) error {
	id := fmt.Sprintf("vol-bench-%06d", w)
	req := publishReq(id, "node-1")
	if k%2 == 1 {
		req = unpublishReq(id)
	}
	_, err := eng.Submit(context.Background(), req)
	return err
}

func median[T cmp.Ordered](x []T) T {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkRatioConc1 measures the ratios of issue 2's targets at
// concurrency 1 in one run, interleaved op by op so that the machine's
// drifting load hits all three alike: Submit -> outcome with 0 and with
// 10,000 other volumes, and the bare bbolt Update floor. It reports the
// medians and their ratios.
func BenchmarkRatioConc1(b *testing.B) {
	eng0, eng10k := newBenchEngine(b, 0, 1), newBenchEngine(b, 10000, 1)
	db, err := bolt.Open(filepath.Join(b.TempDir(), "floor.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err })
	var t0, t10k, tf []time.Duration
	key := make([]byte, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := toggle(eng0, 0, i); err != nil {
			b.Fatal(err)
		}
		t0 = append(t0, time.Since(start))
		start = time.Now()
		if err := toggle(eng10k, 0, i); err != nil {
			b.Fatal(err)
		}
		t10k = append(t10k, time.Since(start))
		binary.BigEndian.PutUint64(key, uint64(i))
		start = time.Now()
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put(key, key) }); err != nil {
			b.Fatal(err)
		}
		tf = append(tf, time.Since(start))
	}
	m0, m10k, mf := median(t0), median(t10k), median(tf)
	b.ReportMetric(float64(mf.Microseconds()), "floor-µs")
	b.ReportMetric(float64(m0.Microseconds()), "submit-µs")
	b.ReportMetric(float64(m10k.Microseconds()), "submit10k-µs")
	b.ReportMetric(float64(mf)/float64(m0), "x-floor")
	b.ReportMetric(float64(m10k)/float64(m0), "x-10k")
}

// BenchmarkRatioConc64 measures throughput at concurrency 64 against
// concurrency 1, and at 10,000 volumes against 0, in alternating bursts
// (one of each per iteration), and reports the ratios of the median burst
// throughputs.
func BenchmarkRatioConc64(b *testing.B) {
	const conc, perWorker = 64, 8
	eng0, eng10k := newBenchEngine(b, 0, conc), newBenchEngine(b, 10000, conc)
	burst := func(eng *Engine, workers, ops int, round int) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for k := 0; k < ops; k++ {
					if err := toggle(eng, w, round*ops+k); err != nil {
						b.Error(err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		return float64(workers*ops) / time.Since(start).Seconds()
	}
	var c1, c64, c64k []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c64 = append(c64, burst(eng0, conc, perWorker, i))
		c64k = append(c64k, burst(eng10k, conc, perWorker, i))
		c1 = append(c1, burst(eng0, 1, 2*perWorker, i))
	}
	b.ReportMetric(median(c1), "conc1-ops/s")
	b.ReportMetric(median(c64), "conc64-ops/s")
	b.ReportMetric(median(c64)/median(c1), "x-conc64")
	b.ReportMetric(median(c64)/median(c64k), "x-10k")
}
