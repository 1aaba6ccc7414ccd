package ops

import (
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Counts is what the store holds at one instant, counted for the metrics:
// the volumes and the snapshots by state, the ops in flight by event, and
// the resize queue.
type Counts struct {
	// Volumes counts the volume records by state. A volume whose create op
	// is still in flight is counted as fsm.Absent.
	Volumes map[fsm.State]int
	// Snapshots counts the snapshot records by state (fsm.Absent: being
	// cut).
	Snapshots map[fsm.State]int
	// Active counts the ops queued, running or compensating, by event.
	Active map[fsm.Event]int
	// Resizes counts the resize queue's entries by status (waiting for the
	// volume to be detached, or running).
	Resizes map[store.ResizeStatus]int
	// OldestResize is when the oldest entry of the resize queue was first
	// queued; zero when the queue is empty.
	OldestResize time.Time
	// StoreBytes is the size of the state file.
	StoreBytes int64
}

// Counts counts, in one read transaction, the volumes and snapshots by
// state, the ops in flight and the resize queue. It costs O(volumes +
// snapshots + ops in flight + queued resizes), decoding only each volume's
// state: cheap enough for every scrape of a driver with tens of thousands
// of volumes, not for a hot path.
func (e *Engine) Counts() (Counts, error) {
	s := Counts{Active: map[fsm.Event]int{}, Resizes: map[store.ResizeStatus]int{}}
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		if s.Volumes, err = tx.CountVolumesByState(); err != nil {
			return err
		}
		if s.Snapshots, err = tx.CountSnapshotsByState(); err != nil {
			return err
		}
		active, err := tx.ActiveOps()
		if err != nil {
			return err
		}
		for _, op := range active {
			s.Active[op.Event]++
		}
		s.StoreBytes = tx.Size()
		return tx.ForEachResize(func(r *store.Resize) bool {
			s.Resizes[r.Status]++
			if s.OldestResize.IsZero() || r.QueuedAt.Before(s.OldestResize) {
				s.OldestResize = r.QueuedAt
			}
			return true
		})
	})
	if err != nil {
		return Counts{}, err
	}
	return s, nil
}
