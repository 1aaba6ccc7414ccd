// Package yandexfake is a fake of the Yandex Cloud API for the tests of
// csid's Yandex backend: a real gRPC server (plaintext, on 127.0.0.1) that
// implements the vendor's generated service interfaces from
// github.com/yandex-cloud/go-genproto, so that the backend talks to it
// through the real clients (and the Go SDK) over a real connection.
//
// It is imported only by tests and test helpers, never by csid itself.
//
// # Services
//
// One listener (Endpoint) serves:
//
//   - yandex.cloud.endpoint.ApiEndpointService: List and Get name every
//     service at the fake's own address, as the SDK's endpoint discovery
//     expects.
//   - yandex.cloud.iam.v1.IamTokenService.Create: an IAM token for a JWT
//     signed (PS256) by a service-account key the fake issued
//     (NewServiceAccountKey). The signature, the key id ("kid"), the issuer
//     (the key's service account), the audience
//     (https://iam.api.cloud.yandex.net/iam/v1/tokens), the expiry and a
//     lifetime of at most an hour are checked. Tokens expire after
//     Options.TokenTTL.
//   - yandex.cloud.compute.v1.DiskService: Get, List, Create, Update,
//     Delete, ListOperations.
//   - yandex.cloud.compute.v1.InstanceService: Get, AttachDisk, DetachDisk.
//   - yandex.cloud.compute.v1.ZoneService: Get, List.
//   - yandex.cloud.operation.OperationService: Get (Cancel is
//     Unimplemented).
//
// Every call except ApiEndpointService and IamTokenService.Create needs the
// metadata "authorization: Bearer <IAM token>" with a token the fake issued
// and that has not expired; Unauthenticated otherwise.
//
// # Semantics
//
// Mutations validate their request first and fail at once with a status
// (nothing started); otherwise they return an Operation with done=false
// whose metadata names the resource (CreateDiskMetadata.disk_id, ...). The
// operation completes once Options.OperationDelay (SetOperationDelay) has
// passed and it is not held (HoldOperations), at the first API call after
// that: OperationService.Get then reports done, with the resource as the
// response (the Disk for disk operations, the Instance for attach and
// detach, google.protobuf.Empty for a delete) or the error it failed with.
// What a mutation reserves (a disk's name, quota, an instance's slot) is
// taken when it starts; what it changes is visible when it completes. A
// disk with an operation in flight refuses other mutations with
// FailedPrecondition: a disk being created cannot be attached, nor one
// being deleted; the fake extends that to every mutation, a choice (the
// real API's rule for a busy disk is not documented).
// A mutating call repeated with the same "idempotency-key" metadata
// returns the first call's operation.
//
// The codes, where the API leaves a choice:
//
//   - Create: a name taken in the folder, AlreadyExists; an unknown zone or
//     disk type, a name, label or size out of the API's documented rules,
//     InvalidArgument; over the folder's quota (Options.Quota),
//     ResourceExhausted with a google.rpc.QuotaFailure detail
//     (subjects "compute.disks.count", "compute.disks.size"; the real
//     quotas are per disk type, compute.hddDisks.size and the like).
//   - Update: only the update_mask paths "labels" and "size" (and "name",
//     "description"); an empty mask or another path, InvalidArgument.
//     Labels are replaced as a whole. A smaller size, InvalidArgument; a
//     larger size of a disk attached to an instance, FailedPrecondition
//     (the disk cannot grow online) unless Options.GrowAttached.
//   - Delete: an attached disk, FailedPrecondition.
//   - List: folder_id must be the fake's folder (another is
//     PermissionDenied); the filter grammar is
//     conditions joined by AND, each `name` or `labels.<key>` with `=`,
//     `!=`, `IN (...)` or `NOT IN (...)` and quoted values; anything else is
//     InvalidArgument. Pages are ordered by id; the page token is opaque.
//   - AttachDisk: device_name must match [a-z][a-z0-9-_]{0,19} (csid uses
//     the disk id); the disk in another zone, attached anywhere, or not
//     READY, FailedPrecondition; a device name taken on the instance,
//     FailedPrecondition; the instance full (AddInstance's maxDisks
//     secondary disks, attaches in flight counted): ResourceExhausted with
//     a google.rpc.QuotaFailure detail (subject
//     "compute.instance.secondaryDisks"). The real API's code for a full
//     instance is not documented; ResourceExhausted with a QuotaFailure lets
//     a client tell it from throttling (no detail) and from a disk attached
//     elsewhere (FailedPrecondition).
//   - DetachDisk: by disk_id or device_name; a disk not attached to that
//     instance, or busy (above), FailedPrecondition. The disk's status is
//     not checked (the API documents no refusal of a detach by status).
//   - Ids longer than the API's 50 characters are InvalidArgument; unknown
//     ids NotFound.
//
// # Knobs
//
// Knobs name a method by its full gRPC name (the Method* constants):
// SetLatency delays calls before they are handled; FailCalls fails the next
// n calls with a code; DropReplies lets the next n calls act and then
// lose their reply; FailOperations lets the next n operations of a method
// start and then fail; Throttle answers ResourceExhausted (or
// another code) for n calls or for a while; SetOperationDelay,
// HoldOperations and ReleaseOperations pace operations; ForgetOperations
// drops the finished ones; SetQuota,
// SetTokenTTL and SetGrowAttached change the rules. Calls reports when
// each call of a method arrived, Seen every request's metadata and body.
//
// # Nodes
//
// NewLoopNode simulates an instance's guest: a disk attached to the
// instance appears as <dir>/by-id/virtio-<device name>, a link to a loop
// device bound to the disk's image file <dir>/images/<disk id>. A disk's
// image is its content: kept across detach, grown by a grow, moved to the
// node it is attached to next, removed with the disk (Fake.ImagePath finds
// it). MetadataServer serves
// the instance metadata (id, zone, the service account's token) as the
// Yandex metadata service does, in its GCE-compatible form.
//
// # Notes for clients (what the fake taught about the SDK)
//
//   - go-sdk v0.33.0 (the last v1) builds against go-genproto up to
//     v0.117.0, not v0.121.0 and later; go.mod pins v0.117.0.
//   - ycsdk.Build with Config{Endpoint: f.Endpoint(), Plaintext: true} talks
//     to the fake; endpoint discovery happens at the first call, and a
//     failure of it is kept by the SDK for the life of the SDK value (so a
//     Throttle of "" leaves discovery and IAM alone).
//   - The SDK's Operation.Wait polls every second; WaitInterval polls
//     faster. The SDK refreshes its IAM token only when the token's
//     expires_at has passed, not on Unauthenticated.
//   - ycsdk.InstanceServiceAccount reads the metadata service's address
//     (host:port) from YC_METADATA_ADDR; MetadataServer serves it.
//
// A Fake is safe for concurrent use.
package yandexfake
