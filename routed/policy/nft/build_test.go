package nft

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/podnet/podnet/routed/policy"
)

func addr4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }

// inPorts tells whether (a, proto, port) is in ps.
func inPorts(ps []policy.PortRange, a netip.Addr, proto uint8, port uint16) int {
	n := 0
	for _, p := range ps {
		if p.Proto == proto && !a.Less(p.Addrs.From) && !p.Addrs.To.Less(a) && p.PortFrom <= port && port <= p.PortTo {
			n++
		}
	}
	return n
}

// TestNormalizePorts: random overlapping (address, protocol, port) boxes
// become disjoint ones (a concatenated interval set refuses overlaps)
// covering exactly the same points.
func TestNormalizePorts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var in []policy.PortRange
		for range 1 + r.IntN(8) {
			a, b := r.IntN(20), r.IntN(20)
			if b < a {
				a, b = b, a
			}
			p := uint16(r.IntN(30))
			in = append(in, policy.PortRange{Addrs: policy.Range{From: addr4(a), To: addr4(b)},
				Proto: []uint8{policy.ProtoTCP, policy.ProtoUDP}[r.IntN(2)], PortFrom: p, PortTo: p + uint16(r.IntN(10))})
		}
		out := normalizePorts(in)
		for a := range 22 {
			for _, proto := range []uint8{policy.ProtoTCP, policy.ProtoUDP} {
				for port := range uint16(42) {
					want, got := inPorts(in, addr4(a), proto, port) > 0, inPorts(out, addr4(a), proto, port)
					if got > 1 || want != (got == 1) {
						t.Fatalf("round %d: %v %d %d in %d output boxes, want in: %v\nin %v\nout %v", round, addr4(a), proto, port, got, want, in, out)
					}
				}
			}
		}
	}
}

// TestMergeRanges: overlapping and touching ranges merge, families stay
// apart, the top of the address space gives an open interval.
func TestMergeRanges(t *testing.T) {
	top := netip.MustParseAddr("255.255.255.255")
	got := mergeRanges([]policy.Range{
		{From: addr4(5), To: addr4(9)}, {From: addr4(1), To: addr4(4)}, {From: addr4(20), To: addr4(30)},
		{From: addr4(25), To: addr4(26)}, {From: netip.MustParseAddr("fd00::1"), To: netip.MustParseAddr("fd00::2")},
		{From: netip.MustParseAddr("11.0.0.0"), To: top}, {From: addr4(9), To: addr4(3)}, // reversed: dropped
	})
	want := []policy.Range{{From: addr4(1), To: addr4(9)}, {From: addr4(20), To: addr4(30)}, {From: netip.MustParseAddr("11.0.0.0"), To: top},
		{From: netip.MustParseAddr("fd00::1"), To: netip.MustParseAddr("fd00::2")}}
	if len(got) != len(want) {
		t.Fatalf("mergeRanges = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("mergeRanges = %v, want %v", got, want)
		}
	}
	if e := rangeElements(got, false); len(e) != 5 || e[4].IntervalEnd {
		t.Errorf("rangeElements = %v: want 5, the last range open", e)
	}
}

// TestEmptyFamilyNoRule: a rule gets a rule and sets only for the
// families in which its peers and ports sets would hold something; an
// IPv4-only rule writes no IPv6 rule or set, and a rule whose ports are
// of one family and peers of the other writes none at all.
func TestEmptyFamilyNoRule(t *testing.T) {
	v4, v6 := addr4(7), netip.MustParseAddr("fd00::7")
	anyV6 := policy.Range{From: netip.IPv6Unspecified(), To: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	tcp80 := func(a policy.Range) policy.PortRange {
		return policy.PortRange{Addrs: a, Proto: policy.ProtoTCP, PortFrom: 80, PortTo: 80}
	}
	rs := policy.Ruleset{
		Known: []netip.Addr{v4},
		Pods:  []policy.PodChains{{ID: "p", Addrs: []netip.Addr{v4}, IngressIsolated: true, Ingress: []string{"a", "b", "c", "d"}}},
		Policies: []policy.PolicyChain{
			// peers and ports IPv4 only: one rule, two sets
			{ID: "a", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: addr4(1), To: addr4(9)}}, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4})}}}},
			// IPv4 ports, IPv6 peers: no family can match
			{ID: "b", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: v6, To: v6}}, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4})}}}},
			// any peer, ports of both families: two rules, two sets
			{ID: "c", Direction: policy.Ingress, Rules: []policy.Rule{{AnyPeer: true, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4}), tcp80(anyV6)}}}},
			// peers of both families, any port: two rules
			{ID: "d", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: addr4(1), To: addr4(1)}, {From: v6, To: v6}}, AnyPort: true}}},
		},
	}
	def, err := build(rs, buildOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]int{}
	for _, c := range def.chains {
		rules[c.chain.Name] = len(c.rules)
	}
	sets := map[string]bool{}
	for _, s := range def.sets {
		sets[s.name] = true
	}
	for chain, want := range map[string]int{"pol-a": 1, "pol-b": 0, "pol-c": 2, "pol-d": 2} {
		if rules[chain] != want {
			t.Errorf("chain %s: %d rules, want %d", chain, rules[chain], want)
		}
	}
	for name, want := range map[string]bool{
		"pol-a-r0-peers4": true, "pol-a-r0-ports4": true, "pol-a-r0-peers6": false, "pol-a-r0-ports6": false,
		"pol-b-r0-peers4": false, "pol-b-r0-peers6": false, "pol-b-r0-ports4": false, "pol-b-r0-ports6": false,
		"pol-c-r0-ports4": true, "pol-c-r0-ports6": true,
		"pol-d-r0-peers4": true, "pol-d-r0-peers6": true,
	} {
		if sets[name] != want {
			t.Errorf("set %s written: %v, want %v", name, sets[name], want)
		}
	}
}
