//go:build !drillbug

package effects

// plantedBug is false in every real build. The drill's own test builds csid
// with the drillbug tag (planted_drillbug.go) to prove that the drill
// catches a non-idempotent executor.
const plantedBug = false
