package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestManifestFlagsAreServeFlags reads every Kubernetes manifest under
// deploy/ and checks that the arguments of each container named csid parse
// as flags of this csid's serve command, so the manifests and the binary
// cannot drift apart (a renamed or removed flag fails here, not in a pod's
// crash loop).
func TestManifestFlagsAreServeFlags(t *testing.T) {
	root := filepath.Join("..", "..", "deploy", "kubernetes")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range strings.Split(string(raw), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Errorf("%s (document %d): %v", path, i, err)
				continue
			}
			for _, c := range containers(obj) {
				if c["name"] != "csid" {
					continue
				}
				args := strings.Fields(strings.Join(toStrings(c["args"]), " "))
				if len(args) == 0 || args[0] != "serve" {
					t.Errorf("%s: the csid container's args %v do not start with serve", path, args)
					continue
				}
				if err := newServe().ParseFlags(args[1:]); err != nil {
					t.Errorf("%s: csid serve %v: %v", path, args[1:], err)
				}
				checked++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 4 {
		t.Fatalf("checked %d csid containers; the base and the overlay have at least 4", checked)
	}
}

// containers finds pod template containers in a manifest (or patch).
func containers(obj map[string]any) []map[string]any {
	spec, _ := obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	var out []map[string]any
	for _, key := range []string{"containers", "initContainers"} {
		list, _ := pod[key].([]any)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

func toStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
