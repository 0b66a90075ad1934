package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// hostileBlocks is 10,000 overlapping ipBlocks (/20 to /32) in
// 100.64.0.0/10, every other with excepts (some nested, some outside their
// cidr).
func hostileBlocks(r *rand.Rand) []networkingv1.NetworkPolicyPeer {
	var peers []networkingv1.NetworkPolicyPeer
	rnd := func(bits int) netip.Prefix {
		b := [4]byte{100, byte(64 + r.IntN(64)), byte(r.IntN(256)), byte(r.IntN(256))}
		return netip.PrefixFrom(netip.AddrFrom4(b), bits).Masked()
	}
	for i := range 10000 {
		c := rnd(20 + r.IntN(13))
		var except []string
		if i%2 == 0 && c.Bits() < 32 {
			for range 1 + r.IntN(4) {
				// inside: c's address with more bits set at random
				b := c.Addr().As4()
				for j := c.Bits(); j < 32; j++ {
					if r.IntN(2) == 0 {
						b[j/8] |= 1 << (7 - j%8)
					}
				}
				e := netip.PrefixFrom(netip.AddrFrom4(b), c.Bits()+1+r.IntN(32-c.Bits())).Masked()
				except = append(except, e.String())
			}
			if r.IntN(4) == 0 {
				except = append(except, rnd(24).String()) // likely outside
			}
		}
		peers = append(peers, blockPeer(c.String(), except...))
	}
	return peers
}

// TestHostilePolicies: 10,000 ipBlocks selecting every pod, excepts galore,
// adjacent blocks, a thousand named ports matching nothing. The output stays
// merged and small and agrees with Explain.
func TestHostilePolicies(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	s := testState()
	big := policy("x", "big", nil, ingress(nil, hostileBlocks(r)...), ptypes(pIngress, pEgress), egress(nil, hostileBlocks(r)...))
	if err := s.SetPolicy(big); err != nil {
		t.Fatal(err)
	}
	// 10,000 adjacent /24s: one range
	var adj []networkingv1.NetworkPolicyPeer
	for i := range 10000 {
		adj = append(adj, blockPeer(netip.AddrFrom4([4]byte{172, byte(16 + i/256), byte(i), 0}).String()+"/24"))
	}
	if err := s.SetPolicy(policy("x", "adjacent", nil, ingress(nil, adj...))); err != nil {
		t.Fatal(err)
	}
	var nope []networkingv1.NetworkPolicyPort
	for i := range 1000 {
		nope = append(nope, port("TCP", fmt.Sprintf("nope%d", i)))
	}
	if err := s.SetPolicy(policy("x", "nope", nil, ingress(nope))); err != nil {
		t.Fatal(err)
	}
	rs := s.Compile("n1", nodeCIDRs["n1"])
	checkRuleset(t, rs)
	if len(rs.Pods) != 3 { // x/a, x/b and the arriving x/pending on n1
		t.Fatalf("pods %+v", rs.Pods)
	}
	for _, pc := range rs.Policies {
		r0 := pc.Rules[0]
		switch pc.Name {
		case "big":
			// 10,000 blocks of /16../32 with excepts: far fewer ranges
			if len(r0.Peers) == 0 || len(r0.Peers) > 10000 {
				t.Errorf("big %s: %d ranges", pc.Direction, len(r0.Peers))
			}
			t.Logf("big %s: 10,000 ipBlocks -> %d ranges", pc.Direction, len(r0.Peers))
		case "adjacent":
			want := []Range{{a("172.16.0.0"), a("172.55.15.255")}}
			if len(r0.Peers) != 1 || r0.Peers[0] != want[0] {
				t.Errorf("adjacent: %v, want %v", r0.Peers, want)
			}
		case "nope":
			if r0.AnyPort || len(r0.Ports) != 0 {
				t.Errorf("nope: %+v", r0)
			}
		}
	}
	m := NewMatcher(rs)
	var in, out int
	for range 3000 {
		b := [4]byte{100, byte(64 + r.IntN(64)), byte(r.IntN(256)), byte(r.IntN(256))}
		peer := netip.AddrFrom4(b)
		for _, f := range [][2]netip.Addr{{peer, a("10.0.1.1")}, {a("10.0.1.2"), peer}} {
			v := s.Explain(f[0], f[1], tcp, 80)
			if got := m.Allows(f[0], f[1], tcp, 80); got != v.Allowed {
				t.Fatalf("%s -> %s: compiled %v, Explain %v", f[0], f[1], got, v)
			}
			if v.Allowed {
				in++
			} else {
				out++
			}
		}
	}
	if in < 100 || out < 100 {
		t.Errorf("probes lopsided: %d in, %d out", in, out)
	}
	// and the nope policy does not open x/a to 172.16.0.1 on a port
	if m.Allows(a("172.16.0.1"), a("10.0.1.1"), tcp, 80) != true {
		t.Error("adjacent blocks: 172.16.0.1 denied")
	}
}

