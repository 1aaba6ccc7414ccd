// Package boltfile checks the structure of a bbolt file before bbolt maps
// it. bbolt trusts its file: a page that is not what its parent says (a
// truncated file, a flipped bit, a page overwritten by something else)
// trips an assertion, and some of those fire on a goroutine bbolt starts
// itself (the free-page scan of Open), or read past the end of the mapped
// file, where no recover can catch them and the process dies. Verify reads
// the file with plain reads instead of a memory map and checks everything
// bbolt relies on when it opens a file and walks its buckets, so that a
// file Verify accepts opens and reads without an assertion, and a file it
// refuses is reported with the page that is wrong.
//
// What it checks: a meta page that bbolt would pick is valid (magic,
// version, checksum) and agrees with the file's length; every page
// reachable from the root bucket lies inside the file and below the
// high-water mark, says it is the page its parent names, is a branch or a
// leaf, is referenced once, holds its elements inside itself, and keeps
// its keys in the order bbolt's own consistency check demands; nested and
// inline buckets are checked the same way; a persisted free list names
// only pages that nothing else uses.
//
// The layout read here is bbolt's file format version 2 on a little-endian
// machine (the machines csid runs on), as written by go.etcd.io/bbolt.
package boltfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// ErrDamaged is matched (errors.Is) by every error that says the file's
// structure is damaged, as opposed to an error reading it.
var ErrDamaged = errors.New("damaged bbolt file")

// Error says what is wrong with a damaged file.
type Error struct {
	// Problem names the page or meta page that is wrong, and how.
	Problem string
}

func (e *Error) Error() string { return e.Problem }

// Is makes errors.Is(err, ErrDamaged) true.
func (e *Error) Is(target error) bool { return target == ErrDamaged }

// On-disk constants of bbolt's format version 2.
const (
	magic          = 0xED0CDAED
	version        = 2
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	metaSize       = 64 // magic, version, pageSize, flags u32; root, sequence, freelist, pgid, txid, checksum u64
	elementSize    = 16 // a branch element (pos, ksize u32, pgid u64) or a leaf element (flags, pos, ksize, vsize u32)
	bucketHeader   = 16 // root pgid u64, sequence u64
	noFreelist     = ^uint64(0)

	branchFlag   = 0x01
	leafFlag     = 0x02
	metaFlag     = 0x04
	freelistFlag = 0x10
	bucketFlag   = 0x01 // of a leaf element

	minPageSize = 512
	maxPageSize = 1 << 24 // the largest bbolt looks for
	// maxDepth bounds nested buckets and tree height; bbolt trees of any
	// real size are a handful of levels deep.
	maxDepth = 64
)

var le = binary.LittleEndian

// Meta is what a valid meta page says.
type Meta struct {
	PageSize uint32
	Root     uint64 // the root bucket's page
	Freelist uint64 // the free list's page, or ^0 when it is not persisted
	Pgid     uint64 // the high-water mark: pages [0, Pgid) are in use or free
	Txid     uint64
}

// Verify checks the bbolt file f (see the package doc). It returns nil for
// a sound file, an error wrapping ErrDamaged naming what is wrong, or the
// error of a failed read. An empty file is sound (bbolt initialises it).
func Verify(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return nil
	}
	v := &verifier{r: f, size: st.Size(), seen: map[uint64]bool{}}
	return v.run()
}

type verifier struct {
	r    io.ReaderAt
	size int64
	meta Meta
	seen map[uint64]bool // pages reached so far (overflow pages included)
}

func damaged(format string, args ...any) error {
	return &Error{Problem: fmt.Sprintf(format, args...)}
}

func (v *verifier) run() error {
	m, err := v.pickMeta()
	if err != nil {
		return err
	}
	v.meta = m
	ps := int64(m.PageSize)
	switch {
	case m.Pgid < 4:
		return damaged("the meta page's high-water mark is %d pages, fewer than bbolt ever writes", m.Pgid)
	case int64(m.Pgid) > v.size/ps:
		return damaged("the file is %d bytes, but its meta page says it holds %d pages of %d bytes (%d bytes): it was truncated",
			v.size, m.Pgid, ps, int64(m.Pgid)*ps)
	case m.Root < 2 || m.Root >= m.Pgid:
		return damaged("the root bucket's page %d is outside the file's pages 2..%d", m.Root, m.Pgid-1)
	case m.Freelist != noFreelist && (m.Freelist < 2 || m.Freelist >= m.Pgid):
		return damaged("the free list's page %d is outside the file's pages 2..%d", m.Freelist, m.Pgid-1)
	}
	if _, err := v.tree(m.Root, nil, nil, 0); err != nil {
		return err
	}
	if m.Freelist != noFreelist {
		return v.freelist(m.Freelist)
	}
	return nil
}

