// Package testns makes the network namespaces of tests: created, and
// removed when the test ends, and an error of the test when one stays on
// the machine. For tests only (it imports testing).
package testns

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// New creates a netns removed at the end of the test.
func New(t testing.TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { Drop(t, n) })
	return n
}

// Drop closes and removes a netns of the test. One removed already is
// fine; one whose bind mount stays is an error of the test: the machine
// would keep it.
func Drop(t testing.TB, n ns.NetNS) {
	t.Helper()
	_ = n.Close()
	err := testutils.UnmountNS(n)
	if _, serr := os.Stat(n.Path()); serr == nil {
		t.Errorf("netns %s left behind: %v", n.Path(), err)
	}
}
