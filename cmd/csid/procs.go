package main

import (
	"os"
	"runtime"
)

// defaultSpareProcs is --spare-procs's default.
const defaultSpareProcs = 1

// setProcs gives the Go scheduler spare processors (Ps) beyond the CPUs
// it would use: GOMAXPROCS becomes the runtime's default (the CPUs, the
// affinity mask and the cgroup CPU limit) plus spare. A GOMAXPROCS
// environment variable is the operator's choice and is left alone, as is
// everything when spare is 0. It returns GOMAXPROCS as it now is.
//
// Why: csid's writes wait on a chain of flushes (the state file's two
// fdatasyncs a commit, the local backend's journal). While one blocks, its
// P runs other goroutines, and when it returns it needs a P again to go
// on; with as many Ps as CPUs, under load both are busy with the RPCs the
// last commit released, and the committer waits in the run queue, still
// holding the state file's write lock. A spare P lets it run at once (the
// kernel shares the CPUs among the threads, and favours the one that
// slept). Measured on 2 CPUs: create+delete at concurrency 8 +7%, at 1
// unchanged (docs/benchmarks.md, "Seventh pass").
//
// Setting GOMAXPROCS stops the runtime from following later changes of the
// CPU limit: a limit changed in place takes effect at the next start.
func setProcs(spare int) int {
	if _, chosen := os.LookupEnv("GOMAXPROCS"); !chosen && spare > 0 {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + spare)
	}
	return runtime.GOMAXPROCS(0)
}
