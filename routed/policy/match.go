package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// Matcher evaluates a Ruleset in Go the way the kernel evaluates table inet
// podnet-policy on that node, for the first packet of a connection (src,
// dst, proto, dport); port is 0 for protocols without ports. It is the
// reference the nft writer's table must agree with, and what decides which
// conntrack entries a new Ruleset revokes.
//
// The order, per direction (egress keyed by src, ingress keyed by dst):
//  1. an address in LocalPodCIDRs that is not in Known: drop;
//  2. an address with no element in the direction's verdict map: pass;
//  3. in the pod's chain: src == dst (a pod reaching itself, e.g. through
//     a Service hairpin) accept; then the Admin tier's rules in order,
//     the first match's action final (Accept, Deny) or skipping the rest
//     of the tier (Pass); then, when a NetworkPolicy isolates the pod,
//     each of its policy chains' rules, first match accept, else drop;
//     otherwise the Baseline tier the same way as the Admin tier, and
//     accept.
//
// Step 3's self rule is the writer's to implement in each pod chain
// ("ip saddr <the pod's addrs> accept" in the ingress chain, "ip daddr
// <the pod's addrs> accept" in the egress chain): the Ruleset has no field
// for it, it always holds.
type Matcher struct {
	cidrs []netip.Prefix
	known map[netip.Addr]bool
	// pods: each local address's judgement by direction; none: not
	// judged (allowed).
	pods [2]map[netip.Addr]*matchPod
}

// matchPod is one pod's judgement in one direction: the Admin tier's
// rules, then (isolated) the NetworkPolicy chains, else the Baseline
// tier's rules.
type matchPod struct {
	admin, baseline []*matchChain
	isolated        bool
	np              []*matchChain
}

type matchChain struct{ rules []matchRule }

// matchRule is a Rule with its sets sorted, merged and disjoint, whatever
// the Ruleset held.
type matchRule struct {
	action           Action
	anyPeer, anyPort bool
	peers            []Range
	ports            []PortRange
}

// NewMatcher indexes rs; it copies what it keeps, rs is not modified.
func NewMatcher(rs Ruleset) *Matcher {
	m := &Matcher{
		cidrs: slices.Clone(rs.LocalPodCIDRs),
		known: make(map[netip.Addr]bool, len(rs.Known)),
	}
	for _, a := range rs.Known {
		m.known[a] = true
	}
	chains := make(map[string]*matchChain, len(rs.Policies))
	for _, pc := range rs.Policies {
		mc := &matchChain{}
		for _, r := range pc.Rules {
			mr := matchRule{action: r.Action, anyPeer: r.AnyPeer, anyPort: r.AnyPort, peers: mergeRanges(slices.Clone(r.Peers))}
			if pc.Tier == TierNetworkPolicy {
				mr.action = ActionAccept
			}
			boxes := make([]portBox, 0, len(r.Ports))
			for _, p := range r.Ports {
				boxes = append(boxes, portBox{addrs: p.Addrs, proto: p.Proto, from: p.PortFrom, to: p.PortTo})
			}
			mr.ports = addressMajorPorts(boxes)
			mc.rules = append(mc.rules, mr)
		}
		chains[pc.ID] = mc
	}
	lookup := func(ids []string) []*matchChain {
		var cs []*matchChain
		for _, id := range ids {
			if c := chains[id]; c != nil {
				cs = append(cs, c)
			}
		}
		return cs
	}
	for d := range 2 {
		m.pods[d] = map[netip.Addr]*matchPod{}
	}
	for _, p := range rs.Pods {
		for d, dir := range dirs {
			if !p.Judged(dir) {
				continue
			}
			mp := &matchPod{admin: lookup(p.Admin[d]), baseline: lookup(p.Baseline[d])}
			mp.isolated, mp.np = p.IngressIsolated, lookup(p.Ingress)
			if d == dirEg {
				mp.isolated, mp.np = p.EgressIsolated, lookup(p.Egress)
			}
			for _, a := range p.Addrs {
				m.pods[d][a] = mp
			}
		}
	}
	return m
}

// Allows reports whether this node lets the first packet of (src, dst,
// proto, port) through. A packet between two nodes is judged by both:
// the cluster's verdict is the AND of the two nodes' Allows.
func (m *Matcher) Allows(src, dst netip.Addr, proto uint8, port uint16) bool {
	return m.allowsDir(dirEg, src, src, dst, proto, port) && m.allowsDir(dirIn, dst, src, dst, proto, port)
}

// allowsDir judges one direction; key is the local pod's address (src for
// egress, dst for ingress).
func (m *Matcher) allowsDir(d int, key, src, dst netip.Addr, proto uint8, port uint16) bool {
	if !m.known[key] {
		for _, c := range m.cidrs {
			if c.Contains(key) {
				return false
			}
		}
	}
	mp := m.pods[d][key]
	if mp == nil || src == dst {
		return true
	}
	peer := dst
	if d == dirIn {
		peer = src
	}
	if a, decided := tierVerdict(mp.admin, peer, dst, proto, port); decided {
		return a
	}
	if mp.isolated {
		for _, c := range mp.np {
			for i := range c.rules {
				if c.rules[i].matches(peer, dst, proto, port) {
					return true
				}
			}
		}
		return false
	}
	if a, decided := tierVerdict(mp.baseline, peer, dst, proto, port); decided {
		return a
	}
	return true
}

// tierVerdict is a tier's decision: the first matching rule's Accept
// (true) or Deny (false); a Pass, or no match, decides nothing.
func tierVerdict(chains []*matchChain, peer, dst netip.Addr, proto uint8, port uint16) (allowed, decided bool) {
	for _, c := range chains {
		for i := range c.rules {
			if !c.rules[i].matches(peer, dst, proto, port) {
				continue
			}
			switch c.rules[i].action {
			case ActionAccept:
				return true, true
			case ActionPass:
				return false, false
			default:
				return false, true
			}
		}
	}
	return false, false
}

func (r *matchRule) matches(peer, dst netip.Addr, proto uint8, port uint16) bool {
	if !r.anyPeer && !rangesContain(r.peers, peer) {
		return false
	}
	if r.anyPort {
		return true
	}
	return portsContain(r.ports, dst, proto, port)
}

// portsContain looks (dst, proto, port) up in ports, as addressMajorPorts
// returns them: sorted by protocol, address, port and disjoint, so that
// the elements holding dst are one run of equal address ranges.
func portsContain(ports []PortRange, dst netip.Addr, proto uint8, port uint16) bool {
	// i: the first element whose (proto, From) > (proto, dst)
	i, _ := slices.BinarySearchFunc(ports, 0, func(p PortRange, _ int) int {
		if c := cmp.Compare(p.Proto, proto); c != 0 {
			return c
		}
		if p.Addrs.From.Compare(dst) <= 0 {
			return -1
		}
		return 1
	})
	if i == 0 || ports[i-1].Proto != proto || !ports[i-1].Addrs.Contains(dst) {
		return false
	}
	seg := ports[i-1].Addrs
	for j := i - 1; j >= 0 && ports[j].Proto == proto && ports[j].Addrs == seg; j-- {
		if ports[j].PortFrom <= port && port <= ports[j].PortTo {
			return true
		}
	}
	return false
}

// Allows is NewMatcher(rs).Allows: for one question; build a Matcher for
// many.
func (rs Ruleset) Allows(src, dst netip.Addr, proto uint8, port uint16) bool {
	return NewMatcher(rs).Allows(src, dst, proto, port)
}
