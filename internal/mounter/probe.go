package mounter

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Filesystem probes device and returns its filesystem type ("" when blank);
// see Mounter.
//
// blkid alone cannot be trusted with "blank": `blkid -p` exits 2 both when
// it finds no signature and when it cannot open or read the device (a
// missing device, a detached disk, an I/O error), and treating every exit 2
// as "unformatted" is how drivers have formatted over data. So the probe
// first proves what the device holds itself, on one descriptor (blank.go):
// it must be a block device of non-zero size; a loop device whose backing
// file has no data in the range it maps is all zeros by the file system's
// map of that file, and nothing is read; any other device must read
// successfully wherever blkid would read it, bypassing the page cache when
// the device allows. Either way, when every byte blkid would read is zero,
// the device is blank, and blkid is not run: it could find nothing
// (blank.go says why). Otherwise blkid decides, and its exit 2 means
// blank. Any other failure is ErrProbeFailed.
//
// A partition table is reported as "partition table (<type>)", and a
// signature without a type as "unknown": neither is blank, and neither is a
// filesystem FormatAndMount would mount.
func (m *Linux) Filesystem(ctx context.Context, device string) (string, error) {
	if err := ValidatePath(device); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	zero, err := zeroed(device)
	if err != nil {
		return "", fmt.Errorf("probe %s: %v: %w", device, err, ErrProbeFailed)
	}
	if zero {
		return "", nil
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

// exitCode is the exit status carried by err, or -1.
func exitCode(err error) int {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return -1
}
