module github.com/csid-dev/csid

go 1.26.0

require (
	github.com/looplab/fsm v1.0.3
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.48.0
)

require golang.org/x/sync v0.23.0 // indirect
