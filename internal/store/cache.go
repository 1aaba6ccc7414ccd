package store

import (
	"maps"
	"slices"
	"sync"
)

// volumeCache maps encoded volume records to their decoded form. It is keyed
// by the bytes themselves, so it can never serve a stale record: a changed
// record has other bytes. Every transition reads a volume several times (the
// read-only plan, the plan in the write transaction, the commit of the
// outcome) and JSON decoding dominated the committer's CPU; a clone costs a
// small fraction of a decode.
type volumeCache struct {
	mu sync.Mutex
	m  map[string]*Volume
}

// volumeCacheSize bounds the cache; it is cleared when full, which keeps the
// working set (the volumes with ops in flight) without any bookkeeping.
const volumeCacheSize = 4096

// decode returns the decoded form of raw, the sealed record at key, from
// the cache if it holds it. keep adds what it had to decode to the cache; a
// scan of every record passes false, lest it evict the working set.
//
// Only records that passed their seal (or that csid wrote) enter the
// cache, so a hit is a byte-for-byte match of a checked encoding: its seal
// holds, under the key it names, which is checked here.
func (c *volumeCache) decode(key, raw []byte, keep bool) (*Volume, error) {
	c.mu.Lock()
	v, ok := c.m[string(raw)]
	c.mu.Unlock()
	if ok {
		if v.ID != string(key) {
			return nil, damaged(bucketVolumes, key, "holds the record of volume "+v.ID)
		}
		return cloneVolume(v), nil
	}
	v, err := decode[Volume](bucketVolumes, key, raw)
	if err != nil {
		return nil, err
	}
	if v.ID != string(key) {
		return nil, damaged(bucketVolumes, key, "holds the record of volume "+v.ID)
	}
	if keep {
		c.remember(raw, v)
	}
	return v, nil
}

// remember caches a copy of v as the decoded form of raw.
func (c *volumeCache) remember(raw []byte, v *Volume) {
	cp := cloneVolume(v)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= volumeCacheSize {
		c.m = make(map[string]*Volume, volumeCacheSize)
	}
	c.m[string(raw)] = cp
	c.mu.Unlock()
}

// cloneVolume deep-copies a volume record.
func cloneVolume(v *Volume) *Volume {
	c := *v
	c.Parameters = maps.Clone(v.Parameters)
	c.Targets = maps.Clone(v.Targets)
	c.Capability.MountFlags = slices.Clone(v.Capability.MountFlags)
	if v.Attachment != nil {
		a := *v.Attachment
		a.PublishContext = maps.Clone(v.Attachment.PublishContext)
		c.Attachment = &a
	}
	if v.Stage != nil {
		s := *v.Stage
		c.Stage = &s
	}
	if v.Source != nil {
		s := *v.Source
		c.Source = &s
	}
	return &c
}

// Clone returns a deep copy of the volume.
func (v *Volume) Clone() *Volume { return cloneVolume(v) }
