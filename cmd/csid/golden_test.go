package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/view"
	"github.com/csid-dev/csid/internal/view/viewtest"
)

// TestInspectGolden pins the output of every inspect command on the
// fixture state file (fixed ids, fixed times, built with the store's API):
// the JSON and YAML documents whose field names tools rely on, and the
// tables people read. go test ./cmd/csid -run Golden -update rewrites them.
func TestInspectGolden(t *testing.T) {
	db := filepath.Join(t.TempDir(), "csid.db")
	if err := viewtest.Build(db); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	now := viewtest.T0.Add(time.Hour)
	cases := []struct {
		golden string
		args   []string
	}{
		{"volumes.json", []string{"volumes", "-o", "json"}},
		{"volumes-published.json", []string{"volumes", "--state", "PUBLISHED", "-o", "json"}},
		{"volume-published.json", []string{"volume", viewtest.Published, "-o", "json"}},
		{"volume-failed.json", []string{"volume", viewtest.Failed, "-o", "json"}},
		{"volume-retrying.json", []string{"volume", viewtest.Retrying, "-o", "json"}},
		{"ops.json", []string{"ops", "-o", "json"}},
		{"ops-pending.json", []string{"ops", "--pending", "-o", "json"}},
		{"ops-failed.json", []string{"ops", "--failed", "-o", "json"}},
		{"resizes.json", []string{"resizes", "-o", "json"}},
		{"volume-published.yaml", []string{"volume", viewtest.Published, "-o", "yaml"}},
		{"volumes.txt", []string{"volumes"}},
		{"volume-published.txt", []string{"volume", viewtest.Published}},
		{"volume-failed.txt", []string{"volume", viewtest.Failed}},
		{"volume-retrying.txt", []string{"volume", viewtest.Retrying}},
		{"ops.txt", []string{"ops"}},
		{"resizes.txt", []string{"resizes"}},
		{"snapshots.json", []string{"snapshots", "-o", "json"}},
		{"snapshots.txt", []string{"snapshots"}},
		{"snapshot.txt", []string{"snapshot", viewtest.Snapshot}},
		{"snapshot-cutting.json", []string{"snapshot", viewtest.Cutting, "-o", "json"}},
		{"volume-restored.txt", []string{"volume", viewtest.Restored}},
	}
	for _, c := range cases {
		t.Run(c.golden, func(t *testing.T) {
			got := inspectAt(t, now, append(c.args, "--db", db)...)
			if strings.HasSuffix(c.golden, ".json") && !json.Valid([]byte(got)) {
				t.Fatalf("not JSON:\n%s", got)
			}
			path := filepath.Join("testdata", "inspect-"+c.golden+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/csid -run Golden -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("csid inspect %s differs from %s (-update rewrites it):\n--- got\n%s\n--- want\n%s", strings.Join(c.args, " "), path, got, want)
			}
		})
	}
	after, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("csid inspect --db changed the state file")
	}
}

// TestInspectJSONFields: the JSON documents decode strictly into the view
// types (no field the package doc does not list) and carry what an
// operator needs from each situation of the fixture.
func TestInspectJSONFields(t *testing.T) {
	db := filepath.Join(t.TempDir(), "csid.db")
	if err := viewtest.Build(db); err != nil {
		t.Fatal(err)
	}
	strict := func(raw string, v any) {
		t.Helper()
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Fatalf("%v in\n%s", err, raw)
		}
	}
	var l view.VolumeList
	strict(inspectAt(t, viewtest.T0, "volumes", "-o", "json", "--db", db), &l)
	byID := map[string]view.Volume{}
	for _, v := range l.Volumes {
		byID[v.ID] = v
	}
	if v := byID[viewtest.Published]; v.Resize == nil || v.Resize.TargetBytes != 2<<30 || v.Node != "node-1" || len(v.Targets) != 2 {
		t.Errorf("published volume: %+v", v)
	}
	if v := byID[viewtest.Failed]; v.LastOp == nil || v.LastOp.Status != view.StatusFailed || v.LastOp.Code != "ResourceExhausted" {
		t.Errorf("failed volume's last op: %+v", v.LastOp)
	}
	if v := byID[viewtest.Retrying]; v.PendingOp == nil || v.PendingOp.Attempts != 3 || v.PendingOp.LastError == "" || v.PendingOp.NextAttemptAt.IsZero() {
		t.Errorf("retrying volume's pending op: %+v", v.PendingOp)
	}
	if v := byID[viewtest.Creating]; v.State != "ABSENT" || v.PendingOp == nil || v.PendingOp.Event != "create" {
		t.Errorf("volume being created: %+v", v)
	}
	var one view.Volume
	strict(inspectAt(t, viewtest.T0, "volume", viewtest.Published, "-o", "json", "--db", db), &one)
	if len(one.History) != 6 || one.History[5].Op != 0 || one.History[0].Event != "create" {
		t.Errorf("history: %+v", one.History)
	}
	var ops view.OpList
	strict(inspectAt(t, viewtest.T0, "ops", "--limit", "3", "-o", "json", "--db", db), &ops)
	if len(ops.Ops) != 3 || ops.Ops[0].Seq != 14 {
		t.Errorf("ops --limit 3: %+v", ops.Ops)
	}
}

// TestCompletion: the shell completion suggests lifecycle states, output
// formats, and the volume ids and nodes of the source the flags name.
func TestCompletion(t *testing.T) {
	db := filepath.Join(t.TempDir(), "csid.db")
	if err := viewtest.Build(db); err != nil {
		t.Fatal(err)
	}
	complete := func(args ...string) []string {
		t.Helper()
		code, stdout, stderr := cli(t, append([]string{"__complete"}, args...)...)
		if code != 0 {
			t.Fatalf("__complete %q: exit %d: %s", args, code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		return lines[:len(lines)-1] // the last line is cobra's directive
	}
	has := func(got []string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !slices.ContainsFunc(got, func(g string) bool { return g == w || strings.HasPrefix(g, w+"\t") }) {
				t.Errorf("completions %q lack %q", got, w)
			}
		}
	}
	has(complete("inspect", "volumes", "--state", ""), "ABSENT", "CREATED", "NODE_READY", "VOL_READY", "PUBLISHED")
	has(complete("inspect", "ops", "-o", ""), "table", "json", "yaml")
	has(complete("inspect", "volume", "--db", db, ""), viewtest.Created, viewtest.Published, viewtest.Failed)
	has(complete("inspect", "volumes", "--db", db, "--node", ""), "node-1")
	has(complete("inspect", ""), "volumes", "volume", "ops", "resizes")
	has(complete(""), "inspect", "check", "serve", "completion")
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if code, stdout, _ := cli(t, "completion", shell); code != 0 || !strings.Contains(stdout, "csid") {
			t.Errorf("csid completion %s: exit %d", shell, code)
		}
	}
}
