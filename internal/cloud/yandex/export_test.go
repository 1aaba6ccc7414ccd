package yandex

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// StartFake starts a fake API (stopped at the end of the test) and returns
// it with the path of a service-account key file it issued.
func StartFake(t *testing.T, opts yandexfake.Options) (*yandexfake.Fake, string) {
	t.Helper()
	f, err := yandexfake.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	path := filepath.Join(t.TempDir(), "key.json")
	if _, err := f.WriteServiceAccountKey(path); err != nil {
		t.Fatal(err)
	}
	return f, path
}

// FakeOptions are a Cloud's options on fake f, with the key file it
// issued: the fake's zones, quick polls and backoffs, and a rate limit
// that does not slow a test.
func FakeOptions(f *yandexfake.Fake, keyFile string) Options {
	return Options{Endpoint: f.Endpoint(), Insecure: true, FolderID: f.FolderID(), KeyFile: keyFile,
		Zones: f.Zones(), Driver: "csid.dev", RateLimit: 1000, Burst: 1000, PollInterval: time.Millisecond,
		Backoff: time.Millisecond}
}

// Open is New, the Cloud closed at the end of the test.
func Open(t *testing.T, o Options) *Cloud {
	t.Helper()
	c, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
