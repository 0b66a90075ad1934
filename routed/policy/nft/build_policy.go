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
	return buildPolicyFrom(p, nil, opt)
}

// buildPolicyFrom is buildPolicy, taking from old (what was built for
// the chain of p's ID before; nil: nothing) each rule that stays the
// same: its copy of the peers and ports and its sets' elements. A chain
// whose one rule gained a peer builds that rule alone.
func buildPolicyFrom(p policy.PolicyChain, old *builtPolicy, opt buildOptions) builtPolicy {
	same := make([]bool, len(p.Rules))
	var oldSets map[string][]nftables.SetElement
	if old != nil {
		for i := range min(len(p.Rules), len(old.pc.Rules)) {
			same[i] = old.pc.Rules[i].Equal(p.Rules[i])
		}
		oldSets = make(map[string][]nftables.SetElement, len(old.sets))
		for _, s := range old.sets {
			oldSets[s.name] = s.elems
		}
	}
	bp := builtPolicy{pc: clonePolicyChainFrom(p, old, same)}
	c := chainDef{chain: nftables.Chain{Name: PolicyChain(p.ID)}}
	var sig strings.Builder
	fmt.Fprintf(&sig, "policy %s %s", p.Direction, p.Tier)
	bp.eachCounter(func(name string, _ CounterKey) { bp.counters = append(bp.counters, name) })
	for i, r := range p.Rules {
		if r.AnyPeer && r.AnyPort {
			c.rules = append(c.rules, verdict(p, i))
			bp.meta = append(bp.meta, ruleMeta{anyFamily: true, anyPeer: true, pass: r.Action == policy.ActionPass && p.Tier != policy.TierNetworkPolicy})
			fmt.Fprintf(&sig, " r%d:any:%s", i, r.Action)
			continue
		}
		for _, v6 := range []bool{false, true} {
			var reuse map[string][]nftables.SetElement
			if same[i] {
				reuse = oldSets
			}
			if rule := ruleOf(p, i, v6, &bp.sets, reuse); rule != nil {
				c.rules = append(c.rules, rule)
				bp.meta = append(bp.meta, ruleMeta{v6: v6, anyPeer: r.AnyPeer, peers: bp.pc.Rules[i].Peers,
					pass: r.Action == policy.ActionPass && p.Tier != policy.TierNetworkPolicy})
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
	c.tiers = append(c.tiers, tierRef{name: name, tierChain: tierChain{tier: t, dir: d, ids: slices.Clone(ids)}})
	c.chain.rules = append(c.chain.rules, []expr.Any{jumpTo(name)})
	sig.WriteString(" " + name)
	return nil
}

// tierChains are the tier chains the pod chains jump to, sorted by name,
// and their guard sets: the rules of their policies, in order.
func (b *builder) tierChains(built map[string]*builtPolicy) ([]chainDef, []setDef) {
	names := make([]string, 0, len(b.tiers))
	for n := range b.tiers {
		names = append(names, n)
	}
	slices.Sort(names)
	var chains []chainDef
	var sets []setDef
	for _, n := range names {
		t := tierChainDef(n, b.tiers[n], b.opt.segmentRules(), func(id string) *builtPolicy { return built[id] })
		chains = append(chains, t.chains...)
		sets = append(sets, t.sets...)
	}
	return chains, sets
}

// tierDef is what a tier chain is made of in the table: its chain (the
// first), the segment chains it goes on to, and their guard sets.
type tierDef struct {
	chains []chainDef
	sets   []setDef
}

// segmentRules is how many rules a tier chain's segment holds at most. A
// tier chain holds the rules of every ClusterNetworkPolicy that selects
// its pods, in priority order, and a connection's first packet walks them
// until one decides. Past segmentRules rules, each run of Accept and Deny
// rules is cut in segments: a chain of its own that the tier chain jumps
// to only when the packet's peer is in one of its rules' peers (one
// lookup in the union of their peers, per family), so that rules whose
// peers cannot match cost one lookup per segment instead of two per rule.
// Accept and Deny decide for good inside a segment; a segment that does
// not decide returns to the tier chain, which goes on. Pass rules stay in
// the tier chain itself: their return must leave the tier, and from a
// segment it would only leave the segment.
const segmentRules = 8

// tierChainDef is tier chain name of t: the rules of its policies (pol
// finds them built), in order, their runs of Accept and Deny rules cut in
// guarded segments of at most per rules when the chain has more than per
// rules (per is segmentRules unless a test says otherwise).
func tierChainDef(name string, t tierChain, per int, pol func(string) *builtPolicy) tierDef {
	var sig strings.Builder
	sig.WriteString("tier " + string(t.tier))
	var rules [][]expr.Any
	var meta []ruleMeta
	for _, id := range t.ids {
		bp := pol(id)
		rules = append(rules, bp.chain.rules...)
		meta = append(meta, bp.meta...)
		sig.WriteString(" " + id + "{" + bp.chain.sig + "}")
	}
	main := chainDef{chain: nftables.Chain{Name: name}}
	if len(rules) <= per {
		main.rules, main.sig = rules, sig.String()
		return tierDef{chains: []chainDef{main}}
	}
	var out tierDef
	segs := 0
	// flush puts rules[lo:hi] (no Pass among them) in the main chain, a
	// lone rule as it is, more in guarded segments of at most per rules
	flush := func(lo, hi int) {
		for lo < hi {
			end := min(lo+per, hi)
			if end-lo == 1 {
				main.rules = append(main.rules, rules[lo])
				sig.WriteString(" .")
				lo = end
				continue
			}
			segs++
			seg := chainDef{chain: nftables.Chain{Name: fmt.Sprintf("%s-s%d", name, segs)}, rules: rules[lo:end],
				sig: fmt.Sprintf("%s segment %d [%d,%d)", sig.String(), segs, lo, end)} // sig so far: the tier's policies
			for _, v6 := range []bool{false, true} {
				guard, set := segmentGuard(seg.chain.Name, meta[lo:end], v6, t.ingress())
				if guard != nil {
					main.rules = append(main.rules, guard)
				}
				if set != nil {
					out.sets = append(out.sets, *set)
				}
			}
			fmt.Fprintf(&sig, " s%d[%d,%d)", segs, lo, end)
			out.chains = append(out.chains, seg)
			lo = end
		}
	}
	run := 0
	for i, m := range meta {
		if m.pass {
			flush(run, i)
			main.rules = append(main.rules, rules[i])
			sig.WriteString(" pass")
			run = i + 1
		}
	}
	flush(run, len(rules))
	main.sig = sig.String()
	out.chains = append([]chainDef{main}, out.chains...)
	return out
}

// segmentGuard is the tier chain's rule that jumps to segment seg (its
// rules' meta) with a packet of family v6 whose peer is in one of the
// rules' peers, and the set it looks up: no set when a rule of the
// segment matches any peer of that family (the rule jumps for every
// packet of the family), no rule when no rule of the segment is of that
// family.
func segmentGuard(seg string, meta []ruleMeta, v6, ingress bool) ([]expr.Any, *setDef) {
	var peers []policy.Range
	of := false
	for _, m := range meta {
		if !m.anyFamily && m.v6 != v6 {
			continue
		}
		of = true
		if m.anyPeer {
			return append(nfproto(v6), jumpTo(seg)), nil
		}
		for _, r := range m.peers {
			if r.From.Is6() == v6 {
				peers = append(peers, r)
			}
		}
	}
	if !of || len(peers) == 0 {
		return nil, nil
	}
	set := setDef{name: famName(seg+"-g", v6), kind: kindInterval, v6: v6, elems: rangeElements(mergeRanges(peers), v6)}
	return append(nfproto(v6),
		loadAddr(v6, ingress, unix.NFT_REG_1),
		&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: set.name},
		jumpTo(seg)), &set
}

// mergeRanges is rs (one family) sorted, overlapping and adjacent ranges
// merged.
func mergeRanges(rs []policy.Range) []policy.Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b policy.Range) int { return a.From.Compare(b.From) })
	out := rs[:0]
	for _, r := range rs {
		if k := len(out) - 1; k >= 0 {
			last := &out[k]
			if next := last.To.Next(); !next.IsValid() || r.From.Compare(next) <= 0 {
				if r.To.Compare(last.To) > 0 {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// ruleOf is rule i of p for the family v6 says, its sets added to sets;
// nil: a family whose peers or ports set would be empty can match
// nothing, so it gets no rule and no sets (an IPv4-only cluster's
// policies get no IPv6 rules, which halves the sets to write and to read
// back). The rule's ranges are canonical by contract (policy.Rule: merged
// peers, disjoint ports) and taken as they are. reuse (nil: none) holds
// the elements of the rule's sets as built before, by name, when the
// rule is the same: a set it lacks was empty.
func ruleOf(p policy.PolicyChain, i int, v6 bool, sets *[]setDef, reuse map[string][]nftables.SetElement) []expr.Any {
	r := p.Rules[i]
	peersName, portsName := ruleSetName(p.ID, i, "peers", v6), ruleSetName(p.ID, i, "ports", v6)
	var peerElems, portElems []nftables.SetElement
	if !r.AnyPeer {
		if reuse != nil {
			peerElems = reuse[peersName]
		} else {
			peerElems = rangeElements(r.Peers, v6)
		}
		if len(peerElems) == 0 {
			return nil
		}
	}
	if !r.AnyPort {
		if reuse != nil {
			portElems = reuse[portsName]
		} else {
			portElems = portElements(r.Ports, v6)
		}
		if len(portElems) == 0 {
			return nil
		}
	}
	rule := nfproto(v6)
	if !r.AnyPeer {
		*sets = append(*sets, setDef{name: peersName, kind: kindInterval, v6: v6, elems: peerElems})
		rule = append(rule,
			loadAddr(v6, p.Direction == policy.Ingress, unix.NFT_REG_1),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: peersName})
	}
	if !r.AnyPort {
		*sets = append(*sets, setDef{name: portsName, kind: kindPorts, v6: v6, elems: portElems})
		rule = append(rule, loadPortKey(v6)...)
		rule = append(rule, &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: portsName})
	}
	return append(rule, verdict(p, i)...)
}
