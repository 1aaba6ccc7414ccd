package yandex

import (
	"encoding/base32"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/csid-dev/csid/internal/cloud"
)

// Yandex labels have a grammar csid's tags do not keep to: a key matches
// [a-z][-_./\@0-9a-z]* (at most 63 characters), a value [-_./\@0-9a-z]*
// (at most 63), and a resource has at most 64 of them. csid's tags hold
// JSON and free text (a capability, a CSI name), so they are mapped to
// labels reversibly:
//
//   - a tag's key is its label's key; it must be a label key without '@'
//     and short enough for its continuation keys (ErrInvalid otherwise).
//     csid's own tag keys (csid.dev/...) all are;
//   - a value that is a label value without '@' is stored as it is;
//   - any other value is stored base32-encoded (lowercase, no padding)
//     behind an '@', in chunks: the first in the tag's key, the next in
//     "<key>@1", "<key>@2", ...
//
// '@' never appears in a plain key or value, so nothing decodes two ways.
// The label ownerLabel (a key no tag can have) carries the driver name of
// the csid that made the disk: csid lists, reads and changes only disks
// that carry its own.
const (
	labelMax      = 63
	labelsMax     = 64
	maxTagKey     = labelMax - 3 // room for "@nn"
	encodedPrefix = "@"
	chunkSep      = "@"
	// ownerLabel names the csid that made a disk (its driver name).
	ownerLabel = "csid@driver"
)

var (
	plainKey   = regexp.MustCompile(`^[a-z][-_./0-9a-z]*$`)
	plainValue = regexp.MustCompile(`^[-_./0-9a-z]*$`)
	b32        = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
)

// tagsToLabels maps tags (and the owner) to the labels of a disk.
func tagsToLabels(tags map[string]string, owner string) (map[string]string, error) {
	ownerValue := encodeValue(owner)
	if len(ownerValue) > 1 {
		return nil, fmt.Errorf("driver name %q is too long for a label: %w", owner, cloud.ErrInvalid)
	}
	labels := map[string]string{ownerLabel: ownerValue[0]}
	for k, v := range tags {
		if k == "" || len(k) > maxTagKey || !plainKey.MatchString(k) {
			return nil, fmt.Errorf("tag key %q is not a Yandex label key (lowercase [a-z][-_./0-9a-z]*, at most %d characters): %w",
				k, maxTagKey, cloud.ErrInvalid)
		}
		if v == "" {
			continue
		}
		for i, chunk := range encodeValue(v) {
			labels[chunkKey(k, i)] = chunk
		}
	}
	if len(labels) > labelsMax {
		return nil, fmt.Errorf("the tags need %d labels, Yandex keeps at most %d: %w", len(labels), labelsMax, cloud.ErrInvalid)
	}
	return labels, nil
}

func chunkKey(k string, i int) string {
	if i == 0 {
		return k
	}
	return k + chunkSep + strconv.Itoa(i)
}

// encodeValue returns the label values that store v: v itself when it is
// a plain label value, else its encoding in chunks.
func encodeValue(v string) []string {
	if len(v) <= labelMax && plainValue.MatchString(v) {
		return []string{v}
	}
	s := encodedPrefix + b32.EncodeToString([]byte(v))
	var chunks []string
	for len(s) > labelMax {
		chunks = append(chunks, s[:labelMax])
		s = s[labelMax:]
	}
	return append(chunks, s)
}

// labelsToTags is the inverse of tagsToLabels: the tags a disk's labels
// hold, and the owner's name. Labels it does not recognise (set by
// someone else) are left out.
func labelsToTags(labels map[string]string) (tags map[string]string, owner string) {
	for k, v := range labels {
		if k == ownerLabel {
			owner, _ = decodeValue(labels, k, v)
			continue
		}
		if strings.Contains(k, chunkSep) || !plainKey.MatchString(k) {
			continue
		}
		dv, ok := decodeValue(labels, k, v)
		if !ok || dv == "" {
			continue
		}
		if tags == nil {
			tags = make(map[string]string)
		}
		tags[k] = dv
	}
	return tags, owner
}

func decodeValue(labels map[string]string, k, v string) (string, bool) {
	if !strings.HasPrefix(v, encodedPrefix) {
		return v, plainValue.MatchString(v)
	}
	var b strings.Builder
	b.WriteString(v[len(encodedPrefix):])
	for i := 1; i < labelsMax; i++ {
		next, ok := labels[chunkKey(k, i)]
		if !ok {
			break
		}
		b.WriteString(next)
	}
	raw, err := b32.DecodeString(b.String())
	if err != nil {
		return "", false
	}
	return string(raw), true
}
