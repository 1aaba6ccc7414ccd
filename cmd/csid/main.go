// Command csid is a CSI driver for block storage that can only be grown
// while detached. See the README and docs/ for how to run it.
package main

import (
	"fmt"
	"os"

	"github.com/csid-dev/csid/internal/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("csid", version.Version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: csid version   (serve, inspect, check, drill and bench are coming)")
	os.Exit(2)
}
