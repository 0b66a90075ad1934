package policynft

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/test/nettest"
)

// gatewayLL is the pod's host veth's link-local gateway as the pod
// reaches it (with its zone).
func gatewayLL() netip.Addr { return netip.MustParseAddr(gateway6).WithZone("eth0") }

// TestLinkLocalJudgedByPort: a packet through a pod's host veth is that
// pod's whatever its addresses. A pod isolated for egress with no rule
// reaches its node neither on the node's addresses nor on its host veth's
// link-local address (before, the link-local packet matched no pod
// address and passed); a pod no policy isolates still reaches both; and
// an isolated pod still resolves its gateway (neighbor discovery between
// neighbours passes).
func TestLinkLocalJudgedByPort(t *testing.T) {
	e := newEnv(t, "a", "b")
	a, b := e.pods["a"], e.pods["b"]
	server(t, e.node, 7001)
	rs := policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6},
		Pods: []policy.PodChains{{ID: "a", Namespace: "ns", Name: "a", Addrs: []netip.Addr{a.v4, a.v6},
			EgressIsolated: true}},
	}
	e.apply(rs)
	// the open pod's own link-local address takes a moment (DAD)
	nettest.Eventually(t, 10*time.Second, "the open pod reaches its node over link-local", func() error {
		return flow(b.ns, "tcp", gatewayLL(), 7001)
	})
	runChecks(t, []check{
		{"isolated pod to the node over link-local (TCP)", false, func() error { return flow(a.ns, "tcp", gatewayLL(), 7001) }},
		{"isolated pod to the node over link-local (ping)", false, func() error { return ping(a.ns, gatewayLL()) }},
		{"isolated pod to the node's address", false, func() error { return flow(a.ns, "tcp", nodeAddr4, 7001) }},
		{"open pod to the node over link-local (TCP)", true, func() error { return flow(b.ns, "tcp", gatewayLL(), 7001) }},
		{"open pod to the node's address", true, func() error { return flow(b.ns, "tcp", nodeAddr6, 7001) }},
	})
	// the isolated pod's gateway is still resolved: its neighbour entry
	// for the gateway reaches REACHABLE or STALE, not FAILED
	nettest.Do(t, a.ns, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, n := range neighs {
			if n.IP.String() == gateway6 && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0 {
				return fmt.Errorf("the isolated pod could not resolve its gateway: state %#x", n.State)
			}
		}
		return nil
	})
	if c := unknownDropped(t, e); c != 0 {
		t.Errorf("unknown_dropped = %d: no packet here is from an unknown pod", c)
	}
}

// TestUnknownPortDroppedFirstWrite: a table written before the node's
// PodCIDRs are known (engine start, this node's Node refused) already
// drops a pod the engine does not know: by its host veth, whatever its
// addresses, link-local included, and counts it.
func TestUnknownPortDroppedFirstWrite(t *testing.T) {
	e := newEnv(t, "a", "c")
	a, c := e.pods["a"], e.pods["c"]
	server(t, e.node, 7002)
	server(t, c.ns, 7002)
	e.apply(policy.Ruleset{Known: []netip.Addr{a.v4, a.v6}}) // no PodCIDRs, c unknown
	runChecks(t, []check{
		{"unknown pod to the node (IPv4)", false, func() error { return flow(c.ns, "tcp", nodeAddr4, 7002) }},
		{"unknown pod to the node over link-local", false, func() error { return flow(c.ns, "tcp", gatewayLL(), 7002) }},
		{"known pod to the unknown pod", false, func() error { return flow(a.ns, "tcp", c.v6, 7002) }},
		{"known pod to the node", true, func() error { return flow(a.ns, "tcp", nodeAddr4, 7002) }},
	})
	if n := unknownDropped(t, e); n == 0 {
		t.Errorf("unknown_dropped = 0 after the unknown pod's packets were dropped")
	}
	// once known, it passes
	e.apply(policy.Ruleset{Known: []netip.Addr{a.v4, a.v6, c.v4, c.v6}})
	runChecks(t, []check{
		{"known pod c to the node", true, func() error { return flow(c.ns, "tcp", nodeAddr4, 7002) }},
		{"a to c", true, func() error { return flow(a.ns, "tcp", c.v6, 7002) }},
	})
}

func unknownDropped(t *testing.T, e *env) uint64 {
	t.Helper()
	var n uint64
	e.do(func() error {
		var err error
		_, n, err = e.w.DropCounters()
		return err
	})
	return n
}
