package yandex_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/cloudtest"
	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

var zones = []string{"ru-central1-a", "ru-central1-b"}

// startFake starts a fake API and returns it with the path of a
// service-account key file it issued.
func startFake(t *testing.T, opts yandexfake.Options) (*yandexfake.Fake, string) {
	t.Helper()
	if opts.Zones == nil {
		opts.Zones = zones
	}
	f, err := yandexfake.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	key, err := f.NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "key.json")
	if err := os.WriteFile(path, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return f, path
}

// options are the backend's options on fake f: quick polls and backoffs, a
// rate limit that does not slow the suite.
func options(f *yandexfake.Fake, keyFile string) yandex.Options {
	return yandex.Options{Endpoint: f.Endpoint(), Insecure: true, FolderID: f.FolderID(), KeyFile: keyFile,
		Zones: zones, Driver: "csid.dev", RateLimit: 1000, Burst: 1000, PollInterval: time.Millisecond,
		Backoff: time.Millisecond}
}

func open(t *testing.T, o yandex.Options) *yandex.Cloud {
	t.Helper()
	c, err := yandex.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func provider(setup func(f *yandexfake.Fake)) func(t *testing.T) cloudtest.Provider {
	return func(t *testing.T) cloudtest.Provider {
		f, key := startFake(t, yandexfake.Options{})
		if setup != nil {
			setup(f)
		}
		o := options(f, key)
		return cloudtest.Provider{
			Cloud: open(t, o),
			AddNode: func(t *testing.T, n cloud.Node) {
				zone := n.Zone
				if zone == "" {
					zone = zones[0]
				}
				if err := f.AddInstance(n.ID, zone, n.MaxAttachments); err != nil {
					t.Fatal(err)
				}
			},
			Reopen:         func(t *testing.T) cloud.Cloud { return open(t, o) },
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