// pickMeta finds the page size as bbolt does (meta 0, else a meta at one of
// the offsets bbolt tries), then picks the meta bbolt would use: the valid
// one with the higher transaction id.
func (v *verifier) pickMeta() (Meta, error) {
	m0, err0 := v.readMeta(0)
	ps := int64(0)
	if err0 == nil {
		ps = int64(m0.PageSize)
	} else {
		for i := 0; i <= 14 && ps == 0; i++ {
			if m, err := v.readMeta(1024 << i); err == nil {
				ps = int64(m.PageSize)
			}
		}
	}
	if ps == 0 {
		return Meta{}, damaged("neither meta page is valid (%v)", err0)
	}
	if v.size < 2*ps {
		return Meta{}, damaged("the file is %d bytes, shorter than its two meta pages of %d bytes: it was truncated", v.size, ps)
	}
	m1, err1 := v.readMeta(ps)
	if err0 == nil && m0.PageSize != m1.PageSize && err1 == nil {
		return Meta{}, damaged("the meta pages disagree on the page size (%d and %d)", m0.PageSize, m1.PageSize)
	}
	switch {
	case err0 == nil && err1 == nil:
		if m1.Txid > m0.Txid {
			return m1, nil
		}
		return m0, nil
	case err0 == nil:
		return m0, nil
	case err1 == nil:
		return m1, nil
	}
	return Meta{}, damaged("neither meta page is valid (%v; %v)", err0, err1)
}

// readMeta reads and validates the meta page at off.
func (v *verifier) readMeta(off int64) (Meta, error) {
	buf := make([]byte, pageHeaderSize+metaSize)
	if off+int64(len(buf)) > v.size {
		return Meta{}, damaged("no meta page at offset %d: the file is %d bytes", off, v.size)
	}
	if _, err := v.r.ReadAt(buf, off); err != nil {
		return Meta{}, fmt.Errorf("read the meta page at offset %d: %w", off, err)
	}
	raw := buf[pageHeaderSize:]
	m := Meta{PageSize: le.Uint32(raw[8:]), Root: le.Uint64(raw[16:]), Freelist: le.Uint64(raw[32:]),
		Pgid: le.Uint64(raw[40:]), Txid: le.Uint64(raw[48:])}
	h := fnv.New64a()
	h.Write(raw[:56])
	switch {
	case le.Uint32(raw) != magic:
		return Meta{}, damaged("the meta page at offset %d is not a bbolt meta page", off)
	case le.Uint32(raw[4:]) != version:
		return Meta{}, damaged("the meta page at offset %d has format version %d, not %d", off, le.Uint32(raw[4:]), version)
	case le.Uint64(raw[56:]) != h.Sum64():
		return Meta{}, damaged("the meta page at offset %d fails its checksum", off)
	case m.PageSize < minPageSize || m.PageSize > maxPageSize || m.PageSize&(m.PageSize-1) != 0:
		return Meta{}, damaged("the meta page at offset %d names page size %d", off, m.PageSize)
	}
	return m, nil
}

// page is one page as read from the file, overflow included.
type page struct {
	id    uint64
	flags uint16
	count int
	buf   []byte // the whole page, header included
}

