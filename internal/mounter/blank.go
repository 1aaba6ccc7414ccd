package mounter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/loopdev"
)

// The blank check: a device is blank, without running blkid, when every
// byte blkid would read of it is zero.
//
// `blkid -p` decides what a device holds from the bytes it reads (and the
// device's geometry: its size, its sector size, whether it is a whole disk,
// a zoned device or a CD-ROM). Each of its probes reads some bytes, and
// what it reads next, and whether it finds anything, depends only on the
// bytes it read so far. On a device whose every byte blkid reads is zero,
// blkid therefore reads the same bytes, in the same order, as on a device
// of zeros of that geometry, and finds what it finds there: nothing (it
// exits 2). So where blkid reads on a device of zeros, csid reads the
// device itself, and when all of it is zero the device is blank: blkid's
// answer is known without its exec, which costs about 5 ms of a stage (of
// 20; docs/benchmarks.md). Anything else (a single byte that is not zero)
// is for blkid to judge, exactly as before.
//
// Where blkid reads, measured (util-linux 2.38, Debian 12's, which csid's
// image ships) on devices of zeros from 1 MiB to 2 TiB, with sectors of
// 512 and 4096 bytes: TestBlankRegionsCoverBlkid runs the installed blkid
// with a shim that records its reads and checks each lies in
// blankRegions, and that blkid finds nothing there; a blkid that reads
// elsewhere fails that test, and blankRegions must then grow.
//
// On a zoned device blkid looks for btrfs's superblock in its log zones,
// and on a CD-ROM for ISO 9660 in the last session; the regions do not
// cover those, so such devices are left to blkid.

// span is a byte range of a device.
type span struct{ off, len int64 }

func (s span) end() int64 { return s.off + s.len }

// Where blkid reads on a device of zeros, by the probes that read there.
const (
	kib = int64(1) << 10
	// blankHead: the start of the device, up to 516 KiB. The boot sector
	// and the partition tables (MBR, GPT's primary header and entries,
	// BSD, Sun, SGI, Mac, ...), the superblocks blkid looks for near the
	// start (ext2/3/4 at 1 KiB, xfs at 0, btrfs at 64 KiB, bcache at 4
	// KiB, swap at the end of the first page for pages up to 64 KiB, ISO
	// 9660 and UDF's volume recognition at 32 KiB, ReiserFS at 64 KiB,
	// JFS at 32 KiB, UFS up to 256 KiB, LVM2's label in the first four
	// sectors, md 1.1 and 1.2 at 0 and 4 KiB, LUKS at 0 and LUKS2's
	// secondary header at 16 KiB to 512 KiB), and ZFS's first two labels
	// (256 KiB each, read whole). Nothing else below 1 MiB.
	blankHead = 516 * kib
	// blankFar is each of the places blkid reads beyond that: LUKS2's
	// secondary header at 1, 2 and 4 MiB, VMFS's volume at 1 MiB and its
	// filesystem at 2 MiB; a page each (blkid reads at most 1 KiB there).
	blankFar = 4 * kib
	// zfsLabel is the size of a ZFS label.
	zfsLabel = 256 * kib
	// blankTail: the end of the device. ZFS's last two labels (read
	// whole) end where the device's size rounded down to 256 KiB does,
	// so the tail starts 512 KiB before that, at most 768 KiB from the
	// end. md 0.90 (64 KiB aligned, in the last 128 KiB) and 1.0 (8 KiB
	// from the end), GPT's backup header (the last sector), DRBD,
	// NILFS2's second superblock, and the metadata of the firmware RAIDs
	// (DDF, Intel, LSI, NVIDIA, VIA, JMicron, Adaptec, Silicon Image,
	// HighPoint, and Promise's first twelve places) are all in the last
	// 512 KiB.
	blankTail = 2 * zfsLabel
	// blankPromise is how far from the end Promise FastTrack's farthest
	// metadata is: 3087 sectors of 512 bytes.
	blankPromise = 3087 * 512
)

