package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/csid-dev/csid/internal/view"
)

// ErrNotServing: nothing answers on the socket (no such file, or a stale
// socket of a csid that has stopped).
var ErrNotServing = errors.New("no csid answers on the admin socket")

// Client reads a live csid through its admin socket. It implements
// view.Source.
type Client struct {
	socket string
	hc     *http.Client
}

var _ view.Source = (*Client)(nil)

// NewClient returns a client of the admin socket at path. It connects on
// the first call; each call is bounded by timeout (0: 10s) and by its
// context.
func NewClient(path string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:    1,
		IdleConnTimeout: 5 * time.Second,
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr, Timeout: timeout}}
}

// Close releases the client's idle connection.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// Info returns which csid answers; see view.Source.
func (c *Client) Info(ctx context.Context) (out view.Info, err error) {
	return out, c.get(ctx, "/v1/info", nil, &out)
}

// Volumes lists volumes; see view.Source.
func (c *Client) Volumes(ctx context.Context, f view.VolumeFilter) (out view.VolumeList, err error) {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", string(f.State))
	}
	if f.Node != "" {
		q.Set("node", f.Node)
	}
	return out, c.get(ctx, "/v1/volumes", q, &out)
}

// Volume returns one volume; see view.Source.
func (c *Client) Volume(ctx context.Context, id string) (out view.Volume, err error) {
	return out, c.get(ctx, "/v1/volumes/"+url.PathEscape(id), nil, &out)
}

// Ops lists ops; see view.Source.
func (c *Client) Ops(ctx context.Context, f view.OpFilter) (out view.OpList, err error) {
	q := url.Values{}
	if f.Status != "" {
		q.Set("status", string(f.Status))
	}
	if f.VolumeID != "" {
		q.Set("volume", f.VolumeID)
	}
	if f.SnapshotID != "" {
		q.Set("snapshot", f.SnapshotID)
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return out, c.get(ctx, "/v1/ops", q, &out)
}

// Op returns one op; see view.Source.
func (c *Client) Op(ctx context.Context, seq uint64) (out view.Op, err error) {
	return out, c.get(ctx, "/v1/ops/"+strconv.FormatUint(seq, 10), nil, &out)
}

// Resizes lists the resize queue; see view.Source.
func (c *Client) Resizes(ctx context.Context) (out view.ResizeList, err error) {
	return out, c.get(ctx, "/v1/resizes", nil, &out)
}

// Snapshots lists the snapshots; see view.Source.
func (c *Client) Snapshots(ctx context.Context) (out view.SnapshotList, err error) {
	return out, c.get(ctx, "/v1/snapshots", nil, &out)
}

// Snapshot returns one snapshot; see view.Source.
func (c *Client) Snapshot(ctx context.Context, id string) (out view.Snapshot, err error) {
	return out, c.get(ctx, "/v1/snapshots/"+url.PathEscape(id), nil, &out)
}

// Damaged lists the damaged records; see view.Source.
func (c *Client) Damaged(ctx context.Context) (out view.DamageList, err error) {
	return out, c.get(ctx, "/v1/damaged", nil, &out)
}

// Backup writes a consistent copy of the live csid's state file to w; it
// returns the bytes written. A stream cut short is an error.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://csid/v1/backup", nil)
	if err != nil {
		return 0, err
	}
	hc := *c.hc
	hc.Timeout = 0 // a backup takes as long as it takes; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return 0, c.dialError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = resp.Status
		}
		return 0, fmt.Errorf("csid at %s: %s", c.socket, e.Error)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("read the backup from %s: %w", c.socket, err)
	}
	return n, nil
}

func (c *Client) get(ctx context.Context, path string, q url.Values, out any) error {
	// path is escaped already (ids are escaped by the callers).
	target := "http://csid" + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.dialError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("read the answer of %s on %s: %w", path, c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = resp.Status
		}
		if resp.StatusCode == http.StatusNotFound {
			return notFoundError(e.Error)
		}
		return fmt.Errorf("csid at %s: %s", c.socket, e.Error)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("decode the answer of %s on %s: %w", path, c.socket, err)
	}
	return nil
}

// dialError says what a failed request means for the operator.
func (c *Client) dialError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%s: %w (csid is not running, or serves another socket: see --admin-socket of csid serve)", c.socket, ErrNotServing)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: permission denied: the admin socket is mode 0600; run this as the user csid runs as (root for the node plugin): %w", c.socket, err)
	}
	return fmt.Errorf("admin socket %s: %w", c.socket, err)
}

// notFoundError is a 404's message; errors.Is(err, view.ErrNotFound) holds.
type notFoundError string

func (e notFoundError) Error() string { return string(e) }

// Is makes errors.Is(err, view.ErrNotFound) true.
func (e notFoundError) Is(target error) bool { return target == view.ErrNotFound }
