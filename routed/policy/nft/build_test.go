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
