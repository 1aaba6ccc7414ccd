// Package testutil holds helpers shared by csid's tests.
package testutil

import (
	"os"
	"testing"
)

// RequireRootEnv names the variable that turns root-only skips into failures.
const RequireRootEnv = "CSID_REQUIRE_ROOT"

// RequireRoot skips the test with a reason when not running as root, unless
// CSID_REQUIRE_ROOT=1 is set (CI sets it), in which case it fails: CI must
// never silently skip the tests that use real loop devices and mounts.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(RequireRootEnv) == "1" {
		t.Fatalf("%s needs root (loop devices, mkfs, mount) and %s=1 forbids skipping it", t.Name(), RequireRootEnv)
	}
	t.Skipf("needs root for loop devices, mkfs and mount; run as root (CI sets %s=1 to make this a failure)", RequireRootEnv)
}
