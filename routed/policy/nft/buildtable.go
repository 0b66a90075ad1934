package nft

// build: a Ruleset made into the table's content (build.go has its
// layout), pod chains and verdict maps first, then the sets, then the
// policy chains and their sets.

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// builder holds what build gathers on its way.
type builder struct {
	def    *tableDef
	opt    buildOptions
	polIDs map[string]bool
	known  []netip.Addr
	// vmaps and portVmaps are the verdict maps' elements by map name;
	// taken, the addresses a map holds already
	vmaps, portVmaps     map[string][]nftables.SetElement
	taken                map[string]map[netip.Addr]bool
	podChains, polChains []chainDef
}

// build is the content of the table for rs. It fails on a Ruleset that
// cannot be written: a pod jumping to a policy chain it does not hold, a
// name nft refuses. cache (nil: none) is read, and replaced by what this
// build made when it succeeds.
func build(rs policy.Ruleset, opt buildOptions, cache *buildCache) (*tableDef, error) {
	b := &builder{def: &tableDef{pods: map[string]CounterKey{}}, opt: opt, polIDs: map[string]bool{},
		known: sortedAddrs(rs.Known), vmaps: map[string][]nftables.SetElement{},
		portVmaps: map[string][]nftables.SetElement{}, taken: map[string]map[netip.Addr]bool{}}
	pods := slices.Clone(rs.Pods)
	slices.SortFunc(pods, func(a, b policy.PodChains) int { return strings.Compare(a.ID, b.ID) })
	pols := slices.Clone(rs.Policies)
	slices.SortFunc(pols, func(a, b policy.PolicyChain) int { return strings.Compare(a.ID, b.ID) })
	for _, p := range pols {
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("policy chain %s/%s %s: %w", p.Namespace, p.Name, p.Direction, err)
		}
		if b.polIDs[p.ID] {
			return nil, fmt.Errorf("policy chain ID %q twice", p.ID)
		}
		b.polIDs[p.ID] = true
	}
	for i, p := range pods {
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if i > 0 && pods[i-1].ID == p.ID {
			return nil, fmt.Errorf("pod ID %q twice", p.ID)
		}
		if err := b.pod(p); err != nil {
			return nil, err
		}
	}
	if err := b.sets(rs); err != nil {
		return nil, err
	}
	built := map[string]builtPolicy{}
	for _, p := range pols {
		built[p.ID] = b.policy(p, cache)
	}
	def := b.def
	def.chains = slices.Concat(baseChains(), b.polChains, b.podChains)
	for _, c := range def.chains {
		if len(c.chain.Name) >= unix.NFT_NAME_MAXLEN {
			return nil, fmt.Errorf("chain name %q too long", c.chain.Name)
		}
	}
	for _, s := range def.sets {
		if len(s.name) >= unix.NFT_NAME_MAXLEN {
			return nil, fmt.Errorf("set name %q too long", s.name)
		}
	}
	if cache != nil {
		cache.opt, cache.pols = opt, built
	}
	return def, nil
}

// pod adds p's chains (one per direction it is isolated in or jumps
// from), their counters and the verdict maps' elements that lead there.
func (b *builder) pod(p policy.PodChains) error {
	addrs := sortedAddrs(p.Addrs)
	b.known = append(b.known, addrs...) // a compiled pod is known
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		isolated, jumps := p.IngressIsolated, p.Ingress
		if d == policy.Egress {
			isolated, jumps = p.EgressIsolated, p.Egress
		}
		if !isolated && len(jumps) == 0 {
			continue
		}
		c, err := b.podChain(p, d, addrs, jumps)
		if err != nil {
			return err
		}
		name := c.chain.Name
		b.podChains = append(b.podChains, c)
		b.def.counters = append(b.def.counters, name)
		b.def.pods[name] = CounterKey{PodID: p.ID, Direction: d}
		for _, port := range p.Ports {
			m := portMapName(d)
			b.portVmaps[m] = append(b.portVmaps[m], nftables.SetElement{Key: ifnameKey(port),
				VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}})
		}
		for _, a := range addrs {
			m := mapName(d, a.Is6())
			if b.taken[m] == nil {
				b.taken[m] = map[netip.Addr]bool{}
			}
			if b.taken[m][a] {
				continue // two pods with one address: the first keeps it
			}
			b.taken[m][a] = true
			b.vmaps[m] = append(b.vmaps[m], nftables.SetElement{Key: a.AsSlice(),
				VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}})
		}
	}
	return nil
}

