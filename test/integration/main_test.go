// Package integration runs the built podnet binaries through libcni, as a
// container runtime does, inside network namespaces the tests create.
package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/podnet/podnet/test/nettest"
)

// fakeIPAMDir holds the test-only fakeipam plugin built for this run.
var fakeIPAMDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "podnet-fakeipam-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if fakeIPAMDir, err = nettest.BuildFakeIPAM(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
