// build's policy chains: their rules and sets, the verdicts of a
// ClusterNetworkPolicy's rules, and the tier chains that hold them
// inline.

package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/podnet/podnet/routed/policy"
	"golang.org/x/sys/unix"
)

// buildPolicy is p's chain, sets and counters. A ClusterNetworkPolicy's
// chain is not written as such: its rules go inline into the tier chains
// (tierChainDef), and its Deny rules count in their counters.
func buildPolicy(p policy.PolicyChain, opt buildOptions) builtPolicy {
	bp := builtPolicy{pc: clonePolicyChain(p)}
	c := chainDef{chain: nftables.Chain{Name: PolicyChain(p.ID)}}
	var sig strings.Builder
	fmt.Fprintf(&sig, "policy %s %s", p.Direction, p.Tier)
	bp.eachCounter(func(name string, _ CounterKey) { bp.counters = append(bp.counters, name) })
	for i, r := range p.Rules {
		if r.AnyPeer && r.AnyPort {
			c.rules = append(c.rules, verdict(p, i))
			fmt.Fprintf(&sig, " r%d:any:%s", i, r.Action)
			continue
		}
		for _, v6 := range []bool{false, true} {
			if rule := ruleOf(p, i, v6, &bp.sets); rule != nil {
				c.rules = append(c.rules, rule)
				fmt.Fprintf(&sig, " r%d:%t/%t/%t:%s", i, v6, r.AnyPeer, r.AnyPort, r.Action)
			}
		}
	}
	c.sig = sig.String()
	bp.chain = c
	return bp
}

// checkNames refuses a policy chain whose names nft cannot take: its
// chain (a NetworkPolicy's, the one written), sets and counters.
func (bp *builtPolicy) checkNames() error {
	var chains []chainDef
	if bp.pc.Tier == policy.TierNetworkPolicy {
		chains = []chainDef{bp.chain}
	}
	return checkNames(bp.counters, bp.sets, chains)
}

// addCounters adds a built policy chain's counters (a
// ClusterNetworkPolicy's Deny rules').
func (b *builder) addCounters(bp builtPolicy) {
	bp.eachCounter(func(name string, k CounterKey) {
		b.def.counters = append(b.def.counters, name)
		b.def.pods[name] = k
	})
}

// eachCounter calls f with each of bp's counters (a ClusterNetworkPolicy's
// Deny rules') and its key.
func (bp *builtPolicy) eachCounter(f func(name string, k CounterKey)) {
	if bp.pc.Tier == policy.TierNetworkPolicy {
		return
	}
	for i, r := range bp.pc.Rules {
		if r.Action == policy.ActionDeny {
			f(CNPCounter(bp.pc.ID, i), CounterKey{PolicyID: bp.pc.ID, Rule: i, Direction: bp.pc.Direction})
		}
	}
}

// verdict is what rule i of p does when it matches: a NetworkPolicy's
// and an Accept rule accept, a Deny rule counts (its own counter) and
// drops, a Pass rule returns from the tier chain (the next tier judges).
func verdict(p policy.PolicyChain, i int) []expr.Any {
	if p.Tier == policy.TierNetworkPolicy {
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	}
	switch p.Rules[i].Action {
	case policy.ActionPass:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}
	case policy.ActionDeny:
		return []expr.Any{
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CNPCounter(p.ID, i)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}
	}
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
}

// tierJump adds to the pod chain the jump to the tier chain of ids (none
// for an empty list) and records the tier chain.
func (c *builtPodChain) tierJump(sig *strings.Builder, p policy.PodChains, t policy.Tier, d policy.Direction, ids []string, tierOf func(string) (policy.Tier, bool)) error {
	if len(ids) == 0 {
		return nil
	}
	for _, id := range ids {
		if pt, ok := tierOf(id); !ok || pt != t {
			return fmt.Errorf("pod %s/%s jumps to %s policy chain %q, which the ruleset lacks", p.Namespace, p.Name, t, id)
		}
	}
	name := TierChain(t, d, ids)
	c.tiers = append(c.tiers, tierRef{name: name, tierChain: tierChain{tier: t, ids: slices.Clone(ids)}})
	c.chain.rules = append(c.chain.rules, []expr.Any{jumpTo(name)})
	sig.WriteString(" " + name)
	return nil
}

// tierChains are the tier chains the pod chains jump to, sorted by name:
// the rules of their policies, in order.
func (b *builder) tierChains(built map[string]*builtPolicy) []chainDef {
	names := make([]string, 0, len(b.tiers))
	for n := range b.tiers {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]chainDef, 0, len(names))
	for _, n := range names {
		out = append(out, tierChainDef(n, b.tiers[n], func(id string) *builtPolicy { return built[id] }))
	}
	return out
}

// tierChainDef is tier chain name of t: the rules of its policies (pol
// finds them built), in order.
func tierChainDef(name string, t tierChain, pol func(string) *builtPolicy) chainDef {
	c := chainDef{chain: nftables.Chain{Name: name}}
	var sig strings.Builder
	sig.WriteString("tier " + string(t.tier))
	for _, id := range t.ids {
		bp := pol(id)
		c.rules = append(c.rules, bp.chain.rules...)
		sig.WriteString(" " + id + "{" + bp.chain.sig + "}")
	}
	c.sig = sig.String()
	return c
}

// ruleOf is rule i of p for the family v6 says, its sets added to sets;
// nil: a family whose peers or ports set would be empty can match
// nothing, so it gets no rule and no sets (an IPv4-only cluster's
// policies get no IPv6 rules, which halves the sets to write and to read
// back). The rule's ranges are canonical by contract (policy.Rule: merged
// peers, disjoint ports) and taken as they are.
func ruleOf(p policy.PolicyChain, i int, v6 bool, sets *[]setDef) []expr.Any {
	r := p.Rules[i]
	var peerElems, portElems []nftables.SetElement
	if !r.AnyPeer {
		if peerElems = rangeElements(r.Peers, v6); len(peerElems) == 0 {
			return nil
		}
	}
	if !r.AnyPort {
		if portElems = portElements(r.Ports, v6); len(portElems) == 0 {
			return nil
		}
	}
	rule := nfproto(v6)
	if !r.AnyPeer {
		name := ruleSetName(p.ID, i, "peers", v6)
		*sets = append(*sets, setDef{name: name, kind: kindInterval, v6: v6, elems: peerElems})
		rule = append(rule,
			loadAddr(v6, p.Direction == policy.Ingress, unix.NFT_REG_1),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
	}
	if !r.AnyPort {
		name := ruleSetName(p.ID, i, "ports", v6)
		*sets = append(*sets, setDef{name: name, kind: kindPorts, v6: v6, elems: portElems})
		rule = append(rule, loadPortKey(v6)...)
		rule = append(rule, &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
	}
	return append(rule, verdict(p, i)...)
}
