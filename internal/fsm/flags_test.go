package fsm

import "flag"

var update = flag.Bool("update", false, "rewrite docs/state-machine.md from the code")
