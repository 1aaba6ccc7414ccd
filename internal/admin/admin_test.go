package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"github.com/csid-dev/csid/internal/view/viewtest"
	"github.com/rs/zerolog"
)

// serveFixture serves the fixture state file, opened read-write as csid
// opens it, on a unix socket; it returns the client, the store source
// the server answers from, and the state file's path.
func serveFixture(t *testing.T) (*Client, *view.StoreSource, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "csid-admin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "csid.db")
	if err := viewtest.Build(path); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	src := view.NewStoreSource(st, view.Info{Mode: "all", StateFile: path, Schema: store.SchemaVersion})
	lis, err := net.Listen("unix", filepath.Join(dir, "admin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(lis, src, zerolog.Nop())
	t.Cleanup(func() {
		if err := srv.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	c := NewClient(filepath.Join(dir, "admin.sock"), 5*time.Second)
	t.Cleanup(func() { c.Close() })
	return c, src, path
}

func jsonOf(t *testing.T, v any, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestClientMatchesStore: every question asked through the socket gets the
// bytes the store source gives directly, and serving them writes nothing.
func TestClientMatchesStore(t *testing.T) {
	c, src, path := serveFixture(t)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type pair struct {
		name       string
		sock, file func() (any, error)
	}
	pairs := []pair{
		{"volumes", func() (any, error) { return c.Volumes(ctx, view.VolumeFilter{}) }, func() (any, error) { return src.Volumes(ctx, view.VolumeFilter{}) }},
		{"volumes created", func() (any, error) { return c.Volumes(ctx, view.VolumeFilter{State: fsm.Created}) },
			func() (any, error) { return src.Volumes(ctx, view.VolumeFilter{State: fsm.Created}) }},
		{"volumes node-1", func() (any, error) { return c.Volumes(ctx, view.VolumeFilter{Node: "node-1"}) },
			func() (any, error) { return src.Volumes(ctx, view.VolumeFilter{Node: "node-1"}) }},
		{"volume", func() (any, error) { return c.Volume(ctx, viewtest.Published) }, func() (any, error) { return src.Volume(ctx, viewtest.Published) }},
		{"ops", func() (any, error) { return c.Ops(ctx, view.OpFilter{}) }, func() (any, error) { return src.Ops(ctx, view.OpFilter{}) }},
		{"ops pending", func() (any, error) { return c.Ops(ctx, view.OpFilter{Status: view.OpsPending}) },
			func() (any, error) { return src.Ops(ctx, view.OpFilter{Status: view.OpsPending}) }},
		{"ops failed", func() (any, error) { return c.Ops(ctx, view.OpFilter{Status: view.OpsFailed}) },
			func() (any, error) { return src.Ops(ctx, view.OpFilter{Status: view.OpsFailed}) }},
		{"ops limit", func() (any, error) { return c.Ops(ctx, view.OpFilter{Limit: 2, VolumeID: viewtest.Published}) },
			func() (any, error) { return src.Ops(ctx, view.OpFilter{Limit: 2, VolumeID: viewtest.Published}) }},
		{"op", func() (any, error) { return c.Op(ctx, 3) }, func() (any, error) { return src.Op(ctx, 3) }},
		{"resizes", func() (any, error) { return c.Resizes(ctx) }, func() (any, error) { return src.Resizes(ctx) }},
		{"snapshots", func() (any, error) { return c.Snapshots(ctx) }, func() (any, error) { return src.Snapshots(ctx) }},
		{"snapshot", func() (any, error) { return c.Snapshot(ctx, viewtest.Snapshot) }, func() (any, error) { return src.Snapshot(ctx, viewtest.Snapshot) }},
		{"ops of a snapshot", func() (any, error) { return c.Ops(ctx, view.OpFilter{SnapshotID: viewtest.Cutting}) },
			func() (any, error) { return src.Ops(ctx, view.OpFilter{SnapshotID: viewtest.Cutting}) }},
		{"damaged", func() (any, error) { return c.Damaged(ctx) }, func() (any, error) { return src.Damaged(ctx) }},
		{"info", func() (any, error) { return c.Info(ctx) }, func() (any, error) { return src.Info(ctx) }},
	}
	for _, p := range pairs {
		sv, serr := p.sock()
		fv, ferr := p.file()
		s, f := jsonOf(t, sv, serr), jsonOf(t, fv, ferr)
		if s != f {
			t.Errorf("%s: socket and store differ:\nsocket: %s\nstore:  %s", p.name, s, f)
		}
		if len(s) < 10 {
			t.Errorf("%s: suspiciously short answer %s", p.name, s)
		}
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("serving the admin API changed the state file")
	}
}

func TestErrors(t *testing.T) {
	c, _, _ := serveFixture(t)
	ctx := context.Background()
	if _, err := c.Volume(ctx, "vol-nope"); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown volume: %v, want ErrNotFound", err)
	}
	if _, err := c.Volume(ctx, "a/b?c"); !errors.Is(err, view.ErrNotFound) || !strings.Contains(err.Error(), "a/b?c") {
		t.Errorf("odd volume id: %v, want ErrNotFound naming it", err)
	}
	if _, err := c.Snapshot(ctx, "snap-nope"); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown snapshot: %v, want ErrNotFound", err)
	}
	if _, err := c.Op(ctx, 999); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown op: %v, want ErrNotFound", err)
	}
	if _, err := c.Volumes(ctx, view.VolumeFilter{State: "STUCK"}); err == nil || !strings.Contains(err.Error(), "PUBLISHED") {
		t.Errorf("bad state filter: %v, want an error listing the states", err)
	}
	if _, err := c.Ops(ctx, view.OpFilter{Status: "weird"}); err == nil {
		t.Error("bad op status: no error")
	}

	hc := &http.Client{Transport: c.hc.Transport}
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, "/v1/volumes", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/v1/volumes/" + viewtest.Created, http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/ops", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v2/volumes", http.StatusNotFound},
		{http.MethodGet, "/v1/ops/x", http.StatusBadRequest},
		{http.MethodGet, "/v1/ops?limit=-1", http.StatusBadRequest},
		{http.MethodHead, "/v1/volumes", http.StatusOK},
	} {
		req, _ := http.NewRequest(tc.method, "http://csid"+tc.path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body errorBody
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
		if tc.code != http.StatusOK && body.Error == "" {
			t.Errorf("%s %s: no JSON error body", tc.method, tc.path)
		}
	}
}

func TestNotServing(t *testing.T) {
	dir := t.TempDir()
	c := NewClient(filepath.Join(dir, "admin-all.sock"), time.Second)
	if _, err := c.Info(context.Background()); !errors.Is(err, ErrNotServing) {
		t.Errorf("missing socket: %v, want ErrNotServing", err)
	}
	// A stale socket: bound, then its listener closed without unlinking.
	path := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := NewClient(path, time.Second).Info(context.Background()); !errors.Is(err, ErrNotServing) {
		t.Errorf("stale socket: %v, want ErrNotServing", err)
	}
}
