package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// patchPeers gives what a merge of the blocks and the members gives, for
// random members changed at random addresses: neighbours that join and
// split ranges, the ends of each family, both families, blocks that hold
// some of them.
func TestPatchPeersIsTheUnion(t *testing.T) {
	pool := []netip.Addr{
		netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("0.0.0.1"),
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"),
		netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.1.0"),
		netip.MustParseAddr("10.0.0.255"), netip.MustParseAddr("172.16.0.5"), netip.MustParseAddr("172.16.0.6"),
		netip.MustParseAddr("255.255.255.254"), netip.MustParseAddr("255.255.255.255"),
		netip.MustParseAddr("::"), netip.MustParseAddr("::1"), netip.MustParseAddr("::ffff:ffff"),
		netip.MustParseAddr("::1:0:0"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"),
		netip.MustParseAddr("fd00::3"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"),
		netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
	}
	blockSets := [][]Range{
		nil,
		{{From: netip.MustParseAddr("10.0.0.2"), To: netip.MustParseAddr("10.0.0.3")}},
		PrefixRanges([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/126")}),
		PrefixRanges([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}),
		PrefixRanges([]netip.Prefix{netip.MustParsePrefix("172.16.0.6/32"), netip.MustParsePrefix("::/127")}),
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 3000 {
		blocks := blockSets[rng.IntN(len(blockSets))]
		members := &addrRangeSet{}
		held := map[netip.Addr]int{}
		for range rng.IntN(8) {
			a := pool[rng.IntN(len(pool))]
			members.add(a)
			held[a]++
		}
		peers := unionRanges(blocks, members.ranges)
		var touched []netip.Addr
		for range 1 + rng.IntN(6) {
			a := pool[rng.IntN(len(pool))]
			if held[a] > 0 && rng.IntN(2) == 0 {
				members.drop(a)
				held[a]--
			} else {
				members.add(a)
				held[a]++
			}
			touched = append(touched, a)
		}
		before := slices.Clone(peers)
		got := patchPeers(peers, blocks, members, touched)
		want := unionRanges(blocks, members.ranges)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: blocks %v, touched %v: patched %v, the union is %v", round, blocks, touched, got, want)
		}
		if !slices.Equal(peers, before) {
			t.Fatalf("round %d: patchPeers changed the peers it was given: %v, was %v", round, peers, before)
		}
	}
}

// setNamedAt on disjointPorts' elements gives what disjointPorts gives
// for the boxes changed at one address: numbered ports over the whole
// family or none, named ports at random neighbouring addresses (the ends
// of each family among them), both families, two protocols.
func TestSetNamedAtIsDisjointPorts(t *testing.T) {
	addrs := []netip.Addr{
		netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("0.0.0.1"), netip.MustParseAddr("10.0.0.1"),
		netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("255.255.255.254"), netip.MustParseAddr("255.255.255.255"),
		netip.MustParseAddr("::"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"),
		netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
	}
	portsPool := []uint16{53, 80, 81, 443, 8080}
	rng := rand.New(rand.NewPCG(9, 10))
	boxesOf := func(global map[uint8][]portSpan, named map[netip.Addr]map[uint8][]uint16) []portBox {
		var out []portBox
		for proto, spans := range global {
			for _, sp := range spans {
				for _, v4 := range []bool{true, false} {
					out = append(out, portBox{addrs: fullRange(v4), proto: proto, from: sp.from, to: sp.to})
				}
			}
		}
		for a, m := range named {
			for proto, ports := range m {
				for _, p := range ports {
					out = append(out, portBox{addrs: single(a), proto: proto, from: p, to: p})
				}
			}
		}
		return out
	}
	for round := range 3000 {
		global := map[uint8][]portSpan{}
		for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
			for range rng.IntN(3) {
				from := portsPool[rng.IntN(len(portsPool))]
				global[proto] = append(global[proto], portSpan{from, from + uint16(rng.IntN(3))})
			}
		}
		named := map[netip.Addr]map[uint8][]uint16{}
		for range rng.IntN(8) {
			a, proto := addrs[rng.IntN(len(addrs))], []uint8{ProtoTCP, ProtoUDP}[rng.IntN(2)]
			if named[a] == nil {
				named[a] = map[uint8][]uint16{}
			}
			named[a][proto] = append(named[a][proto], portsPool[rng.IntN(len(portsPool))])
		}
		before := disjointPorts(boxesOf(global, named))
		// one address changes: its named ports of one protocol replaced
		a, proto := addrs[rng.IntN(len(addrs))], []uint8{ProtoTCP, ProtoUDP}[rng.IntN(2)]
		if named[a] == nil {
			named[a] = map[uint8][]uint16{}
		}
		named[a][proto] = nil
		for range rng.IntN(3) {
			named[a][proto] = append(named[a][proto], portsPool[rng.IntN(len(portsPool))])
		}
		want := disjointPorts(boxesOf(global, named))
		ports := slices.Clone(named[a][proto])
		slices.Sort(ports)
		ports = slices.Compact(ports)
		g := portGroup{proto, a.Is4()}
		lo, hi := groupBounds(before, g)
		els := setNamedAt(slices.Clone(before[lo:hi]), a, ports, proto)
		got := slices.Concat(before[:lo], els, before[hi:])
		if len(got) == 0 {
			got = nil
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: %s %v -> ports %v\nbefore %v\npatched %v\nwant    %v", round, a, proto, ports, before, got, want)
		}
	}
}
