package mounter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/csid-dev/csid/internal/crash"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// An offline growth of ext2/3/4 (e2fsck -f -p, then resize2fs on the
// unmounted device) is not atomic: resize2fs marks the filesystem as having
// errors when it starts and rewrites superblocks, descriptors and the
// resize inode in place, and a kill in the middle (the node plugin's
// container dies, the node loses power) leaves a filesystem that e2fsck -p
// refuses to repair unattended ("UNEXPECTED INCONSISTENCY; RUN fsck
// MANUALLY"). So the mounter records that a growth started before running
// anything, and finds that record again the next time it is asked to mount
// the filesystem: it then runs the repair e2fsprogs prescribes for an
// interrupted resize, a full e2fsck answering yes, before growing again.
//
// A record is a small JSON file named after the filesystem's UUID (which a
// resize never changes, whatever the device is called after a reattach) in
// the mounter's grow directory, written and removed durably (fsync of the
// file and of the directory). The repair runs only for a filesystem that
// has a record: csid answers e2fsck's questions only for damage it may have
// caused itself. Two filesystems with one UUID (a cloned disk) share a
// record; the other is repaired only if e2fsck -p refuses it too.

// growRecord is the record of an offline growth in progress.
type growRecord struct {
	UUID      string    `json:"uuid"`
	Device    string    `json:"device"`
	FromBytes int64     `json:"fromBytes"`
	ToBytes   int64     `json:"toBytes"`
	Started   time.Time `json:"started"`
}

// growRecords is the directory of growth records ("": none; such a
// mounter does not grow offline).
type growRecords struct{ dir string }

func (g growRecords) path(uuid string) string { return filepath.Join(g.dir, uuid+".json") }

// load returns the record of the filesystem with uuid, or nil.
func (g growRecords) load(uuid string) (*growRecord, error) {
	if g.dir == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(g.path(uuid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the growth record of filesystem %s: %w", uuid, err)
	}
	var r growRecord
	if err := json.Unmarshal(raw, &r); err != nil || r.UUID != uuid {
		// A torn record is impossible (it is renamed into place); a
		// damaged one still says that a growth started.
		return &growRecord{UUID: uuid}, nil
	}
	return &r, nil
}

// put records r durably: the record is complete on disk, under its final
// name, before put returns.
func (g growRecords) put(r growRecord) error {
	if err := os.MkdirAll(g.dir, 0o700); err != nil {
		return fmt.Errorf("growth records: %w", err)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(g.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("record the growth of filesystem %s: %w", r.UUID, err)
	}
	defer os.Remove(tmp.Name()) // nothing left once renamed
	_, err = tmp.Write(raw)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), g.path(r.UUID))
	}
	if err == nil {
		err = syncDir(g.dir)
	}
	if err != nil {
		return fmt.Errorf("record the growth of filesystem %s: %w", r.UUID, err)
	}
	return nil
}

