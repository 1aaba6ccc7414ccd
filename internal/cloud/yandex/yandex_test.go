package yandex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

var zones = []string{"ru-central1-a", "ru-central1-b"}

// startFake starts a fake API in the test zones (export_test.go).
func startFake(t *testing.T, opts yandexfake.Options) (*yandexfake.Fake, string) {
	t.Helper()
	if opts.Zones == nil {
		opts.Zones = zones
	}
	return yandex.StartFake(t, opts)
}

func provider(setup func(f *yandexfake.Fake)) func(t *testing.T) cloudtest.Provider {
	return func(t *testing.T) cloudtest.Provider {
		f, key := startFake(t, yandexfake.Options{})
		if setup != nil {
			setup(f)
		}
		o := yandex.FakeOptions(f, key)
		return cloudtest.Provider{
			Cloud: yandex.Open(t, o),
			AddNode: func(t *testing.T, n cloud.Node) {
				zone := n.Zone
				if zone == "" {
					zone = zones[0]
				}
				if err := f.AddInstance(n.ID, zone, n.MaxAttachments); err != nil {
					t.Fatal(err)
				}
			},
			Reopen:         func(t *testing.T) cloud.Cloud { return yandex.Open(t, o) },
			MaxAttachments: yandex.DefaultMaxDisks,
		}
	}
}

func TestContract(t *testing.T) {
	cloudtest.Run(t, provider(nil))
}

// Operations that take a while: every call returns one still running, and
// waits (also resumed ones) poll it to its end.
func TestContractWithLatency(t *testing.T) {
	cloudtest.Run(t, provider(func(f *yandexfake.Fake) {
		f.SetOperationDelay(20 * time.Millisecond)
		for _, m := range []string{yandexfake.MethodDiskGet, yandexfake.MethodDiskList, yandexfake.MethodOperationGet} {
			f.SetLatency(m, 2*time.Millisecond)
		}
	}))
}

// A flaky API: calls refused for load and unavailable now and then; the
// client backs off and retries, and the contract holds.
func TestContractWithFaults(t *testing.T) {
	cloudtest.Run(t, provider(func(f *yandexfake.Fake) {
		for _, m := range []string{yandexfake.MethodDiskGet, yandexfake.MethodDiskCreate, yandexfake.MethodDiskList,
			yandexfake.MethodInstanceAttach, yandexfake.MethodOperationGet, yandexfake.MethodDiskUpdate} {
			f.FailCalls(m, codes.Unavailable, 2)
		}
		f.Throttle(yandexfake.Throttling{Calls: 3})
	}))
}

// The disk type is part of a create's idempotency: the same name and size
// of another type is ErrAlreadyExists; a type Yandex does not have is
// ErrInvalid; the type is reported with the disk.
func TestCreateDiskTypeIsPartOfTheName(t *testing.T) {
	f, key := startFake(t, yandexfake.Options{})
	c := yandex.Open(t, yandex.FakeOptions(f, key))
	ctx := context.Background()
	wait := func(op cloud.Operation, err error) (cloud.Disk, error) {
		if err != nil {
			return cloud.Disk{}, err
		}
		return c.WaitOperation(ctx, op.ID)
	}
	ssd, err := wait(c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-1", SizeBytes: 1 << 30, Type: "network-ssd"}))
	if err != nil || ssd.Type != "network-ssd" {
		t.Fatalf("create of a network-ssd disk: %+v, %v", ssd, err)
	}
	if again, err := wait(c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-1", SizeBytes: 1 << 30, Type: "network-ssd"})); err != nil || again.ID != ssd.ID {
		t.Fatalf("repeat create: %+v, %v; want %s", again, err, ssd.ID)
	}
	for _, typ := range []string{"network-hdd", ""} {
		if _, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-1", SizeBytes: 1 << 30, Type: typ}); !errors.Is(err, cloud.ErrAlreadyExists) {
			t.Errorf("create of vol-1 as %q: %v, want ErrAlreadyExists", typ, err)
		}
	}
	if _, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-2", SizeBytes: 1 << 30, Type: "floppy"}); !errors.Is(err, cloud.ErrInvalid) {
		t.Errorf("create of a floppy: %v, want ErrInvalid", err)
	}
	hdd, err := wait(c.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-3", SizeBytes: 1 << 30}))
	if err != nil || hdd.Type != yandex.DefaultDiskType {
		t.Fatalf("create without a type: %+v, %v; want %s", hdd, err, yandex.DefaultDiskType)
	}
}

