package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
)

// The first Open after a crash of the machine redoes what the journaled
// calls that returned did and the crash lost: the crash is a copy of the
// state directory, taken while its process runs, from which what a crash
// can take (changes made without an fsync) is then taken by hand. Changes
// that were fsynced (a tag update) stay as they are.
func TestReplayRedoesWhatTheCrashLost(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	c := open(t, dir, Options{})
	a := create(t, c, "a", 8*mib)
	if _, err := c.UpdateDiskTags(ctx, a.ID, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	b := create(t, c, "b", 8*mib)
	bRecord, err := os.ReadFile(c.s.recordPath(diskID(b.ID)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteDisk(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	d := create(t, c, "d", 8*mib)

	crashed := filepath.Join(t.TempDir(), "state")
	if out, err := exec.Command("cp", "-a", dir, crashed).CombinedOutput(); err != nil {
		t.Fatalf("copy the state directory: %v: %s", err, out)
	}
	s := newState(crashed)
	// a's name entry never reached the device;
	if err := os.Remove(s.namePath(nameHash("a"))); err != nil {
		t.Fatal(err)
	}
	// b's removal did not either: its record and name entry are back;
	if err := os.WriteFile(s.recordPath(diskID(b.ID)), bRecord, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(s.recordPath(diskID(b.ID)), s.namePath(nameHash("b"))); err != nil {
		t.Fatal(err)
	}
	// d's record file, a spare rewritten in place, holds zeros.
	if err := os.WriteFile(s.recordPath(diskID(d.ID)), make([]byte, 300), 0o600); err != nil {
		t.Fatal(err)
	}

	c2, err := Open(ctx, crashed, Options{bootID: "the next boot"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got, err := c2.GetDisk(ctx, a.ID)
	if err != nil || got.Tags["k"] != "v" {
		t.Errorf("disk a after the replay: %+v, %v; want it with its tag", got, err)
	}
	if op, err := c2.CreateDisk(ctx, cloud.DiskSpec{Name: "a", SizeBytes: 8 * mib}); err != nil || op.DiskID != a.ID {
		t.Errorf("create a again after the replay: %+v, %v; want %s", op, err, a.ID)
	}
	if _, err := c2.GetDisk(ctx, b.ID); !errors.Is(err, cloud.ErrNotFound) {
		t.Errorf("deleted disk b after the replay: %v, want not found", err)
	}
	if op, err := c2.CreateDisk(ctx, cloud.DiskSpec{Name: "b", SizeBytes: 8 * mib}); err != nil || op.DiskID == b.ID {
		t.Errorf("create b again after the replay: %+v, %v; want a new disk", op, err)
	}
	if got, err := c2.GetDisk(ctx, d.ID); err != nil || got.Name != "d" {
		t.Errorf("disk d after the replay: %+v, %v", got, err)
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, crashed)
	if left, err := os.ReadDir(s.journal); err != nil || len(left) != 0 {
		t.Errorf("journals after the replay and a close: %v, %v", left, err)
	}
}

// A journal is replayed by the first Open of another boot only: a journal
// of this boot whose process is gone (killed) is made durable and removed,
// and its intents are not redone (a call it never finished is not).
func TestJournalOfThisBootIsNotReplayed(t *testing.T) {
	dir := newDir(t)
	c := open(t, dir, Options{})
	create(t, c, "keep", 8*mib)
	// A journal a killed process of this boot left, holding the intent of
	// a create it never made.
	lost := cloud.Disk{ID: string(newDiskID()), Name: "lost", SizeBytes: 8 * mib, Zone: DefaultZone}
	head, _ := json.Marshal(journalHeader{Magic: journalMagic, Boot: c.s.boot})
	line, _ := json.Marshal(intent{Op: newOpID(c.opts.now()), Kind: intentCreate, ID: diskID(lost.ID), Disk: &lost})
	path := filepath.Join(c.s.journal, "op-000000000000000000000000"+journalSuffix)
	if err := os.WriteFile(path, append(append(head, '\n'), append(line, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, dir, Options{})
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed process's journal after Open: %v, want it removed", err)
	}
	if _, err := c2.GetDisk(context.Background(), lost.ID); !errors.Is(err, cloud.ErrNotFound) {
		t.Errorf("the disk of an unfinished create: %v, want not found", err)
	}
}
