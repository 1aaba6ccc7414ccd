package app_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReadinessWhileTheStateFileCannotBeWritten: csid's state file made
// immutable under a running csid: writes answer Unavailable naming the
// file, Probe and /readyz say not ready naming the store; once the file is
// writable again csid answers ready and takes writes, without a restart.
func TestReadinessWhileTheStateFileCannotBeWritten(t *testing.T) {
	state := testutil.SmallFS(t, 16<<20)
	socks := apptest.ShortTempDir(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in := apptest.Start(t, app.Options{Cloud: "fake", Fake: fake.New(fake.Options{Zones: []string{"fake"}}), StateDir: state,
		Endpoint: "unix://" + filepath.Join(socks, "csi.sock"), AdminSocket: filepath.Join(socks, "admin.sock"),
		MetricsListener: lis, Log: zerolog.Nop()})
	c, base := apptest.Dial(t, in.Socket), "http://"+lis.Addr().String()
	ctx := context.Background()
	file := filepath.Join(state, "csid.db")
	create := func(name string) error {
		_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: capRange(1 << 20),
			VolumeCapabilities: []*csi.VolumeCapability{apptest.MountCap("ext4")}})
		return err
	}
	if err := create("before"); err != nil {
		t.Fatal(err)
	}

	testutil.SetImmutable(t, file, true)
	err = create("during")
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), file) {
		t.Fatalf("create with the state file immutable: %v; want Unavailable naming %s", err, file)
	}
	if ready := apptest.R(c.Probe(ctx, &csi.ProbeRequest{})).Must(t).GetReady().GetValue(); ready {
		t.Error("Probe says ready while the state file cannot be written")
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]store failed: state file "+file) {
		t.Errorf("/readyz while the state file cannot be written: %d\n%s", code, body)
	}

	testutil.SetImmutable(t, file, false)
	// As a CO does: retry until the driver takes the request again.
	deadline := time.Now().Add(20 * time.Second)
	for err = create("during"); status.Code(err) == codes.Unavailable && time.Now().Before(deadline); err = create("during") {
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create once the state file is writable: %v", err)
	}
	if ready := apptest.R(c.Probe(ctx, &csi.ProbeRequest{})).Must(t).GetReady().GetValue(); !ready {
		t.Error("Probe says not ready after the state file is writable again")
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the fault cleared: %d\n%s", code, body)
	}
}
