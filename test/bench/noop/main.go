// Command noop is the floor of an exec-invoked CNI plugin: a static Go
// binary that reads its stdin and, for ADD, prints the smallest valid CNI
// result. `make bench` (test/bench/cnibench) times it exec'd bare and
// through libcni next to the real plugins, so the report shows how much of
// a plugin's latency is the process start it cannot avoid.
package main

import (
	"io"
	"os"
)

func main() {
	_, _ = io.Copy(io.Discard, os.Stdin)
	if os.Getenv("CNI_COMMAND") == "ADD" {
		_, _ = os.Stdout.WriteString(`{"cniVersion":"1.0.0"}`)
	}
}
