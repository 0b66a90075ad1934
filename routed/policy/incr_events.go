// The incremental compile's changes other than pods': namespaces,
// NetworkPolicies, ClusterNetworkPolicies, Nodes, holders and ports, and
// the indexes of policies they keep.

package policy

import (
	"maps"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

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
				c.selectionChanged(pk, k, c.sel[pk][k], cp.selectsPod(c.s, e.pod), e, e)
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
	old := c.s.holders[a]
	if !c.s.setHolder(a, key) {
		return
	}
	if _, ok := c.contested[a]; ok && old != key {
		c.refresh(c.reown(a))
	}
}

// SetPodPorts sets pod key's host-side interfaces on this node.
func (c *Incremental) SetPodPorts(key string, ps []LocalPort) {
	if c.s.setPodPorts(key, ps) {
		c.portsChanged(key)
	}
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
