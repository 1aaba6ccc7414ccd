package ops

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
)

// BenchmarkCreateDeleteExisting measures create+delete pairs (Submit to
// outcome, no-op executors, durable commits) at concurrency 8 on a store
// with 5,000 volumes against one with none, with the engine's volume ids
// (time-ordered) and, for comparison, with random ids (what csid drew
// before). Names are random, as a CO's (pvc-<uuid>). The four stores take
// bursts in turn, so the machine's drifting load hits them alike; it
// reports the median ratios of the 5,000-volume rate to the empty one, and
// the pages each pair writes.
//
//	go test -run '^$' -bench CreateDeleteExisting -benchtime 40x ./internal/ops
func BenchmarkCreateDeleteExisting(b *testing.B) {
	const existing, conc, perWorker = 5000, 8, 40
	randomID := func() string {
		var x [10]byte
		_, _ = rand.Read(x[:])
		return "vol-" + hex.EncodeToString(x[:])
	}
	type target struct {
		eng *Engine
		st  *store.Store
	}
	open := func(n int, newID func() string) target {
		st, err := store.Open(filepath.Join(b.TempDir(), "csid.db"), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		eng := New(Config{Store: st, Executors: allEvents(noopExec{}), NodeID: "node-1", Log: zerolog.Nop(), NewID: newID})
		if err := eng.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { eng.Close(context.Background()) })
		parallel(b, 32, n, func(int) error {
			_, err := eng.Submit(context.Background(), createReq(randomName(), gib))
			return err
		})
		return target{eng, st}
	}
	// time-ordered: 0, 5000; random: 0, 5000.
	targets := []target{open(0, nil), open(existing, nil), open(0, randomID), open(existing, randomID)}
	burst := func(t target) (rate, pages float64) {
		before := t.st.Stats()
		start := time.Now()
		parallel(b, conc, conc*perWorker, func(int) error {
			out, err := t.eng.Submit(context.Background(), createReq(randomName(), gib))
			if err != nil {
				return err
			}
			_, err = t.eng.Submit(context.Background(), deleteReq(out.Volume.ID))
			return err
		})
		after := t.st.Stats()
		pairs := float64(conc * perWorker)
		return pairs / time.Since(start).Seconds(), float64(after.TxStats.GetWrite()-before.TxStats.GetWrite()) / pairs
	}
	rates, pages := make([][]float64, len(targets)), make([][]float64, len(targets))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, t := range targets {
			r, p := burst(t)
			rates[j], pages[j] = append(rates[j], r), append(pages[j], p)
		}
	}
	ratio := func(num, den int) float64 {
		var x []float64
		for i := range rates[num] {
			x = append(x, rates[num][i]/rates[den][i])
		}
		return median(x)
	}
	b.ReportMetric(median(rates[0]), "pairs/s")
	b.ReportMetric(ratio(1, 0), "x-5000")
	b.ReportMetric(ratio(3, 2), "x-5000-randomids")
	b.ReportMetric(median(pages[0]), "pages/pair")
	b.ReportMetric(median(pages[1]), "pages/pair-5000")
	b.ReportMetric(median(pages[3]), "pages/pair-5000-randomids")
}

// parallel runs fn(0..n-1) on conc goroutines.
func parallel(b *testing.B, conc, n int, fn func(i int) error) {
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func randomName() string {
	var x [16]byte
	_, _ = rand.Read(x[:])
	return fmt.Sprintf("pvc-%x", x)
}
