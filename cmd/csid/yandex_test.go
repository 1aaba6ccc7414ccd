package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

const yandexZone = "ru-central1-a"

// yandexRig is `csid serve --cloud yandex` (a controller, as a child
// process) on a fake Yandex API, with a service-account key file the fake
// issued.
type yandexRig struct {
	fake    *yandexfake.Fake
	dir     string
	keyFile string
	key     yandexfake.KeyFile
	proc    *process
	socket  string
	c       csi.ControllerClient
}

func newYandexRig(t *testing.T) *yandexRig {
	t.Helper()
	f, err := yandexfake.Start(context.Background(), yandexfake.Options{Zones: []string{yandexZone}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	if err := f.AddInstance("node-1", yandexZone, 0); err != nil {
		t.Fatal(err)
	}
	r := &yandexRig{fake: f, dir: apptest.ShortTempDir(t)}
	r.keyFile = filepath.Join(r.dir, "key.json")
	raw, err := f.WriteServiceAccountKey(r.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r.key); err != nil {
		t.Fatal(err)
	}
	r.socket = filepath.Join(r.dir, "csi.sock")
	return r
}

// start runs the controller with the rig's flags and extra ones.
func (r *yandexRig) start(t *testing.T, extra ...string) {
	t.Helper()
	args := append([]string{"serve", "--mode", "controller", "--cloud", "yandex", "--state-dir", r.dir,
		"--endpoint", "unix://" + r.socket, "--node-id", "controller-1",
		"--yandex-endpoint", r.fake.Endpoint(), "--yandex-insecure", "--yandex-folder-id", r.fake.FolderID(),
		"--yandex-key-file", r.keyFile, "--yandex-zones", yandexZone}, extra...)
	r.proc = startCSIDProcess(t, "", args...)
	waitReady(t, r.proc, r.socket)
	r.c = apptest.Dial(t, r.socket).ControllerClient
}

// retried answers a CO retries (csid's own or the API's transient
// failures surfaced); anything else ends the call.
var retried = []codes.Code{codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal}

// eventually retries call as a CO does, until it answers want (OK or
// another code the test expects) or a minute passes; it returns the tries.
func eventually(t *testing.T, what string, want codes.Code, call func(ctx context.Context) error) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for tries := 1; ; tries++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := call(ctx)
		cancel()
		got := status.Code(err)
		if got == want {
			return tries
		}
		if !slices.Contains(retried, got) || time.Now().After(deadline) {
			t.Fatalf("%s: try %d: %v, want %s", what, tries, err, want)
		}
		time.Sleep(100 * time.Millisecond) // a CO's pause between retries
	}
}

