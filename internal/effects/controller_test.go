package effects_test

import (
	"context"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefusedAttachGetsItsCode: the cloud's refusals of an attach reach the
// caller with the code the CSI table gives (chosen by the engine from the
// cloud's sentinel errors) and a message that names the disk or node.
func TestRefusedAttachGetsItsCode(t *testing.T) {
	c := fake.New(fake.Options{})
	for _, n := range []cloud.Node{{ID: "node-1", MaxAttachments: 1}, {ID: "node-2"}} {
		if err := c.AddNode(n); err != nil {
			t.Fatal(err)
		}
	}
	k := newController(t, c)
	ctx := context.Background()

	create := func(name string) store.Volume { return k.must(createReq(name, 1<<30, nil)).Volume }
	publish := func(id, node string) error {
		_, err := k.submit(ctx, ops.Request{VolumeID: id, Event: fsm.ControllerPublish,
			Args: &ops.ControllerPublishArgs{Node: node, Capability: mountCap}})
		return err
	}
	a, b, drifted := create("a"), create("b"), create("drifted")
	if err := publish(a.ID, "node-1"); err != nil {
		t.Fatal(err)
	}
	// node-1 holds its one disk.
	err := publish(b.ID, "node-1")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "node node-1 cannot take another disk") {
		t.Errorf("attach beyond the node's limit: %v", err)
	}
	// The cloud has the disk attached elsewhere, behind csid's back.
	op, err := c.AttachDisk(ctx, drifted.DiskID, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	err = publish(drifted.ID, "node-1")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "attached to another node") {
		t.Errorf("attach of a disk attached elsewhere: %v", err)
	}
}

// TestResizeTag: a disk's resize-to tag is a target while its size is
// short of it, and reached once the size covers it; a tag that does not
// parse is no target and counts as reached (nothing can act on it); a disk
// without the tag has neither.
func TestResizeTag(t *testing.T) {
	for _, c := range []struct {
		tag         string // "-": no tag
		target      int64
		reached     bool
		description string
	}{
		{"-", 0, false, "no tag"},
		{"2048", 2048, false, "a target above the size"},
		{"1024", 0, true, "a target the size reaches"},
		{"512", 0, true, "a target below the size"},
		{"", 0, true, "a cleared tag"},
		{"lots", 0, true, "a tag that does not parse"},
	} {
		d := cloud.Disk{ID: "disk-1", SizeBytes: 1024, Tags: map[string]string{}}
		if c.tag != "-" {
			d.Tags[effects.TagResizeTo] = c.tag
		}
		if got := effects.ResizeTag(d); got != c.target {
			t.Errorf("%s: ResizeTag = %d, want %d", c.description, got, c.target)
		}
		if got := effects.ResizeTagReached(d); got != c.reached {
			t.Errorf("%s: ResizeTagReached = %v, want %v", c.description, got, c.reached)
		}
	}
}
