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
	extSuperOffset    = 1024
	extMagic          = 0xEF53
	extIncompat64Bit  = 0x80
	extOffBlocksLo    = 0x04
	extOffLogBlock    = 0x18
	extOffMagic       = 0x38
	extOffIncompat    = 0x60
	extOffBlocksHi    = 0x150
	extSuperBlockSize = 1024
)

// extSize reads the size in bytes of the ext2/3/4 filesystem on device from
// its superblock. It reads through the page cache, where a mounted ext
// filesystem keeps its superblock, so the size is current also while the
// filesystem is mounted (GrowFilesystem relies on that).
func extSize(device string) (int64, error) {
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, extSuperBlockSize)
	if _, err := f.ReadAt(sb, extSuperOffset); err != nil {
		return 0, fmt.Errorf("read the superblock of %s: %w", device, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[extOffMagic:]) != extMagic {
		return 0, fmt.Errorf("%s has no ext2/3/4 superblock", device)
	}
	logBlock := le.Uint32(sb[extOffLogBlock:])
	if logBlock > 6 { // blocks of 1 KiB to 64 KiB
		return 0, fmt.Errorf("%s: implausible block size 1024<<%d", device, logBlock)
	}
	blocks := uint64(le.Uint32(sb[extOffBlocksLo:]))
	if le.Uint32(sb[extOffIncompat:])&extIncompat64Bit != 0 {
		blocks |= uint64(le.Uint32(sb[extOffBlocksHi:])) << 32
	}
	return int64(blocks) << (10 + logBlock), nil
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

// growExtOffline grows the unmounted ext2/3/4 filesystem on device to fill
// the device, if the device is larger, and reports whether it did. resize2fs
// insists on a freshly checked filesystem, so e2fsck -f -p runs first; it
// repairs only what is safe to repair unattended and fails otherwise.
func (m *Linux) growExtOffline(ctx context.Context, device string) (bool, error) {
	if short, err := m.extShort(ctx, device); err != nil || !short {
		return false, err
	}
	if _, err := m.run(ctx, "e2fsck", "-f", "-p", device); err != nil {
		// 1: errors were corrected; 2: corrected, reboot advised (for a
		// mounted root, not for a volume).
		if code := exitCode(err); code != 1 && code != 2 {
			return false, fmt.Errorf("check %s before growing it (run e2fsck by hand): %w", device, err)
		}
	}
	if _, err := m.run(ctx, "resize2fs", device); err != nil {
		return false, fmt.Errorf("grow the filesystem of %s: %w", device, err)
	}
	return true, nil
}