// podChain is p's chain for direction d: its own addresses accepted, a
// jump to each policy chain, the drop (logged with LogDrops) counted.
func (b *builder) podChain(p policy.PodChains, d policy.Direction, addrs []netip.Addr, jumps []string) (chainDef, error) {
	name := PodChain(p.ID, d)
	c := chainDef{chain: nftables.Chain{Name: name}}
	var sig strings.Builder
	fmt.Fprintf(&sig, "pod %s %v %v", d, addrs, p.Ports)
	// a pod cannot block itself (a Service hairpin): its own address as
	// the peer is accepted before any policy
	for _, a := range addrs {
		c.rules = append(c.rules, nftutil.Join(nfproto(a.Is6()), []expr.Any{
			loadAddr(a.Is6(), d == policy.Ingress, unix.NFT_REG_1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: a.AsSlice()},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}))
	}
	seen := map[string]bool{}
	for _, j := range jumps {
		if !b.polIDs[j] {
			return chainDef{}, fmt.Errorf("pod %s/%s jumps to policy chain %q, which the ruleset lacks", p.Namespace, p.Name, j)
		}
		if seen[j] {
			continue
		}
		seen[j] = true
		c.rules = append(c.rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: PolicyChain(j)}})
		sig.WriteString(" " + j)
	}
	if b.opt.logDrops {
		c.rules = append(c.rules, dropLog(p, d, b.opt.logRate))
		fmt.Fprintf(&sig, " log %d %s/%s", b.opt.logRate, p.Namespace, p.Name)
	}
	c.sig = sig.String()
	c.rules = append(c.rules, []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name},
		&expr.Verdict{Kind: expr.VerdictDrop},
	})
	return c, nil
}

// sets adds the counters' last one and the table's own sets and maps:
// local pod CIDRs, known addresses, the verdict maps, the ports.
func (b *builder) sets(rs policy.Ruleset) error {
	def := b.def
	slices.SortFunc(b.known, netip.Addr.Compare)
	known := slices.Compact(b.known)
	def.counters = append(def.counters, CounterUnknown)
	slices.Sort(def.counters)
	local := policy.PrefixRanges(rs.LocalPodCIDRs)
	for _, v6 := range []bool{false, true} {
		def.sets = append(def.sets,
			setDef{name: famName(setLocal, v6), kind: kindInterval, v6: v6, elems: rangeElements(local, v6)},
			setDef{name: famName(setKnown, v6), kind: kindAddrs, v6: v6, elems: nftutil.AddrElements(known, v6)},
		)
	}
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			m := mapName(d, v6)
			def.sets = append(def.sets, setDef{name: m, kind: kindVmap, v6: v6, elems: b.vmaps[m]})
		}
	}
	ports, err := ifnameElements(rs.Ports)
	if err != nil {
		return err
	}
	def.sets = append(def.sets, setDef{name: setPorts, kind: kindIfnames, elems: ports})
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		m := portMapName(d)
		elems := b.portVmaps[m]
		slices.SortFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		elems = slices.CompactFunc(elems, func(a, b nftables.SetElement) bool { return bytes.Equal(a.Key, b.Key) })
		def.sets = append(def.sets, setDef{name: m, kind: kindIfVmap, elems: elems})
	}
	return nil
}

// policy adds p's chain and sets, from cache when p is the one built
// before, and returns what it added.
func (b *builder) policy(p policy.PolicyChain, cache *buildCache) builtPolicy {
	if cache != nil && cache.opt == b.opt {
		if c, ok := cache.pols[p.ID]; ok && c.pc.Equal(p) {
			b.def.sets = append(b.def.sets, c.sets...)
			b.polChains = append(b.polChains, c.chain)
			return c
		}
	}
	firstSet := len(b.def.sets)
	c := chainDef{chain: nftables.Chain{Name: PolicyChain(p.ID)}}
	var sig strings.Builder
	sig.WriteString("policy " + string(p.Direction))
	for i, r := range p.Rules {
		if r.AnyPeer && r.AnyPort {
			c.rules = append(c.rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})
			fmt.Fprintf(&sig, " r%d:any", i)
			continue
		}
		for _, v6 := range []bool{false, true} {
			if rule := b.ruleOf(p, i, v6); rule != nil {
				c.rules = append(c.rules, rule)
				fmt.Fprintf(&sig, " r%d:%t/%t/%t", i, v6, r.AnyPeer, r.AnyPort)
			}
		}
	}
	c.sig = sig.String()
	b.polChains = append(b.polChains, c)
	return builtPolicy{pc: clonePolicyChain(p), chain: c, sets: slices.Clone(b.def.sets[firstSet:])}
}

// ruleOf is rule i of p for the family v6 says, its sets added; nil: a
// family whose peers or ports set would be empty can match nothing, so it
// gets no rule and no sets (an IPv4-only cluster's policies get no IPv6
// rules, which halves the sets to write and to read back). The rule's
// ranges are canonical by contract (policy.Rule: merged peers, disjoint
// ports) and taken as they are.
func (b *builder) ruleOf(p policy.PolicyChain, i int, v6 bool) []expr.Any {
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
		b.def.sets = append(b.def.sets, setDef{name: name, kind: kindInterval, v6: v6, elems: peerElems})
		rule = append(rule,
			loadAddr(v6, p.Direction == policy.Ingress, unix.NFT_REG_1),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
	}
	if !r.AnyPort {
		name := ruleSetName(p.ID, i, "ports", v6)
		b.def.sets = append(b.def.sets, setDef{name: name, kind: kindPorts, v6: v6, elems: portElems})
		rule = append(rule, loadPortKey(v6)...)
		rule = append(rule, &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
	}
	return append(rule, &expr.Verdict{Kind: expr.VerdictAccept})
}
