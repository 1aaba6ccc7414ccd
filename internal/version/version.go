// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/csid-dev/csid/internal/version.Version=v1.2.3".
package version

// Version is csid's version; "dev" for builds without -ldflags.
var Version = "dev"
