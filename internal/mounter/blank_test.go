package mounter

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// TestBlankRegionsCoverBlkid holds the blank check to its premise (see
// blank.go): on a device of zeros, blkid -p reads nowhere but in
// blankRegions, and finds nothing. It runs the installed blkid with
// readshim (testdata/readshim.c, built with gcc and preloaded), which
// records every read of a block device, on devices of zeros of many sizes
// and both sector sizes. A blkid that reads elsewhere fails it: the
// regions must then grow before csid trusts the check with that blkid.
func TestBlankRegionsCoverBlkid(t *testing.T) {
	testutil.RequireRoot(t)
	shim := buildReadShim(t)
	sizes := []int64{
		600 * kib, mib, 3 * mib, 8 * mib, 16 * mib, 64 * mib,
		64*mib + 512, 64*mib + 100*kib, // not a multiple of ZFS's 256 KiB labels
		1 << 30, 10<<30 + 4*kib, 2 << 40,
	}
	for _, sector := range []int{512, 4096} {
		for _, size := range sizes {
			if size%int64(sector) != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%d-%d", size, sector), func(t *testing.T) {
				sb := newSandbox(t)
				dev := sb.device(size)
				setSectorSize(t, dev, sector)
				reads, code := blkidReads(t, shim, dev)
				if code != 2 {
					t.Fatalf("blkid -p of a device of zeros exited %d, want 2 (nothing found)", code)
				}
				if !slices.ContainsFunc(reads, func(r span) bool { return r.off == 0 }) {
					t.Fatalf("the shim recorded %v, nothing at 0: not blkid's reads", reads)
				}
				regions := blankRegions(size)
				for _, r := range reads {
					if !within(regions, r) {
						t.Errorf("blkid read %d bytes at %d (%d from the end), outside the blank check's regions %v",
							r.len, r.off, size-r.off, regions)
					}
				}
			})
		}
	}
}

// TestBlankCheckReadsEveryRegion holds the check to the other half of its
// premise: it judges every byte of blankRegions. A device of zeros but for
// one byte, the first or the last of any 4 KiB page of a region, is not
// blank (so, with TestBlankRegionsCoverBlkid, a byte that is not zero
// anywhere blkid reads leaves the device to blkid).
func TestBlankCheckReadsEveryRegion(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	for _, size := range []int64{600 * kib, 64*mib + 100*kib} {
		dev := sb.device(size)
		if zero, err := zeroWhereBlkidLooks(dev); err != nil || !zero {
			t.Fatalf("%d bytes of zeros: zeroWhereBlkidLooks = %v, %v; want true", size, zero, err)
		}
		for _, r := range blankRegions(size) {
			for page := r.off; page < r.end(); page += 4 * kib {
				for _, off := range []int64{page, min(page+4*kib, r.end()) - 1} {
					writeDevice(t, dev, off, []byte{1})
					zero, err := zeroWhereBlkidLooks(dev)
					writeDevice(t, dev, off, []byte{0})
					if err != nil || zero {
						t.Errorf("%d bytes, one not zero at %d (region %v): zeroWhereBlkidLooks = %v, %v; want false",
							size, off, r, zero, err)
					}
				}
			}
		}
	}
}

// zeroWhereBlkidLooks is the read check alone, on a descriptor of its own
// (the tests' and the benchmark's: the probe goes through zeroed).
func zeroWhereBlkidLooks(device string) (bool, error) {
	f, size, err := openProbed(device)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return zeroWhereBlkidLooksIn(f, size)
}

// zeroByMap reports what the map check alone says of dev.
func zeroByMap(t *testing.T, dev string) bool {
	t.Helper()
	f, size, err := openProbed(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zero, err := loopdev.Zeroed(f, size)
	if err != nil {
		t.Fatal(err)
	}
	return zero
}

// TestBlankBufferHoldsEveryRegion: the kept buffer holds what the check
// reads of any device, from one sector to 16 TiB.
func TestBlankBufferHoldsEveryRegion(t *testing.T) {
	for size := int64(512); size <= 16<<40; size = size*3 + 4096 {
		var total int64
		for _, p := range backwards(blankRegions(size), blankPiece) {
			total += p.len
		}
		if total > blankBufferSize {
			t.Fatalf("a device of %d bytes: the check reads %d bytes, the buffer holds %d", size, total, blankBufferSize)
		}
	}
}

// buildReadShim compiles testdata/readshim.c.
func buildReadShim(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("gcc is needed (.ci/run installs it): %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	shim := filepath.Join(t.TempDir(), "readshim.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-o", shim,
		filepath.Join(filepath.Dir(file), "testdata", "readshim.c"), "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build the shim: %v\n%s", err, out)
	}
	return shim
}

