package app

import (
	"context"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
	"github.com/csid-dev/csid/internal/driver"
)

// A node on Yandex without --node-id takes it from the instance metadata
// service; given, it is kept, and the service is not asked (the test's
// service would answer another id); a controller asks nothing. The zone is
// never looked up: it is left as given (NodeGetInfo reports the
// instance's zone from the Compute API).
func TestYandexNodeFromMetadata(t *testing.T) {
	f, err := yandexfake.Start(context.Background(), yandexfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	md := f.MetadataServer("fhmnode0000000000001", "ru-central1-b", f.FolderID())
	ctx := context.Background()
	for _, tc := range []struct {
		mode             driver.Mode
		nodeID, zone     string
		wantID, wantZone string
	}{
		{driver.ModeNode, "", "", "fhmnode0000000000001", ""},
		{driver.ModeAll, "", "", "fhmnode0000000000001", ""},
		{driver.ModeNode, "", "zone-given", "fhmnode0000000000001", "zone-given"},
		{driver.ModeNode, "given", "", "given", ""},
		{driver.ModeController, "", "", "", ""},
	} {
		o := Options{Cloud: "yandex", Mode: tc.mode, NodeID: tc.nodeID, Zone: tc.zone, Yandex: YandexOptions{MetadataURL: md.URL}}
		if err := o.yandexNode(ctx); err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if o.NodeID != tc.wantID || o.Zone != tc.wantZone {
			t.Errorf("%s with node %q, zone %q: got %q, %q; want %q, %q", tc.mode, tc.nodeID, tc.zone, o.NodeID, o.Zone, tc.wantID, tc.wantZone)
		}
	}
	// No metadata service: a node without --node-id cannot start, and says
	// why; one with --node-id needs none.
	o := Options{Cloud: "yandex", Mode: driver.ModeNode, Yandex: YandexOptions{MetadataURL: "http://127.0.0.1:1"}}
	if err := o.yandexNode(ctx); err == nil {
		t.Fatalf("no metadata service: node id %q, want an error", o.NodeID)
	}
	o.NodeID = "given"
	if err := o.yandexNode(ctx); err != nil {
		t.Fatalf("no metadata service, --node-id given: %v, want no lookup", err)
	}
}

// The loop-file identity stand-in is refused unless the endpoint is a
// plaintext fake: on a real cloud's node only the virtio serial proves a
// disk.
func TestLoopSerialNeedsAFakeAPI(t *testing.T) {
	f, err := yandexfake.Start(context.Background(), yandexfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	o := Options{Cloud: "yandex", Mode: driver.ModeNode, NodeID: "fhmnode0000000000001", StateDir: t.TempDir(),
		Yandex: YandexOptions{Endpoint: f.Endpoint(), FolderID: f.FolderID(), LoopSerial: true}}
	if _, err := newYandex(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--yandex-insecure") {
		t.Fatalf("loop serial without --yandex-insecure: %v, want a refusal naming --yandex-insecure", err)
	}
}
