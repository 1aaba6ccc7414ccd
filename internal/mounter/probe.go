package mounter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// probeBytes is how much of a device the probe reads to prove it readable.
const probeBytes = 1 << 20

// Filesystem probes device and returns its filesystem type ("" when blank);
// see Mounter.
//
// blkid alone cannot be trusted with "blank": `blkid -p` exits 2 both when
// it finds no signature and when it cannot open or read the device (a
// missing device, a detached disk, an I/O error), and treating every exit 2
// as "unformatted" is how drivers have formatted over data. So the probe
// first proves the device readable itself: it must be a block device of
// non-zero size whose first MiB reads successfully, bypassing the page cache
// when the device allows. Only then does blkid's exit 2 mean blank. Any
// other failure is ErrProbeFailed.
//
// A partition table is reported as "partition table (<type>)", and a
// signature without a type as "unknown": neither is blank, and neither is a
// filesystem FormatAndMount would mount.
func (m *Linux) Filesystem(ctx context.Context, device string) (string, error) {
	if err := ValidatePath(device); err != nil {
		return "", err
	}
	if err := readable(device); err != nil {
		return "", fmt.Errorf("probe %s: %v: %w", device, err, ErrProbeFailed)
	}
	out, err := m.run(ctx, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", device)
	if err != nil {
		if exitCode(err) == 2 {
			return "", nil // nothing found on a device proven readable: blank
		}
		return "", fmt.Errorf("probe %s: %v: %w", device, err, ErrProbeFailed)
	}
	var fsType, ptType string
	for _, line := range strings.Split(string(out), "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch key {
		case "TYPE":
			fsType = value
		case "PTTYPE":
			ptType = value
		}
	}
	switch {
	case ptType != "":
		return "partition table (" + ptType + ")", nil
	case fsType != "":
		return fsType, nil
	default:
		return "unknown", nil
	}
}

// readable proves that device is a block device whose first MiB (or all of
// it, if smaller) can be read.
func readable(device string) error {
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		// Some devices refuse O_DIRECT; read through the page cache.
		f, err = os.OpenFile(device, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !isBlock(fi) {
		return fmt.Errorf("not a block device (%s)", fi.Mode().Type())
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if size <= 0 {
		return errors.New("the device has no size (nothing attached behind it?)")
	}
	// An anonymous mapping is page-aligned, as O_DIRECT requires.
	buf, err := unix.Mmap(-1, 0, probeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	n := min(size, probeBytes)
	if _, err := f.ReadAt(buf[:n], 0); err != nil {
		return fmt.Errorf("read the first %d bytes: %w", n, err)
	}
	return nil
}

// exitCode is the exit status carried by err, or -1.
func exitCode(err error) int {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return -1
}
