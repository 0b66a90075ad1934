package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestCompiledRangesCanonical: what Compile hands the writer is
// canonical (the contract of Rule that routed/policy/nft trusts, without
// normalising again): peers merged and sorted, port elements disjoint,
// and making them canonical again changes nothing.
func TestCompiledRangesCanonical(t *testing.T) {
	for seed := range uint64(6) {
		g := newGen(seed, 3, 4, 80, 30)
		for _, n := range g.nodes {
			rs := g.s.Compile(n, g.cidrs[n])
			checkRuleset(t, rs)
			for _, pc := range rs.Policies {
				for i, r := range pc.Rules {
					c := r.Canonical()
					if !slices.Equal(c.Peers, r.Peers) {
						t.Fatalf("seed %d %s rule %d: peers %v not canonical (%v)", seed, pc.ID, i, r.Peers, c.Peers)
					}
					if !slices.Equal(c.Ports, r.Ports) {
						t.Fatalf("seed %d %s rule %d: ports %v not canonical (%v)", seed, pc.ID, i, r.Ports, c.Ports)
					}
				}
			}
			if got := PrefixRanges(rs.LocalPodCIDRs); !slices.Equal(got, PrefixRanges(slices.Concat(rs.LocalPodCIDRs, rs.LocalPodCIDRs))) {
				t.Fatalf("PrefixRanges of %v not idempotent: %v", rs.LocalPodCIDRs, got)
			}
		}
	}
}

func addr4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }

// inPorts counts the elements of ps holding (a, proto, port).
func inPorts(ps []PortRange, a netip.Addr, proto uint8, port uint16) int {
	n := 0
	for _, p := range ps {
		if p.Proto == proto && !a.Less(p.Addrs.From) && !p.Addrs.To.Less(a) && p.PortFrom <= port && port <= p.PortTo {
			n++
		}
	}
	return n
}

// TestCanonicalPorts: random overlapping (address, protocol, port) boxes
// become disjoint ones (a concatenated interval set refuses overlaps)
// covering exactly the same points.
func TestCanonicalPorts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var in []PortRange
		for range 1 + r.IntN(8) {
			a, b := r.IntN(20), r.IntN(20)
			if b < a {
				a, b = b, a
			}
			p := uint16(r.IntN(30))
			in = append(in, PortRange{Addrs: Range{From: addr4(a), To: addr4(b)},
				Proto: []uint8{ProtoTCP, ProtoUDP}[r.IntN(2)], PortFrom: p, PortTo: p + uint16(r.IntN(10))})
		}
		out := Rule{Ports: in}.Canonical().Ports
		for a := range 22 {
			for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
				for port := range uint16(42) {
					want, got := inPorts(in, addr4(a), proto, port) > 0, inPorts(out, addr4(a), proto, port)
					if got > 1 || want != (got == 1) {
						t.Fatalf("round %d: %v %d %d in %d output boxes, want in: %v\nin %v\nout %v", round, addr4(a), proto, port, got, want, in, out)
					}
				}
			}
		}
		if again := (Rule{Ports: out}).Canonical().Ports; !slices.Equal(again, out) {
			t.Fatalf("round %d: canonical ports not canonical again:\n%v\n%v", round, out, again)
		}
	}
}

// TestCanonicalPeers: overlapping and touching ranges merge, families
// stay apart, the top of the address space stays, a reversed range goes;
// prefixes become merged ranges.
func TestCanonicalPeers(t *testing.T) {
	top := netip.MustParseAddr("255.255.255.255")
	got := Rule{Peers: []Range{
		{From: addr4(5), To: addr4(9)}, {From: addr4(1), To: addr4(4)}, {From: addr4(20), To: addr4(30)},
		{From: addr4(25), To: addr4(26)}, {From: netip.MustParseAddr("fd00::1"), To: netip.MustParseAddr("fd00::2")},
		{From: netip.MustParseAddr("11.0.0.0"), To: top}, {From: addr4(9), To: addr4(3)}, // reversed: dropped
	}}.Canonical().Peers
	want := []Range{{From: addr4(1), To: addr4(9)}, {From: addr4(20), To: addr4(30)}, {From: netip.MustParseAddr("11.0.0.0"), To: top},
		{From: netip.MustParseAddr("fd00::1"), To: netip.MustParseAddr("fd00::2")}}
	if !slices.Equal(got, want) {
		t.Fatalf("Canonical peers = %v, want %v", got, want)
	}
	pr := PrefixRanges([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.0.0/24"),
		netip.MustParsePrefix("10.244.1.128/25"), netip.MustParsePrefix("::ffff:10.9.0.0/112"), netip.MustParsePrefix("fd00::/64"), {}})
	wantPR := []Range{{From: netip.MustParseAddr("10.9.0.0"), To: netip.MustParseAddr("10.9.255.255")},
		{From: netip.MustParseAddr("10.244.0.0"), To: netip.MustParseAddr("10.244.1.255")},
		{From: netip.MustParseAddr("fd00::"), To: netip.MustParseAddr("fd00::ffff:ffff:ffff:ffff")}}
	if !slices.Equal(pr, wantPR) {
		t.Fatalf("PrefixRanges = %v, want %v", pr, wantPR)
	}
}