// lifecycle runs one volume through what a controller does with it:
// create, publish, an expand that is queued while published, unpublish
// (which runs the queued grow), an expand of the detached volume, delete.
func (r *yandexRig) lifecycle(t *testing.T, name string) (tries int) {
	t.Helper()
	mount := apptest.MountCap("ext4")
	var id string
	tries += eventually(t, name+": create", codes.OK, func(ctx context.Context) error {
		resp, err := r.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{mount},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"type": "network-ssd"}})
		id = resp.GetVolume().GetVolumeId()
		return err
	})
	tries += eventually(t, name+": publish", codes.OK, func(ctx context.Context) error {
		_, err := r.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: mount})
		return err
	})
	tries += eventually(t, name+": expand while published (queued)", codes.FailedPrecondition, func(ctx context.Context) error {
		_, err := r.c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}})
		return err
	})
	tries += eventually(t, name+": unpublish", codes.OK, func(ctx context.Context) error {
		_, err := r.c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-1"})
		return err
	})
	tries += eventually(t, name+": expand", codes.OK, func(ctx context.Context) error {
		resp, err := r.c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 3 << 30}})
		if err == nil && resp.GetCapacityBytes() < 3<<30 {
			return status.Errorf(codes.Unknown, "expanded to %d bytes, want 3 GiB", resp.GetCapacityBytes())
		}
		return err
	})
	tries += eventually(t, name+": delete", codes.OK, func(ctx context.Context) error {
		_, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	return tries
}

// TestYandexThrottledAPIIsNotHammered: the fake API answers every call
// ResourceExhausted for a while, as a throttled Yandex API does. csid's
// calls to it stay within its client-side rate limit (a token bucket of
// --yandex-rate-limit calls a second and --yandex-rate-burst at once:
// in any second, at most burst+rate calls arrive), retries included, and
// every CSI call of five volumes' lifecycles eventually succeeds.
func TestYandexThrottledAPIIsNotHammered(t *testing.T) {
	const rate, burst = 15, 5
	r := newYandexRig(t)
	r.start(t, "--yandex-rate-limit", fmt.Sprint(rate), "--yandex-rate-burst", fmt.Sprint(burst))
	throttled := time.Now()
	r.fake.Throttle(yandexfake.Throttling{For: 3 * time.Second})

	var wg sync.WaitGroup
	tries := make([]int, 5)
	for i := range tries {
		wg.Go(func() { tries[i] = r.lifecycle(t, fmt.Sprintf("pvc-throttled-%d", i)) })
	}
	wg.Wait()
	terminate(t, r.proc, 30*time.Second)

	calls := r.fake.Calls("")
	slices.SortFunc(calls, func(a, b time.Time) int { return a.Compare(b) })
	during := 0
	for _, at := range calls {
		if at.After(throttled) && at.Before(throttled.Add(3*time.Second)) {
			during++
		}
	}
	if during == 0 {
		t.Fatal("no call reached the API while it was throttled: the test throttled nothing")
	}
	// The bucket allows burst+rate*1s in any window of a second; arrival
	// times jitter by the transport, so one more is tolerated.
	peak, at := 0, time.Time{}
	for i, start := range calls {
		n, _ := slices.BinarySearchFunc(calls[i:], start.Add(time.Second), func(a, b time.Time) int { return a.Compare(b) })
		if n > peak {
			peak, at = n, start
		}
	}
	if peak > burst+rate+1 {
		t.Fatalf("%d calls reached the API in the second from %s, want at most %d (rate %d/s, burst %d); %d calls in all",
			peak, at.Format(time.StampMilli), burst+rate+1, rate, burst, len(calls))
	}
	t.Logf("%d API calls in all, %d while throttled, at most %d in any second; CSI tries per volume %v", len(calls), during, peak, tries)
}

// TestYandexSecretsStayHidden: nothing secret csid holds for the Yandex
// API appears in its log at debug level, in its state file (its raw
// bytes) or in `csid inspect`: not the key file's private key (any line
// of it) nor its key id, not a JWT signed with it, not an IAM token the
// API issued for it. The run makes csid exchange tokens again (they
// expire within seconds), fail an exchange once, and fail calls, so that
// error paths log too.
func TestYandexSecretsStayHidden(t *testing.T) {
	r := newYandexRig(t)
	r.fake.SetTokenTTL(2 * time.Second)
	r.fake.FailCalls(yandexfake.MethodIAMTokenCreate, codes.Unavailable, 1)
	r.start(t, "--log-level", "debug", "--log-format", "json")
	for i := range 2 {
		r.lifecycle(t, fmt.Sprintf("pvc-secret-%d", i))
	}
	// A volume left published, and refused calls, for inspect and the log.
	mount := apptest.MountCap("ext4")
	var id string
	eventually(t, "create", codes.OK, func(ctx context.Context) error {
		resp, err := r.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-kept", VolumeCapabilities: []*csi.VolumeCapability{mount},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
		id = resp.GetVolume().GetVolumeId()
		return err
	})
	eventually(t, "publish to an unknown instance", codes.NotFound, func(ctx context.Context) error {
		_, err := r.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-x", VolumeCapability: mount})
		return err
	})
	eventually(t, "publish", codes.OK, func(ctx context.Context) error {
		_, err := r.c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-1", VolumeCapability: mount})
		return err
	})
	eventually(t, "create of an unknown disk type", codes.InvalidArgument, func(ctx context.Context) error {
		_, err := r.c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-bad", VolumeCapabilities: []*csi.VolumeCapability{mount},
			Parameters: map[string]string{"type": "floppy"}})
		return err
	})
	var shown strings.Builder
	for _, args := range [][]string{{"volumes"}, {"volumes", "-o", "json"}, {"volume", id, "-o", "yaml"}, {"ops", "-o", "json"}, {"resizes"}} {
		shown.WriteString(inspectAt(t, time.Now(), append(args, "--state-dir", r.dir)...))
	}
	terminate(t, r.proc, 30*time.Second)
	shown.WriteString(inspectAt(t, time.Now(), "volumes", "-o", "json", "--db", filepath.Join(r.dir, "controller.db")))

	secrets := r.secrets(t)
	places := map[string]string{"the log": r.proc.stderr.String(), "csid inspect": shown.String()}
	files, err := filepath.Glob(filepath.Join(r.dir, "*.db"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no state file in %s: %v", r.dir, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		places["state file "+filepath.Base(f)] = string(raw)
	}
	for place, text := range places {
		if len(text) == 0 {
			t.Fatalf("%s is empty: the test looks at nothing", place)
		}
		for what, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds %s", place, what)
			}
		}
	}
	if !strings.Contains(places["the log"], `"level":"debug"`) {
		t.Fatalf("the log has no debug line: the test looks at less than it says")
	}
	t.Logf("looked for %d secrets in %d places (log %d bytes)", len(secrets), len(places), len(places["the log"]))
}

// secrets are what must not leak: every line of the private key's PEM
// body, the key id, and every JWT and IAM token that crossed the wire
// (the fake saw them all).
func (r *yandexRig) secrets(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"the key id": r.key.ID}
	for i, line := range strings.Split(r.key.PrivateKey, "\n") {
		if len(line) >= 32 && !strings.HasPrefix(line, "-----") && !strings.HasPrefix(line, "PLEASE") {
			out[fmt.Sprintf("line %d of the private key", i)] = line
		}
	}
	jwts, tokens := 0, 0
	for _, req := range r.fake.Seen() {
		for _, v := range req.Metadata.Get("authorization") {
			tok := strings.TrimPrefix(v, "Bearer ")
			out["IAM token "+tok[:min(6, len(tok))]+"..."] = tok
			tokens++
		}
		if req.Method == yandexfake.MethodIAMTokenCreate {
			var body struct {
				JWT string `json:"jwt"`
			}
			if err := json.Unmarshal(req.Body, &body); err == nil && body.JWT != "" {
				out[fmt.Sprintf("JWT %d", jwts)] = body.JWT
				// Its signature alone, too (the last segment).
				out[fmt.Sprintf("JWT %d's signature", jwts)] = body.JWT[strings.LastIndex(body.JWT, ".")+1:]
				jwts++
			}
		}
	}
	if jwts < 2 || tokens == 0 {
		t.Fatalf("%d JWTs and %d authorised calls seen: the run exchanged no second token", jwts, tokens)
	}
	return out
}