// TestRanges checks the range arithmetic against brute force on a small
// address space.
func TestRanges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for range 300 {
		var base, holes []Range
		var in [512]bool
		var hole [512]bool
		for range 1 + r.IntN(5) {
			x, y := r.IntN(512), r.IntN(512)
			x, y = min(x, y), max(x, y)
			base = append(base, Range{addr(x), addr(y)})
			for i := x; i <= y; i++ {
				in[i] = true
			}
		}
		for range r.IntN(8) {
			x, y := r.IntN(512), r.IntN(512)
			x, y = min(x, y), max(x, y)
			holes = append(holes, Range{addr(x), addr(y)})
			for i := x; i <= y; i++ {
				hole[i] = true
			}
		}
		got := subtractRanges(mergeRanges(base), mergeRanges(holes))
		for i := range 512 {
			if want := in[i] && !hole[i]; rangesContain(got, addr(i)) != want {
				t.Fatalf("%v - %v = %v: %s wrong", base, holes, got, addr(i))
			}
		}
		// boxes: made disjoint, same coverage
		var boxes []portBox
		type key struct{ a, p int }
		cover := map[key]bool{}
		for range 1 + r.IntN(6) {
			x, y := r.IntN(64), r.IntN(64)
			x, y = min(x, y), max(x, y)
			pf, pt := r.IntN(20), r.IntN(20)
			pf, pt = min(pf, pt), max(pf, pt)
			boxes = append(boxes, portBox{addrs: Range{addr(x), addr(y)}, proto: ProtoTCP, from: uint16(pf), to: uint16(pt)})
			for i := x; i <= y; i++ {
				for p := pf; p <= pt; p++ {
					cover[key{i, p}] = true
				}
			}
		}
		ports := disjointPorts(boxes)
		checkRuleset(t, Ruleset{Policies: []PolicyChain{{ID: "000000000000", Rules: []Rule{{Ports: ports}}}}})
		for i := range 64 {
			for p := range 20 {
				if portsContain(lookupForm(ports), addr(i), ProtoTCP, uint16(p)) != cover[key{i, p}] {
					t.Fatalf("boxes %v -> %v: (%s, %d) wrong", boxes, ports, addr(i), p)
				}
			}
		}
	}
	// full-family and single-address boxes (what Compile makes): the
	// linear path
	for range 300 {
		var boxes []portBox
		type key struct{ a, p int }
		cover := map[key]bool{}
		var global [20]bool
		for range 1 + r.IntN(8) {
			pf, pt := r.IntN(20), r.IntN(20)
			pf, pt = min(pf, pt), max(pf, pt)
			if r.IntN(4) == 0 {
				boxes = append(boxes, portBox{addrs: fullRange(true), proto: ProtoUDP, from: uint16(pf), to: uint16(pt)})
				for p := pf; p <= pt; p++ {
					global[p] = true
				}
				continue
			}
			i := r.IntN(16)
			if r.IntN(10) == 0 {
				i = 0 // 10.0.0.0
			}
			boxes = append(boxes, portBox{addrs: single(addr(i)), proto: ProtoUDP, from: uint16(pf), to: uint16(pt)})
			for p := pf; p <= pt; p++ {
				cover[key{i, p}] = true
			}
		}
		ports := disjointPorts(slices.Clone(boxes))
		checkRuleset(t, Ruleset{Policies: []PolicyChain{{ID: "000000000000", Rules: []Rule{{Ports: ports}}}}})
		probe := []netip.Addr{a("0.0.0.0"), a("9.255.255.255"), a("255.255.255.255")}
		for i := range 18 {
			probe = append(probe, addr(i))
		}
		for _, x := range probe {
			for p := range 20 {
				i := -1
				if x.Compare(addr(0)) >= 0 && x.Compare(addr(17)) <= 0 {
					i = int(x.As4()[3])
				}
				want := global[p] || cover[key{i, p}]
				if portsContain(lookupForm(ports), x, ProtoUDP, uint16(p)) != want {
					t.Fatalf("boxes %v -> %v: (%s, %d) wrong, want %v", boxes, ports, x, p, want)
				}
			}
		}
		if _, ok := pointsSweep(nil, boxes); !ok {
			t.Fatal("pointsSweep refused points")
		}
	}
	// full-family boxes and boxes of one port over any addresses (what
	// Compile makes of numbered and named ports): port-major, the same
	// coverage, and again the same when given its own elements
	for range 300 {
		var boxes []portBox
		type key struct{ a, p int }
		cover := map[key]bool{}
		var global [20]bool
		for range 1 + r.IntN(10) {
			if r.IntN(5) == 0 {
				pf, pt := r.IntN(20), r.IntN(20)
				pf, pt = min(pf, pt), max(pf, pt)
				boxes = append(boxes, portBox{addrs: fullRange(true), proto: ProtoTCP, from: uint16(pf), to: uint16(pt)})
				for p := pf; p <= pt; p++ {
					global[p] = true
				}
				continue
			}
			x, y, p := r.IntN(16), r.IntN(16), r.IntN(20)
			x, y = min(x, y), max(x, y)
			boxes = append(boxes, portBox{addrs: Range{addr(x), addr(y)}, proto: ProtoTCP, from: uint16(p), to: uint16(p)})
			for i := x; i <= y; i++ {
				cover[key{i, p}] = true
			}
		}
		ports := disjointPorts(slices.Clone(boxes))
		checkRuleset(t, Ruleset{Policies: []PolicyChain{{ID: "000000000000", Rules: []Rule{{Ports: ports}}}}})
		if !slices.IsSortedFunc(ports, portMajorCmp) {
			t.Fatalf("boxes %v -> %v: not port-major", boxes, ports)
		}
		for i := range 18 {
			for p := range 20 {
				if got, want := portsContain(lookupForm(ports), addr(i), ProtoTCP, uint16(p)), global[p] || cover[key{i, p}]; got != want {
					t.Fatalf("boxes %v -> %v: (%s, %d) %v, want %v", boxes, ports, addr(i), p, got, want)
				}
			}
		}
		if again := (Rule{Ports: ports}).Canonical().Ports; !slices.Equal(again, ports) {
			t.Fatalf("boxes %v -> %v, then %v", boxes, ports, again)
		}
	}
	// the edges of the families
	full := []Range{fullRange(true), fullRange(false)}
	if got := mergeRanges([]Range{{a("0.0.0.0"), a("255.255.255.254")}, {a("255.255.255.255"), a("255.255.255.255")}, {a("::"), a("::1")}}); len(got) != 2 || got[0] != full[0] {
		t.Errorf("merge at the top of IPv4: %v", got)
	}
	if got := subtractRanges(full, []Range{{a("255.255.255.255"), a("255.255.255.255")}, {a("::"), a("::")}}); len(got) != 2 ||
		got[0].To != a("255.255.255.254") || got[1].From != a("::1") {
		t.Errorf("subtract at the edges: %v", got)
	}
	if got := disjointPorts([]portBox{{addrs: fullRange(false), proto: ProtoUDP, from: 53, to: 53}}); len(got) != 1 || got[0].Addrs != full[1] {
		t.Errorf("full IPv6 box: %v", got)
	}
}

// lookupForm is ports laid out for portsContain (address-major).
func lookupForm(ports []PortRange) []PortRange {
	boxes := make([]portBox, len(ports))
	for i, p := range ports {
		boxes[i] = portBox{addrs: p.Addrs, proto: p.Proto, from: p.PortFrom, to: p.PortTo}
	}
	return addressMajorPorts(boxes)
}
