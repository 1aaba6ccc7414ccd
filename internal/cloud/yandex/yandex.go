// Package yandex is csid's provider for Yandex Compute Cloud: its disks
// are csid's disks, its instances csid's nodes, its asynchronous
// operations csid's operations. The Cloud talks to the Yandex API through
// the generated clients of go-genproto (api.go; credentials.go signs the
// service account's JWT); the Host (host*.go) finds an attached disk on an
// instance by its device name, which is the disk's id.
//
// Yandex Compute grows a disk only while it is detached as far as csid is
// concerned (GrowsAttached is false): csid's engine queues a resize of an
// attached volume for its detach. Snapshots are not implemented.
package yandex

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	computepb "github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud"
)

// Documented limits of Yandex Compute Cloud.
const (
	// DefaultEndpoint is the public API endpoint (endpoint discovery
	// answers there).
	DefaultEndpoint = "api.cloud.yandex.net:443"
	// MaxDiskBytes is the largest disk csid makes or grows a disk to: the
	// API grows a disk to at most 4 TiB (UpdateDiskRequest.size), though
	// it creates larger ones (26 TiB), and csid makes no disk it could
	// not grow.
	MaxDiskBytes = int64(4) << 40
	// DefaultMaxDisks is the number of disks an instance holds (the
	// documented limit of disks attached to one VM, boot disk included,
	// is 16; one is taken by the boot disk).
	DefaultMaxDisks = 15
	// DefaultDiskType is the disk type Yandex gives a disk made without
	// one.
	DefaultDiskType = "network-hdd"
	// Granularity: sizes are rounded up to whole GiB, as the API wants.
	Granularity = int64(1) << 30
)

// DiskTypes are the disk types of Yandex Compute a StorageClass may name
// (parameter "type").
var DiskTypes = []string{"network-hdd", "network-ssd", "network-ssd-nonreplicated", "network-ssd-io-m3"}

// Options configure a Cloud.
type Options struct {
	// Endpoint is the API endpoint (DefaultEndpoint when empty); Insecure
	// talks plaintext gRPC to it (a test's fake API only).
	Endpoint string
	Insecure bool
	// FolderID is the folder csid's disks live in (required).
	FolderID string
	// KeyFile is a service-account key file (JSON, as Yandex IAM issues
	// it); empty: the instance's service account, through the metadata
	// service at MetadataURL (DefaultMetadataURL when empty).
	KeyFile     string
	MetadataURL string
	// Zones are the zones csid makes disks in, the first the default;
	// empty: the zones the API lists.
	Zones []string
	// MaxDisks is the number of disks csid reports an instance can hold
	// (DefaultMaxDisks when 0).
	MaxDisks int
	// RateLimit (calls per second) and Burst pace every compute and
	// operation call (an IAM token exchange runs inside one of them);
	// MaxAttempts bounds the tries of a call the API refuses for load.
	RateLimit   float64
	Burst       int
	MaxAttempts int
	// Backoff is the first pause after a refusal for load (default
	// 200ms; it doubles up to 10s, jittered).
	Backoff time.Duration
	// Driver is the CSI driver name: csid labels the disks it makes with
	// it, and lists, reads and changes only disks so labelled.
	Driver string
	// PollInterval is the first pause between polls of an operation
	// (default 250ms; it doubles up to 5s).
	PollInterval time.Duration
}

// Cloud is the cloud.Cloud of Yandex Compute.
type Cloud struct {
	opts Options // opts.Zones: the zones given, or those the API lists (start)
	api  *api
}

var _ cloud.Cloud = (*Cloud)(nil)

// New connects to the Yandex API, and checks that it answers with these
// credentials: it lists the zones when none are given, else one disk of
// the folder.
func New(ctx context.Context, o Options) (*Cloud, error) {
	if !nodePattern.MatchString(o.FolderID) {
		return nil, fmt.Errorf("yandex: a folder id is required (--yandex-folder-id), got %q", o.FolderID)
	}
	if o.Driver == "" {
		return nil, errors.New("yandex: the driver name is required")
	}
	if _, err := tagsToLabels(nil, o.Driver); err != nil {
		return nil, err
	}
	if o.Endpoint == "" {
		o.Endpoint = DefaultEndpoint
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 250 * time.Millisecond
	}
	if o.MaxDisks <= 0 {
		o.MaxDisks = DefaultMaxDisks
	}
	o.Zones = slices.Clone(o.Zones) // start may fill it: never the caller's array
	creds, err := credentials(o.KeyFile, o.MetadataURL)
	if err != nil {
		return nil, err
	}
	th := newThrottle(o.RateLimit, o.Burst, o.MaxAttempts)
	if o.Backoff > 0 {
		th.base = o.Backoff
	}
	a, err := dialAPI(ctx, o.Endpoint, o.Insecure, creds, th.unary)
	if err != nil {
		return nil, fmt.Errorf("yandex: connect to %s: %w", o.Endpoint, err)
	}
	c := &Cloud{opts: o, api: a}
	if err := c.start(ctx); err != nil {
		_ = a.close()
		return nil, err
	}
	return c, nil
}

