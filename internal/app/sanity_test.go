package app_test

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"github.com/rs/zerolog"
)

// TestSanity runs the CSI sanity suite (csi-test v5) against real csid
// processes on the local backend (sparse files, loop devices, mkfs,
// mounts), on the fake backend (the fake cloud, the fake mounter) and on
// the Yandex backend against a fake of the Yandex API (the node's disks
// loop devices found through a by-id directory the test owns): each once
// with mount volumes, once with raw block volumes, the snapshot and clone
// specs included where the backend takes them. Every skipped spec is
// logged with csi-test's reason, and each reason must name a capability
// csid does not claim on that backend (unclaimed), so a capability lost by
// mistake fails the test. Afterwards no loop device, no mount and (on
// Yandex) no disk may be left.
func TestSanity(t *testing.T) {
	testutil.RequireRoot(t)
	const attachLimit = 4
	configs := map[string]*sanity.TestConfig{}
	instances := map[string]*apptest.Instance{}
	clouds := map[string]*yandexCloud{}
	for _, run := range sanityRuns {
		backend, access, _ := strings.Cut(run, "/")
		o := app.Options{Cloud: backend, MaxVolumesPerNode: attachLimit, Log: zerolog.Nop()}
		var in *apptest.Instance
		size, expandTo := int64(64<<20), int64(96<<20)
		if backend == "yandex" {
			in, clouds[run] = startYandex(t, attachLimit)
			size, expandTo = 1<<30, 2<<30 // Yandex sizes disks in whole GiB
		} else {
			in = apptest.Start(t, o)
		}
		cfg := sanity.NewTestConfig()
		cfg.Address = in.Socket
		cfg.TargetPath = filepath.Join(in.Dir, "target")
		cfg.StagingPath = filepath.Join(in.Dir, "staging")
		cfg.TestVolumeAccessType = access
		cfg.TestVolumeSize = size
		cfg.TestVolumeExpandSize = expandTo
		cfg.IdempotentCount = 3
		cfg.TestNodeVolumeAttachLimit = true
		configs[run], instances[run] = &cfg, in
	}
	var contexts []*sanity.TestContext
	for _, run := range sanityRuns {
		backend, access, _ := strings.Cut(run, "/")
		ginkgo.Describe(backend+" backend, access type "+access, func() {
			contexts = append(contexts, sanity.GinkgoTest(configs[run]))
		})
	}
	var skipped []string
	ginkgo.ReportAfterSuite("skipped specs", func(r ginkgo.Report) {
		for _, s := range r.SpecReports {
			if s.State == types.SpecStateSkipped {
				skipped = append(skipped, s.FullText()+": "+strings.TrimSpace(s.Failure.Message))
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	reporter.Succinct = !testing.Verbose()
	ok := ginkgo.RunSpecs(t, "csid CSI sanity", suite, reporter)
	for _, c := range contexts {
		c.Finalize()
	}
	sort.Strings(skipped)
	t.Logf("%d skipped specs:\n%s", len(skipped), strings.Join(skipped, "\n"))
	for _, s := range skipped {
		reasons := unclaimed
		if strings.HasPrefix(s, "yandex backend") {
			reasons = append(slices.Clip(unclaimed), unclaimedOnYandex...)
		}
		if !slices.ContainsFunc(reasons, func(c string) bool { return strings.Contains(strings.ToLower(s), c) }) {
			t.Errorf("skipped for a reason that is not a capability csid leaves unclaimed: %s", s)
		}
	}
	if !ok {
		return
	}
	for run, in := range instances {
		in.Stop(t)
		if y := clouds[run]; y != nil {
			checkNothingLeftOnYandex(t, run, y)
			continue
		}
		checkNothingLeft(t, run, in.Dir)
	}
}

// sanityRuns are the backends and access types the suite runs with.
var sanityRuns = []string{"local/mount", "local/block", "fake/mount", "fake/block", "yandex/mount", "yandex/block"}

// unclaimed are the capabilities csid does not claim, as csi-test's skip
// reasons name them (lower case): a spec skipped for anything else fails.
// Snapshots and clones are claimed (both backends take them): a snapshot
// or clone spec skipped fails.
var unclaimed = []string{
	"groupcontrollerservice", "modify volume", "controllermodifyvolume",
	"volumehealth", "storagehealth", "listvolumehealth",
	"readonly field not supported", "single node multi writer",
}

// unclaimedOnYandex are what csid does not claim on the Yandex backend
// besides: snapshots and clones (no Snapshotter for Yandex yet).
var unclaimedOnYandex = []string{"snapshot not supported", "listsnapshots not supported", "volume cloning not supported"}

// checkNothingLeft fails the test if a loop device of the state dir's disks,
// or a mount under the state dir, is left.
func checkNothingLeft(t *testing.T, what, dir string) {
	t.Helper()
	h := newHostView(t, dir)
	if devs := h.hostDevices(t); len(devs) > 0 {
		t.Errorf("%s: loop devices left: %v", what, devs)
	}
	for _, m := range mountsUnder(t, h.dir) {
		t.Errorf("%s: mount left at %s", what, m)
	}
}
