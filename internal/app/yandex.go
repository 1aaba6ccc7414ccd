package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/mounter"
)

// YandexOptions are the settings of Cloud "yandex" (the --yandex-* flags).
type YandexOptions struct {
	// Endpoint is the API endpoint (yandex.DefaultEndpoint when empty);
	// Insecure talks plaintext gRPC to it (a fake API, in tests).
	Endpoint string
	Insecure bool
	FolderID string
	// KeyFile is a service-account key file; empty: the instance's
	// service account, through the metadata service.
	KeyFile string
	// Zones are the zones of disks, the first the default; empty: those
	// the API lists as up.
	Zones []string
	// MetadataURL is the instance metadata service (for the node id when
	// not given, and the instance's service account).
	MetadataURL string
	// ByIDDir is where a node finds its disks' by-id links.
	ByIDDir string
	// MaxDisks is the disks an instance holds (yandex.DefaultMaxDisks
	// when 0).
	MaxDisks int
	// RateLimit (calls per second) and RateBurst pace the calls to the API.
	RateLimit float64
	RateBurst int
	// LoopSerial proves a device's identity by the name of its loop
	// device's backing file instead of its virtio serial: for a test's
	// node simulator, which stands loop devices in for attached disks.
	LoopSerial bool
}

// yandexNode fills in o.NodeID from the instance metadata service where it
// is not given, on the node side (a controller's node id names nothing in
// the cloud); Run calls it before complete, which names any other node
// after the host. The zone is not looked up: on Yandex, NodeGetInfo reports
// the instance's zone as the Compute API has it (cloud.GetNode), and
// o.Zone is not read.
func (o *Options) yandexNode(ctx context.Context) error {
	if o.Cloud != "yandex" || o.Mode == driver.ModeController || o.NodeID != "" {
		return nil
	}
	id, err := yandex.NewMetadata(o.Yandex.MetadataURL).InstanceID(ctx)
	if err != nil {
		return fmt.Errorf("no --node-id: the instance id from the metadata service: %w", err)
	}
	o.NodeID = id
	return nil
}

// newYandex is the provider of Cloud "yandex".
func newYandex(ctx context.Context, o Options) (*provider, error) {
	y := o.Yandex
	if y.LoopSerial && !y.Insecure {
		// The stand-in proof is for a test's node simulator, which talks
		// to a fake API: never let it replace the virtio serial on a node
		// of a real cloud.
		return nil, errors.New("--yandex-loop-serial proves devices by a loop file's name, for tests only: it needs --yandex-insecure (a fake API)")
	}
	c, err := yandex.New(ctx, yandex.Options{Endpoint: y.Endpoint, Insecure: y.Insecure, FolderID: y.FolderID,
		KeyFile: y.KeyFile, MetadataURL: y.MetadataURL, Zones: y.Zones, MaxDisks: y.MaxDisks,
		RateLimit: y.RateLimit, Burst: y.RateBurst, Driver: o.DriverName})
	if err != nil {
		return nil, err
	}
	serial := yandex.VirtioSerial
	if y.LoopSerial {
		serial = yandex.LoopSerial
	}
	host := yandex.NewHost(yandex.HostOptions{InstanceID: o.NodeID, Cloud: c, ByIDDir: y.ByIDDir, Serial: serial})
	m := mounter.NewWithState(filepath.Join(o.StateDir, GrowDir))
	// Yandex's zones are the ones its Kubernetes nodes are labelled with:
	// csid names them with the well-known key, so StorageClasses and node
	// labels need nothing of csid's own.
	return &provider{cloud: c, host: host, mounter: m, topologyKey: driver.ZoneTopologyKey}, nil
}
