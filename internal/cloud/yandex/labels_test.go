package yandex

import (
	"errors"
	"maps"
	"regexp"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/cloud"
)

// The API's label grammar (CreateDiskRequest.labels).
var (
	apiKey   = regexp.MustCompile(`^[a-z][-_./\\@0-9a-z]*$`)
	apiValue = regexp.MustCompile(`^[-_./\\@0-9a-z]*$`)
)

func TestLabelsKeepTagsReversibly(t *testing.T) {
	long := strings.Repeat(`{"mount":{"fsType":"ext4","flags":["noatime"]},"mode":"SINGLE_NODE_WRITER"}`, 3)
	for _, tags := range []map[string]string{
		nil,
		{"keep": "1", "csid/volume": "pvc-1"},
		{"csid.dev/volume-id": "vol-0123abcd", "csid.dev/name": "PVC With Spaces/and Ünïcode"},
		{"csid.dev/capability": long, "csid.dev/parameters": `{"type":"network-ssd"}`},
		{"a": "@looks-encoded", "b": strings.Repeat("x", 63), "c": strings.Repeat("x", 64), "d": "back\\slash"},
	} {
		labels, err := tagsToLabels(tags, "csid.dev")
		if err != nil {
			t.Fatalf("tagsToLabels(%v): %v", tags, err)
		}
		if len(labels) > labelsMax {
			t.Fatalf("%d labels for %v", len(labels), tags)
		}
		for k, v := range labels {
			if len(k) > labelMax || !apiKey.MatchString(k) || len(v) > labelMax || !apiValue.MatchString(v) {
				t.Fatalf("label %q=%q of %v breaks the API's grammar", k, v, tags)
			}
		}
		got, owner := labelsToTags(labels)
		if owner != "csid.dev" {
			t.Fatalf("owner = %q", owner)
		}
		if !maps.Equal(got, tags) {
			t.Fatalf("round trip of %v gave %v (labels %v)", tags, got, labels)
		}
	}
}

func TestLabelsRefuseWhatTheyCannotHold(t *testing.T) {
	for name, tags := range map[string]map[string]string{
		"an upper-case key":          {"Key": "v"},
		"a key with @":               {"a@1": "v"},
		"a key too long":             {strings.Repeat("k", maxTagKey+1): "v"},
		"more than 64 labels":        {"big": strings.Repeat("\xff", 64*40)},
		"a key with a leading digit": {"1a": "v"},
	} {
		if _, err := tagsToLabels(tags, "csid.dev"); !errors.Is(err, cloud.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// Labels someone else set on a disk are not csid's tags, and a broken
// encoding decodes to nothing rather than to garbage.
func TestForeignLabelsAreLeftOut(t *testing.T) {
	tags, owner := labelsToTags(map[string]string{"env": "prod", "x@1": "abc", "bad": "@!!", "Upper": "v"})
	if owner != "" || !maps.Equal(tags, map[string]string{"env": "prod"}) {
		t.Fatalf("got %v, owner %q", tags, owner)
	}
}
