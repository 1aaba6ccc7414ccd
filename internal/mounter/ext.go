package mounter

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func isExt(fsType string) bool { return fsType == "ext4" || fsType == "ext3" }

// The ext2/3/4 superblock: 1024 bytes at offset 1024 of the device.
const (
	extSuperOffset     = 1024
	extSuperBlockSize  = 1024
	extMagic           = 0xEF53
	extOffBlocksLo     = 0x04
	extOffFirstData    = 0x14
	extOffLogBlock     = 0x18
	extOffPerGroup     = 0x20
	extOffMagic        = 0x38
	extOffCompat       = 0x5C
	extOffIncompat     = 0x60
	extOffUUID         = 0x68
	extOffReservedGDT  = 0xCE
	extOffDescSize     = 0xFE
	extOffBlocksHi     = 0x150
	extCompatResizeIno = 0x10
	extIncompatMetaBG  = 0x10
	extIncompat64Bit   = 0x80
)

// extSuper is what csid reads of an ext2/3/4 superblock.
type extSuper struct {
	blocks         uint64 // s_blocks_count
	blockSize      int64
	firstDataBlock uint64
	blocksPerGroup uint64
	reservedGDT    uint64 // descriptor blocks set aside for growth
	descSize       uint64 // bytes per group descriptor
	metaBG         bool
	uuid           [16]byte
}

// size is the filesystem's size in bytes.
func (s extSuper) size() int64 { return int64(s.blocks) * s.blockSize }

// UUID is the filesystem's UUID in its usual form; it survives a resize.
func (s extSuper) UUID() string {
	u := s.uuid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// readExtSuper reads the ext2/3/4 superblock of device. It reads through the
// page cache, where a mounted ext filesystem keeps its superblock, so the
// size is current also while the filesystem is mounted (GrowFilesystem
// relies on that). It does not verify the superblock's checksum: a growth
// killed while it rewrote the superblock leaves the checksum wrong, and the
// UUID is what finds the record of that growth.
func readExtSuper(device string) (extSuper, error) {
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return extSuper{}, err
	}
	defer f.Close()
	sb := make([]byte, extSuperBlockSize)
	if _, err := f.ReadAt(sb, extSuperOffset); err != nil {
		return extSuper{}, fmt.Errorf("read the superblock of %s: %w", device, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[extOffMagic:]) != extMagic {
		return extSuper{}, fmt.Errorf("%s has no ext2/3/4 superblock", device)
	}
	logBlock := le.Uint32(sb[extOffLogBlock:])
	if logBlock > 6 { // blocks of 1 KiB to 64 KiB
		return extSuper{}, fmt.Errorf("%s: implausible block size 1024<<%d", device, logBlock)
	}
	s := extSuper{
		blocks:         uint64(le.Uint32(sb[extOffBlocksLo:])),
		blockSize:      1024 << logBlock,
		firstDataBlock: uint64(le.Uint32(sb[extOffFirstData:])),
		blocksPerGroup: uint64(le.Uint32(sb[extOffPerGroup:])),
		reservedGDT:    uint64(le.Uint16(sb[extOffReservedGDT:])),
		descSize:       32,
		metaBG:         le.Uint32(sb[extOffIncompat:])&extIncompatMetaBG != 0,
	}
	if le.Uint32(sb[extOffCompat:])&extCompatResizeIno == 0 {
		s.reservedGDT = 0
	}
	if le.Uint32(sb[extOffIncompat:])&extIncompat64Bit != 0 {
		s.blocks |= uint64(le.Uint32(sb[extOffBlocksHi:])) << 32
		if d := uint64(le.Uint16(sb[extOffDescSize:])); d >= 32 {
			s.descSize = d
		}
	}
	if s.blocksPerGroup == 0 {
		return extSuper{}, fmt.Errorf("%s: implausible superblock (no blocks per group)", device)
	}
	copy(s.uuid[:], sb[extOffUUID:extOffUUID+16])
	return s, nil
}

// extSize reads the size in bytes of the ext2/3/4 filesystem on device.
func extSize(device string) (int64, error) {
	s, err := readExtSuper(device)
	if err != nil {
		return 0, err
	}
	return s.size(), nil
}

// extShort reports whether the ext2/3/4 filesystem on device is worth
// growing: at least one MiB smaller than the device. resize2fs may leave
// less than a block group's overhead unused, and a smaller remainder is not
// worth an e2fsck or a resize2fs.
func (m *Linux) extShort(ctx context.Context, device string) (bool, error) {
	fsBytes, err := extSize(device)
	if err != nil {
		return false, err
	}
	devBytes, err := m.DeviceSize(ctx, device)
	if err != nil {
		return false, err
	}
	return devBytes-fsBytes >= 1<<20, nil
}

// fitsReservedGDT reports whether growing the filesystem to newBytes needs
// no more group descriptor blocks than it has set aside for growth. Beyond
// that, an offline resize2fs relocates blocks and inode tables, and a kill
// in the middle of that can leave nothing for e2fsck to repair (measured:
// docs/operations.md, "Growing filesystems"). A meta_bg filesystem keeps
// its descriptors in the groups they describe, and always fits.
func (s extSuper) fitsReservedGDT(newBytes int64) bool {
	if s.metaBG {
		return true
	}
	perBlock := uint64(s.blockSize) / s.descSize
	descBlocks := func(blocks uint64) uint64 {
		groups := (blocks - s.firstDataBlock + s.blocksPerGroup - 1) / s.blocksPerGroup
		return (groups + perBlock - 1) / perBlock
	}
	newBlocks := uint64(newBytes / s.blockSize)
	return descBlocks(newBlocks) <= descBlocks(s.blocks)+s.reservedGDT
}
