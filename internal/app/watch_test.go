package app_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/csid-dev/csid/internal/view"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStateFileChangedUnderARunningCsid deletes, replaces and truncates
// the state file of a running csid. Within seconds Probe and /readyz say
// not ready naming the file, writes answer Unavailable naming it, and the
// log says what happened and what to do; csid never keeps taking writes as
// if they were durable, and a file cut short is not read (no crash: the
// admin socket and the metrics answer).
func TestStateFileChangedUnderARunningCsid(t *testing.T) {
	cases := []struct {
		name, says, todo string
		change           func(t *testing.T, file string)
	}{
		{"deleted", "was removed while csid ran", "csid state backup", func(t *testing.T, file string) {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced", "was replaced while csid ran", "csid state backup", func(t *testing.T, file string) {
			if err := os.WriteFile(file+".new", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(file+".new", file); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated", "was cut to 16384 bytes", "restore the file from a backup", func(t *testing.T, file string) {
			if err := os.Truncate(file, 16384); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var logs testutil.Buffer
			in := apptest.Start(t, app.Options{Cloud: "fake", Fake: fake.New(fake.Options{Zones: []string{"fake"}}),
				MetricsListener: lis, StateWatchInterval: 20 * time.Millisecond, Log: zerolog.New(&logs)})
			cl, base := apptest.Dial(t, in.Socket), "http://"+lis.Addr().String()
			ctx := context.Background()
			create := func(name string) error {
				_, err := cl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(1 << 20),
					VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})
				return err
			}
			for i := range 20 { // a file of several pages, so a cut loses some
				if err := create("before-" + string(rune('a'+i))); err != nil {
					t.Fatal(err)
				}
			}
			file := app.StateFile(in.Dir, driver.ModeAll)

			c.change(t, file)
			deadline := time.Now().Add(5 * time.Second)
			for apptest.R(cl.Probe(ctx, &csi.ProbeRequest{})).Must(t).GetReady().GetValue() {
				if time.Now().After(deadline) {
					t.Fatal("Probe still says ready 5s after the state file changed")
				}
				time.Sleep(10 * time.Millisecond) // polling for csid's own watch, which runs every 20ms
			}
			err = create("after")
			if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), file) ||
				!strings.Contains(status.Convert(err).Message(), c.says) {
				t.Errorf("a create after the state file %s: %v; want Unavailable naming %s", c.name, err, file)
			}
			if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]store failed: state file "+file) ||
				!strings.Contains(body, c.says) {
				t.Errorf("/readyz after the state file %s: %d\n%s", c.name, code, body)
			}
			if l := logs.String(); !strings.Contains(l, c.says) || !strings.Contains(l, c.todo) {
				t.Errorf("the log does not say what happened (%q) and what to do (%q):\n%s", c.says, c.todo, l)
			}
			// Reads answer (an error for a file cut short), never crash.
			if code, _ := get(t, base+"/metrics"); code == 0 {
				t.Error("no answer from /metrics")
			}
			src := admin.NewClient(app.AdminSocketPath(in.Dir, driver.ModeAll), 5*time.Second)
			defer src.Close()
			_, err = src.Volumes(ctx, view.VolumeFilter{})
			if (err != nil) != (c.name == "truncated") {
				t.Errorf("csid inspect volumes after the state file %s: %v", c.name, err)
			}
			in.Stop(t)
		})
	}
}