// blankRegions returns where the blank check reads a device of size bytes:
// where blkid reads on a device of zeros (see above), each widened to 4
// KiB boundaries (O_DIRECT's alignment on any sector size) and clipped to
// the device, in order, overlaps merged.
func blankRegions(size int64) []span {
	tail := size&^(zfsLabel-1) - blankTail // where ZFS's third label starts
	reads := []span{
		{0, blankHead},
		{1 << 20, blankFar}, {2 << 20, blankFar}, {4 << 20, blankFar},
		{tail, size - tail},
		{size - blankPromise, 512},
	}
	var out []span
	for _, s := range reads {
		start := max(s.off, 0) &^ (4*kib - 1)
		end := min((s.end()+4*kib-1)&^(4*kib-1), size)
		if end > start {
			out = append(out, span{start, end - start})
		}
	}
	slices.SortFunc(out, func(a, b span) int { return int(a.off - b.off) })
	merged := out[:0]
	for _, s := range out {
		if n := len(merged); n > 0 && s.off <= merged[n-1].end() {
			merged[n-1].len = max(merged[n-1].end(), s.end()) - merged[n-1].off
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

// zeroed reports whether every byte of device blkid would read is zero,
// on one descriptor of it (openProbed): by its backing file's map when it
// is a loop device whose map can tell (loopdev.Zeroed: every byte is then
// zero, and nothing is read), else by reading where blkid would
// (zeroWhereBlkidLooksIn). A device of no size, or not a block device, is
// an error.
func zeroed(device string) (bool, error) {
	f, size, err := openProbed(device)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if zero, err := loopdev.Zeroed(f, size); err != nil || zero {
		return zero, err
	}
	return zeroWhereBlkidLooksIn(f, size)
}

// openProbed opens device for the blank check, bypassing the page cache
// when the device allows, and returns it with its size: a block device of
// non-zero size.
func openProbed(device string) (*os.File, int64, error) {
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		// Some devices refuse O_DIRECT; read through the page cache.
		f, err = os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, 0, err
	}
	size, err := blockSize(f)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, size, nil
}

// blockSize is the size of f, which must be a block device of non-zero
// size.
func blockSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !isBlock(fi) {
		return 0, fmt.Errorf("not a block device (%s)", fi.Mode().Type())
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, errors.New("the device has no size (nothing attached behind it?)")
	}
	return size, nil
}

// zeroWhereBlkidLooksIn reads the device f of size bytes where blkid would
// (blankRegions) and reports whether every byte there is zero. Reading it
// is also the proof that the device is readable at all: every region reads
// in full. A device blkid reads elsewhere (zoned, a CD-ROM) is not
// checked: (false, nil), blkid's to judge.
func zeroWhereBlkidLooksIn(f *os.File, size int64) (bool, error) {
	// Read the pieces at once, each into its own part of one buffer: on a
	// loop device bound with direct I/O (the local backend's) each read
	// waits for the loop's worker, and eight waits in turn cost twice
	// what they cost together. The pieces run from the end of the device
	// towards its start, in 256 KiB: whole regions read forward make the
	// kernel read ahead in a buffered loop device's backing file, and
	// cost two to five times as much there (docs/benchmarks.md).
	pieces := backwards(blankRegions(size), blankPiece)
	var total int64
	for _, p := range pieces {
		total += p.len
	}
	buf, err := takeBlankBuffer()
	if err != nil {
		return false, err
	}
	defer putBlankBuffer(buf)
	// Every piece is read, also after a byte that is not zero: the device
	// must be readable wherever blkid reads, or its "nothing found" is not
	// worth trusting either.
	errs := make([]error, len(pieces))
	var wg sync.WaitGroup
	at := int64(0)
	for i, p := range pieces {
		part := buf[at : at+p.len]
		at += p.len
		wg.Go(func() {
			if _, err := f.ReadAt(part, p.off); err != nil {
				errs[i] = fmt.Errorf("read %d bytes at %d: %w", p.len, p.off, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	zero := allZero(buf[:total])
	if !zero || blkidReadsElsewhere(f) {
		return false, nil
	}
	return true, nil
}

// The ioctls blkid asks a device's kind with (linux/blkzoned.h,
// linux/cdrom.h); golang.org/x/sys/unix lacks them.
const (
	ioctlBlkGetZoneSz       = 0x80041284 // BLKGETZONESZ: _IOR(0x12, 132, __u32)
	ioctlCDROMGetCapability = 0x5331     // CDROM_GET_CAPABILITY
)

// blkidReadsElsewhere reports whether blkid reads the device f beyond
// blankRegions, as it does on a zoned device (btrfs keeps its superblock
// in log zones) and on a CD-ROM (ISO 9660 in the last session). It asks
// as blkid does.
func blkidReadsElsewhere(f *os.File) bool {
	fd := int(f.Fd())
	if zone, err := unix.IoctlGetUint32(fd, ioctlBlkGetZoneSz); err == nil && zone != 0 {
		return true
	}
	_, err := unix.IoctlRetInt(fd, ioctlCDROMGetCapability)
	return err == nil
}

// blankPiece is the most the blank check reads at once.
const blankPiece = 256 * kib

// blankBufferSize is what the blank check reads of a device at most: its
// regions' pieces laid end to end (the head, three far pages, the tail and
// Promise's sector, each widened to 4 KiB).
const blankBufferSize = blankHead + 3*blankFar + blankTail + zfsLabel + 4*kib

// blankBuffers keeps the blank check's buffers between checks. A buffer is
// an anonymous mapping of blankBufferSize (page-aligned, as O_DIRECT
// requires), and a fresh one's pages fault in as the first read fills
// them: about a quarter of a check on a loop device bound with direct I/O.
// Two are kept (two checks at once); a third check maps a buffer of its
// own and unmaps it after.
var blankBuffers = make(chan []byte, 2)

// takeBlankBuffer returns a kept buffer, or maps one.
func takeBlankBuffer() ([]byte, error) {
	select {
	case b := <-blankBuffers:
		return b, nil
	default:
	}
	return unix.Mmap(-1, 0, int(blankBufferSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}

// putBlankBuffer keeps b for the next check, or unmaps it when two are
// kept already.
func putBlankBuffer(b []byte) {
	select {
	case blankBuffers <- b:
	default:
		_ = unix.Munmap(b)
	}
}

// backwards cuts the regions (in order, not overlapping) into pieces of at
// most piece bytes, the last piece of the last region first.
func backwards(regions []span, piece int64) []span {
	var out []span
	for _, r := range slices.Backward(regions) {
		for end := r.end(); end > r.off; end -= piece {
			start := max(end-piece, r.off)
			out = append(out, span{start, end - start})
		}
	}
	return out
}

// zeros is what allZero compares with.
var zeros [64 << 10]byte

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
