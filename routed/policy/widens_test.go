package policy

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// verdictOf is what chain c does with a packet from or to peer a on
// (proto, port): the first matching rule's action ("" Accept), "none"
// when no rule matches. The ports' address is taken to be a as well.
func verdictOf(c PolicyChain, a netip.Addr, proto uint8, port uint16) Action {
	for _, r := range c.Rules {
		peer := r.AnyPeer
		for _, p := range r.Peers {
			peer = peer || (p.From.Is4() == a.Is4() && p.From.Compare(a) <= 0 && a.Compare(p.To) <= 0)
		}
		ports := r.AnyPort
		for _, p := range r.Ports {
			ports = ports || (p.Proto == proto && p.PortFrom <= port && port <= p.PortTo &&
				p.Addrs.From.Is4() == a.Is4() && p.Addrs.From.Compare(a) <= 0 && a.Compare(p.Addrs.To) <= 0)
		}
		if peer && ports {
			return r.Action
		}
	}
	return "none"
}

func randRule(r *rand.Rand) Rule {
	rule := Rule{Action: []Action{ActionAccept, ActionAccept, ActionDeny, ActionPass}[r.IntN(4)], AnyPeer: r.IntN(6) == 0, AnyPort: r.IntN(6) == 0}
	for range r.IntN(3) {
		lo := byte(r.IntN(20))
		rule.Peers = append(rule.Peers, Range{From: netip.AddrFrom4([4]byte{10, 0, 0, lo}), To: netip.AddrFrom4([4]byte{10, 0, 0, lo + byte(r.IntN(4))})})
	}
	for range r.IntN(3) {
		lo := uint16(80 + r.IntN(5))
		rule.Ports = append(rule.Ports, PortRange{Addrs: Range{From: netip.AddrFrom4([4]byte{10, 0, 0, 0}), To: netip.AddrFrom4([4]byte{10, 0, 0, 30})},
			Proto: []uint8{ProtoTCP, ProtoUDP}[r.IntN(2)], PortFrom: lo, PortTo: lo + uint16(r.IntN(3))})
	}
	rule.Peers = mergeRanges(rule.Peers) // as a compile makes them
	return rule
}

// mutate changes c a little: a rule grows or shrinks its peers or ports,
// changes its action, comes or goes.
func mutate(r *rand.Rand, c PolicyChain) PolicyChain {
	out := c
	out.Rules = append([]Rule(nil), c.Rules...)
	if len(out.Rules) == 0 || r.IntN(8) == 0 {
		out.Rules = append(out.Rules, randRule(r))
		return out
	}
	i := r.IntN(len(out.Rules))
	rule := out.Rules[i]
	rule.Peers, rule.Ports = append([]Range(nil), rule.Peers...), append([]PortRange(nil), rule.Ports...)
	switch r.IntN(6) {
	case 0:
		extra := randRule(r)
		rule.Peers = append(rule.Peers, extra.Peers...)
	case 1:
		extra := randRule(r)
		rule.Ports = append(rule.Ports, extra.Ports...)
	case 2:
		if len(rule.Peers) > 0 && r.IntN(2) == 0 {
			rule.Peers = rule.Peers[1:]
		} else if len(rule.Peers) > 0 { // one address of a range goes
			j := r.IntN(len(rule.Peers))
			rule.Peers = append(rule.Peers[:j:j], subtractRanges([]Range{rule.Peers[j]}, []Range{{From: rule.Peers[j].To, To: rule.Peers[j].To}})...)
			rule.Peers = append(rule.Peers, c.Rules[i].Peers[j+1:]...)
		}
	case 3:
		rule.AnyPeer, rule.AnyPort = !rule.AnyPeer, r.IntN(2) == 0
	case 4:
		rule.Action = []Action{ActionAccept, ActionDeny, ActionPass}[r.IntN(3)]
	default:
		out.Rules = append(out.Rules[:i:i], out.Rules[i+1:]...)
		return out
	}
	rule.Peers = mergeRanges(rule.Peers)
	out.Rules[i] = rule
	return out
}

