package driver

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of the fields csid accepts.
const (
	// MaxNameBytes is the longest CO name of a volume (the CSI default).
	MaxNameBytes = 128
	// MaxPathBytes is the longest node path (staging, target, volume path).
	MaxPathBytes = 4096
	// MaxMapBytes bounds parameters and contexts (the CSI default).
	MaxMapBytes = 4096
	// MiB is the size granularity of csid's disks.
	MiB = int64(1) << 20
	// DefaultVolumeBytes is the size of a volume created without a
	// capacity range.
	DefaultVolumeBytes = 1 << 30
	// MinXFSBytes is the smallest volume mkfs.xfs formats.
	MinXFSBytes = int64(300) << 20
)

// volumeIDPattern is the shape of the volume ids csid hands out.
var volumeIDPattern = regexp.MustCompile(`^vol-[0-9a-f]{20}$`)

// knownVolumeID reports whether id has the shape of a csid volume id. Any
// other id names no volume (NotFound, or success for the negations); it is
// never used further.
func knownVolumeID(id string) bool { return volumeIDPattern.MatchString(id) }

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func required(name, value string) error {
	if value == "" {
		return invalid("%s is required", name)
	}
	return nil
}

// checkName enforces the CSI rules for a CreateVolume name: at most 128
// bytes of valid UTF-8 without control characters.
func checkName(name string) error {
	switch {
	case name == "":
		return invalid("name is required")
	case len(name) > MaxNameBytes:
		return invalid("name is %d bytes; at most %d are allowed", len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return invalid("name is not valid UTF-8")
	}
	for _, r := range name {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return invalid("name contains the control character %U", r)
		}
	}
	return nil
}

// checkPath validates a node path before it can reach the file system: it
// must be absolute, clean of ".." elements, without NUL, and not too long.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return invalid("%s is required", field)
	case len(p) > MaxPathBytes:
		return invalid("%s is %d bytes; at most %d are allowed", field, len(p), MaxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return invalid("%s contains a NUL byte", field)
	case !filepath.IsAbs(p):
		return invalid("%s %q is not an absolute path", field, p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return invalid("%s %q contains a \"..\" element", field, p)
		}
	}
	return nil
}

// nodePath validates a path of a node request (checkPath) and, when csid
// knows kubelet's root, that it lies under it: csid acts on kubelet's
// paths only.
func (d *Driver) nodePath(field, p string) error {
	if err := checkPath(field, p); err != nil {
		return err
	}
	if root := d.cfg.KubeletRoot; root != "" && !within(root, p) {
		return invalid("%s %q is outside kubelet's directory %s: csid acts only on paths under it (--kubelet-root)", field, p, root)
	}
	return nil
}

