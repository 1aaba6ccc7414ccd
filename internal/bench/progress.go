package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws one line, redrawn in place every progressEvery:
//
//	round 1 c=8 lifecycle  [=========>          ]   45/100   212.4/s
//
// It is written to a terminal's stderr (or wherever Config.Progress
// points), never to stdout, which carries the report. A nil *progress
// draws nothing.
type progress struct {
	w io.Writer

	mu    sync.Mutex
	label string
	total int
	start time.Time
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

const (
	progressEvery = 200 * time.Millisecond
	barWidth      = 24
)

func newProgress(w io.Writer) *progress {
	if w == nil {
		return nil
	}
	return &progress{w: w}
}

// begin starts a line for a measurement of total units.
func (p *progress) begin(label string, total int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label, p.total, p.start = label, total, time.Now()
	p.mu.Unlock()
	p.done.Store(0)
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
}

// step counts one unit done.
func (p *progress) step() {
	if p != nil {
		p.done.Add(1)
	}
}

// end stops the redrawing and clears the line.
func (p *progress) end() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	fmt.Fprint(p.w, "\r\033[K")
}

func (p *progress) draw() {
	p.mu.Lock()
	label, total, start := p.label, p.total, p.start
	p.mu.Unlock()
	done := int(p.done.Load())
	filled := 0
	if total > 0 {
		filled = min(barWidth, done*barWidth/total)
	}
	bar := strings.Repeat("=", filled)
	if filled < barWidth {
		bar += ">" + strings.Repeat(" ", barWidth-filled-1)
	}
	rate := float64(done) / max(time.Since(start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r\033[K%s  [%s] %*d/%d  %8.1f/s", label, bar, len(fmt.Sprint(total)), done, total, rate)
}