// start checks that the API answers with these credentials and learns the
// zones when none were given.
func (c *Cloud) start(ctx context.Context) error {
	if len(c.opts.Zones) == 0 {
		resp, err := c.api.zones.List(ctx, &computepb.ListZonesRequest{PageSize: 100})
		if err != nil {
			return apiError(err, "list zones")
		}
		for _, z := range resp.GetZones() {
			if z.GetStatus() == computepb.Zone_UP {
				c.opts.Zones = append(c.opts.Zones, z.GetId())
			}
		}
		slices.Sort(c.opts.Zones)
		if len(c.opts.Zones) == 0 {
			return errors.New("yandex: the API lists no zone that is up; name them with --yandex-zones")
		}
		return nil
	}
	_, err := c.api.disks.List(ctx, &computepb.ListDisksRequest{FolderId: c.opts.FolderID, PageSize: 1})
	return apiError(err, "list disks of folder "+c.opts.FolderID)
}

// Close closes the connections to the API.
func (c *Cloud) Close() error { return c.api.close() }

// String names the provider (in logs); it holds no secret.
func (c *Cloud) String() string {
	return fmt.Sprintf("yandex(endpoint=%s, folder=%s, zones=%v)", c.opts.Endpoint, c.opts.FolderID, c.opts.Zones)
}

// Zones lists the zones csid makes disks in, the default first.
func (c *Cloud) Zones() []string { return slices.Clone(c.opts.Zones) }

// MaxDiskBytes is the largest disk csid makes on Yandex (the largest the
// API grows a disk to).
func (c *Cloud) MaxDiskBytes() int64 { return MaxDiskBytes }

// GrowsAttached is false: csid grows Yandex disks while detached (see the
// package doc).
func (c *Cloud) GrowsAttached() bool { return false }

// DiskTypes lists the disk types a StorageClass may name.
func (c *Cloud) DiskTypes() []string { return slices.Clone(DiskTypes) }

// Capacity reports the largest disk a zone takes, once the API says the
// zone is up (so it is also the controller's readiness check of the API
// and the credentials). Yandex's free space is a quota of the cloud, which
// the Compute API does not report: a create beyond it fails with
// ErrLimitReached.
func (c *Cloud) Capacity(ctx context.Context, zone string) (int64, error) {
	z, err := c.zone(zone)
	if err != nil {
		return 0, err
	}
	got, err := c.api.zones.Get(ctx, &computepb.GetZoneRequest{ZoneId: z})
	if err != nil {
		return 0, apiError(err, "get zone "+z)
	}
	if got.GetStatus() != computepb.Zone_UP {
		return 0, nil
	}
	return MaxDiskBytes, nil
}

func (c *Cloud) zone(z string) (string, error) {
	if z == "" {
		return c.opts.Zones[0], nil
	}
	if !slices.Contains(c.opts.Zones, z) {
		return "", fmt.Errorf("zone %q is not one of %v: %w", z, c.opts.Zones, cloud.ErrInvalid)
	}
	return z, nil
}

// GetNode reports an instance: its zone, and the number of disks it holds
// (Options.MaxDisks: the API does not say).
func (c *Cloud) GetNode(ctx context.Context, nodeID string) (cloud.Node, error) {
	if !nodePattern.MatchString(nodeID) {
		return cloud.Node{}, fmt.Errorf("instance id %q: %w", nodeID, cloud.ErrNotFound)
	}
	inst, err := c.instance(ctx, nodeID)
	if err != nil {
		return cloud.Node{}, err
	}
	return cloud.Node{ID: inst.GetId(), Zone: inst.GetZoneId(), MaxAttachments: c.opts.MaxDisks}, nil
}

func (c *Cloud) instance(ctx context.Context, id string) (*computepb.Instance, error) {
	inst, err := c.api.instances.Get(ctx, &computepb.GetInstanceRequest{InstanceId: id})
	if err != nil {
		return nil, apiError(err, "get instance "+id)
	}
	return inst, nil
}

// Ids. Yandex's are 20 characters of [a-z0-9], the first a letter (the virtio serial limit,
// which the device name, the disk id, must keep to). Instance ids are held
// to the API's own limit instead, so that a node id a test or an operator
// chose is still looked up.
var (
	idPattern   = regexp.MustCompile(`^[a-z][a-z0-9]{19}$`)
	nodePattern = regexp.MustCompile(`^[a-z0-9][-a-z0-9]{0,49}$`)
	namePattern = regexp.MustCompile(`^[a-z]([-_a-z0-9]{0,61}[a-z0-9])?$`)
)

// checkDiskID refuses an id that is not a Yandex disk id: as ErrNotFound
// for a lookup, ErrInvalid for a mutation.
func checkDiskID(id string, lookup bool) error {
	if idPattern.MatchString(id) {
		return nil
	}
	if lookup {
		return fmt.Errorf("disk id %q is not a Yandex disk id: %w", id, cloud.ErrNotFound)
	}
	return fmt.Errorf("disk id %q is not a Yandex disk id: %w", id, cloud.ErrInvalid)
}
