package store

import (
	"encoding/json"

	"github.com/csid-dev/csid/internal/fsm"
)

// CountVolumesByState counts the volume records by state. It visits every
// record (O(volumes)) but decodes only its state, and bypasses the decode
// cache: a full scan would otherwise evict the records of the volumes with
// ops in flight. Meant for metrics and inspection, not for a hot path. A
// damaged record is not counted (see Skipped).
func (t *Tx) CountVolumesByState() (map[fsm.State]int, error) {
	out := map[fsm.State]int{}
	var rec struct {
		State fsm.State `json:"state"`
	}
	c := t.tx.Bucket(bucketVolumes).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		rec.State = ""
		payload, err := unseal(bucketVolumes, k, raw)
		if err == nil && json.Unmarshal(payload, &rec) != nil {
			err = damaged(bucketVolumes, k, "does not decode")
		}
		if t.skipDamaged(err) {
			continue
		}
		out[rec.State]++
	}
	return out, nil
}

// Size is the size of the state file in bytes, as this transaction sees it.
func (t *Tx) Size() int64 { return t.tx.Size() }
