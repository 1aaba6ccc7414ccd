package ops

import (
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
)

// Volume returns a volume's record, or nil when the volume does not exist
// (or is still being created: it exists for nobody but its creator yet).
// An error is an *Error: DataLoss for a damaged record.
func (e *Engine) Volume(id string) (*store.Volume, error) {
	var v *store.Volume
	err := e.st.View(func(tx *store.Tx) error {
		var err error
		v, err = tx.Volume(id)
		return err
	})
	if err != nil {
		return nil, readError("read volume "+id, err)
	}
	if v == nil || v.State == fsm.Absent {
		return nil, nil
	}
	return v, nil
}

// ListVolumes returns up to max volumes (0: all) in id order after the id
// `after`, and the id to continue after ("" when there are no more). Volumes
// still being created are left out, and so are volumes whose records are
// damaged (csid check reports them).
func (e *Engine) ListVolumes(after string, max int) ([]store.Volume, string, error) {
	var out []store.Volume
	next := ""
	err := e.st.View(func(tx *store.Tx) error {
		return tx.ForEachVolume(after, func(v *store.Volume) bool {
			if v.State == fsm.Absent {
				return true
			}
			if max > 0 && len(out) == max {
				next = out[len(out)-1].ID
				return false
			}
			out = append(out, *v)
			return true
		})
	})
	return out, next, err
}
