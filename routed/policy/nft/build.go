package nft

// build: a Ruleset made into the table's content (names.go has its
// layout), pod chains and verdict maps first, then the sets, then the
// policy chains and their sets; and the table's content as data.

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// chainDef is a chain (without Table) and its rules.
type chainDef struct {
	chain nftables.Chain
	rules [][]expr.Any
	// sig is everything build made the rules from: two chainDefs of one
	// name with the same sig have the same rules, which an incremental
	// write compares without walking the expressions.
	sig string
}

// tableDef is the whole content of the table for a Ruleset.
type tableDef struct {
	counters []string // named counters, sorted
	sets     []setDef // in the order they are written
	chains   []chainDef
	// pods maps each pod counter's name to its pod and direction.
	pods map[string]CounterKey
}

// spec is the table as data, for a whole write and the repair rule.
func (d *tableDef) spec() *nftutil.Table {
	t := &nftutil.Table{Family: nftables.TableFamilyINet, Name: TableName, Counters: d.counters,
		Sets: make([]nftutil.Set, len(d.sets)), Chains: make([]nftutil.Chain, len(d.chains))}
	for i, s := range d.sets {
		t.Sets[i] = nftutil.Set{Def: *s.set(nil), Elems: s.elems}
	}
	for i, c := range d.chains {
		t.Chains[i] = nftutil.Chain{Def: c.chain, Rules: c.rules}
	}
	return t
}

// CounterKey names a drop counter: a pod chain's (PodID), or a Deny
// rule's of a ClusterNetworkPolicy chain (PolicyID, Rule: its index).
type CounterKey struct {
	PodID     string
	PolicyID  string
	Rule      int
	Direction policy.Direction
}

// buildOptions are the Writer's settings that shape the table.
type buildOptions struct {
	logDrops bool
	logRate  uint64
	// segment is the rules of a tier chain's segment (0: segmentRules)
	segment int
}

// segmentRules is o's rules per tier chain segment.
func (o buildOptions) segmentRules() int {
	if o.segment > 0 {
		return o.segment
	}
	return segmentRules
}

// builtPolicy is what build makes of one policy chain: its chain (a
// NetworkPolicy's is written as such; a ClusterNetworkPolicy's rules go
// inline into tier chains), its sets, and its Deny rules' counters (a
// ClusterNetworkPolicy's). The Writer's store keeps one per policy: a
// policy chain equal to the one built before (policy.PolicyChain Equal,
// the same options) is not built again. At 1,000 policies that is most of
// a whole build's time, and a change touches a few of them.
type builtPolicy struct {
	pc       policy.PolicyChain // a deep copy: the caller's may change
	chain    chainDef
	meta     []ruleMeta // of each of chain.rules
	sets     []setDef
	counters []string // as eachCounter lists them
}

// builtPod is what build makes of one pod: its addresses as the table
// holds them and its chains, one per direction it is judged in.
type builtPod struct {
	pc     policy.PodChains // a deep copy
	addrs  []netip.Addr     // sortedAddrs(pc.Addrs)
	chains []builtPodChain  // ingress first
	// pols are the policy chains its chains refer to (jump to, or hold
	// the rules of through a tier chain), each once
	pols []string
}

// builtPodChain is one of a pod's chains and the tier chains it jumps to.
type builtPodChain struct {
	d     policy.Direction
	chain chainDef
	jumps []string // the NetworkPolicy chains it jumps to
	tiers []tierRef
}

// tierRef is a tier chain a pod chain jumps to: its name and what makes
// it (tierChainDef).
type tierRef struct {
	name string
	tierChain
}

// clonePolicyChain is a deep copy of p.
func clonePolicyChain(p policy.PolicyChain) policy.PolicyChain {
	return clonePolicyChainFrom(p, nil, nil)
}

// clonePolicyChainFrom is clonePolicyChain, with old's copy (nil: none)
// of each rule same says stays the same (nil: none does).
func clonePolicyChainFrom(p policy.PolicyChain, old *builtPolicy, same []bool) policy.PolicyChain {
	p.Rules = slices.Clone(p.Rules)
	for i := range p.Rules {
		if i < len(same) && same[i] {
			p.Rules[i] = old.pc.Rules[i] // never changed once built
			continue
		}
		p.Rules[i].Peers = slices.Clone(p.Rules[i].Peers)
		p.Rules[i].Ports = slices.Clone(p.Rules[i].Ports)
	}
	return p
}

