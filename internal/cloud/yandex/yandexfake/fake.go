package yandexfake

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/endpoint"
	iam "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
)

// Defaults of Options.
const (
	DefaultFolderID = "b1gfakefolder0000001"
	DefaultTokenTTL = 12 * time.Hour
	// DefaultDiskType is the type of a disk created without one.
	DefaultDiskType = "network-hdd"
)

// API limits the fake enforces (from the API's field rules).
const (
	MinDiskBytes       = 4 << 20
	MaxDiskBytes       = 28587302322176
	MaxUpdateDiskBytes = 4 << 40
	maxIDLen           = 50
	defaultPageSize    = 100
	maxPageSize        = 1000
)

// DefaultZones are the zones of a fake started without Options.Zones.
var DefaultZones = []string{"ru-central1-a", "ru-central1-b", "ru-central1-d"}

// DefaultDiskTypes are the disk types of a fake started without
// Options.DiskTypes.
var DefaultDiskTypes = []string{"network-hdd", "network-ssd", "network-ssd-nonreplicated", "network-ssd-io-m3"}

// Options configure a Fake. The zero value is usable.
type Options struct {
	// FolderID is the one folder the fake has. Default: DefaultFolderID.
	FolderID string
	// Zones are the availability zones. Default: DefaultZones.
	Zones []string
	// DiskTypes are the disk type ids. Default: DefaultDiskTypes.
	DiskTypes []string
	// Quota limits the folder's disks; zero fields are unlimited.
	Quota Quota
	// OperationDelay is how long an operation runs before it completes.
	// Default 0: it completes at the first call after the one that started
	// it (the starting call always answers done=false).
	OperationDelay time.Duration
	// TokenTTL is the lifetime of the IAM tokens the fake issues. Default:
	// DefaultTokenTTL (the real IAM's 12 hours).
	TokenTTL time.Duration
	// GrowAttached lets Update grow a disk attached to an instance (the
	// image of a loop node is grown and its loop device resized).
	GrowAttached bool
}

// Quota is the folder's disk quota; a zero field is unlimited.
type Quota struct {
	// Disks is the number of disks.
	Disks int
	// Bytes is the total size of the disks.
	Bytes int64
}

// Fake is a running fake API. Start makes one; Close stops it.
type Fake struct {
	opts Options
	srv  *grpc.Server
	lis  net.Listener
	addr string
	// ctx ends when the fake closes (wakes calls held by SetLatency).
	ctx    context.Context
	cancel context.CancelFunc
	served chan struct{}

	// settleMu serialises the completion of operations (settle), which
	// runs node hooks outside mu.
	settleMu sync.Mutex

	mu        sync.Mutex
	seq       uint64
	disks     map[string]*diskState
	instances map[string]*instanceState
	ops       map[string]*opState
	pending   []*opState // operations not done, in start order
	idem      map[string]*opState
	keys      map[string]saKey // by key id
	tokens    map[string]time.Time
	nodes     map[string]nodeHook // by instance id
	images    map[string]string   // disk id -> image path of a loop node
	metadata  []*httptest.Server
	closed    bool

	knobs knobs
}

// Start starts a fake on 127.0.0.1 and returns it; Close stops it.
func Start(ctx context.Context, opts Options) (*Fake, error) {
	if opts.FolderID == "" {
		opts.FolderID = DefaultFolderID
	}
	if len(opts.Zones) == 0 {
		opts.Zones = DefaultZones
	}
	opts.Zones = slices.Clone(opts.Zones)
	if len(opts.DiskTypes) == 0 {
		opts.DiskTypes = DefaultDiskTypes
	}
	opts.DiskTypes = slices.Clone(opts.DiskTypes)
	if opts.TokenTTL <= 0 {
		opts.TokenTTL = DefaultTokenTTL
	}
	if opts.OperationDelay < 0 {
		return nil, errors.New("yandexfake: negative operation delay")
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("yandexfake: listen: %w", err)
	}
	f := &Fake{
		opts:      opts,
		lis:       lis,
		addr:      lis.Addr().String(),
		served:    make(chan struct{}),
		disks:     map[string]*diskState{},
		instances: map[string]*instanceState{},
		ops:       map[string]*opState{},
		idem:      map[string]*opState{},
		keys:      map[string]saKey{},
		tokens:    map[string]time.Time{},
		nodes:     map[string]nodeHook{},
		images:    map[string]string{},
		knobs:     newKnobs(opts.OperationDelay),
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(f.intercept))
	endpoint.RegisterApiEndpointServiceServer(f.srv, endpointService{f: f})
	iam.RegisterIamTokenServiceServer(f.srv, iamService{f: f})
	compute.RegisterDiskServiceServer(f.srv, diskService{f: f})
	compute.RegisterInstanceServiceServer(f.srv, instanceService{f: f})
	compute.RegisterZoneServiceServer(f.srv, zoneService{f: f})
	operation.RegisterOperationServiceServer(f.srv, operationService{f: f})
	go func() {
		defer close(f.served)
		_ = f.srv.Serve(lis)
	}()
	return f, nil
}

// Endpoint is the fake's address (host:port), for the SDK's Endpoint (with
// Plaintext) or a plaintext gRPC dial.
func (f *Fake) Endpoint() string { return f.addr }

// FolderID is the fake's folder.
func (f *Fake) FolderID() string { return f.opts.FolderID }

// Zones are the fake's zones.
func (f *Fake) Zones() []string { return slices.Clone(f.opts.Zones) }

// Close stops the server (calls in flight fail), releases the loop
// devices of the loop nodes and stops the metadata servers. It is safe to
// call more than once.
func (f *Fake) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	nodes := make([]nodeHook, 0, len(f.nodes))
	for _, n := range f.nodes {
		nodes = append(nodes, n)
	}
	servers := f.metadata
	f.mu.Unlock()
	f.cancel()
	f.srv.Stop()
	<-f.served
	for _, s := range servers {
		s.Close()
	}
	// A settle still running its node effects finishes first; none starts
	// after (settle checks closed).
	f.settleMu.Lock()
	defer f.settleMu.Unlock()
	for _, n := range nodes {
		_ = n.close()
	}
}

// AddInstance adds a running instance in zone that holds at most maxDisks
// secondary disks (0: the documented limit of 15 secondary disks besides
// the boot disk). An instance that exists is updated.
func (f *Fake) AddInstance(id, zone string, maxDisks int) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("yandexfake: instance id %q: empty or longer than %d", id, maxIDLen)
	}
	if !slices.Contains(f.opts.Zones, zone) {
		return fmt.Errorf("yandexfake: instance %s: unknown zone %q", id, zone)
	}
	if maxDisks <= 0 {
		maxDisks = DefaultMaxDisks
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if in, ok := f.instances[id]; ok {
		in.zone, in.maxDisks = zone, maxDisks
		return nil
	}
	f.instances[id] = &instanceState{id: id, zone: zone, maxDisks: maxDisks, created: time.Now()}
	return nil
}

// DefaultMaxDisks is the number of secondary disks an instance holds when
// AddInstance is given 0.
const DefaultMaxDisks = 15

// newID returns a new id in the API's format: 20 characters, a 3-letter
// prefix and 17 base-36 digits. Callers hold f.mu.
func (f *Fake) newID(prefix string) string {
	f.seq++
	s := strconv.FormatUint(f.seq, 36)
	return prefix + strings.Repeat("0", 17-len(s)) + s
}

// saKey is a service-account key the fake issued.
type saKey struct {
	serviceAccountID string
	public           *rsa.PublicKey
}
