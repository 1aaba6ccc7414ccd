package ops

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// model is what a volume should look like, kept by its walker.
type model struct {
	state    fsm.State
	targets  []string
	capacity int64
	queued   int64 // deferred resize target, 0 if none
	deleted  bool
}

// TestRandomizedLifecycles drives 1000 volumes at once through random legal
// walks of at least 12 events each. Every request is submitted twice,
// concurrently (a CO's duplicate), and 1 in 8 first executions fails with a
// transient error. After every step the outcome must match the walker's
// model; at the end every volume is in a legal state that its history
// explains, no op is left, and the executor never saw two ops of one volume
// overlap.
func TestRandomizedLifecycles(t *testing.T) {
	volumes, minSteps := 1000, 12
	if testing.Short() {
		volumes = 100
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CSID_RANDOM_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with CSID_RANDOM_SEED=%d)", seed, seed)

	// Durability is the crash test's subject; this one checks logic and
	// concurrency, so it skips fsync.
	h := newHarness(t, func(c *Config) { c.Retry = &Backoff{Base: time.Millisecond, Cap: 2 * time.Millisecond, MaxAttempts: 6} })
	h.restartWith(store.Options{NoSync: true})
	var injected atomic.Int64
	h.ex.fail = func(x *Exec) error {
		if x.Op.Attempts == 0 && (x.Op.Seq*2654435761)%8 == 0 {
			injected.Add(1)
			return errTransient
		}
		return nil
	}
	models := make([]*model, volumes)
	ids := make([]string, volumes)
	var events atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < volumes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			m := &model{}
			models[i] = m
			id, err := walk(h, r, m, fmt.Sprintf("pvc-%d", i), minSteps, &events)
			ids[i] = id
			if err != nil {
				t.Errorf("volume %d (%s): %v", i, id, err)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	checkInvariants(t, h)
	for i, m := range models {
		v := h.volume(ids[i])
		switch {
		case m.deleted && v != nil:
			t.Errorf("volume %s should be deleted: %+v", ids[i], v)
		case !m.deleted && (v == nil || v.State != m.state || v.CapacityBytes != m.capacity || len(v.Targets) != len(m.targets)):
			t.Errorf("volume %s: stored %+v, model %+v", ids[i], v, m)
		}
	}
	t.Logf("%d volumes, %d events (each submitted twice), %d transient failures injected", volumes, events.Load(), injected.Load())
	if events.Load() < int64(volumes*minSteps) {
		t.Fatalf("only %d events", events.Load())
	}
}

// walk runs one volume's random lifecycle.
func walk(h *harness, r *rand.Rand, m *model, name string, minSteps int, events *atomic.Int64) (string, error) {
	twice := func(req Request) (Outcome, error) {
		events.Add(1)
		type res struct {
			out Outcome
			err error
		}
		c := make(chan res, 1)
		go func() { out, err := h.submit(req); c <- res{out, err} }()
		var a res
		a.out, a.err = h.submit(req)
		b := <-c
		if status.Code(a.err) != status.Code(b.err) {
			return a.out, fmt.Errorf("%s: duplicates disagree: %v / %v", req.Event, a.err, b.err)
		}
		// Duplicates agree on the state; not necessarily on the generation:
		// the later one may be answered after a chained op (the resize an
		// unpublish starts) has moved the volume on.
		if a.err == nil && a.out.Volume.State != b.out.Volume.State {
			return a.out, fmt.Errorf("%s: duplicates saw different outcomes: %+v / %+v", req.Event, a.out.Volume, b.out.Volume)
		}
		return a.out, a.err
	}
	out, err := twice(createReq(name, gib))
	if err != nil {
		return "", err
	}
	id := out.Volume.ID
	m.state, m.capacity = fsm.Created, gib
	target := 0
	// expect(twice(req))(want) checks an outcome's state against the model.
	expect := func(out Outcome, err error) func(want fsm.State) error {
		return func(want fsm.State) error {
			if err != nil {
				return err
			}
			if out.Volume.State != want {
				return fmt.Errorf("state %s, model %s", out.Volume.State, want)
			}
			m.state = want
			return nil
		}
	}
	for step := 0; step < minSteps || m.state != fsm.Created; step++ {
		var err error
		p := r.IntN(10)
		switch m.state {
		case fsm.Created:
			switch {
			case p < 7:
				out, e := twice(publishReq(id, "node-1"))
				if e == nil && out.Volume.CapacityBytes != m.capacity {
					e = fmt.Errorf("attached at %d bytes, model %d", out.Volume.CapacityBytes, m.capacity)
				}
				err = expect(out, e)(fsm.NodeReady)
			default:
				size := m.capacity + gib
				out, e := twice(expandReq(id, size))
				if e == nil && out.Volume.CapacityBytes != size {
					e = fmt.Errorf("expanded to %d, want %d", out.Volume.CapacityBytes, size)
				}
				m.capacity = size
				err = expect(out, e)(fsm.Created)
			}
		case fsm.NodeReady:
			switch {
			case p < 6:
				err = expect(twice(stageReq(id, "/stage/"+id)))(fsm.VolReady)
			case p < 8:
				err = expect(twice(unpublishReq(id)))(fsm.Created)
				if m.queued > m.capacity {
					// The unpublish's commit started the queued resize;
					// whatever comes next waits for it.
					m.capacity, m.queued = m.queued, 0
				}
			default:
				err = deferExpand(twice, id, m)
			}
		case fsm.VolReady:
			switch {
			case p < 6:
				tp := fmt.Sprintf("/target/%s/%d", id, target)
				target++
				err = expect(twice(Request{VolumeID: id, Event: fsm.NodePublish, Args: &NodePublishArgs{TargetPath: tp, StagingPath: "/stage/" + id, Capability: mountCap}}))(fsm.Published)
				m.targets = append(m.targets, tp)
			case p < 9:
				err = expect(twice(unstageReq(id, "/stage/"+id)))(fsm.NodeReady)
			default:
				err = deferExpand(twice, id, m)
			}
		case fsm.Published:
			if p < 3 && len(m.targets) < 3 {
				tp := fmt.Sprintf("/target/%s/%d", id, target)
				target++
				err = expect(twice(Request{VolumeID: id, Event: fsm.NodePublish, Args: &NodePublishArgs{TargetPath: tp, StagingPath: "/stage/" + id, Capability: mountCap}}))(fsm.Published)
				m.targets = append(m.targets, tp)
			} else {
				k := r.IntN(len(m.targets))
				tp := m.targets[k]
				m.targets = slices.Delete(m.targets, k, k+1)
				want := fsm.Published
				if len(m.targets) == 0 {
					want = fsm.VolReady
				}
				err = expect(twice(nodeUnpublishReq(id, tp)))(want)
			}
		}
		if err != nil {
			return id, fmt.Errorf("step %d from %s: %w", step, m.state, err)
		}
	}
	// The walk ends detached: a resize queued on the way ran at the last
	// unpublish. Expanding to the model's size now must find it done.
	if out, err := twice(expandReq(id, m.capacity)); err != nil || out.Volume.CapacityBytes != m.capacity {
		return id, fmt.Errorf("capacity after the walk: %+v, %v; model %d", out.Volume, err, m.capacity)
	}
	if r.IntN(2) == 0 {
		if _, err := twice(deleteReq(id)); err != nil {
			return id, err
		}
		m.deleted = true
	}
	return id, nil
}

func deferExpand(twice func(Request) (Outcome, error), id string, m *model) error {
	size := max(m.capacity, m.queued) + gib
	_, err := twice(expandReq(id, size))
	if status.Code(err) != codes.FailedPrecondition {
		return fmt.Errorf("expand of an attached volume: %v", err)
	}
	m.queued = size
	return nil
}