// within reports whether path p lies inside directory dir (not dir
// itself); both are absolute, without ".." elements.
func within(dir, p string) bool {
	dir, p = filepath.Clean(dir), filepath.Clean(p)
	return p != dir && strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// separatePaths refuses a publish whose target is its staging path, or
// lies inside it, or holds it: the bind mount would cover the staging mount
// (and NodeUnpublishVolume would then unmount and remove the staging), or
// land inside the user's filesystem.
func separatePaths(target, staging string) error {
	t, s := filepath.Clean(target), filepath.Clean(staging)
	switch {
	case t == s:
		return invalid("target_path and staging_target_path are both %s: a volume is published at a path of its own, not where it is staged", t)
	case within(s, t):
		return invalid("target_path %s lies inside staging_target_path %s", t, s)
	case within(t, s):
		return invalid("staging_target_path %s lies inside target_path %s", s, t)
	}
	return nil
}

func mapBytes(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}

// checkParameters accepts the parameters Kubernetes adds (every key under
// csi.storage.k8s.io/) and, where the provider has disk types (diskTypes
// not empty), "type" naming one of them; it refuses anything else, naming
// it: a silently ignored typo is worse than an error.
func checkParameters(params map[string]string, diskTypes []string) error {
	if n := mapBytes(params); n > MaxMapBytes {
		return invalid("parameters are %d bytes; at most %d are allowed", n, MaxMapBytes)
	}
	for k, v := range params {
		switch {
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
		case k == ops.ParamDiskType && len(diskTypes) > 0:
			if !slices.Contains(diskTypes, v) {
				return invalid("parameter %s=%q is not one of this provider's disk types %v", k, v, diskTypes)
			}
		case k == ops.ParamDiskType:
			return invalid("parameter %s: this provider's disks have no types", k)
		default:
			return invalid("unknown parameter %q: csid accepts the csi.storage.k8s.io/ parameters Kubernetes adds%s", k, typeNote(diskTypes))
		}
	}
	return nil
}

func typeNote(diskTypes []string) string {
	if len(diskTypes) == 0 {
		return ""
	}
	return " and " + ops.ParamDiskType + " (one of " + strings.Join(diskTypes, ", ") + ")"
}

// unsupported says why csid cannot serve a capability.
type unsupported string

// toCapability converts a CSI capability. A malformed one is an
// InvalidArgument error; one csid does not support is returned as the
// reason (each RPC reports it with its own code).
func toCapability(vc *csi.VolumeCapability) (store.Capability, unsupported, error) {
	if vc == nil {
		return store.Capability{}, "", invalid("volume_capability is required")
	}
	am := vc.GetAccessMode()
	if am == nil {
		return store.Capability{}, "", invalid("volume_capability.access_mode is required")
	}
	c := store.Capability{AccessMode: am.GetMode().String()}
	switch am.GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return c, "", invalid("volume_capability.access_mode.mode is required")
	default:
		return c, unsupported(fmt.Sprintf("access mode %s is not supported: a csid disk attaches to one node at a time "+
			"(SINGLE_NODE_WRITER or SINGLE_NODE_READER_ONLY)", am.GetMode())), nil
	}
	switch at := vc.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		c.AccessType = "block"
	case *csi.VolumeCapability_Mount:
		c.AccessType = "mount"
		c.FsType = at.Mount.GetFsType()
		c.MountFlags = at.Mount.GetMountFlags()
		switch c.FsType {
		case "", "ext4", "xfs":
		default:
			return c, unsupported(fmt.Sprintf("filesystem %q is not supported (ext4 or xfs)", c.FsType)), nil
		}
		n := 0
		for _, f := range c.MountFlags {
			n += len(f)
			if f == "" || strings.ContainsAny(f, "\x00\n") {
				return c, "", invalid("mount flag %q is malformed", f)
			}
		}
		if n > MaxMapBytes {
			return c, "", invalid("mount flags are %d bytes; at most %d are allowed", n, MaxMapBytes)
		}
	default:
		return c, "", invalid("volume_capability needs an access type: block or mount")
	}
	return c, "", nil
}

// capability converts a CSI capability that the request requires; one csid
// does not support is an error with code, which each RPC's table chooses
// (InvalidArgument on the controller, FailedPrecondition on the node).
func capability(vc *csi.VolumeCapability, code codes.Code) (store.Capability, error) {
	c, why, err := toCapability(vc)
	if err != nil {
		return c, err
	}
	if why != "" {
		return c, status.Error(code, string(why))
	}
	return c, nil
}

// capabilities converts a required list of capabilities; all must agree on
// the access type.
func capabilities(vcs []*csi.VolumeCapability) (store.Capability, unsupported, error) {
	if len(vcs) == 0 {
		return store.Capability{}, "", invalid("volume_capabilities is required")
	}
	var first store.Capability
	for i, vc := range vcs {
		c, why, err := toCapability(vc)
		if err != nil || why != "" {
			return c, why, err
		}
		if i == 0 {
			first = c
			continue
		}
		if c.AccessType != first.AccessType {
			return c, unsupported("a volume is either block or mount, not both"), nil
		}
	}
	return first, "", nil
}

// sizeFor chooses the size of a new or grown volume: the required bytes
// rounded up to MiB, within the limit.
func sizeFor(cr *csi.CapacityRange, fallback, max int64) (size, required, limit int64, err error) {
	required, limit = cr.GetRequiredBytes(), cr.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, 0, 0, invalid("capacity_range must not be negative (required %d, limit %d)", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, 0, 0, status.Errorf(codes.OutOfRange, "capacity_range is empty: required %d bytes exceeds the %d bytes limit", required, limit)
	}
	size = required
	if size == 0 {
		size = fallback
		if limit > 0 && size > limit {
			size = limit
		}
	}
	size = (size + MiB - 1) / MiB * MiB
	if limit > 0 && size > limit {
		size = limit / MiB * MiB
	}
	switch {
	case size < required || size <= 0:
		return 0, 0, 0, status.Errorf(codes.OutOfRange, "csid sizes volumes in whole MiB; no such size lies in [%d, %d] bytes", required, limit)
	case size > max:
		return 0, 0, 0, status.Errorf(codes.OutOfRange, "%d bytes is more than the largest volume this backend holds (%d bytes)", size, max)
	}
	return size, required, limit, nil
}
