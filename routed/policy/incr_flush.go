// The incremental compile's Flush: what the changes touched compiled
// again, and the Delta of what changed; the Ruleset as a whole.

package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Counts are the pod entries and policy chains of the last Flush.
func (c *Incremental) Counts() (pods, chains int) {
	if c.whole && c.last != nil {
		return len(c.last.Pods), len(c.last.Policies)
	}
	return len(c.pods), len(c.chains)
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
// peers from the members kept (patched at the addresses touched, when
// only members changed), their ports from those peers.
func (c *Incremental) recompileRules(id string, cs *chainState, rules map[int]*ruleDirt) {
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
	var targets []*entry // an ingress rule's named ports', made when needed
	targetsOf := func() []*entry {
		if targets == nil {
			for _, k := range slices.Sorted(maps.Keys(c.sel[cs.pk])) {
				targets = append(targets, c.local[k])
			}
		}
		return targets
	}
	pc := old
	pc.Rules = slices.Clone(old.Rules)
	for i, dirt := range rules {
		if i >= len(parsed) || i >= len(pc.Rules) || i >= len(cs.members) {
			continue
		}
		r := &parsed[i]
		rule := pc.Rules[i]
		hasNodes := nodes != nil && len(nodes[i]) > 0
		if hasNodes {
			// nodes peers (a ClusterNetworkPolicy's): whole
			dirt = &ruleDirt{whole: true, ports: dirt.ports}
		}
		peersChanged := dirt.whole || len(dirt.touched) > 0
		switch {
		case r.anyPeer || !peersChanged:
		case !dirt.whole:
			rule.Peers = patchPeers(rule.Peers, r.blocks, cs.members[i], dirt.touched)
		default:
			rule.Peers = unionRanges(r.blocks, cs.members[i].ranges) // a new slice
		}
		rule.Ports = c.ruleNamedPorts(cs, r, rule, dirt, targetsOf)
		if hasNodes {
			rule.Peers = unionRanges(rule.Peers, c.s.nodeRanges(nodes[i]))
		}
		pc.Rules[i] = rule
	}
	if !old.Equal(pc) {
		c.chains[id] = pc
		c.outPols[id] = true
	}
}

// ruleNamedPorts are rule's Ports (parsed r, of chain state cs) once what
// dirt says changed is compiled again: numbered ports do not depend on
// the peers, nor do an ingress rule's named ports (they resolve against
// the pods the policy selects, targetsOf): those are resolved again when
// they changed; an egress rule's named ports resolve against its peers.
func (c *Incremental) ruleNamedPorts(cs *chainState, r *parsedRule, rule Rule, dirt *ruleDirt, targetsOf func() []*entry) []PortRange {
	if !slices.ContainsFunc(r.ports, func(p parsedPort) bool { return p.name != "" }) {
		return rule.Ports
	}
	switch {
	case cs.d == dirEg && (dirt.whole || dirt.ports):
		return rulePorts(c, r, cs.d, nil, rule.Peers)
	case cs.d == dirEg:
		at := slices.Concat(dirt.touched, dirt.portsAt)
		if len(at) == 0 {
			return rule.Ports
		}
		return c.patchNamedPorts(rule.Ports, r, at, func(a netip.Addr) *entry {
			if !r.anyPeer && !rangesContain(rule.Peers, a) {
				return nil
			}
			return c.ents[c.own[a]]
		})
	case dirt.ports || dirt.whole:
		return rulePorts(c, r, cs.d, targetsOf(), nil)
	case len(dirt.portsAt) > 0:
		return c.patchNamedPorts(rule.Ports, r, dirt.portsAt, func(a netip.Addr) *entry {
			if k := c.own[a]; c.sel[cs.pk][k] {
				return c.local[k]
			}
			return nil
		})
	}
	return rule.Ports
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