// clonePodChains is a deep copy of p.
func clonePodChains(p policy.PodChains) policy.PodChains {
	p.Addrs, p.Ports, p.BridgePorts = slices.Clone(p.Addrs), slices.Clone(p.Ports), slices.Clone(p.BridgePorts)
	p.Ingress, p.Egress = slices.Clone(p.Ingress), slices.Clone(p.Egress)
	for i := range 2 {
		p.Admin[i], p.Baseline[i] = slices.Clone(p.Admin[i]), slices.Clone(p.Baseline[i])
	}
	return p
}

// nfproto matches the family (meta nfproto ipv4|ipv6).
func nfproto(v6 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{p}},
	}
}

// loadAddr loads the source (or destination) address into reg.
func loadAddr(v6, source bool, reg uint32) expr.Any {
	offset, size := uint32(16), uint32(4)
	if source {
		offset = 12
	}
	if v6 {
		offset, size = 24, 16
		if source {
			offset = 8
		}
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size}
}

// loadPortKey loads ip daddr . meta l4proto . th dport, each field in
// the next 32-bit registers after the previous one.
func loadPortKey(v6 bool) []expr.Any {
	words := uint32(1)
	if v6 {
		words = 4
	}
	return []expr.Any{
		loadAddr(v6, false, unix.NFT_REG_1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG32_00 + words},
		&expr.Payload{DestRegister: unix.NFT_REG32_00 + words + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

func ptr[T any](v T) *T { return &v }

func sortedAddrs(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(in))
	for _, a := range in {
		if a.IsValid() {
			out = append(out, a.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// builder holds what build gathers on its way.
type builder struct {
	def    *tableDef
	opt    buildOptions
	polIDs map[string]policy.Tier
	known  []netip.Addr
	// vmaps and portVmaps are the verdict maps' elements by map name;
	// taken, the addresses of the pods judged in a map's direction;
	// dispatched, those the map holds already (byAddress)
	vmaps, portVmaps  map[string][]nftables.SetElement
	taken, dispatched map[string]map[netip.Addr]bool
	// hairpin are the hairpin sets' elements, IPv4 and IPv6
	hairpin              [2][]nftables.SetElement
	podChains, polChains []chainDef
	// tiers are the tier chains the pod chains jump to, by name
	tiers map[string]tierChain
}

// tierChain is the chain of one list of ClusterNetworkPolicy chains of
// one tier and direction: their rules inline, in order, so that a Pass
// (return) leaves the whole tier.
type tierChain struct {
	tier policy.Tier
	dir  policy.Direction
	ids  []string
}

// ingress tells whether the tier chain judges ingress (its peer is the
// packet's source).
func (t tierChain) ingress() bool { return t.dir == policy.Ingress }

// ruleMeta is what a tier chain's segments need to know of one rule of a
// policy chain (builtPolicy.chain.rules, one each): its family (both for
// a rule that matches any peer and any port) and its peers.
type ruleMeta struct {
	v6, anyFamily, anyPeer bool
	pass                   bool // a ClusterNetworkPolicy's Pass rule
	peers                  []policy.Range
}

// build is the content of the table for rs, made whole. It fails on a
// Ruleset that cannot be written: a pod jumping to a policy chain it does
// not hold, a name nft refuses. The Writer keeps what it wrote per object
// (store.go) and assembles the same content from that; build is the
// reference it is tested against, and what Verify and Check compare with.
func build(rs policy.Ruleset, opt buildOptions) (*tableDef, error) {
	b := &builder{def: &tableDef{pods: map[string]CounterKey{}}, opt: opt, polIDs: map[string]policy.Tier{},
		known: sortedAddrs(rs.Known), vmaps: map[string][]nftables.SetElement{},
		portVmaps: map[string][]nftables.SetElement{}, taken: map[string]map[netip.Addr]bool{}, dispatched: map[string]map[netip.Addr]bool{},
		tiers: map[string]tierChain{}}
	pods := slices.Clone(rs.Pods)
	slices.SortFunc(pods, func(a, b policy.PodChains) int { return strings.Compare(a.ID, b.ID) })
	pols := slices.Clone(rs.Policies)
	slices.SortFunc(pols, func(a, b policy.PolicyChain) int { return strings.Compare(a.ID, b.ID) })
	for _, p := range pols {
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("policy chain %s/%s %s: %w", p.Namespace, p.Name, p.Direction, err)
		}
		if _, ok := b.polIDs[p.ID]; ok {
			return nil, fmt.Errorf("policy chain ID %q twice", p.ID)
		}
		b.polIDs[p.ID] = p.Tier
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
	built := map[string]*builtPolicy{}
	for _, p := range pols {
		bp := buildPolicy(p, opt)
		built[p.ID] = &bp
		b.def.sets = append(b.def.sets, bp.sets...)
		if p.Tier == policy.TierNetworkPolicy {
			b.polChains = append(b.polChains, bp.chain)
		}
		b.addCounters(bp)
	}
	def := b.def
	slices.Sort(def.counters) // with the ClusterNetworkPolicies' ones
	tierChains, tierSets := b.tierChains(built)
	def.sets = append(def.sets, tierSets...)
	def.chains = slices.Concat(baseChains(), b.polChains, tierChains, b.podChains)
	if err := checkNames(def.counters, def.sets, def.chains); err != nil {
		return nil, err
	}
	return def, nil
}

// checkNames refuses names nft cannot take (NFT_NAME_MAXLEN with its
// terminating zero).
func checkNames(counters []string, sets []setDef, chains []chainDef) error {
	for _, c := range chains {
		if len(c.chain.Name) >= unix.NFT_NAME_MAXLEN {
			return fmt.Errorf("chain name %q too long", c.chain.Name)
		}
	}
	for _, s := range sets {
		if len(s.name) >= unix.NFT_NAME_MAXLEN {
			return fmt.Errorf("set name %q too long", s.name)
		}
	}
	for _, n := range counters {
		if len(n) >= unix.NFT_NAME_MAXLEN {
			return fmt.Errorf("counter name %q too long", n)
		}
	}
	return nil
}

// pod adds p's chains (one per direction it is isolated in or jumps
// from), their counters and the verdict maps' elements that lead there.
func (b *builder) pod(p policy.PodChains) error {
	bp, err := buildPod(p, b.opt, func(id string) (policy.Tier, bool) { t, ok := b.polIDs[id]; return t, ok })
	if err != nil {
		return err
	}
	b.known = append(b.known, bp.addrs...) // a compiled pod is known
	if !byAddress(p) {
		for _, port := range p.Ports {
			for _, a := range bp.addrs {
				b.hairpin[famIndex(a.Is6())] = append(b.hairpin[famIndex(a.Is6())], nftables.SetElement{Key: hairpinKey(port, a)})
			}
		}
	}
	for _, c := range bp.chains {
		name := c.chain.chain.Name
		b.podChains = append(b.podChains, c.chain)
		b.def.counters = append(b.def.counters, name)
		b.def.pods[name] = CounterKey{PodID: p.ID, Direction: c.d}
		for _, t := range c.tiers {
			if _, ok := b.tiers[t.name]; !ok {
				b.tiers[t.name] = t.tierChain
			}
		}
		for _, port := range p.Ports {
			m := portMapName(c.d)
			b.portVmaps[m] = append(b.portVmaps[m], nftables.SetElement{Key: ifnameKey(port), VerdictData: jumpTo(name)})
		}
		for _, a := range bp.addrs {
			m := mapName(c.d, a.Is6())
			if b.taken[m] == nil {
				b.taken[m] = map[netip.Addr]bool{}
			}
			b.taken[m][a] = true // judged
			if !byAddress(p) {
				continue
			}
			if b.dispatched[m] == nil {
				b.dispatched[m] = map[netip.Addr]bool{}
			}
			if b.dispatched[m][a] {
				continue // two pods with one address: the first (the lower ID) keeps it
			}
			b.dispatched[m][a] = true
			b.vmaps[m] = append(b.vmaps[m], nftables.SetElement{Key: a.AsSlice(), VerdictData: jumpTo(name)})
		}
	}
	return nil
}

func jumpTo(chain string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// buildPod is what the table holds of p: its chains, one per direction it
// is judged in. tierOf tells the tier of a policy chain the table holds
// (ok false: none of that ID); a jump to one it lacks, or of another tier,
// is an error.
func buildPod(p policy.PodChains, opt buildOptions, tierOf func(string) (policy.Tier, bool)) (builtPod, error) {
	bp := builtPod{pc: clonePodChains(p), addrs: sortedAddrs(p.Addrs)}
	// a pod cannot block itself (a Service hairpin): the chain of a pod
	// judged by its addresses accepts them as the peer first; the
	// hairpin sets do it for a pod judged by its ports, before its chain,
	// so that its chain does not change when it gets its addresses
	var selfAddrs []netip.Addr
	if byAddress(p) {
		selfAddrs = bp.addrs
	}
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		isolated, jumps := p.IngressIsolated, p.Ingress
		if d == policy.Egress {
			isolated, jumps = p.EgressIsolated, p.Egress
		}
		if !p.Judged(d) {
			continue
		}
		c, err := podChain(p, d, selfAddrs, isolated || len(jumps) > 0, jumps, opt, tierOf)
		if err != nil {
			return builtPod{}, err
		}
		if len(c.chain.chain.Name) >= unix.NFT_NAME_MAXLEN {
			return builtPod{}, fmt.Errorf("chain name %q too long", c.chain.chain.Name)
		}
		bp.chains = append(bp.chains, c)
		bp.pols = append(bp.pols, c.jumps...)
		for _, t := range c.tiers {
			bp.pols = append(bp.pols, t.ids...)
		}
	}
	slices.Sort(bp.pols)
	bp.pols = slices.Compact(bp.pols)
	return bp, nil
}

// podChain is p's chain for direction d: its own addresses accepted, the
// Admin tier's chain; then, isolated, a jump to each policy chain and the
// drop (logged with LogDrops) counted; else the Baseline tier's chain
// and accept.
func podChain(p policy.PodChains, d policy.Direction, addrs []netip.Addr, isolated bool, jumps []string, opt buildOptions, tierOf func(string) (policy.Tier, bool)) (builtPodChain, error) {
	name := PodChain(p.ID, d)
	out := builtPodChain{d: d}
	c := &out.chain
	c.chain = nftables.Chain{Name: name}
	var sig strings.Builder
	fmt.Fprintf(&sig, "pod %s %v %v", d, addrs, p.Ports)
	// its own address as the peer first (buildPod: addrs is nil for a
	// pod judged by its ports)
	for _, a := range addrs {
		c.rules = append(c.rules, nftutil.Join(nfproto(a.Is6()), []expr.Any{
			loadAddr(a.Is6(), d == policy.Ingress, unix.NFT_REG_1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: a.AsSlice()},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}))
	}
	i := policy.DirIndex(d)
	if err := out.tierJump(&sig, p, policy.TierAdmin, d, p.Admin[i], tierOf); err != nil {
		return builtPodChain{}, err
	}
	if !isolated {
		if err := out.tierJump(&sig, p, policy.TierBaseline, d, p.Baseline[i], tierOf); err != nil {
			return builtPodChain{}, err
		}
		c.sig = sig.String() + " accept"
		c.rules = append(c.rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})
		return out, nil
	}
	seen := map[string]bool{}
	for _, j := range jumps {
		if t, ok := tierOf(j); !ok || t != policy.TierNetworkPolicy {
			return builtPodChain{}, fmt.Errorf("pod %s/%s jumps to NetworkPolicy chain %q, which the ruleset lacks", p.Namespace, p.Name, j)
		}
		if seen[j] {
			continue
		}
		seen[j] = true
		out.jumps = append(out.jumps, j)
		c.rules = append(c.rules, []expr.Any{jumpTo(PolicyChain(j))})
		sig.WriteString(" " + j)
	}
	if opt.logDrops {
		c.rules = append(c.rules, dropLog(p, d, opt.logRate))
		fmt.Fprintf(&sig, " log %d %s/%s", opt.logRate, p.Namespace, p.Name)
	}
	c.sig = sig.String()
	c.rules = append(c.rules, []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name},
		&expr.Verdict{Kind: expr.VerdictDrop},
	})
	return out, nil
}

// sets adds the counters' last one and the table's own sets and maps:
// local pod CIDRs, known addresses, judged addresses, hairpins, the
// verdict maps, the ports.
func (b *builder) sets(rs policy.Ruleset) error {
	def := b.def
	slices.SortFunc(b.known, netip.Addr.Compare)
	known := slices.Compact(b.known)
	def.counters = append(def.counters, CounterUnknown)
	slices.Sort(def.counters)
	local := policy.PrefixRanges(rs.LocalPodCIDRs)
	var judged []netip.Addr // the verdict maps' addresses
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			judged = slices.AppendSeq(judged, maps.Keys(b.taken[mapName(d, v6)]))
		}
	}
	slices.SortFunc(judged, netip.Addr.Compare)
	judged = slices.Compact(judged)
	for _, v6 := range []bool{false, true} {
		def.sets = append(def.sets,
			setDef{name: famName(setLocal, v6), kind: kindInterval, v6: v6, elems: rangeElements(local, v6)},
			setDef{name: famName(setKnown, v6), kind: kindAddrs, v6: v6, elems: nftutil.AddrElements(known, v6)},
			setDef{name: famName(setJudged, v6), kind: kindAddrs, v6: v6, elems: nftutil.AddrElements(judged, v6)},
			setDef{name: famName(setHairpin, v6), kind: kindIfAddrs, v6: v6, elems: sortedElements(b.hairpin[famIndex(v6)])},
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
		// stable, and the pods were walked by ID: of two pods with one
		// port, the lower ID keeps it, as with an address
		slices.SortStableFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		elems = slices.CompactFunc(elems, func(a, b nftables.SetElement) bool { return bytes.Equal(a.Key, b.Key) })
		def.sets = append(def.sets, setDef{name: m, kind: kindIfVmap, elems: elems})
	}
	return nil
}
