package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
)

// Every value csid stores (a record's JSON, or an index entry's bytes) is
// sealed: followed by a CRC-32C (Castagnoli) of the record's key and its
// encoding, 4 bytes big-endian. The key is covered so that a record that
// turns up under another key (a flipped bit in the key) fails too. Every
// read checks the seal before it decodes; a record that fails it is
// damaged, and csid does not act on it.

const sealSize = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrDamaged is matched (errors.Is) by a *DamagedError: a record fails its
// checksum, does not decode, or contradicts its key or its index.
var ErrDamaged = errors.New("damaged record")

// DamagedError names a damaged record. csid does not act on it: the
// volume it belongs to answers with it until the record is restored.
type DamagedError struct {
	// Bucket is where the record is: volumes, names, ops, active, resize,
	// history, snapshots or snapnames.
	Bucket string `json:"bucket"`
	// Key is the record's key, printable: a volume or snapshot id, a
	// volume or snapshot name, an op's sequence number, or "<id>#<n>" for
	// a history note.
	Key string `json:"key"`
	// VolumeID is the volume the record belongs to, when it is known.
	VolumeID string `json:"volumeID,omitempty"`
	// SnapshotID is the snapshot the record belongs to, when it is known
	// (then VolumeID is empty).
	SnapshotID string `json:"snapshotID,omitempty"`
	// Problem says what is wrong ("fails its checksum", ...).
	Problem string `json:"problem"`
}

func (e *DamagedError) Error() string {
	s := fmt.Sprintf("%s %s (%s/%s) %s", recordKinds[e.Bucket], e.Key, e.Bucket, e.Key, e.Problem)
	if e.VolumeID != "" && e.VolumeID != e.Key {
		s += fmt.Sprintf(" (it belongs to volume %s)", e.VolumeID)
	}
	if e.SnapshotID != "" && e.SnapshotID != e.Key {
		s += fmt.Sprintf(" (it belongs to snapshot %s)", e.SnapshotID)
	}
	return s
}

// Is makes errors.Is(err, ErrDamaged) true.
func (e *DamagedError) Is(target error) bool { return target == ErrDamaged }

// recordKinds names a bucket's records for people.
var recordKinds = map[string]string{
	"volumes": "the volume record", "names": "the name index entry", "ops": "the op record",
	"active": "the active-op index entry", "resize": "the resize record", "history": "the history note",
	"snapshots": "the snapshot record", "snapnames": "the snapshot name index entry",
}

func checksum(key, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, payload)
}

// seal returns payload followed by its checksum under key.
func seal(key, payload []byte) []byte {
	out := make([]byte, len(payload)+sealSize)
	copy(out, payload)
	binary.BigEndian.PutUint32(out[len(payload):], checksum(key, payload))
	return out
}

// unseal checks the seal of raw, stored under key in bucket, and returns
// the encoding it covers.
func unseal(bucket, key, raw []byte) ([]byte, error) {
	if len(raw) < sealSize {
		return nil, damaged(bucket, key, fmt.Sprintf("is %d bytes, shorter than its checksum", len(raw)))
	}
	payload := raw[:len(raw)-sealSize]
	if binary.BigEndian.Uint32(raw[len(payload):]) != checksum(key, payload) {
		return nil, damaged(bucket, key, "fails its checksum")
	}
	return payload, nil
}

// damaged builds the DamagedError of a record, filling in the volume it
// belongs to when the key says.
func damaged(bucket, key []byte, problem string) *DamagedError {
	e := &DamagedError{Bucket: string(bucket), Key: printableKey(bucket, key), Problem: problem}
	switch string(bucket) {
	case string(bucketVolumes), string(bucketActive), string(bucketResize):
		e.VolumeID = string(key)
	case string(bucketHistory):
		if id, _, ok := splitHistoryKey(key); ok {
			e.VolumeID = id
		}
	case string(bucketSnapshots):
		e.SnapshotID = string(key)
	}
	return e
}

// printableKey renders a key of bucket for messages.
func printableKey(bucket, key []byte) string {
	switch string(bucket) {
	case string(bucketOps):
		if len(key) == 8 {
			return strconv.FormatUint(fromU64(key), 10)
		}
	case string(bucketHistory):
		if id, n, ok := splitHistoryKey(key); ok {
			return fmt.Sprintf("%s#%d", id, n)
		}
	}
	q := strconv.Quote(string(key))
	return q[1 : len(q)-1]
}

// splitHistoryKey splits a note's key into its volume id and index.
func splitHistoryKey(key []byte) (id string, n uint64, ok bool) {
	if len(key) < 9 || key[len(key)-9] != 0 {
		return "", 0, false
	}
	return string(key[:len(key)-9]), fromU64(key[len(key)-8:]), true
}

// sealedBuckets hold sealed values; the meta bucket's two numbers (the
// schema version and the pruning cursor) are checked by their length.
var sealedBuckets = [][]byte{bucketVolumes, bucketNames, bucketOps, bucketActive, bucketResize, bucketHistory,
	bucketSnapshots, bucketSnapNames}

// asDamaged returns err as a *DamagedError, if it is one.
func asDamaged(err error) (*DamagedError, bool) {
	var d *DamagedError
	ok := errors.As(err, &d)
	return d, ok
}
