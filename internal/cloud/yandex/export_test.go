package yandex

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
