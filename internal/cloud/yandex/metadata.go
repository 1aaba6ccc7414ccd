package yandex

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// Metadata reads what an instance knows of itself from the metadata
// service: its id (the node id). Each read is bounded (a short
// timeout per attempt, a few attempts with a growing pause), so a node
// that is not on Yandex Compute fails at start-up within seconds, saying
// so, instead of hanging.
type Metadata struct {
	base     string
	client   *http.Client
	attempts int
	pause    time.Duration
}

// Metadata's bounds.
const (
	metadataTimeout  = 2 * time.Second
	metadataAttempts = 4
	metadataPause    = 200 * time.Millisecond
	metadataMaxBody  = 4 << 10
)

// NewMetadata returns a reader of the metadata service at url (default
// DefaultMetadataURL when empty).
func NewMetadata(url string) *Metadata {
	if url == "" {
		url = DefaultMetadataURL
	}
	return &Metadata{base: strings.TrimRight(url, "/"), client: &http.Client{Timeout: metadataTimeout},
		attempts: metadataAttempts, pause: metadataPause}
}

// metadataValue is what an id may be: nothing that could be a
// path or carry a control character.
var metadataValue = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// InstanceID is this instance's id.
func (m *Metadata) InstanceID(ctx context.Context) (string, error) {
	return m.value(ctx, "instance/id")
}

// value reads computeMetadata/v1/<key>, retrying what may pass (a network
// error, a 5xx or 429 answer) and not what will not (another status, a
// malformed value).
func (m *Metadata) value(ctx context.Context, key string) (string, error) {
	url := m.base + "/computeMetadata/v1/" + key
	var last error
	pause := m.pause
	for attempt := range m.attempts {
		if attempt > 0 {
			if err := sleepCtx(ctx, pause); err != nil {
				return "", fmt.Errorf("metadata %s: %w (last: %v)", key, err, last)
			}
			pause *= 2
		}
		raw, retry, err := m.get(ctx, url)
		if err == nil {
			v := strings.TrimSpace(raw)
			if !metadataValue.MatchString(v) {
				return "", fmt.Errorf("metadata %s: the service answered %q, not an id", key, raw)
			}
			return v, nil
		}
		if !retry {
			return "", fmt.Errorf("metadata %s: %w", key, err)
		}
		last = err
	}
	return "", fmt.Errorf("metadata %s: no answer from %s in %d attempts (is this a Yandex Compute instance? set the flag instead): %w",
		key, m.base, m.attempts, last)
}

// errMetadataStatus: the service answered with a status that is not 200.
var errMetadataStatus = errors.New("unexpected status")

// get makes one request; retry says whether another may succeed.
func (m *Metadata) get(ctx context.Context, url string) (body string, retry bool, err error) {
	b, code, err := metadataGet(ctx, m.client, url, metadataMaxBody)
	switch {
	case errors.Is(err, errMetadataStatus):
		retry := code >= 500 || code == http.StatusTooManyRequests
		return "", retry, fmt.Errorf("%s: %w", url, err)
	case err != nil:
		return "", ctx.Err() == nil, err
	}
	return string(b), false, nil
}

// metadataGet makes one request of the metadata service, with the header
// it requires, and returns the body of an answer with status 200 (at
// most max bytes). Another status is errMetadataStatus, with the code;
// its body is not read (it might hold a token).
func metadataGet(ctx context.Context, client *http.Client, url string, max int64) (body []byte, code int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode, fmt.Errorf("%s: %w", resp.Status, errMetadataStatus)
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, max))
	return body, resp.StatusCode, err
}
