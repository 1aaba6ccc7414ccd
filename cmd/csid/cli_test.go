package main

import (
	"bytes"
	"context"
	"flag"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// cli runs csid with args in-process, as a user would, and returns its
// exit code, stdout and stderr.
func cli(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runIO(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// inspectAt runs `csid inspect args...` in-process with a fixed clock (the
// ages in tables), and returns stdout, or fails the test.
func inspectAt(t testing.TB, now time.Time, args ...string) string {
	t.Helper()
	root := &cobra.Command{Use: "csid", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(newInspect(func() time.Time { return now }))
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(append([]string{"inspect"}, args...))
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("csid inspect %q: %v\n%s", args, err, errb.String())
	}
	return out.String()
}
