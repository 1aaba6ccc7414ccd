package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
)

// A disk's image is made by its first attach, at the disk's size then: a
// create makes none, a resize of a disk never attached grows its record
// alone, and a later attach keeps the image (and what was written to it).
// A delete removes the image when there is one.
func TestImageIsMadeByTheFirstAttach(t *testing.T) {
	ctx := context.Background()
	c := open(t, newDir(t), Options{})
	if err := c.RegisterNode(ctx, cloud.Node{ID: "node-a"}); err != nil {
		t.Fatal(err)
	}
	d := create(t, c, "pvc-1", 16*mib)
	img := c.s.imagePath(diskID(d.ID))
	noImage := func(when string) {
		t.Helper()
		if _, err := os.Lstat(img); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: image: %v, want none", when, err)
		}
	}
	noImage("after the create")

	if _, err := c.ResizeDisk(ctx, d.ID, 32*mib); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetDisk(ctx, d.ID); err != nil || got.SizeBytes != 32*mib {
		t.Fatalf("after the resize: %+v, %v; want 32 MiB", got, err)
	}
	noImage("after the resize of a disk never attached")

	if _, err := c.AttachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	first, err := os.Lstat(img)
	if err != nil || first.Size() != 32*mib {
		t.Fatalf("after the first attach: image %v, %v; want 32 MiB", first, err)
	}
	marker := []byte("written through the disk's device")
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(marker, 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	if _, err := c.DetachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	again, err := os.Lstat(img)
	if err != nil || !os.SameFile(first, again) || again.Size() != 32*mib {
		t.Fatalf("after the second attach: image %v, %v; want the first one, 32 MiB", again, err)
	}
	got := make([]byte, len(marker))
	if f, err := os.Open(img); err != nil {
		t.Fatal(err)
	} else {
		_, err = f.ReadAt(got, 4096)
		f.Close()
		if err != nil || !bytes.Equal(got, marker) {
			t.Fatalf("the image's content after the second attach: %q, %v; want %q", got, err, marker)
		}
	}

	if _, err := c.DetachDisk(ctx, d.ID, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteDisk(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	noImage("after the delete")
	checkInvariants(t, c.Dir())
}
