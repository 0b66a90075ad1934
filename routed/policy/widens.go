package policy

import (
	"net/netip"
	"slices"
)

// Change is how a policy chain changed, for the connections it judged.
type Change int

const (
	// Widened: it can only allow more (or is the same).
	Widened Change = iota
	// LostGone: beyond widening, it lost only addresses (a few) that no
	// pod holds any more (a deleted pod that was a peer, or whose named
	// port a rule resolved): only connections of gone pods can lose
	// their allowance.
	LostGone
	// Narrowed: anything else.
	Narrowed
)

// Widens tells whether a policy chain that changed from old to new can
// only allow more: the same chain (ID, direction, tier, priority), the
// same rules in the same order, each either equal or an accepting rule
// whose peers and ports now cover what they covered before. A new pod
// that becomes a peer of a policy, or whose named port a rule now
// resolves, changes its chains that way: no connection can lose its
// allowance, so no conntrack scan is needed for it. Anything else (a
// Deny or Pass rule that grew, a rule that went, a shrinking peer set)
// is not a widening.
func Widens(old, new PolicyChain) bool {
	return Compare(old, new, func(netip.Addr) bool { return false }) == Widened
}

// Compare tells how a policy chain changed from old to new (Widens);
// gone tells whether no pod holds an address any more.
func Compare(old, new PolicyChain, gone func(netip.Addr) bool) Change {
	if old.ID != new.ID || old.Direction != new.Direction || old.Tier != new.Tier ||
		old.Priority != new.Priority || len(old.Rules) != len(new.Rules) {
		return Narrowed
	}
	out := Widened
	for i := range old.Rules {
		o, n := &old.Rules[i], &new.Rules[i]
		if o.Action != n.Action || o.Name != n.Name {
			return Narrowed
		}
		if ruleEqual(*o, *n) {
			continue
		}
		if n.Action != ActionAccept {
			return Narrowed
		}
		out = max(out, peersCover(*o, *n, gone), portsCover(*o, *n, gone))
		if out == Narrowed {
			return Narrowed
		}
	}
	return out
}

func ruleEqual(a, b Rule) bool {
	return a.AnyPeer == b.AnyPeer && a.AnyPort == b.AnyPort && slices.Equal(a.Peers, b.Peers) && slices.Equal(a.Ports, b.Ports)
}

// peersCover: whether every peer of o is a peer of n (Widened), or
// those that are not are addresses gone (LostGone).
func peersCover(o, n Rule, gone func(netip.Addr) bool) Change {
	if n.AnyPeer {
		return Widened
	}
	if o.AnyPeer {
		return Narrowed
	}
	out := Widened
	for _, r := range o.Peers {
		if rangeCovered(r, n.Peers) {
			continue
		}
		for _, left := range rangeMinus(r, n.Peers) {
			if !allGone(left, gone) {
				return Narrowed
			}
			out = LostGone
		}
	}
	return out
}

// allGone: r is a few addresses (pods deleted together), each gone.
func allGone(r Range, gone func(netip.Addr) bool) bool {
	n := 0
	for a := r.From; ; a = a.Next() {
		if n++; n > 256 || !gone(a) {
			return false
		}
		if a == r.To {
			return true
		}
	}
}

// rangeMinus is r without the ranges of rs.
func rangeMinus(r Range, rs []Range) []Range {
	left := []Range{r}
	for _, c := range rs {
		if c.From.Is4() != r.From.Is4() {
			continue
		}
		var next []Range
		for _, l := range left {
			if c.To.Less(l.From) || l.To.Less(c.From) {
				next = append(next, l)
				continue
			}
			if l.From.Less(c.From) {
				next = append(next, Range{From: l.From, To: c.From.Prev()})
			}
			if c.To.Less(l.To) {
				next = append(next, Range{From: c.To.Next(), To: l.To})
			}
		}
		left = next
	}
	return left
}

// rangeCovered: r lies in one range of sorted, merged rs (merged ranges
// never touch, so a range covered by several would be covered by one).
func rangeCovered(r Range, rs []Range) bool {
	for _, c := range rs {
		if c.From.Is4() == r.From.Is4() && c.From.Compare(r.From) <= 0 && r.To.Compare(c.To) <= 0 {
			return true
		}
	}
	return false
}

// portsCover: whether every (address, protocol, port) of o is one of
// n's (Widened), or those that are not are of addresses gone
// (LostGone: a gone pod's named port). An element of o is covered by the
// elements of n of its protocol whose ports hold all of its ports, and
// whose addresses together hold its addresses: merged port sets split
// address ranges where a named port adds a port for one pod.
func portsCover(o, n Rule, gone func(netip.Addr) bool) Change {
	if n.AnyPort {
		return Widened
	}
	if o.AnyPort {
		return Narrowed
	}
	out := Widened
	var addrs []Range
	for _, p := range o.Ports {
		addrs = addrs[:0]
		for _, c := range n.Ports {
			if c.Proto == p.Proto && c.PortFrom <= p.PortFrom && p.PortTo <= c.PortTo {
				addrs = append(addrs, c.Addrs)
			}
		}
		for _, left := range rangeMinus(p.Addrs, addrs) {
			if !allGone(left, gone) {
				return Narrowed
			}
			out = LostGone
		}
	}
	return out
}
