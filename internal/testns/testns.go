// Package testns makes the network namespaces of tests: created, and
// removed when the test ends, and an error of the test when one stays on
// the machine. For tests only (it imports testing).
package testns

import (
	"os"
	"strings"
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

// NetfilterSockets counts the netfilter netlink sockets (nftables',
// conntrack's) of the calling thread's netns: what a socket closed at
// each use would show as coming and going.
func NetfilterSockets(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/net/netlink")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "12" { // NETLINK_NETFILTER
			n++
		}
	}
	return n
}