// blkidReads runs blkid -p on dev as the probe does, with the shim, and
// returns where it read dev and its exit status.
func blkidReads(t *testing.T, shim, dev string) ([]span, int) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "reads")
	cmd := exec.Command("blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+shim, "SHIM_READS="+log)
	code := 0
	if out, err := cmd.CombinedOutput(); err != nil {
		if code = exitCode(err); code < 0 {
			t.Fatalf("blkid: %v: %s", err, out)
		}
	}
	f, err := os.Open(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil, code
	} else if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reads []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		off, n, _ := strings.Cut(sc.Text(), " ")
		o, err1 := strconv.ParseInt(off, 10, 64)
		l, err2 := strconv.ParseInt(n, 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("shim log %q: %v", sc.Text(), err)
		}
		reads = append(reads, span{o, l})
	}
	return reads, code
}

// within reports whether r lies in one of regions.
func within(regions []span, r span) bool {
	for _, g := range regions {
		if r.off >= g.off && r.end() <= g.end() {
			return true
		}
	}
	return false
}

// setSectorSize gives the loop device dev sectors of n bytes.
func setSectorSize(t *testing.T, dev string, n int) {
	t.Helper()
	if n == 512 {
		return
	}
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_BLOCK_SIZE, n); err != nil {
		t.Fatal(err)
	}
	if got, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err != nil || got != n {
		t.Fatalf("sector size %d, %v; want %d", got, err, n)
	}
}

// A blank device is formatted without blkid: the check proves it blank,
// by the backing file's map when the image is all holes, and by reading
// where blkid reads when the image has data the map cannot see into (zeros
// written over the places blkid reads first and last).
func TestBlankDeviceIsFormattedWithoutBlkid(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	ctx := context.Background()
	for _, size := range []int64{600 * kib, 64 * mib, 64*mib + 100*kib} {
		for _, written := range []bool{false, true} {
			rec := &recorder{}
			m := newLinux(rec.run)
			dev := sb.device(size)
			if written {
				writeDevice(t, dev, 0, make([]byte, 4*kib))
				writeDevice(t, dev, size-4*kib, make([]byte, 4*kib))
			}
			if byMap := zeroByMap(t, dev); byMap == written {
				t.Fatalf("%d bytes, zeros written %v: zero by the map %v", size, written, byMap)
			}
			if got, err := m.Filesystem(ctx, dev); err != nil || got != "" {
				t.Fatalf("%d bytes, zeros written %v: Filesystem of a blank device = %q, %v; want blank", size, written, got, err)
			}
			if rec.ranProgram("blkid") {
				t.Fatalf("%d bytes, zeros written %v: blkid ran on a blank device", size, written)
			}
		}
	}
	rec := &recorder{}
	m := newLinux(rec.run)
	dev := sb.device(64 * mib)
	if _, err := m.FormatAndMount(ctx, dev, sb.path("staging"), "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if !rec.formatted() || rec.ranProgram("blkid") {
		t.Fatalf("FormatAndMount of a blank device ran %v; want mkfs and no blkid", rec.ran)
	}
}

// A device with any signature blkid knows, wherever blkid looks for it, is
// never formatted over: the blank check leaves it to blkid, which names
// it, and FormatAndMount refuses to format or mount it as another
// filesystem. Bytes that are no signature leave it blank, as blkid says.
func TestSignaturesAreNeverFormattedOver(t *testing.T) {
	testutil.RequireRoot(t)
	size := 64 * mib
	cases := []struct {
		name string
		size int64
		make func(t *testing.T, dev string)
		want string // what Filesystem says; "" for blank
	}{
		{"ext4", size, tool("mkfs.ext4", "-q"), "ext4"},
		{"xfs", fsSizes["xfs"], tool("mkfs.xfs", "-q"), "xfs"},
		{"swap", size, tool("mkswap"), "swap"},
		{"dos partition table", size, writeMBR, "partition table (dos)"},
		{"gpt", size, func(t *testing.T, dev string) { writeGPT(t, dev, true) }, "partition table (gpt)"},
		{"gpt, its backup header alone", size, func(t *testing.T, dev string) { writeGPT(t, dev, false) }, "partition table (gpt)"},
		{"LUKS1", size, at(0, append([]byte("LUKS\xba\xbe"), 0, 1)), "crypto_LUKS"},
		{"LUKS2's secondary header at 4 MiB", size, luks2Secondary(4 << 20), "crypto_LUKS"},
		{"VMFS at 2 MiB", size, at(2<<20, []byte("\x5e\xf1\xab\x2f")), "VMFS"},
		{"ZFS uberblocks in its third label", size, zfsLabel2, "zfs_member"},
		{"Promise FastTrack, 3087 sectors from the end", size,
			func(t *testing.T, dev string) { at(size-3087*512, []byte("Promise Technology, Inc."))(t, dev) },
			"promise_fasttrack_raid_member"},
		{"bytes that are no signature", size, at(100*kib, []byte{0xff}), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb := newSandbox(t)
			ctx := context.Background()
			dev := sb.device(tc.size)
			tc.make(t, dev)
			before := deviceSum(t, dev)
			rec := &recorder{}
			m := newLinux(rec.run)
			got, err := m.Filesystem(ctx, dev)
			if err != nil || got != tc.want {
				t.Fatalf("Filesystem = %q, %v; want %q", got, err, tc.want)
			}
			if !rec.ranProgram("blkid") {
				t.Fatal("the blank check judged a device that is not all zeros where blkid looks")
			}
			if tc.want == "" {
				return // blkid's blank, formatted as ever
			}
			asked := map[bool]string{true: "xfs", false: "ext4"}[tc.want == "ext4"]
			target := sb.path("staging")
			if _, err := m.FormatAndMount(ctx, dev, target, asked, nil, nil); !errors.Is(err, ErrFormatMismatch) {
				t.Fatalf("FormatAndMount as %s: %v; want ErrFormatMismatch", asked, err)
			}
			if rec.formatted() {
				t.Fatal("mkfs ran on a device that holds a signature")
			}
			if mounted, _ := m.IsMounted(ctx, target); mounted {
				t.Fatal("a device holding a signature was mounted as another filesystem")
			}
			if deviceSum(t, dev) != before {
				t.Fatal("the device's content changed")
			}
		})
	}
}

