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
	"maps"
	"net/netip"
	"slices"
	"strings"

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
	dirtyRule map[string]map[int]*ruleDirt
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
	c.dirtyRule, c.cstate = map[string]map[int]*ruleDirt{}, map[string]*chainState{}
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

// Holds tells whether a pod the engine knows, on any node, owns address
// a now.
func (c *Incremental) Holds(a netip.Addr) bool {
	_, ok := c.own[a]
	return ok
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

// entryOf is pod k's entry: the addresses it owns (nil: none, or no pod),
// none for a pod of this node arriving.
func (c *Incremental) entryOf(k string) *entry {
	p := c.s.pods[k]
	if arriving(p) && p.Node == c.node {
		// (a whole compile's index has every arriving pod: only this
		// node's make anything of it)
		return &entry{pod: p}
	}
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
	c.peersChanged(ns, o, n, ol, nl)
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
		c.selectionChanged(pk, k, so, sn, o, n)
	}
	for name, cp := range c.s.cnps {
		so := wasLocal && cp.selectsPod(c.s, o.pod)
		sn := isLocal && cp.selectsPod(c.s, n.pod)
		c.selectionChanged("/"+name, k, so, sn, o, n)
	}
}

// peersChanged updates the members of the rules whose selector peers
// select pod entry o before or n after (either nil; ol and nl their
// labels), and notes those rules.
func (c *Incremental) peersChanged(ns string, o, n *entry, ol, nl labels.Set) {
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
				c.markPortsAt(r.chain, r.rule, o, n)
			}
			continue
		}
		m := cs.members[r.rule]
		var to, tn *entry
		if mo {
			to = o
			for _, a := range o.ips {
				m.drop(a)
			}
		}
		if mn {
			tn = n
			for _, a := range n.ips {
				m.add(a)
			}
		}
		c.markMembers(r.chain, r.rule, to, tn)
	}
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
			c.markPortsAt(id, i, o, n)
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
// with ingress named ports resolve them against the pods they select (at
// the addresses of k's entries o before and n after, when the caller has
// them; else at every address).
func (c *Incremental) selectionChanged(pk, k string, so, sn bool, o, n *entry) {
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
	if (so || sn) && c.namedIn[pk] && !c.dirtyPol[pk] {
		c.markInNamed(pk, o, n)
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
