package yandex

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	computepb "github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	endpointpb "github.com/yandex-cloud/go-genproto/yandex/cloud/endpoint"
	iampb "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	operationpb "github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The API's services csid calls, by their ids in endpoint discovery.
const (
	computeService   = "compute"
	operationService = "operation"
	iamService       = "iam"
)

// api is csid's clients of the Yandex API: the generated clients of
// go-genproto, each on a connection to its service's endpoint. csid does
// not link the Yandex Go SDK's root package: it imports the clients of
// every Yandex Cloud service (over 200 packages, whose initialisation
// cost every csid about 30 MiB of memory, whatever its backend), and csid
// needs four services.
type api struct {
	disks      computepb.DiskServiceClient
	instances  computepb.InstanceServiceClient
	zones      computepb.ZoneServiceClient
	operations operationpb.OperationServiceClient
	conns      []*grpc.ClientConn
}

// dialAPI finds the services' endpoints through the ApiEndpointService at
// endpoint (a connection closed once they are known) and connects to
// them: compute and operation with IAM tokens from src on every call
// (per-call credentials), IAM's token service (for a service-account
// key's exchange) without. gRPC's own retries are disabled on every
// connection. paced (the throttle's interceptor) applies to the compute
// and operation connections only: an IAM exchange runs inside a compute
// or operation call's try (its per-call credentials), which the throttle
// has already paced and retries as a whole, so one try makes at most one
// exchange; retried on its own as well, each try would retry its
// exchange, with the token cache's lock held throughout. Endpoint
// discovery, asked once at start-up with no token, is paced and retried
// like a compute call: an API that is busy for a moment does not fail New.
// plaintext is for a fake API, never the real one.
func dialAPI(ctx context.Context, endpoint string, plaintext bool, src iamTokenSource, paced grpc.UnaryClientInterceptor) (a *api, err error) {
	transport := grpc.WithTransportCredentials(grpccreds.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}))
	if plaintext {
		transport = grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	a = &api{}
	defer func() {
		if err != nil {
			_ = a.close()
		}
	}()
	newClient := func(address string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
		return grpc.NewClient(address, append([]grpc.DialOption{transport, grpc.WithDisableRetry()}, extra...)...)
	}
	dial := func(address string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
		conn, err := newClient(address, extra...)
		if err != nil {
			return nil, err
		}
		a.conns = append(a.conns, conn)
		return conn, nil
	}
	// Discovery is asked once: its connection is not kept.
	discovery, err := newClient(endpoint, grpc.WithChainUnaryInterceptor(paced))
	if err != nil {
		return nil, err
	}
	list, err := endpointpb.NewApiEndpointServiceClient(discovery).List(ctx, &endpointpb.ListApiEndpointsRequest{})
	_ = discovery.Close()
	if err != nil {
		return nil, fmt.Errorf("endpoint discovery: %w", err)
	}
	addresses := map[string]string{}
	for _, e := range list.GetEndpoints() {
		addresses[e.GetId()] = e.GetAddress()
	}
	for _, id := range []string{computeService, operationService, iamService} {
		if addresses[id] == "" {
			return nil, fmt.Errorf("endpoint discovery at %s names no %s endpoint", endpoint, id)
		}
	}
	if key, ok := src.(*serviceAccountKey); ok {
		conn, err := dial(addresses[iamService])
		if err != nil {
			return nil, err
		}
		key.iam = iampb.NewIamTokenServiceClient(conn)
	}
	authorized := []grpc.DialOption{grpc.WithPerRPCCredentials(&tokens{src: src}), grpc.WithChainUnaryInterceptor(paced)}
	compute, err := dial(addresses[computeService], authorized...)
	if err != nil {
		return nil, err
	}
	operation, err := dial(addresses[operationService], authorized...)
	if err != nil {
		return nil, err
	}
	a.disks = computepb.NewDiskServiceClient(compute)
	a.instances = computepb.NewInstanceServiceClient(compute)
	a.zones = computepb.NewZoneServiceClient(compute)
	a.operations = operationpb.NewOperationServiceClient(operation)
	return a, nil
}

// close closes the connections.
func (a *api) close() error {
	var errs []error
	for _, c := range a.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