// tool makes a signature by running a program on the device.
func tool(name string, args ...string) func(*testing.T, string) {
	return func(t *testing.T, dev string) {
		t.Helper()
		if out, err := exec.Command(name, append(args, dev)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", name, err, out)
		}
	}
}

// at writes b at off.
func at(off int64, b []byte) func(*testing.T, string) {
	return func(t *testing.T, dev string) {
		t.Helper()
		writeDevice(t, dev, off, b)
	}
}

func writeDevice(t *testing.T, dev string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// deviceSize returns the size of the block device dev.
func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	size, err := New().DeviceSize(context.Background(), dev)
	if err != nil {
		t.Fatal(err)
	}
	return size
}

// deviceSum hashes all of dev.
func deviceSum(t *testing.T, dev string) [32]byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// luks2Secondary writes a LUKS2 secondary header alone at off (its primary
// wiped, as blkid looks for it then).
func luks2Secondary(off int64) func(*testing.T, string) {
	return func(t *testing.T, dev string) {
		t.Helper()
		h := make([]byte, 512)
		copy(h, "SKUL\xba\xbe")
		binary.BigEndian.PutUint16(h[6:], 2)
		binary.BigEndian.PutUint64(h[256:], uint64(off)) // hdr_offset: where it is
		writeDevice(t, dev, off, h)
	}
}

// zfsLabel2 writes four uberblocks into the uberblock ring of ZFS's third
// label, the farthest from the end blkid reads.
func zfsLabel2(t *testing.T, dev string) {
	t.Helper()
	size := deviceSize(t, dev)
	label := size&^(zfsLabel-1) - 2*zfsLabel
	for i := range int64(4) {
		ub := make([]byte, 8)
		binary.LittleEndian.PutUint64(ub, 0x00bab10c)
		writeDevice(t, dev, label+128*kib+i*kib, ub)
	}
}

// writeMBR writes a DOS partition table with one Linux partition.
func writeMBR(t *testing.T, dev string) {
	t.Helper()
	mbr := make([]byte, 512)
	e := mbr[446:]
	e[4] = 0x83 // Linux
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], 4096)
	mbr[510], mbr[511] = 0x55, 0xaa
	writeDevice(t, dev, 0, mbr)
}

// writeGPT writes a GPT with one partition: the protective MBR, the
// primary header and entries (only if primary), and the backup entries
// and header at the end.
func writeGPT(t *testing.T, dev string, primary bool) {
	t.Helper()
	const sector = 512
	last := uint64(deviceSize(t, dev)/sector - 1)
	pmbr := make([]byte, sector)
	e := pmbr[446:]
	e[4] = 0xee
	binary.LittleEndian.PutUint32(e[8:], 1)
	binary.LittleEndian.PutUint32(e[12:], uint32(min(last, 0xffffffff)))
	pmbr[510], pmbr[511] = 0x55, 0xaa
	writeDevice(t, dev, 0, pmbr)

	entries := make([]byte, 128*128)
	copy(entries[0:], []byte{0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4}) // Linux filesystem
	copy(entries[16:], "csid-test-part-1")                                                                                    // unique GUID
	binary.LittleEndian.PutUint64(entries[32:], 2048)
	binary.LittleEndian.PutUint64(entries[40:], 4095)
	header := func(self, other, table uint64) []byte {
		h := make([]byte, sector)
		copy(h, "EFI PART")
		binary.LittleEndian.PutUint32(h[8:], 0x00010000)
		binary.LittleEndian.PutUint32(h[12:], 92)
		binary.LittleEndian.PutUint64(h[24:], self)
		binary.LittleEndian.PutUint64(h[32:], other)
		binary.LittleEndian.PutUint64(h[40:], 34)
		binary.LittleEndian.PutUint64(h[48:], last-33)
		copy(h[56:], "csid-test-disk-1")
		binary.LittleEndian.PutUint64(h[72:], table)
		binary.LittleEndian.PutUint32(h[80:], 128)
		binary.LittleEndian.PutUint32(h[84:], 128)
		binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
		binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
		return h
	}
	if primary {
		writeDevice(t, dev, sector, header(1, last, 2))
		writeDevice(t, dev, 2*sector, entries)
	}
	writeDevice(t, dev, int64(last-32)*sector, entries)
	writeDevice(t, dev, int64(last)*sector, header(last, 1, last-32))
}