// readPage reads page id (with its overflow pages), checks that it lies in
// the file and below the high-water mark and says it is page id, and marks
// it seen; a page reached twice is damage.
func (v *verifier) readPage(id uint64, parent string) (*page, error) {
	ps := uint64(v.meta.PageSize)
	if id < 2 || id >= v.meta.Pgid {
		return nil, damaged("%s names page %d, outside the file's pages 2..%d", parent, id, v.meta.Pgid-1)
	}
	hdr := make([]byte, pageHeaderSize)
	if _, err := v.r.ReadAt(hdr, int64(id*ps)); err != nil {
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	p := &page{id: le.Uint64(hdr), flags: le.Uint16(hdr[8:]), count: int(le.Uint16(hdr[10:]))}
	overflow := uint64(le.Uint32(hdr[12:]))
	switch {
	case p.id != id:
		return nil, damaged("page %d (named by %s) says it is page %d: it was overwritten, or the file was cut short and refilled", id, parent, p.id)
	case p.flags != branchFlag && p.flags != leafFlag:
		return nil, damaged("page %d (named by %s) has type flags %#x, not a branch or a leaf", id, parent, p.flags)
	case id+overflow >= v.meta.Pgid:
		return nil, damaged("page %d runs over %d more pages, past the high-water mark %d", id, overflow, v.meta.Pgid)
	}
	for i := id; i <= id+overflow; i++ {
		if v.seen[i] {
			return nil, damaged("page %d is reached twice (again from %s)", i, parent)
		}
		v.seen[i] = true
	}
	p.buf = make([]byte, (overflow+1)*ps)
	if _, err := v.r.ReadAt(p.buf, int64(id*ps)); err != nil {
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	return p, nil
}

// tree checks the subtree rooted at page id, whose keys must lie in [lo,
// hi) (nil: unbounded), and returns its largest key, as bbolt's check does.
func (v *verifier) tree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, damaged("page %d lies %d levels deep", id, depth)
	}
	parent := "the root bucket"
	if depth > 0 {
		parent = "its parent"
	}
	p, err := v.readPage(id, parent)
	if err != nil {
		return nil, err
	}
	if p.flags == leafFlag {
		return v.leaf(p.buf, p.count, fmt.Sprintf("page %d", id), lo, hi, depth)
	}
	return v.branch(p, lo, hi, depth)
}

func (v *verifier) branch(p *page, lo, hi []byte, depth int) ([]byte, error) {
	where := fmt.Sprintf("branch page %d", p.id)
	if p.count == 0 {
		return nil, damaged("%s has no elements", where)
	}
	if pageHeaderSize+p.count*elementSize > len(p.buf) {
		return nil, damaged("%s claims %d elements, more than it can hold", where, p.count)
	}
	keys := make([][]byte, p.count)
	for i := range keys {
		at := pageHeaderSize + i*elementSize
		k, err := span(p.buf, at, uint64(le.Uint32(p.buf[at:])), le.Uint32(p.buf[at+4:]))
		if err != nil {
			return nil, damaged("%s element %d: key %v", where, i, err)
		}
		keys[i] = k
	}
	running := lo
	var max []byte
	for i, k := range keys {
		if err := order(where, i, k, running, hi); err != nil {
			return nil, err
		}
		next := hi
		if i+1 < len(keys) {
			next = keys[i+1]
		}
		child := le.Uint64(p.buf[pageHeaderSize+i*elementSize+8:])
		sub, err := v.tree(child, k, next, depth+1)
		if err != nil {
			return nil, err
		}
		max, running = sub, sub
	}
	return max, nil
}

// leaf checks the leaf page in buf (a file page, or the inline page of a
// small bucket) and the buckets its elements hold.
func (v *verifier) leaf(buf []byte, count int, where string, lo, hi []byte, depth int) ([]byte, error) {
	if pageHeaderSize+count*elementSize > len(buf) {
		return nil, damaged("%s claims %d elements, more than it can hold", where, count)
	}
	prev := lo
	for i := range count {
		at := pageHeaderSize + i*elementSize
		flags, pos, ksize, vsize := le.Uint32(buf[at:]), le.Uint32(buf[at+4:]), le.Uint32(buf[at+8:]), le.Uint32(buf[at+12:])
		k, err := span(buf, at, uint64(pos), ksize)
		if err != nil {
			return nil, damaged("%s element %d: key %v", where, i, err)
		}
		val, err := span(buf, at, uint64(pos)+uint64(ksize), vsize)
		if err != nil {
			return nil, damaged("%s element %d: value %v", where, i, err)
		}
		if flags&^bucketFlag != 0 {
			return nil, damaged("%s element %d has unknown flags %#x", where, i, flags)
		}
		if err := order(where, i, k, prev, hi); err != nil {
			return nil, err
		}
		prev = k
		if flags&bucketFlag != 0 {
			if err := v.bucket(val, fmt.Sprintf("bucket %q in %s", k, where), depth); err != nil {
				return nil, err
			}
		}
	}
	if count == 0 {
		return nil, nil
	}
	return prev, nil
}

