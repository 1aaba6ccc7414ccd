package yandexfake

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/endpoint"
)

// ServiceIDs are the API endpoint ids the fake lists (the SDK's names of
// its services); every one is at the fake's address.
var ServiceIDs = []string{"compute", "endpoint", "iam", "operation", "resource-manager"}

type endpointService struct {
	endpoint.UnimplementedApiEndpointServiceServer
	f *Fake
}

// Get reports a service's endpoint.
func (s endpointService) Get(_ context.Context, req *endpoint.GetApiEndpointRequest) (*endpoint.ApiEndpoint, error) {
	if !slices.Contains(ServiceIDs, req.GetApiEndpointId()) {
		return nil, status.Errorf(codes.NotFound, "api endpoint %q not found", req.GetApiEndpointId())
	}
	return &endpoint.ApiEndpoint{Id: req.GetApiEndpointId(), Address: s.f.addr}, nil
}

// List lists every service's endpoint (one page).
func (s endpointService) List(context.Context, *endpoint.ListApiEndpointsRequest) (*endpoint.ListApiEndpointsResponse, error) {
	resp := &endpoint.ListApiEndpointsResponse{}
	for _, id := range ServiceIDs {
		resp.Endpoints = append(resp.Endpoints, &endpoint.ApiEndpoint{Id: id, Address: s.f.addr})
	}
	return resp, nil
}

type zoneService struct {
	compute.UnimplementedZoneServiceServer
	f *Fake
}

func zonePB(id string) *compute.Zone {
	region := id
	if i := strings.LastIndex(id, "-"); i > 0 {
		region = id[:i]
	}
	return &compute.Zone{Id: id, RegionId: region, Status: compute.Zone_UP}
}

// Get reports a zone.
func (s zoneService) Get(_ context.Context, req *compute.GetZoneRequest) (*compute.Zone, error) {
	if err := checkID("zone_id", req.GetZoneId()); err != nil {
		return nil, err
	}
	if !slices.Contains(s.f.opts.Zones, req.GetZoneId()) {
		return nil, status.Errorf(codes.NotFound, "zone %s not found", req.GetZoneId())
	}
	return zonePB(req.GetZoneId()), nil
}

// List lists the zones (one page).
func (s zoneService) List(_ context.Context, req *compute.ListZonesRequest) (*compute.ListZonesResponse, error) {
	if _, err := pageSize(req.GetPageSize()); err != nil {
		return nil, err
	}
	if req.GetPageToken() != "" {
		return nil, malformedPageToken(req.GetPageToken())
	}
	resp := &compute.ListZonesResponse{}
	for _, z := range s.f.opts.Zones {
		resp.Zones = append(resp.Zones, zonePB(z))
	}
	return resp, nil
}
