// The incremental compile: a change of one pod, namespace, policy or node
// recompiles only the chains it touches, found through indexes kept
// change by change (who owns each address, the pods of each namespace,
// which local pods each policy selects, which selector peers can select
// the pods of a namespace, which policies name a port), not through a
// compile of everything. Compile stays the reference: the engine compares
// Incremental.Ruleset with it at every resync, and tests after every step
// of random changes.

package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Incremental compiles one node's Ruleset change by change. Its methods
// change the State it wraps (which nothing else may change) and note
// what the change touches; Flush recompiles that and says what changed
// since the last Flush. Not safe for concurrent use.
type Incremental struct {
	s     *State
	node  string
	cidrs []netip.Prefix

	// claims are the keys of the pods (not hostNetwork, with addresses)
	// that claim each address, own who got it (resolveOwner), contested
	// the addresses more than one claims
	claims    map[netip.Addr][]string
	own       map[netip.Addr]string
	contested map[netip.Addr]bool
	// ents are the pods that own at least one address (the entries a
	// whole compile's index holds), by key; nsEnts by namespace, local
	// those of this node, named by named port
	ents   map[string]*entry
	nsEnts map[string]map[string]*entry
	local  map[string]*entry
	named  map[namedKey]map[string]*entry

	// nsPols are the keys of each namespace's NetworkPolicies, sorted;
	// sel the local pods each policy selects (NetworkPolicy "ns/name",
	// ClusterNetworkPolicy "/name"); namedEg the policies with an egress
	// rule naming a port, namedIn those with an ingress one; peers the
	// selector peers that may select a namespace's pods (built on
	// demand, dropped when a policy or the namespace changes); tiers the
	// ClusterNetworkPolicies of each tier in evaluation order (nil: to
	// sort again)
	nsPols  map[string][]string
	sel     map[string]map[string]bool
	namedEg map[namedKey]map[string]bool
	namedIn map[string]bool
	peers   map[string][]peerRef
	tiers   *[2][]*parsedCNP

	// the Ruleset, by piece: the policy chains by ID, the pod entries by
	// pod key, the known addresses sorted, the ports counted per pod
	chains  map[string]PolicyChain
	cstate  map[string]*chainState
	pods    map[string]PodChains
	known   *countedSet[netip.Addr]
	routed  *countedSet[string]
	bridged *countedSet[string]
	counted map[string][]LocalPort
	// ids are the IDs in use and their keys: two keys with one short ID
	// (which a whole compile would lengthen) make the compile whole
	ids map[string]string

	// dirtyPol and dirtyPod are what the next Flush recompiles (policy
	// keys, local pod keys); outPods and outPols the IDs whose entries
	// changed since the last Flush
	dirtyPol  map[string]bool
	dirtyRule map[string]map[int]bool
	dirtyPod  map[string]bool
	outPods   map[string]bool
	outPols   map[string]bool
	// whole: an ID collision; every Flush compiles whole (last is what
	// the previous one gave)
	whole bool
	last  *Ruleset
	// flushed are the Ruleset's own fields as of the last Flush
	flushed Delta
}

// peerRef is a selector peer of policy pk that may select the pods of
// a namespace (its namespace part does), with its pod selector: of rule
// rule of direction d, in chain chain (its ID).
type peerRef struct {
	pk      string
	d, rule int
	chain   string
	podSel  labels.Selector
	// named: an egress rule that names a port (its ports depend on the
	// named ports of the pods it selects)
	named bool
}

// chainState is what a policy chain in the Ruleset keeps to update its
// rules one address at a time: by rule, the addresses its selector peers
// select (an address counts once per peer that selects its pod; nil for
// a rule with any peer).
type chainState struct {
	pk      string
	d       int
	members []*addrRangeSet
}

// addrRangeSet is a counted set of addresses kept as merged ranges: an
// address comes or goes at the cost of a binary search and a copy, not a
// sort. Only the counts above one are kept apart (extra: count - 1), so
// that a rule of one peer costs its ranges and nothing per address.
type addrRangeSet struct {
	extra  map[netip.Addr]int
	ranges []Range
}

// find is the index of the first range that does not end before a, and
// whether it holds a.
func (s *addrRangeSet) find(a netip.Addr) (int, bool) {
	i, _ := slices.BinarySearchFunc(s.ranges, a, func(r Range, a netip.Addr) int { return r.To.Compare(a) })
	return i, i < len(s.ranges) && s.ranges[i].Contains(a)
}

func (s *addrRangeSet) add(a netip.Addr) {
	i, in := s.find(a)
	if in {
		if s.extra == nil {
			s.extra = map[netip.Addr]int{}
		}
		s.extra[a]++
		return
	}
	rs := s.ranges
	joinsPrev := i > 0 && rs[i-1].To.Is4() == a.Is4() && !lastOfFamily(rs[i-1].To) && rs[i-1].To.Next() == a
	joinsNext := i < len(rs) && rs[i].From.Is4() == a.Is4() && !lastOfFamily(a) && a.Next() == rs[i].From
	switch {
	case joinsPrev && joinsNext:
		rs[i-1].To = rs[i].To
		s.ranges = slices.Delete(rs, i, i+1)
	case joinsPrev:
		rs[i-1].To = a
	case joinsNext:
		rs[i].From = a
	default:
		s.ranges = slices.Insert(rs, i, single(a))
	}
}