// Another csid's disks (another driver name in the same folder) are not
// this one's: not listed, not found, not deleted.
func TestOnlyItsOwnDisks(t *testing.T) {
	f, key := startFake(t, yandexfake.Options{})
	mine := yandex.Open(t, yandex.FakeOptions(f, key))
	o := yandex.FakeOptions(f, key)
	o.Driver = "other.csid.dev"
	theirs := yandex.Open(t, o)
	ctx := context.Background()
	op, err := theirs.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-theirs", SizeBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	d, err := theirs.WaitOperation(ctx, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if page, err := mine.ListDisks(ctx, cloud.ListOptions{}); err != nil || len(page.Disks) != 0 {
		t.Fatalf("ListDisks lists another csid's disks: %+v, %v", page, err)
	}
	if _, err := mine.GetDisk(ctx, d.ID); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("GetDisk of another csid's disk: %v, want ErrNotFound", err)
	}
	if _, err := mine.CreateDisk(ctx, cloud.DiskSpec{Name: "vol-theirs", SizeBytes: 1 << 30}); !errors.Is(err, cloud.ErrAlreadyExists) {
		t.Fatalf("create of another csid's disk's name: %v, want ErrAlreadyExists", err)
	}
	if op, err := mine.DeleteDisk(ctx, d.ID); err != nil || !op.Done {
		t.Fatalf("DeleteDisk of another csid's disk: %+v, %v; want done at once (nothing of ours)", op, err)
	}
	if _, err := theirs.GetDisk(ctx, d.ID); err != nil {
		t.Fatalf("another csid's disk after our delete: %v", err)
	}
}

// IAM tokens are renewed before they expire: calls made back to back
// across several token lifetimes never reach the API with a token that
// expired in flight (renewAt renews a fifth of a token's life early).
func TestTokensRenewBeforeTheyExpire(t *testing.T) {
	f, key := startFake(t, yandexfake.Options{})
	f.SetTokenTTL(300 * time.Millisecond)
	c := yandex.Open(t, yandex.FakeOptions(f, key))
	ctx := context.Background()
	if err := f.AddInstance("node-a", zones[0], 0); err != nil {
		t.Fatal(err)
	}
	calls, failed := 0, 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); calls++ {
		if _, err := c.GetNode(ctx, "node-a"); err != nil {
			failed++
			t.Logf("call %d: %v", calls, err)
		}
	}
	exchanges := len(f.Calls(yandexfake.MethodIAMTokenCreate))
	if failed > 0 || exchanges < 5 {
		t.Fatalf("%d of %d calls failed; %d token exchanges", failed, calls, exchanges)
	}
	t.Logf("%d calls, %d token exchanges", calls, exchanges)
}

// Without a key file, the backend authenticates as the instance's service
// account, with tokens from the metadata service.
func TestInstanceServiceAccount(t *testing.T) {
	f, _ := startFake(t, yandexfake.Options{})
	md := f.MetadataServer("fhmnode0000000000001", zones[0], f.FolderID())
	o := yandex.FakeOptions(f, "")
	o.MetadataURL = md.URL
	c := yandex.Open(t, o)
	if _, err := c.ListDisks(context.Background(), cloud.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Calls(yandexfake.MethodIAMTokenCreate)); n != 0 {
		t.Fatalf("%d JWT exchanges; the instance's tokens come from the metadata service", n)
	}
}

// An IAM token exchange is retried only by the call that needs the token:
// with IAM answering Unavailable, one backend call makes at most
// MaxAttempts exchanges (one per try of the call), never an exchange
// retried inside each of its tries.
func TestIAMExchangesAreNotRetriedInsideRetries(t *testing.T) {
	const maxAttempts = 4
	f, key := startFake(t, yandexfake.Options{TokenTTL: 250 * time.Millisecond})
	o := yandex.FakeOptions(f, key)
	o.MaxAttempts = maxAttempts
	c := yandex.Open(t, o)
	time.Sleep(300 * time.Millisecond) // Open's token has expired
	f.FailCalls(yandexfake.MethodIAMTokenCreate, codes.Unavailable, 1000)
	before := len(f.Calls(yandexfake.MethodIAMTokenCreate))
	_, err := c.ListDisks(context.Background(), cloud.ListOptions{})
	exchanges := len(f.Calls(yandexfake.MethodIAMTokenCreate)) - before
	if err == nil {
		t.Fatal("ListDisks succeeded without a token")
	}
	if exchanges > maxAttempts {
		t.Fatalf("one ListDisks made %d IAM token exchanges with IAM unavailable, want at most %d (MaxAttempts): %v",
			exchanges, maxAttempts, err)
	}
	t.Logf("%d exchanges: %v", exchanges, err)
}

// TestEndpointDiscoveryIsRetried: an API that refuses the start-up's
// endpoint discovery for load a few times does not fail the start; the
// discovery is retried as a compute call is.
func TestEndpointDiscoveryIsRetried(t *testing.T) {
	f, key := startFake(t, yandexfake.Options{})
	f.FailCalls(yandexfake.MethodEndpointList, codes.Unavailable, 2)
	c := yandex.Open(t, yandex.FakeOptions(f, key))
	if _, err := c.ListDisks(context.Background(), cloud.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Calls(yandexfake.MethodEndpointList)); n != 3 {
		t.Fatalf("endpoint discovery asked %d times, want 3 (two refused, one answered)", n)
	}
}
