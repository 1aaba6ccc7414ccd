module github.com/csid-dev/csid

go 1.26.0

require (
	github.com/looplab/fsm v1.0.3
	github.com/moby/sys/mountinfo v0.7.2
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.48.0
	k8s.io/mount-utils v0.37.2
	k8s.io/utils v0.0.0-20260626114624-be93311217bd
)

require (
	github.com/go-logr/logr v1.4.3 // indirect
	golang.org/x/sync v0.23.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