// TestWidens: whenever Widens says a change only widens, no packet the
// old chain accepted is refused by the new one, and none it handed on
// (Pass, or no rule) is now refused. And it says so for the changes
// that do widen often enough to matter (a peer added to an accepting
// rule).
func TestWidens(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	widened, lostGone, checked := 0, 0, 0
	for range 20000 {
		old := PolicyChain{ID: "p", Tier: []Tier{TierNetworkPolicy, TierAdmin, TierBaseline}[r.IntN(3)]}
		for range 1 + r.IntN(3) {
			old.Rules = append(old.Rules, randRule(r))
		}
		if old.Tier == TierNetworkPolicy {
			for i := range old.Rules {
				old.Rules[i].Action = ActionAccept
			}
		}
		new := mutate(r, old)
		// 10.0.0.5-7 are held by no pod any more
		gone := func(a netip.Addr) bool { b := a.As4(); return b[3] >= 5 && b[3] <= 7 }
		change := Compare(old, new, gone)
		if Widens(old, new) != (Compare(old, new, func(netip.Addr) bool { return false }) == Widened) {
			t.Fatal("Widens and Compare disagree")
		}
		switch change {
		case Narrowed:
			continue
		case Widened:
			widened++
		case LostGone:
			lostGone++
		}
		for a := range byte(32) {
			addr := netip.AddrFrom4([4]byte{10, 0, 0, a})
			if change == LostGone && gone(addr) {
				continue // a gone pod's connections may lose their allowance
			}
			for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
				for port := uint16(78); port < 90; port++ {
					before, after := verdictOf(old, addr, proto, port), verdictOf(new, addr, proto, port)
					checked++
					if before == ActionAccept && after != ActionAccept || before != ActionDeny && after == ActionDeny ||
						before == "none" && after == ActionPass {
						t.Fatalf("Compare(%+v, %+v) = %d but %v :%d/%d went from %q to %q", old, new, change, addr, port, proto, before, after)
					}
				}
			}
		}
	}
	if lostGone < 50 {
		t.Fatalf("only %d changes lost only gone addresses", lostGone)
	}
	if widened < 2000 {
		t.Fatalf("only %d of 20000 changes widened: the test does not exercise Widens", widened)
	}
	t.Logf("%d widening changes, %d losing only gone addresses, %d probes", widened, lostGone, checked)
	if Widens(PolicyChain{ID: "a"}, PolicyChain{ID: "b"}) {
		t.Fatal("chains of two IDs widen")
	}
}

// TestComparePortsSplit: merged port sets split an address range where a
// named port adds a port for one pod; the split halves still cover it.
func TestComparePortsSplit(t *testing.T) {
	a := func(last byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 0, last}) }
	pr := func(from, to byte) PortRange {
		return PortRange{Addrs: Range{From: a(from), To: a(to)}, Proto: ProtoTCP, PortFrom: 5201, PortTo: 5201}
	}
	chain := func(ports ...PortRange) PolicyChain {
		return PolicyChain{ID: "p", Rules: []Rule{{AnyPeer: true, Ports: ports}}}
	}
	old := chain(pr(3, 64))
	gone39 := func(x netip.Addr) bool { return x == a(39) }
	for _, c := range []struct {
		new  PolicyChain
		gone func(netip.Addr) bool
		want Change
	}{
		{chain(pr(3, 39), pr(40, 64)), gone39, Widened},
		{chain(pr(3, 38), pr(40, 64)), gone39, LostGone},
		{chain(pr(3, 38), pr(40, 64)), func(netip.Addr) bool { return false }, Narrowed},
		{chain(pr(3, 37), pr(40, 64)), gone39, Narrowed},
		{chain(pr(3, 37), pr(40, 64)), func(x netip.Addr) bool { return x == a(38) || x == a(39) }, LostGone},
		{chain(pr(40, 64)), func(netip.Addr) bool { return true }, LostGone},
	} {
		if got := Compare(old, c.new, c.gone); got != c.want {
			t.Errorf("Compare(%v, %v) = %d, want %d", old.Rules[0].Ports, c.new.Rules[0].Ports, got, c.want)
		}
	}
	// more than a few addresses gone at once is no pod deletion
	wide := chain(PortRange{Addrs: Range{From: a(0), To: netip.MustParseAddr("10.244.3.255")}, Proto: ProtoTCP, PortFrom: 5201, PortTo: 5201})
	if got := Compare(wide, chain(), func(netip.Addr) bool { return true }); got != Narrowed {
		t.Errorf("1,024 addresses lost: Compare = %d, want Narrowed", got)
	}
}
