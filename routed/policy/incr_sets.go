// The incremental compile's sets: a rule's members as merged ranges,
// counted sets of addresses and names, and where a rule's compile finds
// its peers.

package policy

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// addrRangeSet is a counted set of addresses kept as merged ranges: an
// address comes or goes at the cost of a binary search and a copy, not a
// sort. Only the counts above one are kept apart (extra: count - 1), so
// that a rule of one peer costs its ranges and nothing per address.
type addrRangeSet struct {
	extra  map[netip.Addr]int
	ranges []Range
}

// findRange is the index of the first range of rs (merged) that does
// not end before a, and whether it holds a.
func findRange(rs []Range, a netip.Addr) (int, bool) {
	i, _ := slices.BinarySearchFunc(rs, a, func(r Range, a netip.Addr) int { return r.To.Compare(a) })
	return i, i < len(rs) && rs[i].Contains(a)
}

// insertAddr adds a, which rs (merged) does not hold, at index i (from
// findRange), merged into the ranges it touches.
func insertAddr(rs []Range, i int, a netip.Addr) []Range {
	joinsPrev := i > 0 && rs[i-1].To.Is4() == a.Is4() && !lastOfFamily(rs[i-1].To) && rs[i-1].To.Next() == a
	joinsNext := i < len(rs) && rs[i].From.Is4() == a.Is4() && !lastOfFamily(a) && a.Next() == rs[i].From
	switch {
	case joinsPrev && joinsNext:
		rs[i-1].To = rs[i].To
		return slices.Delete(rs, i, i+1)
	case joinsPrev:
		rs[i-1].To = a
	case joinsNext:
		rs[i].From = a
	default:
		return slices.Insert(rs, i, single(a))
	}
	return rs
}

// removeAddr takes a out of rs[i], which holds it, splitting the range.
func removeAddr(rs []Range, i int, a netip.Addr) []Range {
	r := rs[i]
	switch {
	case r.From == a && r.To == a:
		return slices.Delete(rs, i, i+1)
	case r.From == a:
		rs[i].From = a.Next()
	case r.To == a:
		rs[i].To = a.Prev()
	default:
		rs[i].To = a.Prev()
		return slices.Insert(rs, i+1, Range{From: a.Next(), To: r.To})
	}
	return rs
}

func (s *addrRangeSet) has(a netip.Addr) bool {
	_, in := findRange(s.ranges, a)
	return in
}

func (s *addrRangeSet) add(a netip.Addr) {
	i, in := findRange(s.ranges, a)
	if in {
		if s.extra == nil {
			s.extra = map[netip.Addr]int{}
		}
		s.extra[a]++
		return
	}
	s.ranges = insertAddr(s.ranges, i, a)
}

func (s *addrRangeSet) drop(a netip.Addr) {
	i, in := findRange(s.ranges, a)
	if !in {
		return
	}
	if n := s.extra[a]; n > 0 {
		if n == 1 {
			delete(s.extra, a)
		} else {
			s.extra[a] = n - 1
		}
		return
	}
	s.ranges = removeAddr(s.ranges, i, a)
}

