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
// those that are not are addresses gone (LostGone). Peers are merged and
// sorted: one linear subtraction.
func peersCover(o, n Rule, gone func(netip.Addr) bool) Change {
	if n.AnyPeer {
		return Widened
	}
	if o.AnyPeer {
		return Narrowed
	}
	return lost(subtractRanges(o.Peers, n.Peers), gone)
}

// portsCover: whether every (address, protocol, port) of o is one of
// n's (Widened), or those that are not are of addresses gone (LostGone:
// a gone pod's named port). The addresses o has for a protocol and port
// range must lie in those of n's elements of that protocol whose ports
// hold that range: merged port sets split address ranges where a named
// port adds a port for one pod, so the halves are taken together.
func portsCover(o, n Rule, gone func(netip.Addr) bool) Change {
	if n.AnyPort {
		return Widened
	}
	if o.AnyPort {
		return Narrowed
	}
	type key struct {
		proto    uint8
		from, to uint16
	}
	olds := map[key][]Range{}
	for _, p := range o.Ports {
		k := key{p.Proto, p.PortFrom, p.PortTo}
		olds[k] = append(olds[k], p.Addrs)
	}
	out := Widened
	for k, addrs := range olds {
		var cover []Range
		for _, c := range n.Ports {
			if c.Proto == k.proto && c.PortFrom <= k.from && k.to <= c.PortTo {
				cover = append(cover, c.Addrs)
			}
		}
		out = max(out, lost(subtractRanges(mergeRanges(addrs), mergeRanges(cover)), gone))
		if out == Narrowed {
			return Narrowed
		}
	}
	return out
}

// lost is what losing the addresses left means: nothing (Widened), only
// a few addresses that are all gone (LostGone: pods deleted together),
// or more (Narrowed).
func lost(left []Range, gone func(netip.Addr) bool) Change {
	if len(left) == 0 {
		return Widened
	}
	n := 0
	for _, r := range left {
		for a := r.From; ; a = a.Next() {
			if n++; n > 256 || !gone(a) {
				return Narrowed
			}
			if a == r.To {
				break
			}
		}
	}
	return LostGone
}