func (s *addrRangeSet) drop(a netip.Addr) {
	i, in := s.find(a)
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
	rs := s.ranges
	r := rs[i]
	switch {
	case r.From == a && r.To == a:
		s.ranges = slices.Delete(rs, i, i+1)
	case r.From == a:
		rs[i].From = a.Next()
	case r.To == a:
		rs[i].To = a.Prev()
	default:
		rs[i].To = a.Prev()
		s.ranges = slices.Insert(rs, i+1, Range{From: a.Next(), To: r.To})
	}
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

// NewIncremental compiles node's Ruleset from s, which from now on only
// the Incremental changes; the first Flush gives all of it.
func NewIncremental(s *State, node string, localPodCIDRs []netip.Prefix) *Incremental {
	c := &Incremental{s: s, node: node, cidrs: normalCIDRs(localPodCIDRs),
		chains: map[string]PolicyChain{}, pods: map[string]PodChains{}, ids: map[string]string{}}
	c.Reset()
	return c
}

// State is the State the Incremental compiles (read it, do not change it).
func (c *Incremental) State() *State { return c.s }

// Reset rebuilds the indexes from the State and recompiles everything at
// the next Flush, which says what differs from the last one's result.
func (c *Incremental) Reset() {
	c.claims, c.own, c.contested = map[netip.Addr][]string{}, map[netip.Addr]string{}, map[netip.Addr]bool{}
	c.ents, c.nsEnts, c.local = map[string]*entry{}, map[string]map[string]*entry{}, map[string]*entry{}
	c.named = map[namedKey]map[string]*entry{}
	c.nsPols, c.sel = map[string][]string{}, map[string]map[string]bool{}
	c.namedEg, c.namedIn = map[namedKey]map[string]bool{}, map[string]bool{}
	c.peers, c.tiers = map[string][]peerRef{}, nil
	c.known, c.counted = newCountedSet(netip.Addr.Compare), map[string][]LocalPort{}
	c.routed, c.bridged = newCountedSet(strings.Compare), newCountedSet(strings.Compare)
	c.dirtyPol, c.dirtyPod = map[string]bool{}, map[string]bool{}
	c.dirtyRule, c.cstate = map[string]map[int]bool{}, map[string]*chainState{}
	if c.outPods == nil {
		c.outPods, c.outPols = map[string]bool{}, map[string]bool{}
	}
	for k := range c.pods {
		c.dirtyPod[k] = true
	}
	for id, pc := range c.chains {
		c.dirtyPol[policyKey(pc)] = true
		_ = id
	}
	keys := slices.Sorted(maps.Keys(c.s.pods))
	for _, k := range keys {
		if p := c.s.pods[k]; seen(p) {
			for _, a := range p.IPs {
				c.claims[a] = append(c.claims[a], k)
			}
		}
	}
	for a, ks := range c.claims {
		if len(ks) > 1 {
			c.contested[a] = true
		}
		c.own[a] = c.resolveOwner(a)
	}
	for _, k := range keys {
		if e := c.entryOf(k); e != nil {
			c.reindex(k, nil, e)
			if e.pod.Node == c.node {
				c.dirtyPod[k] = true
				c.addKnown(e.ips)
				c.recountPorts(k, true)
			}
		}
	}
	for pk, pp := range c.s.policies {
		c.policyIndexes(pk, nil, pp)
		c.sel[pk] = c.selectNP(pp)
		c.dirtyPol[pk] = true
	}
	for name, cp := range c.s.cnps {
		pk := "/" + name
		c.cnpIndexes(pk, nil, cp)
		c.sel[pk] = c.selectCNP(cp)
		c.dirtyPol[pk] = true
	}
}

// policyKey is the key of the policy of chain pc.
func policyKey(pc PolicyChain) string { return pc.Namespace + "/" + pc.Name }

// SetLocalPodCIDRs sets the node's PodCIDRs.
func (c *Incremental) SetLocalPodCIDRs(cidrs []netip.Prefix) {
	c.cidrs = normalCIDRs(cidrs)
}

// LocalPodCIDRs are the node's PodCIDRs, normalized.
func (c *Incremental) LocalPodCIDRs() []netip.Prefix { return slices.Clone(c.cidrs) }

// SetPod adds or replaces a pod; it reports whether a Ruleset can change
// (State.SetPod).
func (c *Incremental) SetPod(p Pod) bool {
	key := p.Key()
	old := c.s.pods[key]
	if !c.s.SetPod(p) {
		return false
	}
	c.podChanged(key, old, c.s.pods[key])
	return true
}

// DeletePod removes a pod; it reports whether a Ruleset can change.
func (c *Incremental) DeletePod(namespace, name string) bool {
	key := namespace + "/" + name
	old := c.s.pods[key]
	if !c.s.DeletePod(namespace, name) {
		return false
	}
	c.podChanged(key, old, nil)
	return true
}

// podChanged moves pod key from old to p (either nil or not seen): its
// claims, then every entry whose owned addresses that changes.
func (c *Incremental) podChanged(key string, old, p *Pod) {
	var addrs []netip.Addr
	if seen(old) {
		for _, a := range old.IPs {
			c.claims[a] = slices.DeleteFunc(c.claims[a], func(k string) bool { return k == key })
			addrs = append(addrs, a)
		}
	}
	if seen(p) {
		for _, a := range p.IPs {
			c.claims[a] = append(c.claims[a], key)
			addrs = append(addrs, a)
		}
	}
	touched := []string{key}
	for _, a := range addrs {
		if len(c.claims[a]) == 0 {
			delete(c.claims, a)
		}
		c.contested[a] = len(c.claims[a]) > 1
		if !c.contested[a] {
			delete(c.contested, a)
		}
		touched = append(touched, c.reown(a)...)
	}
	c.refresh(touched)
}

// reown decides address a's owner again; it returns the pods that lost
// or got it.
func (c *Incremental) reown(a netip.Addr) []string {
	was, now := c.own[a], c.resolveOwner(a)
	if was == now {
		return nil
	}
	if now == "" {
		delete(c.own, a)
	} else {
		c.own[a] = now
	}
	return []string{was, now}
}

// resolveOwner is the pod a goes to (resolveClaims' rule): its only
// claimant; else the holder by this node's records; else claimOrder's
// first.
func (c *Incremental) resolveOwner(a netip.Addr) string {
	ks := c.claims[a]
	switch len(ks) {
	case 0:
		return ""
	case 1:
		return ks[0]
	}
	if h, ok := c.s.holders[a]; ok && slices.Contains(ks, h) {
		return h
	}
	best := c.s.pods[ks[0]]
	for _, k := range ks[1:] {
		if p := c.s.pods[k]; claimOrder(p, best) < 0 {
			best = p
		}
	}
	return best.Key()
}

// refresh recomputes the entries of keys (each once) and notes what
// their change touches.
func (c *Incremental) refresh(keys []string) {
	done := map[string]bool{}
	for _, k := range keys {
		if k == "" || done[k] {
			continue
		}
		done[k] = true
		o, n := c.ents[k], c.entryOf(k)
		c.reindex(k, o, n)
		c.entryChanged(k, o, n)
	}
}

// entryOf is pod k's entry: the addresses it owns (nil: none, or no pod).
func (c *Incremental) entryOf(k string) *entry {
	p := c.s.pods[k]
	if !seen(p) {
		return nil
	}
	e := &entry{pod: p}
	for _, a := range p.IPs {
		if c.own[a] == k {
			e.ips = append(e.ips, a)
		}
	}
	if len(e.ips) == 0 {
		return nil
	}
	return e
}

// reindex replaces o by n (either nil) in the entry indexes.
func (c *Incremental) reindex(k string, o, n *entry) {
	if o != nil {
		delete(c.ents, k)
		delete(c.nsEnts[o.pod.Namespace], k)
		if len(c.nsEnts[o.pod.Namespace]) == 0 {
			delete(c.nsEnts, o.pod.Namespace)
		}
		delete(c.local, k)
		for _, np := range o.pod.Ports {
			nk := namedKey{np.Name, np.Protocol}
			delete(c.named[nk], k)
			if len(c.named[nk]) == 0 {
				delete(c.named, nk)
			}
		}
	}
	if n != nil {
		c.ents[k] = n
		m := c.nsEnts[n.pod.Namespace]
		if m == nil {
			m = map[string]*entry{}
			c.nsEnts[n.pod.Namespace] = m
		}
		m[k] = n
		if n.pod.Node == c.node {
			c.local[k] = n
		}
		for _, np := range n.pod.Ports {
			nk := namedKey{np.Name, np.Protocol}
			if c.named[nk] == nil {
				c.named[nk] = map[string]*entry{}
			}
			c.named[nk][k] = n
		}
	}
}

// entryChanged notes what pod k's entry going from o to n (either nil)
// touches: the policies whose selector peers select it before or after
// (when that or its addresses change), those naming a port it has, and,
// for a local pod, its own entry, the known addresses, the ports and
// the policies that select it.
func (c *Incremental) entryChanged(k string, o, n *entry) {
	if o == nil && n == nil {
		return
	}
	ref := n
	if ref == nil {
		ref = o
	}
	ns := ref.pod.Namespace
	var ol, nl labels.Set
	if o != nil {
		ol = labels.Set(o.pod.Labels)
	}
	if n != nil {
		nl = labels.Set(n.pod.Labels)
	}
	sameIPs := o != nil && n != nil && slices.Equal(o.ips, n.ips)
	samePorts := o != nil && n != nil && slices.Equal(o.pod.Ports, n.pod.Ports)
	for _, r := range c.peersFor(ns) {
		cs := c.cstate[r.chain]
		if cs == nil || c.dirtyPol[r.pk] {
			continue // no chain (one that comes is compiled whole), or whole at Flush
		}
		mo := o != nil && (r.podSel == nil || r.podSel.Empty() || r.podSel.Matches(ol))
		mn := n != nil && (r.podSel == nil || r.podSel.Empty() || r.podSel.Matches(nl))
		if !mo && !mn {
			continue
		}
		if mo && mn && sameIPs {
			if r.named && !samePorts {
				c.markRule(r.chain, r.rule)
			}
			continue
		}
		m := cs.members[r.rule]
		if mo {
			for _, a := range o.ips {
				m.drop(a)
			}
		}
		if mn {
			for _, a := range n.ips {
				m.add(a)
			}
		}
		c.markRule(r.chain, r.rule)
	}
	for _, e := range []*entry{o, n} {
		if e == nil {
			continue
		}
		for _, np := range e.pod.Ports {
			for pk := range c.namedEg[namedKey{np.Name, np.Protocol}] {
				c.markNamedEgress(pk, o, n)
			}
		}
	}
	wasLocal, isLocal := o != nil && o.pod.Node == c.node, n != nil && n.pod.Node == c.node
	if !wasLocal && !isLocal {
		return
	}
	c.dirtyPod[k] = true
	if wasLocal {
		c.dropKnown(o.ips)
	}
	if isLocal {
		c.addKnown(n.ips)
	}
	c.recountPorts(k, isLocal)
	for _, pk := range c.nsPols[ns] {
		pp := c.s.policies[pk]
		so := wasLocal && pp.selector != nil && pp.selector.Matches(ol)
		sn := isLocal && pp.selector != nil && pp.selector.Matches(nl)
		c.selectionChanged(pk, k, so, sn)
	}
	for name, cp := range c.s.cnps {
		so := wasLocal && cp.selectsPod(c.s, o.pod)
		sn := isLocal && cp.selectsPod(c.s, n.pod)
		c.selectionChanged("/"+name, k, so, sn)
	}
}

// markRule notes that rule i of chain id is to be compiled again.
func (c *Incremental) markRule(id string, i int) {
	m := c.dirtyRule[id]
	if m == nil {
		m = map[int]bool{}
		c.dirtyRule[id] = m
	}
	m[i] = true
}

// markNamedEgress notes that the egress rules of policy pk that name a
// port, and whose peers hold pod o or n (a pod with such a port) by
// anything but a selector (any peer, an ipBlock: the selector peers are
// entryChanged's), are to be compiled again.
func (c *Incremental) markNamedEgress(pk string, o, n *entry) {
	if c.dirtyPol[pk] {
		return
	}
	id := shortID(pk + "/" + string(Egress))
	if c.cstate[id] == nil {
		return
	}
	in := func(e *entry, blocks []Range) bool {
		return e != nil && slices.ContainsFunc(e.ips, func(a netip.Addr) bool { return rangesContain(blocks, a) })
	}
	for i, r := range c.parsedRules(pk)[dirEg] {
		if slices.ContainsFunc(r.ports, func(p parsedPort) bool { return p.name != "" }) &&
			(r.anyPeer || in(o, r.blocks) || in(n, r.blocks)) {
			c.markRule(id, i)
		}
	}
}

// parsedRules are policy pk's rules.
func (c *Incremental) parsedRules(pk string) [2][]parsedRule {
	if name, ok := strings.CutPrefix(pk, "/"); ok {
		return cnpRules(c.s.cnps[name])
	}
	if pp := c.s.policies[pk]; pp != nil {
		return pp.rules
	}
	return [2][]parsedRule{}
}

// selectionChanged notes that policy pk selected local pod k (so) and now
// does (sn): its chains come or go with its first or last pod, and those
// with ingress named ports resolve them against the pods they select.
func (c *Incremental) selectionChanged(pk, k string, so, sn bool) {
	if so != sn {
		m := c.sel[pk]
		if m == nil {
			m = map[string]bool{}
			c.sel[pk] = m
		}
		if sn {
			m[k] = true
			if len(m) == 1 {
				c.dirtyPol[pk] = true
			}
		} else {
			delete(m, k)
			if len(m) == 0 {
				c.dirtyPol[pk] = true
			}
		}
	}
	if (so || sn) && c.namedIn[pk] {
		c.dirtyPol[pk] = true
	}
}

// addKnown and dropKnown keep the known addresses.
func (c *Incremental) addKnown(ips []netip.Addr) {
	for _, a := range ips {
		c.known.add(a)
	}
}

func (c *Incremental) dropKnown(ips []netip.Addr) {
	for _, a := range ips {
		c.known.drop(a)
	}
}

// recountPorts counts pod k's ports in the Ruleset's when it is a local
// entry (local), and not otherwise.
func (c *Incremental) recountPorts(k string, local bool) {
	for _, p := range c.counted[k] {
		c.portSet(p).drop(p.Name)
	}
	delete(c.counted, k)
	if !local {
		return
	}
	ps := slices.Clone(c.s.ports[k])
	for _, p := range ps {
		c.portSet(p).add(p.Name)
	}
	if len(ps) > 0 {
		c.counted[k] = ps
	}
}

func (c *Incremental) portSet(p LocalPort) *countedSet[string] {
	if p.Bridged {
		return c.bridged
	}
	return c.routed
}

// SetNamespace adds or replaces a namespace.
func (c *Incremental) SetNamespace(ns Namespace) {
	old := c.s.nsLabels(ns.Name)
	c.s.SetNamespace(ns)
	c.namespaceChanged(ns.Name, old)
}

// DeleteNamespace removes a namespace.
func (c *Incremental) DeleteNamespace(name string) {
	old := c.s.nsLabels(name)
	c.s.DeleteNamespace(name)
	c.namespaceChanged(name, old)
}

// namespaceChanged notes what namespace ns's labels going from old
// touch: the policies whose namespace selectors (of a peer, of a
// ClusterNetworkPolicy's subject) select it before or after, not both.
func (c *Incremental) namespaceChanged(ns string, old map[string]string) {
	now := c.s.nsLabels(ns)
	if maps.Equal(old, now) {
		return
	}
	delete(c.peers, ns)
	ol, nl := labels.Set(old), labels.Set(now)
	differs := func(sel labels.Selector) bool { return sel != nil && sel.Matches(ol) != sel.Matches(nl) }
	peersDiffer := func(rules []parsedRule) bool {
		for i := range rules {
			for j := range rules[i].peers {
				if p := &rules[i].peers[j]; !p.isBlock && differs(p.nsSel) {
					return true
				}
			}
		}
		return false
	}
	for pk, pp := range c.s.policies {
		if peersDiffer(pp.rules[dirIn]) || peersDiffer(pp.rules[dirEg]) {
			c.dirtyPol[pk] = true
		}
	}
	for name, cp := range c.s.cnps {
		pk := "/" + name
		for d := range 2 {
			for i := range cp.rules[d] {
				if peersDiffer([]parsedRule{cp.rules[d][i].parsedRule}) {
					c.dirtyPol[pk] = true
				}
			}
		}
		if !differs(cp.nsSel) {
			continue
		}
		for k, e := range c.local {
			if e.pod.Namespace == ns {
				c.selectionChanged(pk, k, c.sel[pk][k], cp.selectsPod(c.s, e.pod))
				c.dirtyPod[k] = true
			}
		}
	}
}

// SetPolicy adds or replaces a NetworkPolicy (State.SetPolicy).
func (c *Incremental) SetPolicy(np *networkingv1.NetworkPolicy) error {
	pk := np.Namespace + "/" + np.Name
	old := c.s.policies[pk]
	err := c.s.SetPolicy(np)
	c.npChanged(pk, old, c.s.policies[pk])
	return err
}

// DeletePolicy removes a NetworkPolicy.
func (c *Incremental) DeletePolicy(namespace, name string) {
	pk := namespace + "/" + name
	old, ok := c.s.policies[pk]
	c.s.DeletePolicy(namespace, name)
	if ok {
		c.npChanged(pk, old, nil)
	}
}

func (c *Incremental) npChanged(pk string, old, pp *parsedPolicy) {
	c.policyIndexes(pk, old, pp)
	var sel map[string]bool
	if pp != nil {
		sel = c.selectNP(pp)
	}
	c.reselect(pk, sel)
}

// reselect sets the local pods policy pk selects: they and those it
// selected are recompiled, and so is the policy.
func (c *Incremental) reselect(pk string, sel map[string]bool) {
	for k := range c.sel[pk] {
		c.dirtyPod[k] = true
	}
	for k := range sel {
		c.dirtyPod[k] = true
	}
	if len(sel) == 0 {
		delete(c.sel, pk)
	} else {
		c.sel[pk] = sel
	}
	c.dirtyPol[pk] = true
}

// selectNP are the local pods pp selects.
func (c *Incremental) selectNP(pp *parsedPolicy) map[string]bool {
	out := map[string]bool{}
	if pp.selector == nil {
		return out
	}
	for k, e := range c.nsEnts[pp.namespace] {
		if e.pod.Node == c.node && pp.selector.Matches(labels.Set(e.pod.Labels)) {
			out[k] = true
		}
	}
	return out
}

// selectCNP are the local pods cp selects.
func (c *Incremental) selectCNP(cp *parsedCNP) map[string]bool {
	out := map[string]bool{}
	for k, e := range c.local {
		if cp.selectsPod(c.s, e.pod) {
			out[k] = true
		}
	}
	return out
}

// policyIndexes moves NetworkPolicy pk from old to pp (either nil) in
// the indexes of policies: by namespace, by named port, by peer.
func (c *Incremental) policyIndexes(pk string, old, pp *parsedPolicy) {
	var ns string
	if old != nil {
		ns = old.namespace
		c.unindexRules(pk, old.rules)
	}
	if pp != nil {
		ns = pp.namespace
		c.indexRules(pk, pp.rules)
	}
	l := c.nsPols[ns]
	i, found := slices.BinarySearch(l, pk)
	switch {
	case pp != nil && !found:
		c.nsPols[ns] = slices.Insert(l, i, pk)
	case pp == nil && found:
		if l = slices.Delete(l, i, i+1); len(l) == 0 {
			delete(c.nsPols, ns)
		} else {
			c.nsPols[ns] = l
		}
	}
	clear(c.peers)
}

func (c *Incremental) indexRules(pk string, rules [2][]parsedRule) {
	for d := range 2 {
		for i := range rules[d] {
			for _, p := range rules[d][i].ports {
				if p.name == "" {
					continue
				}
				if d == dirIn {
					c.namedIn[pk] = true
					continue
				}
				nk := namedKey{p.name, p.proto}
				if c.namedEg[nk] == nil {
					c.namedEg[nk] = map[string]bool{}
				}
				c.namedEg[nk][pk] = true
			}
		}
	}
}

func (c *Incremental) unindexRules(pk string, rules [2][]parsedRule) {
	delete(c.namedIn, pk)
	for i := range rules[dirEg] {
		for _, p := range rules[dirEg][i].ports {
			nk := namedKey{p.name, p.proto}
			if p.name != "" && c.namedEg[nk] != nil {
				delete(c.namedEg[nk], pk)
				if len(c.namedEg[nk]) == 0 {
					delete(c.namedEg, nk)
				}
			}
		}
	}
}

// cnpRules are a ClusterNetworkPolicy's rules as parsedRules.
func cnpRules(cp *parsedCNP) [2][]parsedRule {
	var out [2][]parsedRule
	if cp == nil {
		return out
	}
	for d := range 2 {
		for i := range cp.rules[d] {
			out[d] = append(out[d], cp.rules[d][i].parsedRule)
		}
	}
	return out
}

func (c *Incremental) cnpIndexes(pk string, old, cp *parsedCNP) {
	if old != nil {
		c.unindexRules(pk, cnpRules(old))
	}
	if cp != nil {
		c.indexRules(pk, cnpRules(cp))
	}
	c.tiers = nil
	clear(c.peers)
}

// SetClusterPolicy adds or replaces a ClusterNetworkPolicy
// (State.SetClusterPolicy).
func (c *Incremental) SetClusterPolicy(cp *cnpv1.ClusterNetworkPolicy) error {
	if cp == nil {
		return c.s.SetClusterPolicy(cp)
	}
	old := c.s.cnps[cp.Name]
	err := c.s.SetClusterPolicy(cp)
	c.cnpChanged(cp.Name, old, c.s.cnps[cp.Name])
	return err
}

// DeleteClusterPolicy removes a ClusterNetworkPolicy.
func (c *Incremental) DeleteClusterPolicy(name string) {
	old, ok := c.s.cnps[name]
	c.s.DeleteClusterPolicy(name)
	if ok {
		c.cnpChanged(name, old, nil)
	}
}

func (c *Incremental) cnpChanged(name string, old, cp *parsedCNP) {
	pk := "/" + name
	c.cnpIndexes(pk, old, cp)
	var sel map[string]bool
	if cp != nil {
		sel = c.selectCNP(cp)
	}
	c.reselect(pk, sel)
}

// SetNode adds or replaces a node; it reports whether a Ruleset can
// change (State.SetNode).
func (c *Incremental) SetNode(n Node) bool {
	if !c.s.SetNode(n) {
		return false
	}
	c.nodesChanged()
	return true
}

// DeleteNode removes a node; it reports whether a Ruleset can change.
func (c *Incremental) DeleteNode(name string) bool {
	if !c.s.DeleteNode(name) {
		return false
	}
	c.nodesChanged()
	return true
}

// nodesChanged recompiles the ClusterNetworkPolicies with a nodes peer.
func (c *Incremental) nodesChanged() {
	for name, cp := range c.s.cnps {
		for d := range 2 {
			for i := range cp.rules[d] {
				if len(cp.rules[d][i].nodes) > 0 {
					c.dirtyPol["/"+name] = true
				}
			}
		}
	}
}

// SetHolders sets who holds each of this node's addresses by its
// records (State.SetHolders); a contested address whose holder changed
// is decided again.
func (c *Incremental) SetHolders(h map[netip.Addr]string) bool {
	old := c.s.holders
	if !c.s.SetHolders(h) {
		return false
	}
	var touched []string
	for a := range c.contested {
		if old[a] != h[a] {
			touched = append(touched, c.reown(a)...)
		}
	}
	c.refresh(touched)
	return true
}

// SetHolder says that pod key holds address a by this node's records
// (a plugin's ADD-time wait said so); a contested address is decided
// again.
func (c *Incremental) SetHolder(a netip.Addr, key string) {
	if c.s.holders[a] == key {
		return
	}
	h := maps.Clone(c.s.holders)
	if h == nil {
		h = map[netip.Addr]string{}
	}
	h[a] = key
	c.SetHolders(h)
}

// SetPodPorts sets pod key's host-side interfaces on this node.
func (c *Incremental) SetPodPorts(key string, ps []LocalPort) {
	if slices.Equal(c.s.ports[key], ps) {
		return
	}
	m := maps.Clone(c.s.ports)
	if m == nil {
		m = map[string][]LocalPort{}
	}
	if len(ps) == 0 {
		delete(m, key)
	} else {
		m[key] = slices.Clone(ps)
	}
	c.SetLocalPorts(m)
}

// Counts are the pod entries and policy chains of the last Flush.
func (c *Incremental) Counts() (pods, chains int) {
	if c.whole && c.last != nil {
		return len(c.last.Pods), len(c.last.Policies)
	}
	return len(c.pods), len(c.chains)
}

// SetLocalPorts sets this node's host-side pod interfaces by pod
// (State.SetLocalPorts).
func (c *Incremental) SetLocalPorts(p map[string][]LocalPort) bool {
	old := c.s.ports
	if !c.s.SetLocalPorts(p) {
		return false
	}
	for k, ps := range p {
		if !slices.Equal(old[k], ps) {
			c.portsChanged(k)
		}
	}
	for k := range old {
		if _, ok := p[k]; !ok {
			c.portsChanged(k)
		}
	}
	return true
}

func (c *Incremental) portsChanged(k string) {
	if _, ok := c.local[k]; ok {
		c.recountPorts(k, true)
		c.dirtyPod[k] = true
	}
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

// sortedTiers are the ClusterNetworkPolicies of each tier in evaluation
// order.
func (c *Incremental) sortedTiers() *[2][]*parsedCNP {
	if c.tiers == nil {
		c.tiers = &[2][]*parsedCNP{c.s.sortedCNPs(TierAdmin), c.s.sortedCNPs(TierBaseline)}
	}
	return c.tiers
}

// Flush recompiles what the changes since the last Flush touched and
// returns what changed in the Ruleset.
func (c *Incremental) Flush() Delta {
	if c.whole {
		return c.flushWhole()
	}
	for _, pk := range slices.Sorted(maps.Keys(c.dirtyPol)) {
		c.recompilePolicy(pk)
	}
	for _, id := range slices.Sorted(maps.Keys(c.dirtyRule)) {
		if cs := c.cstate[id]; cs != nil && !c.dirtyPol[cs.pk] {
			c.recompileRules(id, cs, c.dirtyRule[id])
		}
	}
	clear(c.dirtyRule)
	for _, k := range slices.Sorted(maps.Keys(c.dirtyPod)) {
		c.recomputePod(k)
	}
	clear(c.dirtyPol)
	clear(c.dirtyPod)
	if c.whole {
		return c.flushWhole()
	}
	d := c.globals()
	byID := make(map[string]PodChains, len(c.outPods))
	for _, p := range c.pods {
		if c.outPods[p.ID] {
			byID[p.ID] = p
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.outPods)) {
		if p, ok := byID[id]; ok {
			d.Pods = append(d.Pods, p)
		} else {
			d.GonePods = append(d.GonePods, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.outPols)) {
		if pc, ok := c.chains[id]; ok {
			d.Policies = append(d.Policies, pc)
		} else {
			d.GonePolicies = append(d.GonePolicies, id)
		}
	}
	clear(c.outPods)
	clear(c.outPols)
	c.flushed = Delta{LocalPodCIDRs: d.LocalPodCIDRs, Known: d.Known, Ports: d.Ports, BridgePorts: d.BridgePorts}
	return d
}

func (c *Incremental) globals() Delta {
	return Delta{LocalPodCIDRs: slices.Clone(c.cidrs), Known: c.known.sorted(),
		Ports: c.routed.sorted(), BridgePorts: c.bridged.sorted()}
}

// takeID claims the short ID of key; false: another key has it.
func (c *Incremental) takeID(key string) (string, bool) {
	id := shortID(key)
	if k, ok := c.ids[id]; ok && k != key {
		c.whole = true
		return id, false
	}
	c.ids[id] = key
	return id, true
}

// recompilePolicy compiles policy pk's chains again (none when it is gone
// or selects no local pod).
func (c *Incremental) recompilePolicy(pk string) {
	var np *parsedPolicy
	var cp *parsedCNP
	if name, ok := strings.CutPrefix(pk, "/"); ok {
		cp = c.s.cnps[name]
	} else {
		np = c.s.policies[pk]
	}
	sel := c.sel[pk]
	var targets []*entry
	if len(sel) > 0 {
		for _, k := range slices.Sorted(maps.Keys(sel)) {
			targets = append(targets, c.local[k])
		}
	}
	for d := range 2 {
		key := pk + "/" + string(dirs[d])
		id := shortID(key)
		var pc PolicyChain
		exists := false
		src := memberSource{c: c, members: map[*parsedRule]*addrRangeSet{}}
		var rules []*parsedRule
		switch {
		case np != nil:
			exists = np.selector != nil && len(targets) > 0 && np.types[d]
			if exists {
				pc = npChain(src, id, np, d, targets)
				for i := range np.rules[d] {
					rules = append(rules, &np.rules[d][i])
				}
			}
		case cp != nil:
			exists = len(targets) > 0 && len(cp.rules[d]) > 0
			if exists {
				pc = c.s.cnpChain(src, id, cp, d, targets)
				for i := range cp.rules[d] {
					rules = append(rules, &cp.rules[d][i].parsedRule)
				}
			}
		}
		delete(c.cstate, id)
		if exists {
			cs := &chainState{pk: pk, d: d, members: make([]*addrRangeSet, len(rules))}
			for i, r := range rules {
				cs.members[i] = src.members[r]
			}
			c.cstate[id] = cs
		}
		old, had := c.chains[id]
		if had && c.ids[id] != key {
			had = false // another key's (whole mode follows)
		}
		switch {
		case exists:
			if _, ok := c.takeID(key); !ok {
				return
			}
			if !had || !old.Equal(pc) {
				c.chains[id] = pc
				c.outPols[id] = true
			}
		case had:
			delete(c.chains, id)
			delete(c.ids, id)
			c.outPols[id] = true
		}
	}
}

// recompileRules compiles rules (by index) of chain id again: their
// peers from the members kept, their ports from those peers.
func (c *Incremental) recompileRules(id string, cs *chainState, rules map[int]bool) {
	old, ok := c.chains[id]
	if !ok {
		return
	}
	var parsed []parsedRule
	var nodes [][]labels.Selector
	if name, isCNP := strings.CutPrefix(cs.pk, "/"); isCNP {
		cp := c.s.cnps[name]
		if cp == nil {
			return
		}
		for i := range cp.rules[cs.d] {
			parsed = append(parsed, cp.rules[cs.d][i].parsedRule)
			nodes = append(nodes, cp.rules[cs.d][i].nodes)
		}
	} else if pp := c.s.policies[cs.pk]; pp != nil {
		parsed = pp.rules[cs.d]
	}
	var targets []*entry
	if cs.d == dirIn {
		for _, k := range slices.Sorted(maps.Keys(c.sel[cs.pk])) {
			targets = append(targets, c.local[k])
		}
	}
	pc := old
	pc.Rules = slices.Clone(old.Rules)
	for i := range rules {
		if i >= len(parsed) || i >= len(pc.Rules) || i >= len(cs.members) {
			continue
		}
		r := &parsed[i]
		rule := pc.Rules[i]
		if !r.anyPeer {
			rule.Peers = unionRanges(r.blocks, cs.members[i].ranges) // a new slice
		}
		if slices.ContainsFunc(r.ports, func(p parsedPort) bool { return p.name != "" }) {
			// numbered ports do not depend on the peers: kept
			rule.Ports = rulePorts(c, r, cs.d, targets, rule.Peers)
		}
		if nodes != nil && len(nodes[i]) > 0 {
			rule.Peers = unionRanges(rule.Peers, c.s.nodeRanges(nodes[i]))
		}
		pc.Rules[i] = rule
	}
	if !old.Equal(pc) {
		c.chains[id] = pc
		c.outPols[id] = true
	}
}

// recomputePod computes local pod k's entry again (none when it is gone
// or judged in no direction).
func (c *Incremental) recomputePod(k string) {
	e := c.local[k]
	old, had := c.pods[k]
	if e == nil {
		if had {
			delete(c.pods, k)
			delete(c.ids, old.ID)
			c.outPods[old.ID] = true
		}
		return
	}
	p := e.pod
	pc := PodChains{Namespace: p.Namespace, Name: p.Name, Addrs: slices.Clone(e.ips)}
	pc.Ports, pc.BridgePorts = c.s.localPorts(k)
	for _, pk := range c.nsPols[p.Namespace] {
		if !c.sel[pk][k] {
			continue
		}
		pp := c.s.policies[pk]
		for d := range 2 {
			if pp.types[d] {
				id := shortID(pk + "/" + string(dirs[d]))
				if d == dirIn {
					pc.IngressIsolated, pc.Ingress = true, append(pc.Ingress, id)
				} else {
					pc.EgressIsolated, pc.Egress = true, append(pc.Egress, id)
				}
			}
		}
	}
	for ti, list := range c.sortedTiers() {
		for _, cp := range list {
			pk := "/" + cp.name
			if !c.sel[pk][k] {
				continue
			}
			for d := range 2 {
				if len(cp.rules[d]) > 0 {
					id := shortID(pk + "/" + string(dirs[d]))
					if ti == 0 {
						pc.Admin[d] = append(pc.Admin[d], id)
					} else {
						pc.Baseline[d] = append(pc.Baseline[d], id)
					}
				}
			}
		}
	}
	if !pc.Judged(Ingress) && !pc.Judged(Egress) {
		if had {
			delete(c.pods, k)
			delete(c.ids, old.ID)
			c.outPods[old.ID] = true
		}
		return
	}
	id, ok := c.takeID(k)
	if !ok {
		return
	}
	pc.ID = id
	if !had || !old.Equal(pc) {
		c.pods[k] = pc
		c.outPods[id] = true
	}
}

// Ruleset is the whole Ruleset as of the last Flush (BridgeUnfiltered
// aside, which the caller sets), in the order Compile gives.
func (c *Incremental) Ruleset() Ruleset {
	if c.whole && c.last != nil {
		return *c.last
	}
	d := c.flushed
	rs := Ruleset{LocalPodCIDRs: slices.Clone(d.LocalPodCIDRs), Known: slices.Clone(d.Known),
		Ports: slices.Clone(d.Ports), BridgePorts: slices.Clone(d.BridgePorts)}
	keys := slices.Collect(maps.Keys(c.pods))
	slices.SortFunc(keys, func(a, b string) int {
		an, aname, _ := strings.Cut(a, "/")
		bn, bname, _ := strings.Cut(b, "/")
		return cmp.Or(strings.Compare(an, bn), strings.Compare(aname, bname))
	})
	for _, k := range keys {
		rs.Pods = append(rs.Pods, c.pods[k])
	}
	for _, pk := range slices.Sorted(maps.Keys(c.s.policies)) {
		for d := range 2 {
			if pc, ok := c.chains[shortID(pk+"/"+string(dirs[d]))]; ok && policyKey(pc) == pk && pc.Tier == TierNetworkPolicy {
				rs.Policies = append(rs.Policies, pc)
			}
		}
	}
	for _, list := range c.sortedTiers() {
		for _, cp := range list {
			for d := range 2 {
				if pc, ok := c.chains[shortID("/"+cp.name+"/"+string(dirs[d]))]; ok && pc.Tier != TierNetworkPolicy {
					rs.Policies = append(rs.Policies, pc)
				}
			}
		}
	}
	return rs
}

// flushWhole compiles whole (after an ID collision): every entry of the
// compile, and the IDs of those given before that are gone.
func (c *Incremental) flushWhole() Delta {
	rs := c.s.Compile(c.node, c.cidrs)
	prev := c.last
	if prev == nil {
		// what the Flushes before gave: the entries kept, and those this
		// one touched before the collision
		prev = &Ruleset{}
		for _, p := range c.pods {
			prev.Pods = append(prev.Pods, PodChains{ID: p.ID})
		}
		for id := range c.outPods {
			prev.Pods = append(prev.Pods, PodChains{ID: id})
		}
		for id := range c.chains {
			prev.Policies = append(prev.Policies, PolicyChain{ID: id})
		}
		for id := range c.outPols {
			prev.Policies = append(prev.Policies, PolicyChain{ID: id})
		}
		clear(c.outPods)
		clear(c.outPols)
	}
	c.last = &rs
	return DiffRulesets(*prev, rs)
}

// DiffRulesets is the Delta that makes old into rs.
func DiffRulesets(old, rs Ruleset) Delta {
	d := Delta{LocalPodCIDRs: slices.Clone(rs.LocalPodCIDRs), Known: slices.Clone(rs.Known),
		Ports: slices.Clone(rs.Ports), BridgePorts: slices.Clone(rs.BridgePorts), BridgeUnfiltered: rs.BridgeUnfiltered}
	oldPods := map[string]PodChains{}
	for _, p := range old.Pods {
		oldPods[p.ID] = p
	}
	for _, p := range rs.Pods {
		if o, ok := oldPods[p.ID]; !ok || !o.Equal(p) {
			d.Pods = append(d.Pods, p)
		}
		delete(oldPods, p.ID)
	}
	// an ID twice in old (flushWhole's list of what was given) is one
	// entry
	d.GonePods = slices.Sorted(maps.Keys(oldPods))
	oldPols := map[string]PolicyChain{}
	for _, p := range old.Policies {
		oldPols[p.ID] = p
	}
	for _, p := range rs.Policies {
		if o, ok := oldPols[p.ID]; !ok || !o.Equal(p) {
			d.Policies = append(d.Policies, p)
		}
		delete(oldPols, p.ID)
	}
	d.GonePolicies = slices.Sorted(maps.Keys(oldPols))
	return d
}

// Clashes are the addresses more than one Pod object claims and who got
// each (State.Clashes, without a whole index).
func (c *Incremental) Clashes() []Clash {
	var out []Clash
	for a := range c.contested {
		cl := Clash{Addr: a, Pods: slices.Sorted(slices.Values(c.claims[a])), Winner: c.own[a]}
		if h, ok := c.s.holders[a]; ok && h == cl.Winner && slices.Contains(cl.Pods, h) {
			cl.ByHolder = true
		}
		out = append(out, cl)
	}
	slices.SortFunc(out, func(x, y Clash) int { return x.Addr.Compare(y.Addr) })
	return out
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
