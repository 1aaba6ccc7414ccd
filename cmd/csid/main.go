// Command csid is a CSI driver for block storage that can only be grown
// while detached. `csid serve` runs the driver; `csid --help` lists the rest.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
