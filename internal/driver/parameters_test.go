package driver

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDiskTypeParameter: "type" is a StorageClass parameter only where the
// provider has disk types, and then only one of them; other parameters
// are refused as before.
func TestDiskTypeParameter(t *testing.T) {
	types := []string{"network-hdd", "network-ssd"}
	for _, tc := range []struct {
		params map[string]string
		types  []string
		want   string // "" for accepted, else a part of the InvalidArgument message
	}{
		{map[string]string{"type": "network-ssd"}, types, ""},
		{map[string]string{"type": "network-ssd", "csi.storage.k8s.io/pvc/name": "data"}, types, ""},
		{map[string]string{"type": "network-nvme"}, types, `"network-nvme" is not one of this provider's disk types`},
		{map[string]string{"type": ""}, types, "is not one of"},
		{map[string]string{"type": "network-ssd"}, nil, "disks have no types"},
		{map[string]string{"tier": "gold"}, types, `unknown parameter "tier": csid accepts the csi.storage.k8s.io/ parameters Kubernetes adds and type (one of network-hdd, network-ssd)`},
		{map[string]string{"tier": "gold"}, nil, `unknown parameter "tier"`},
	} {
		err := checkParameters(tc.params, tc.types)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v with types %v: %v, want accepted", tc.params, tc.types, err)
		case tc.want != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want)):
			t.Errorf("%v with types %v: %v, want InvalidArgument saying %q", tc.params, tc.types, err, tc.want)
		}
	}
}
