//go:build drillbug

package effects

// plantedBug makes the create executor non-idempotent: it neither records
// nor looks for a cloud operation, and creates a disk under a fresh name on
// every run, so a crash after the cloud created the disk leaks it. Only the drill's
// test builds this (go build -tags drillbug); never a release.
const plantedBug = true