// patchPeers is peers (a rule's, merged: blocks and its members as
// they were) with each address of touched in it exactly when blocks or
// members (as they are now) hold it: the rule's peers again at the cost
// of a binary search and a copy per address, not a merge of all its
// ranges. A new slice: the old one may be held by the last Delta.
func patchPeers(peers, blocks []Range, members *addrRangeSet, touched []netip.Addr) []Range {
	out, owned := peers, false
	for _, a := range touched {
		want := members.has(a) || rangesContain(blocks, a)
		i, have := findRange(out, a)
		if want == have {
			continue
		}
		if !owned { // copied at the first change only
			out, owned = slices.Grow(slices.Clone(out), len(touched)), true
		}
		if want {
			out = insertAddr(out, i, a)
		} else {
			out = removeAddr(out, i, a)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// addrRangeSetOf is the set of addrs (each counted as often as listed).
func addrRangeSetOf(addrs []netip.Addr) *addrRangeSet {
	s := &addrRangeSet{}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for i := 1; i < len(addrs); i++ {
		if addrs[i] == addrs[i-1] {
			if s.extra == nil {
				s.extra = map[netip.Addr]int{}
			}
			s.extra[addrs[i]]++
		}
	}
	s.ranges = addrRanges(slices.Compact(addrs))
	return s
}

// peersFor are the selector peers whose namespace part selects namespace
// ns (built on demand).
func (c *Incremental) peersFor(ns string) []peerRef {
	if refs, ok := c.peers[ns]; ok {
		return refs
	}
	nsl := labels.Set(c.s.nsLabels(ns))
	refs := []peerRef{}
	add := func(pk, policyNS string, d, rule int, chain string, r *parsedRule) {
		if r.anyPeer {
			return
		}
		for i := range r.peers {
			p := &r.peers[i]
			if p.isBlock || (p.nsSel == nil && policyNS != ns) || (p.nsSel != nil && !p.nsSel.Matches(nsl)) {
				continue
			}
			named := d == dirEg && slices.ContainsFunc(r.ports, func(p parsedPort) bool { return p.name != "" })
			refs = append(refs, peerRef{pk: pk, d: d, rule: rule, chain: chain, podSel: p.podSel, named: named})
		}
	}
	for pk, pp := range c.s.policies {
		for d := range 2 {
			chain := shortID(pk + "/" + string(dirs[d]))
			for i := range pp.rules[d] {
				add(pk, pp.namespace, d, i, chain, &pp.rules[d][i])
			}
		}
	}
	for name, cp := range c.s.cnps {
		pk := "/" + name
		for d := range 2 {
			chain := shortID(pk + "/" + string(dirs[d]))
			for i := range cp.rules[d] {
				add(pk, "", d, i, chain, &cp.rules[d][i].parsedRule)
			}
		}
	}
	c.peers[ns] = refs
	return refs
}

// selectorRanges (peerSource) are the owned addresses of the pods r's
// selector peers select.
func (c *Incremental) selectorRanges(policyNS string, r *parsedRule) []Range {
	return c.members(policyNS, r).ranges
}

// members are the owned addresses of the pods r's selector peers select,
// each counted once per peer that selects its pod.
func (c *Incremental) members(policyNS string, r *parsedRule) *addrRangeSet {
	var addrs []netip.Addr
	for i := range r.peers {
		p := &r.peers[i]
		if p.isBlock {
			continue
		}
		for ns, ents := range c.nsEnts {
			if p.nsSel == nil && ns != policyNS || p.nsSel != nil && !p.nsSel.Matches(labels.Set(c.s.nsLabels(ns))) {
				continue
			}
			for _, e := range ents {
				if p.podSel == nil || p.podSel.Empty() || p.podSel.Matches(labels.Set(e.pod.Labels)) {
					addrs = append(addrs, e.ips...)
				}
			}
		}
	}
	return addrRangeSetOf(addrs)
}

// addrRanges are sorted addresses as merged ranges.
func addrRanges(addrs []netip.Addr) []Range {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]Range, 0, len(addrs))
	for _, a := range addrs {
		if n := len(out); n > 0 && out[n-1].To.Is4() == a.Is4() && !lastOfFamily(out[n-1].To) && out[n-1].To.Next() == a {
			out[n-1].To = a
			continue
		}
		out = append(out, single(a))
	}
	return out
}

// memberSource is the peerSource of a whole recompile of one policy: it
// keeps the members it computed for each rule.
type memberSource struct {
	c       *Incremental
	members map[*parsedRule]*addrRangeSet
}

func (m memberSource) selectorRanges(policyNS string, r *parsedRule) []Range {
	set := m.c.members(policyNS, r)
	m.members[r] = set
	return slices.Clone(set.ranges)
}

func (m memberSource) namedPorts(k namedKey, f func(netip.Addr, uint16)) { m.c.namedPorts(k, f) }

// namedPorts (peerSource) walks the pods with a named port k.
func (c *Incremental) namedPorts(k namedKey, f func(netip.Addr, uint16)) {
	for _, e := range c.named[k] {
		for _, np := range e.pod.Ports {
			if np.Name == k.name && np.Protocol == k.proto {
				for _, a := range e.ips {
					f(a, np.Port)
				}
			}
		}
	}
}

// countedSet is a counted set that keeps its members sorted: a member is
// in it while it was added more often than dropped (two local pods can
// hold one address or port for a moment, while it moves between them).
type countedSet[T comparable] struct {
	n    map[T]int
	list []T
	cmp  func(a, b T) int
}

func newCountedSet[T comparable](cmp func(a, b T) int) *countedSet[T] {
	return &countedSet[T]{n: map[T]int{}, cmp: cmp}
}

func (s *countedSet[T]) add(x T) {
	s.n[x]++
	if s.n[x] == 1 {
		i, _ := slices.BinarySearchFunc(s.list, x, s.cmp)
		s.list = slices.Insert(s.list, i, x)
	}
}

func (s *countedSet[T]) drop(x T) {
	if s.n[x] == 0 {
		return
	}
	s.n[x]--
	if s.n[x] == 0 {
		delete(s.n, x)
		if i, found := slices.BinarySearchFunc(s.list, x, s.cmp); found {
			s.list = slices.Delete(s.list, i, i+1)
		}
	}
}

func (s *countedSet[T]) sorted() []T { return slices.Clone(s.list) }