// bucket checks a bucket from its header (and inline page) in value.
func (v *verifier) bucket(value []byte, where string, depth int) error {
	if len(value) < bucketHeader {
		return damaged("%s: a bucket header of %d bytes", where, len(value))
	}
	root := le.Uint64(value)
	if root != 0 {
		_, err := v.tree(root, nil, nil, depth+1)
		return err
	}
	inline := value[bucketHeader:]
	if len(inline) < pageHeaderSize {
		return damaged("%s: an inline page of %d bytes", where, len(inline))
	}
	if f := le.Uint16(inline[8:]); f != leafFlag {
		return damaged("%s: its inline page has type flags %#x, not a leaf", where, f)
	}
	if depth+1 > maxDepth {
		return damaged("%s lies %d levels deep", where, depth+1)
	}
	_, err := v.leaf(inline, int(le.Uint16(inline[10:])), where+" (inline)", nil, nil, depth+1)
	return err
}

// span returns the n bytes at element offset at plus pos, if they lie in buf.
func span(buf []byte, at int, pos uint64, n uint32) ([]byte, error) {
	start := uint64(at) + pos
	end := start + uint64(n)
	if end > uint64(len(buf)) {
		return nil, fmt.Errorf("at %d..%d lies outside its %d-byte page", start, end, len(buf))
	}
	return buf[start:end], nil
}

// order checks element i's key k against the previous key (or the lower
// bound, for i == 0) and the upper bound, as bbolt's consistency check.
func order(where string, i int, k, prev, hi []byte) error {
	switch c := bytes.Compare(prev, k); {
	case i == 0 && prev != nil && c > 0:
		return damaged("%s: its first key %q sorts before its parent's %q", where, k, prev)
	case i > 0 && c >= 0:
		return damaged("%s: key %d %q does not sort after %q", where, i, k, prev)
	}
	if hi != nil && bytes.Compare(k, hi) >= 0 {
		return damaged("%s: key %d %q does not sort before its parent's next key %q", where, i, k, hi)
	}
	return nil
}

// freelist checks a persisted free list: it names pages below the
// high-water mark that nothing else uses, once each.
func (v *verifier) freelist(id uint64) error {
	ps := uint64(v.meta.PageSize)
	hdr := make([]byte, pageHeaderSize)
	if _, err := v.r.ReadAt(hdr, int64(id*ps)); err != nil {
		return fmt.Errorf("read the free list's page %d: %w", id, err)
	}
	overflow := uint64(le.Uint32(hdr[12:]))
	switch {
	case le.Uint64(hdr) != id:
		return damaged("the free list's page %d says it is page %d", id, le.Uint64(hdr))
	case le.Uint16(hdr[8:]) != freelistFlag:
		return damaged("the free list's page %d has type flags %#x", id, le.Uint16(hdr[8:]))
	case id+overflow >= v.meta.Pgid:
		return damaged("the free list's page %d runs past the high-water mark", id)
	}
	buf := make([]byte, (overflow+1)*ps)
	if _, err := v.r.ReadAt(buf, int64(id*ps)); err != nil {
		return fmt.Errorf("read the free list's page %d: %w", id, err)
	}
	for i := id; i <= id+overflow; i++ {
		if v.seen[i] {
			return damaged("the free list's page %d is also used by the tree", i)
		}
		v.seen[i] = true
	}
	start, count := uint64(pageHeaderSize), uint64(le.Uint16(hdr[10:]))
	if count == 0xFFFF {
		count, start = le.Uint64(buf[pageHeaderSize:]), pageHeaderSize+8
	}
	if count > (uint64(len(buf))-start)/8 {
		return damaged("the free list's page %d claims %d pages, more than it can hold", id, count)
	}
	for i := range count {
		free := le.Uint64(buf[start+8*i:])
		if free < 2 || free >= v.meta.Pgid {
			return damaged("the free list names page %d, outside the file's pages 2..%d", free, v.meta.Pgid-1)
		}
		if v.seen[free] {
			return damaged("the free list names page %d, which is in use (or listed twice)", free)
		}
		v.seen[free] = true
	}
	return nil
}
