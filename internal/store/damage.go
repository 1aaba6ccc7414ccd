package store

import (
	"encoding/json"
	"fmt"
)

// Damaged checks every record of the file, O(records), and returns the
// damaged ones: those that fail their seal or do not decode, and entries
// of the active-op index that name no op of their volume or snapshot.
// Each names the volume (or snapshot) it belongs to when that is known (an
// op whose record is damaged belongs to the one whose active or last op it
// is). Meant for `csid
// check` and `csid state verify`, not for a hot path.
func (t *Tx) Damaged() ([]*DamagedError, error) {
	var out []*DamagedError
	owner := map[uint64]string{} // op seq -> the volume naming it active or last
	c := t.tx.Bucket(bucketVolumes).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		v, err := t.s.volumes.decode(k, raw, false)
		if d, ok := asDamaged(err); ok {
			out = append(out, d)
			continue
		} else if err != nil {
			return nil, err
		}
		if v.LastOp != 0 {
			owner[v.LastOp] = v.ID
		}
	}
	out = append(out, checkRaw(t, bucketNames, nil)...)
	snaps, err := t.damagedSnapshots(owner)
	if err != nil {
		return nil, err
	}
	out = append(out, snaps...)
	c = t.tx.Bucket(bucketActive).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		seq, err := t.activeOfKey(k)
		if d, ok := asDamaged(err); ok {
			out = append(out, d)
			continue
		}
		owner[seq] = string(k)
		if op, err := t.Op(seq); err == nil && (op == nil || op.Subject() != string(k)) {
			out = append(out, damaged(bucketActive, k, fmt.Sprintf("names op %d, which is not an op of this volume or snapshot", seq)))
		}
	}
	c = t.tx.Bucket(bucketOps).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		if _, err := decodeOp(fromU64(k), raw); err != nil {
			d, ok := asDamaged(err)
			if !ok {
				return nil, err
			}
			d.VolumeID = owner[fromU64(k)] // a snapshot's: attribute moves it
			out = append(out, d)
		}
	}
	c = t.tx.Bucket(bucketResize).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		if _, err := decodeResize(k, raw); err != nil {
			d, ok := asDamaged(err)
			if !ok {
				return nil, err
			}
			out = append(out, d)
		}
	}
	out = append(out, checkRaw(t, bucketHistory, func(p []byte) error {
		var h HistoryEntry
		return json.Unmarshal(p, &h)
	})...)
	for _, d := range out {
		t.attribute(d)
	}
	return out, nil
}

// checkRaw checks the seal (and, with parse, the decoding) of every value
// of a bucket.
func checkRaw(t *Tx, bucket []byte, parse func([]byte) error) []*DamagedError {
	var out []*DamagedError
	c := t.tx.Bucket(bucket).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		payload, err := unseal(bucket, k, raw)
		if err == nil && parse != nil {
			if perr := parse(payload); perr != nil {
				err = damaged(bucket, k, "does not decode: "+perr.Error())
			}
		}
		if d, ok := asDamaged(err); ok {
			out = append(out, d)
		}
	}
	return out
}
