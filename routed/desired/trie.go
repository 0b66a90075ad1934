package desired

import "net/netip"

// prefixTrie is a binary trie of prefixes, one per family, that answers
// "does any prefix in the set overlap p, and which one" in O(address bits)
// whatever the set's size: validation of N Nodes then costs O(N) lookups,
// never a pairwise scan.
type prefixTrie struct {
	root4, root6 *trieNode
}

type trieNode struct {
	child [2]*trieNode
	// count is how many times the prefix ending here was inserted, owner
	// the name of the last inserter (for the reason a refusal gives).
	count int
	owner string
	// below is the sum of count over this node's subtree, itself included.
	below  int
	prefix netip.Prefix
}

func bit(a netip.Addr, i int) int {
	if a.Is4() {
		b := a.As4()
		return int(b[i/8]>>(7-i%8)) & 1
	}
	b := a.As16()
	return int(b[i/8]>>(7-i%8)) & 1
}

func (t *prefixTrie) root(p netip.Prefix, create bool) *trieNode {
	r := &t.root6
	if p.Addr().Is4() {
		r = &t.root4
	}
	if *r == nil && create {
		*r = &trieNode{}
	}
	return *r
}

// insert adds p (masked) for owner.
func (t *prefixTrie) insert(p netip.Prefix, owner string) {
	p = p.Masked()
	n := t.root(p, true)
	for i := 0; ; i++ {
		n.below++
		if i == p.Bits() {
			break
		}
		b := bit(p.Addr(), i)
		if n.child[b] == nil {
			n.child[b] = &trieNode{}
		}
		n = n.child[b]
	}
	n.count++
	n.owner = owner
	n.prefix = p
}

// remove takes one insertion of p away; a prefix not in the set is ignored.
func (t *prefixTrie) remove(p netip.Prefix) {
	p = p.Masked()
	path := make([]*trieNode, 0, p.Bits()+1)
	n := t.root(p, false)
	for i := 0; n != nil; i++ {
		path = append(path, n)
		if i == p.Bits() {
			break
		}
		n = n.child[bit(p.Addr(), i)]
	}
	if n == nil || n.count == 0 {
		return
	}
	n.count--
	for i, m := range path {
		m.below--
		if m.below == 0 && i > 0 {
			// the subtree is empty: cut it off its parent
			parent := path[i-1]
			parent.child[bit(p.Addr(), i-1)] = nil
			return
		}
	}
}

// overlap returns a prefix of the set that overlaps p (contains it, equals
// it or lies inside it) and its owner.
func (t *prefixTrie) overlap(p netip.Prefix) (netip.Prefix, string, bool) {
	p = p.Masked()
	n := t.root(p, false)
	for i := 0; n != nil; i++ {
		if n.count > 0 {
			return n.prefix, n.owner, true // p's supernet, or p itself
		}
		if i == p.Bits() {
			break
		}
		n = n.child[bit(p.Addr(), i)]
	}
	if n == nil {
		return netip.Prefix{}, "", false
	}
	return t.within(p) // some prefix inside p
}

// within returns a prefix of the set that lies inside p (or equals it).
func (t *prefixTrie) within(p netip.Prefix) (netip.Prefix, string, bool) {
	p = p.Masked()
	n := t.root(p, false)
	for i := 0; n != nil && i < p.Bits(); i++ {
		n = n.child[bit(p.Addr(), i)]
	}
	if n == nil || n.below == 0 {
		return netip.Prefix{}, "", false
	}
	for n.count == 0 {
		if c := n.child[0]; c != nil && c.below > 0 {
			n = c
		} else {
			n = n.child[1]
		}
	}
	return n.prefix, n.owner, true
}

// contains reports a prefix of the set that holds address a.
func (t *prefixTrie) contains(a netip.Addr) (netip.Prefix, string, bool) {
	q, owner, ok := t.overlap(netip.PrefixFrom(a, a.BitLen()))
	return q, owner, ok
}
