package yandex

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// metadataStub answers the GCE-style paths as Yandex's metadata service
// does, after failing the first `fail` requests with status failStatus.
func metadataStub(t *testing.T, fail int32, failStatus int) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "missing Metadata-Flavor", http.StatusForbidden)
			return
		}
		if n <= fail {
			http.Error(w, "not now", failStatus)
			return
		}
		switch r.URL.Path {
		case "/computeMetadata/v1/instance/id":
			w.Write([]byte("fhm0instance00000001"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// The instance id, with the header the service requires, after
// a few answers that may pass (a 5xx) are retried.
func TestMetadataReadsID(t *testing.T) {
	srv, calls := metadataStub(t, 2, http.StatusServiceUnavailable)
	m := NewMetadata(srv.URL + "/")
	m.pause = time.Millisecond
	ctx := context.Background()
	id, err := m.InstanceID(ctx)
	if err != nil || id != "fhm0instance00000001" {
		t.Fatalf("instance id %q, %v", id, err)
	}
	if calls.Load() != 3 {
		t.Fatalf("%d requests, want 2 failed and 1 answered", calls.Load())
	}
}

// What will not pass is not retried; what may is retried a bounded number
// of times; a service that does not answer fails within the per-request
// timeout, not never.
func TestMetadataBounded(t *testing.T) {
	srv, calls := metadataStub(t, 100, http.StatusNotFound)
	m := NewMetadata(srv.URL)
	m.pause = time.Millisecond
	if _, err := m.InstanceID(context.Background()); err == nil || calls.Load() != 1 {
		t.Fatalf("a 404: %v after %d requests, want an error after 1", err, calls.Load())
	}

	srv, calls = metadataStub(t, 100, http.StatusInternalServerError)
	m = NewMetadata(srv.URL)
	m.pause = time.Millisecond
	if _, err := m.InstanceID(context.Background()); err == nil || calls.Load() != metadataAttempts {
		t.Fatalf("a 500 for ever: %v after %d requests, want an error after %d", err, calls.Load(), metadataAttempts)
	}

	hang := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer silent.Close()
	defer close(hang)
	m = NewMetadata(silent.URL)
	m.client.Timeout = 20 * time.Millisecond
	m.pause = time.Millisecond
	if _, err := m.InstanceID(context.Background()); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("a silent service: %v", err)
	}
}

// An answer that is no id (a path, a control character) is refused.
func TestMetadataRefusesMalformedValues(t *testing.T) {
	for _, body := range []string{"", "..", "a/b", "a b", "fhm\x00x", strings.Repeat("a", 200)} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) }))
		m := NewMetadata(srv.URL)
		if v, err := m.InstanceID(context.Background()); err == nil {
			t.Errorf("answer %q read as %q", body, v)
		}
		srv.Close()
	}
}

// Against the fake API's metadata server, which answers as Yandex's does
// and refuses a request without the header.
func TestMetadataOfTheFake(t *testing.T) {
	f, err := yandexfake.Start(context.Background(), yandexfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	srv := f.MetadataServer("fhm0instance00000001", "ru-central1-d", f.FolderID())
	m := NewMetadata(srv.URL)
	id, err := m.InstanceID(context.Background())
	if err != nil || id != "fhm0instance00000001" {
		t.Fatalf("instance id %q, %v", id, err)
	}
}

// The instance's service-account token comes from the same service; a
// refusal says what may be missing and never quotes the answer's body
// (it might hold a token).
func TestInstanceTokenRefused(t *testing.T) {
	srv, calls := metadataStub(t, 1, http.StatusUnauthorized)
	creds, err := credentials("", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := creds.(*instanceServiceAccount).IAMToken(context.Background())
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "service account") ||
		strings.Contains(err.Error(), "not now") || calls.Load() != 1 {
		t.Fatalf("a refused token: %v, %v after %d requests; want an error naming the status, not the body", tok, err, calls.Load())
	}
}
