package app_test

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// client speaks CSI to a csid socket.
type client struct {
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

func dial(t testing.TB, socket string) client {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return client{csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)}
}

func mountCap(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func capRange(bytes int64) *csi.CapacityRange { return &csi.CapacityRange{RequiredBytes: bytes} }
