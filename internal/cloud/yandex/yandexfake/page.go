package yandexfake

import (
	"encoding/base64"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// pageRequest is the page a List call asks for: at most size items, those
// after the id its page token names ("" for the first page).
type pageRequest struct {
	size  int
	after string
}

// parsePage checks a List call's page_size and page_token.
func parsePage(size int64, token string) (pageRequest, error) {
	n, err := pageSize(size)
	if err != nil {
		return pageRequest{}, err
	}
	after, err := decodePageToken(token)
	if err != nil {
		return pageRequest{}, err
	}
	return pageRequest{size: n, after: after}, nil
}

// takePage returns clones of the items of the page p asks for among ids
// (sorted), keeping the ids item keeps, and the next page's token ("" when
// this page is the last).
func takePage[T proto.Message](p pageRequest, ids []string, item func(id string) (T, bool)) ([]T, string) {
	var out []T
	last := ""
	for _, id := range ids {
		if id <= p.after {
			continue
		}
		v, keep := item(id)
		if !keep {
			continue
		}
		if len(out) == p.size {
			return out, encodePageToken(last)
		}
		out = append(out, proto.Clone(v).(T))
		last = id
	}
	return out, ""
}

func pageSize(n int64) (int, error) {
	switch {
	case n < 0 || n > maxPageSize:
		return 0, status.Errorf(codes.InvalidArgument, "page_size %d: the value must be between 0 and %d", n, maxPageSize)
	case n == 0:
		return defaultPageSize, nil
	}
	return int(n), nil
}

const pageTokenPrefix = "after:"

func encodePageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + lastID))
}

func decodePageToken(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", malformedPageToken(tok)
	}
	after, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if !ok {
		return "", malformedPageToken(tok)
	}
	return after, nil
}

func malformedPageToken(tok string) error {
	return status.Errorf(codes.InvalidArgument, "page_token %q is malformed", tok)
}
