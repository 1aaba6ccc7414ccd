package drill

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// MarkerBlock is the size of a marker: one block, written and read with
// O_DIRECT, so that no page cache stands between the reader and the disk
// (a device's cache could outlive the disk it was bound to).
const MarkerBlock = 4096

const markerPrefix = "csid-marker "

// marker is the block a volume's pod writes at the start of each block of
// its device: unique to the volume.
func marker(volumeID string) []byte {
	b := bytes.Repeat([]byte{'.'}, MarkerBlock)
	copy(b, markerPrefix+volumeID+"\n")
	return b
}

// alignedBlocks is a page-aligned buffer of n blocks, as O_DIRECT wants;
// free releases it.
func alignedBlocks(n int) (buf []byte, free func(), err error) {
	buf, err = unix.Mmap(-1, 0, n*MarkerBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return buf, func() { _ = unix.Munmap(buf) }, nil
}

// WriteMarker writes blocks blocks of the volume's marker at the start of
// path (a raw block volume's target, or a device), and syncs them.
func WriteMarker(path, volumeID string, blocks int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf, free, err := alignedBlocks(blocks)
	if err != nil {
		return err
	}
	defer free()
	for off := 0; off < len(buf); off += MarkerBlock {
		copy(buf[off:], marker(volumeID))
	}
	if _, err := f.Write(buf); err != nil {
		return fmt.Errorf("write the marker of %s to %s: %w", volumeID, path, err)
	}
	return f.Sync()
}

// ReadMarker reads the first block of path and returns the volume id of
// the marker it holds, "" when it holds none.
func ReadMarker(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf, free, err := alignedBlocks(1)
	if err != nil {
		return "", err
	}
	defer free()
	if _, err := f.ReadAt(buf, 0); err != nil {
		return "", fmt.Errorf("read the marker at %s: %w", path, err)
	}
	line, _, _ := bytes.Cut(buf, []byte{'\n'})
	id, ok := strings.CutPrefix(string(line), markerPrefix)
	if !ok {
		return "", nil
	}
	return id, nil
}