// remove deletes the record of uuid durably. A missing record is success.
func (g growRecords) remove(uuid string) error {
	if g.dir == "" {
		return nil
	}
	err := os.Remove(g.path(uuid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = syncDir(g.dir)
	}
	if err != nil {
		return fmt.Errorf("clear the growth record of filesystem %s: %w", uuid, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// growExtBeforeMount prepares the unmounted ext2/3/4 filesystem on device
// for its mount: it repairs what an interrupted offline growth left, and,
// if grow is set (a read-write mount), grows the filesystem offline to the
// size of the device, or leaves it for GrowFilesystem to grow online after
// the mount. It reports whether it grew the filesystem.
//
// The kernel journals an online growth, so a kill in the middle of one
// leaves a consistent filesystem: where this process may grow ext4 online
// (CAP_SYS_RESOURCE), the filesystem is mounted as it is and grown after.
// An interrupted offline growth is repaired first in any case: mounting a
// filesystem resize2fs left half-done is never safe.
func (m *Linux) growExtBeforeMount(ctx context.Context, device string, grow bool) (bool, error) {
	sb, err := readExtSuper(device)
	if err != nil {
		return false, err
	}
	rec, err := m.grow.load(sb.UUID())
	if err != nil {
		return false, err
	}
	if rec != nil {
		if err := m.repairInterruptedGrowth(ctx, device, rec); err != nil {
			return false, err
		}
		// The repair may have rewritten the superblock.
		if sb, err = readExtSuper(device); err != nil {
			return false, err
		}
	}
	if !grow || rec == nil && m.onlineExt {
		return false, nil
	}
	return m.growExtOffline(ctx, device, sb, rec != nil)
}

// growExtOffline grows the unmounted filesystem on device to fill it, if
// the device is larger, and reports whether it did. resize2fs insists on a
// freshly checked filesystem, so e2fsck -f -p runs first; it repairs only
// what is safe to repair unattended. recorded says a record of a growth of
// this filesystem exists already (an interrupted growth, now repaired).
func (m *Linux) growExtOffline(ctx context.Context, device string, sb extSuper, recorded bool) (bool, error) {
	devBytes, err := m.DeviceSize(ctx, device)
	if err != nil {
		return false, err
	}
	uuid := sb.UUID()
	if devBytes-sb.size() < 1<<20 { // see extShort
		if recorded {
			return false, m.grow.remove(uuid) // the growth had finished
		}
		return false, nil
	}
	if m.grow.dir == "" {
		return false, fmt.Errorf("grow the filesystem of %s offline: this mounter has no directory for growth records", device)
	}
	if !sb.fitsReservedGDT(devBytes) {
		return false, fmt.Errorf("grow the filesystem of %s from %d to %d bytes: that needs more group descriptor blocks than it reserved for growth, "+
			"which resize2fs does offline by moving inode tables, where a crash can leave nothing to repair; "+
			"grow it online (csid does when it has CAP_SYS_RESOURCE) or by hand with resize2fs after a backup", device, sb.size(), devBytes)
	}
	if !recorded {
		// Recorded before e2fsck runs: a kill while e2fsck rewrites the
		// superblock leaves its checksum wrong.
		r := growRecord{UUID: uuid, Device: device, FromBytes: sb.size(), ToBytes: devBytes, Started: time.Now().UTC()}
		if err := m.grow.put(r); err != nil {
			return false, err
		}
		crash.Point(crash.MounterGrowRecorded)
	}
	if _, err := m.run(ctx, "e2fsck", "-f", "-p", device); err != nil {
		// 1: errors were corrected; 2: corrected, reboot advised (for a
		// mounted root, not for a volume).
		if code := exitCode(err); code != 1 && code != 2 {
			if !recorded && code > 0 {
				// Not csid's doing: the filesystem was damaged before
				// this growth touched it.
				err = errors.Join(err, m.grow.remove(uuid))
			}
			return false, fmt.Errorf("check %s before growing it (run e2fsck by hand): %w", device, err)
		}
	}
	if _, err := m.run(ctx, "resize2fs", device); err != nil {
		// The record stays: the next mount repairs what resize2fs left.
		return false, fmt.Errorf("grow the filesystem of %s: %w", device, err)
	}
	crash.Point(crash.MounterAfterResize)
	return true, m.grow.remove(uuid)
}

// repairInterruptedGrowth repairs the filesystem on device after a growth
// that was recorded and never finished. A filesystem e2fsck -p finds clean
// (or repairs) needs nothing more; otherwise e2fsck -f -y repairs it, which
// is what e2fsprogs prescribes after an interrupted resize2fs and what
// leaves every measured interruption clean with its data intact. The record
// stays until the growth completes.
func (m *Linux) repairInterruptedGrowth(ctx context.Context, device string, rec *growRecord) error {
	log := zerolog.Ctx(ctx)
	log.Warn().Str("device", device).Str("uuid", rec.UUID).Time("started", rec.Started).
		Msg("an earlier growth of this filesystem did not finish; checking it")
	_, err := m.run(ctx, "e2fsck", "-f", "-p", device)
	if code := exitCode(err); err == nil || code == 1 || code == 2 {
		return nil
	} else if code < 0 {
		return fmt.Errorf("check %s after an interrupted growth: %w", device, err)
	}
	log.Warn().Str("device", device).Str("uuid", rec.UUID).Err(err).
		Msg("repairing the filesystem an interrupted growth left inconsistent (e2fsck -f -y)")
	_, err = m.run(ctx, "e2fsck", "-f", "-y", device)
	if code := exitCode(err); err != nil && code != 1 && code != 2 {
		return fmt.Errorf("repair %s after an interrupted growth (record %s): e2fsck -f -y could not: %w",
			device, m.grow.path(rec.UUID), err)
	}
	return nil
}
