package nft

// The Writer's store: what it built for the table, per object (pod,
// policy chain, tier chain, and the elements of the table's own sets and
// maps), so that a change builds and compares only what it touches. At
// 1,000 policies and 500 pods a whole build and its comparison with the
// last one cost tens of milliseconds, and a new pod's ADD waits for its
// policy to be in the kernel: a change must cost what it changes.
//
// A change (store.apply, from a policy.Delta) is made into two small
// tableDefs, the touched objects as they were and as they become, and
// for the table's own sets only the touched elements: tableDiff compares
// them as it would the whole tables, so the order of a transaction
// (elements deleted first and added last, chains created before the
// jumps to them, sets before the rules that name them) is the one whole
// tables get. The whole tableDef, which a whole write, a resync and
// Verify need, is assembled from the store when asked (assemble); build
// makes the same from a Ruleset, and the tests hold the two equal.

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// store is the table of one Ruleset, built per object.
type store struct {
	opt   buildOptions
	pods  map[string]*builtPod
	pols  map[string]*builtPolicy
	tiers map[string]*storedTier
	// polPods are, by policy chain ID, the pods whose chains refer to it
	// (builtPod.pols): a policy that goes or changes tier while one of
	// them stays is refused. polTiers are, by policy chain ID, the tier
	// chains holding its rules: a change of the policy rewrites them.
	polPods  map[string]map[string]struct{}
	polTiers map[string]map[string]struct{}

	// the Ruleset's own fields, as given (a delta's are compared with
	// them first: most deltas leave them alone) and as the table holds
	// them
	local      []netip.Prefix
	localElems [2][]nftables.SetElement
	// knownList is Known, canonical (sortedAddrs): a delta's Known (a
	// thousand addresses at 500 pods) is compared with it in one pass
	// (knownChanges)
	knownList  []netip.Addr
	ports      []string
	portElems  []nftables.SetElement
	bports     []string
	bportElems []nftables.SetElement
	unfiltered bool

	// known counts, by address, what makes it known: Known (1) and each
	// pod holding it; the known sets hold those above 0.
	known map[netip.Addr]int
	// vmaps are, by direction (policy.DirIndex) and address, the pods
	// judged there holding it, sorted by ID: the verdict map's element
	// jumps to the first one's chain (build walks the pods by ID, and the
	// first keeps an address). pmaps the same for the port maps, by
	// interface name key (ifnameKey).
	vmaps [2]map[netip.Addr][]string
	pmaps [2]map[string][]string
	// bridgeIso counts, by direction and bridge port, the pods judged
	// there holding it: the bridge table's isolated-in and isolated-eg.
	bridgeIso [2]map[string]int
	// counters are the pod chains' and the ClusterNetworkPolicies' Deny
	// rules' counters (DropCounters)
	counters map[string]CounterKey
}

// storedTier is a tier chain some pod chain jumps to (refs of them).
type storedTier struct {
	tierChain
	refs  int
	chain chainDef
}

func newStore(opt buildOptions) *store {
	s := &store{opt: opt, pods: map[string]*builtPod{}, pols: map[string]*builtPolicy{},
		tiers: map[string]*storedTier{}, polPods: map[string]map[string]struct{}{},
		polTiers: map[string]map[string]struct{}{}, known: map[netip.Addr]int{},
		counters: map[string]CounterKey{}}
	for i := range 2 {
		s.vmaps[i] = map[netip.Addr][]string{}
		s.pmaps[i] = map[string][]string{}
		s.bridgeIso[i] = map[string]int{}
	}
	return s
}

// change is what one store.apply changed: the touched objects as they
// were (old) and as they are (def), the table's own sets in both with
// only their touched elements.
type change struct {
	old, def *tableDef
	// bridge: the bridge table's content changed
	bridge bool
	// changed: the store changed (its assembled table with it)
	changed bool
}

// ruleset is the Ruleset the store holds (in no particular order).
func (s *store) ruleset() policy.Ruleset {
	rs := policy.Ruleset{LocalPodCIDRs: s.local, Ports: s.ports, BridgePorts: s.bports, BridgeUnfiltered: s.unfiltered}
	rs.Known = s.knownList
	for _, p := range s.pods {
		rs.Pods = append(rs.Pods, p.pc)
	}
	for _, p := range s.pols {
		rs.Policies = append(rs.Policies, p.pc)
	}
	return rs
}

// deltaTo is the Delta that makes the store's Ruleset want: want's own
// fields, its entries that are new or differ, the IDs of those it lacks.
// It compares every entry (a whole Ruleset is O(table) anyway) but builds
// nothing.
func (s *store) deltaTo(want policy.Ruleset) (policy.Delta, error) {
	d := policy.Delta{LocalPodCIDRs: want.LocalPodCIDRs, Known: want.Known, Ports: want.Ports,
		BridgePorts: want.BridgePorts, BridgeUnfiltered: want.BridgeUnfiltered}
	seen := make(map[string]bool, len(want.Pods))
	for _, p := range want.Pods {
		if seen[p.ID] {
			return policy.Delta{}, fmt.Errorf("pod ID %q twice", p.ID)
		}
		seen[p.ID] = true
		if o, ok := s.pods[p.ID]; !ok || !o.pc.Equal(p) {
			d.Pods = append(d.Pods, p)
		}
	}
	for id := range s.pods {
		if !seen[id] {
			d.GonePods = append(d.GonePods, id)
		}
	}
	seen = make(map[string]bool, len(want.Policies))
	for _, p := range want.Policies {
		if seen[p.ID] {
			return policy.Delta{}, fmt.Errorf("policy chain ID %q twice", p.ID)
		}
		seen[p.ID] = true
		if o, ok := s.pols[p.ID]; !ok || !o.pc.Equal(p) {
			d.Policies = append(d.Policies, p)
		}
	}
	for id := range s.pols {
		if !seen[id] {
			d.GonePolicies = append(d.GonePolicies, id)
		}
	}
	slices.Sort(d.GonePods)
	slices.Sort(d.GonePolicies)
	return d, nil
}

// apply changes the store by d (as policy.Ruleset.With would its
// Ruleset: an entry of d replaces the one of its ID, a gone ID that d
// also puts back stays) and returns what changed. It refuses what build
// refuses (a pod referring to a policy chain the store will not hold or
// of another tier, an ID twice, a name nft cannot take, an interface name
// that is none), and then the store is left as it was.
func (s *store) apply(d policy.Delta) (*change, error) {
	// what changes: d's entries that are new or differ from the stored
	// ones, and the stored ones d takes away
	var pods []*policy.PodChains
	moving := map[string]bool{} // pods that change or go
	inDelta := make(map[string]bool, len(d.Pods))
	for i := range d.Pods {
		p := &d.Pods[i]
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if inDelta[p.ID] {
			return nil, fmt.Errorf("pod ID %q twice", p.ID)
		}
		inDelta[p.ID] = true
		if o, ok := s.pods[p.ID]; ok && o.pc.Equal(*p) {
			continue
		}
		pods = append(pods, p)
		moving[p.ID] = true
	}
	var gonePods []string
	for _, id := range d.GonePods {
		if _, ok := s.pods[id]; ok && !inDelta[id] && !moving[id] {
			gonePods = append(gonePods, id)
			moving[id] = true
		}
	}
	var pols []*policy.PolicyChain
	polMoving := map[string]bool{}
	newTier := map[string]policy.Tier{}
	inDelta = make(map[string]bool, len(d.Policies))
	for i := range d.Policies {
		p := &d.Policies[i]
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("policy chain %s/%s %s: %w", p.Namespace, p.Name, p.Direction, err)
		}
		if inDelta[p.ID] {
			return nil, fmt.Errorf("policy chain ID %q twice", p.ID)
		}
		inDelta[p.ID] = true
		if o, ok := s.pols[p.ID]; ok && o.pc.Equal(*p) {
			continue
		}
		pols = append(pols, p)
		polMoving[p.ID] = true
		newTier[p.ID] = p.Tier
	}
	var gonePols []string
	goneSet := map[string]bool{}
	for _, id := range d.GonePolicies {
		if _, ok := s.pols[id]; ok && !inDelta[id] && !goneSet[id] {
			gonePols = append(gonePols, id)
			goneSet[id] = true
		}
	}
	tierOf := func(id string) (policy.Tier, bool) {
		if t, ok := newTier[id]; ok {
			return t, true
		}
		if goneSet[id] {
			return "", false
		}
		if bp, ok := s.pols[id]; ok {
			return bp.pc.Tier, true
		}
		return "", false
	}

	// build what comes, refuse what cannot be written
	builtPols := make([]*builtPolicy, len(pols))
	for i, p := range pols {
		bp := buildPolicy(*p, s.opt)
		if err := bp.checkNames(); err != nil {
			return nil, fmt.Errorf("policy chain %s/%s %s: %w", p.Namespace, p.Name, p.Direction, err)
		}
		builtPols[i] = &bp
	}
	// the pods that stay must still find their policies
	lost := slices.Clone(gonePols)
	for _, p := range pols {
		if o, ok := s.pols[p.ID]; ok && o.pc.Tier != p.Tier {
			lost = append(lost, p.ID)
		}
	}
	for _, id := range lost {
		for pod := range s.polPods[id] {
			if !moving[pod] {
				pc := s.pods[pod].pc
				return nil, fmt.Errorf("pod %s/%s refers to policy chain %q, which the ruleset lacks (or of another tier)", pc.Namespace, pc.Name, id)
			}
		}
	}
	builtPods := make([]*builtPod, len(pods))
	for i, p := range pods {
		bp, err := buildPod(*p, s.opt, tierOf)
		if err != nil {
			return nil, err
		}
		if p.Judged(policy.Ingress) || p.Judged(policy.Egress) {
			if _, err := ifnameElements(p.BridgePorts); err != nil {
				return nil, fmt.Errorf("bridge ports: %w", err)
			}
		}
		builtPods[i] = &bp
	}
	portsChanged := !slices.Equal(d.Ports, s.ports)
	var portElems []nftables.SetElement
	if portsChanged {
		var err error
		if portElems, err = ifnameElements(d.Ports); err != nil {
			return nil, err
		}
	}
	bportsChanged := !slices.Equal(d.BridgePorts, s.bports)
	var bportElems []nftables.SetElement
	if bportsChanged {
		var err error
		if bportElems, err = ifnameElements(d.BridgePorts); err != nil {
			return nil, fmt.Errorf("bridge ports: %w", err)
		}
	}
	localChanged := !slices.Equal(d.LocalPodCIDRs, s.local)
	knownDel, knownAdd, knownList := knownChanges(s.knownList, d.Known)
	knownChanged := len(knownDel)+len(knownAdd) > 0

	// from here on nothing fails: the store changes
	c := &changer{s: s, ch: &change{old: &tableDef{pods: map[string]CounterKey{}}, def: &tableDef{pods: map[string]CounterKey{}}},
		known: map[netip.Addr]bool{}, judged: map[netip.Addr]bool{}, vmaps: map[vmapKey]string{}, pmaps: map[pmapKey]string{},
		bridge: map[pmapKey]bool{}, tiers: map[string]*chainDef{}, rebuild: map[string]bool{}}
	ch := c.ch
	ch.changed = len(pods)+len(gonePods)+len(pols)+len(gonePols) > 0 || portsChanged || bportsChanged ||
		localChanged || knownChanged || d.BridgeUnfiltered != s.unfiltered
	for _, p := range pols {
		if _, ok := s.pols[p.ID]; ok {
			for name := range s.polTiers[p.ID] {
				c.touchTier(name)
				c.rebuild[name] = true
			}
		}
	}
	for _, p := range pods {
		if o, ok := s.pods[p.ID]; ok {
			c.removePod(o)
		}
	}
	for _, id := range gonePods {
		c.removePod(s.pods[id])
	}
	for _, bp := range builtPods {
		c.addPod(bp)
	}
	for _, p := range pols {
		if o, ok := s.pols[p.ID]; ok {
			c.removePolicy(o)
		}
	}
	for _, id := range gonePols {
		c.removePolicy(s.pols[id])
	}
	for _, bp := range builtPols {
		c.addPolicy(bp)
	}
	c.finishTiers()
	if knownChanged {
		for _, a := range knownDel {
			c.addKnown(a, -1)
		}
		for _, a := range knownAdd {
			c.addKnown(a, 1)
		}
		s.knownList = knownList
	}
	global := map[string][2][]nftables.SetElement{} // old and new touched elements, by set name
	if localChanged {
		r := policy.PrefixRanges(d.LocalPodCIDRs)
		for i, v6 := range []bool{false, true} {
			e := rangeElements(r, v6)
			global[famName(setLocal, v6)] = [2][]nftables.SetElement{s.localElems[i], e}
			s.localElems[i] = e
		}
		s.local = slices.Clone(d.LocalPodCIDRs)
	}
	if portsChanged {
		del, add := sortedChanges(s.portElems, portElems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		global[setPorts] = [2][]nftables.SetElement{del, add}
		s.ports, s.portElems = slices.Clone(d.Ports), portElems
	}
	if bportsChanged {
		ch.bridge = true
		s.bports, s.bportElems = slices.Clone(d.BridgePorts), bportElems
	}
	if d.BridgeUnfiltered != s.unfiltered {
		ch.bridge, s.unfiltered = true, d.BridgeUnfiltered
	}
	c.finishElements(global)
	// the table's own sets are in both, so that they stay: their
	// elements are added and deleted
	for i, t := range []*tableDef{ch.old, ch.def} {
		t.sets = append(globalSets(func(name string) []nftables.SetElement { return global[name][i] }), t.sets...)
		slices.Sort(t.counters)
	}
	return ch, nil
}

// globalSets are the table's own sets and maps, in build's order, with
// the elements elems gives.
func globalSets(elems func(name string) []nftables.SetElement) []setDef {
	var out []setDef
	for _, v6 := range []bool{false, true} {
		out = append(out,
			setDef{name: famName(setLocal, v6), kind: kindInterval, v6: v6, elems: elems(famName(setLocal, v6))},
			setDef{name: famName(setKnown, v6), kind: kindAddrs, v6: v6, elems: elems(famName(setKnown, v6))},
			setDef{name: famName(setJudged, v6), kind: kindAddrs, v6: v6, elems: elems(famName(setJudged, v6))})
	}
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			m := mapName(d, v6)
			out = append(out, setDef{name: m, kind: kindVmap, v6: v6, elems: elems(m)})
		}
	}
	out = append(out, setDef{name: setPorts, kind: kindIfnames, elems: elems(setPorts)})
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		m := portMapName(d)
		out = append(out, setDef{name: m, kind: kindIfVmap, elems: elems(m)})
	}
	return out
}

// vmapKey and pmapKey name an element of a verdict map, or of a port
// map (key: ifnameKey) and of the bridge table's isolated sets.
type vmapKey struct {
	d int
	a netip.Addr
}

type pmapKey struct {
	d   int
	key string
}

// changer is one apply's work: the touched keys of the table's own sets
// with their state before the change (present; the pod whose chain an
// element jumps to, "" for none), the touched tier chains with theirs
// (nil: not in the table).
type changer struct {
	s      *store
	ch     *change
	known  map[netip.Addr]bool
	judged map[netip.Addr]bool
	vmaps  map[vmapKey]string
	pmaps  map[pmapKey]string
	bridge map[pmapKey]bool
	tiers  map[string]*chainDef
	// rebuild: tier chains one of whose policies changed
	rebuild map[string]bool
}

func (c *changer) addKnown(a netip.Addr, n int) {
	if _, ok := c.known[a]; !ok {
		c.known[a] = c.s.known[a] > 0
	}
	if c.s.known[a] += n; c.s.known[a] <= 0 {
		delete(c.s.known, a)
	}
}

func (c *changer) touchTier(name string) {
	if _, ok := c.tiers[name]; ok {
		return
	}
	var before *chainDef
	if t, ok := c.s.tiers[name]; ok && t.refs > 0 {
		before = &t.chain
	}
	c.tiers[name] = before
}

// owners adds (or removes) id to the sorted owners list of a map key.
func owners(list []string, id string, add bool) []string {
	i, found := slices.BinarySearch(list, id)
	switch {
	case add && !found:
		return slices.Insert(list, i, id)
	case !add && found:
		return slices.Delete(slices.Clip(list), i, i+1)
	}
	return list
}

func first(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[0]
}

// pod adds (n 1) or removes (n -1) what p makes of the table's own sets
// and maps, the tier chains' references and the policies' referrers.
func (c *changer) pod(p *builtPod, n int) {
	s, id := c.s, p.pc.ID
	for _, a := range p.addrs {
		c.addKnown(a, n)
	}
	for _, ch := range p.chains {
		i := policy.DirIndex(ch.d)
		for _, a := range p.addrs {
			k := vmapKey{i, a}
			if _, ok := c.vmaps[k]; !ok {
				c.vmaps[k] = first(s.vmaps[i][a])
			}
			if _, ok := c.judged[a]; !ok {
				c.judged[a] = s.isJudged(a)
			}
			if l := owners(s.vmaps[i][a], id, n > 0); len(l) > 0 {
				s.vmaps[i][a] = l
			} else {
				delete(s.vmaps[i], a)
			}
		}
		for _, port := range p.pc.Ports {
			k := pmapKey{i, string(ifnameKey(port))}
			if _, ok := c.pmaps[k]; !ok {
				c.pmaps[k] = first(s.pmaps[i][k.key])
			}
			if l := owners(s.pmaps[i][k.key], id, n > 0); len(l) > 0 {
				s.pmaps[i][k.key] = l
			} else {
				delete(s.pmaps[i], k.key)
			}
		}
		for _, port := range p.pc.BridgePorts {
			k := pmapKey{i, port}
			if _, ok := c.bridge[k]; !ok {
				c.bridge[k] = s.bridgeIso[i][port] > 0
			}
			if s.bridgeIso[i][port] += n; s.bridgeIso[i][port] <= 0 {
				delete(s.bridgeIso[i], port)
			}
		}
		for _, t := range ch.tiers {
			c.touchTier(t.name)
			st := s.tiers[t.name]
			if st == nil {
				st = &storedTier{tierChain: t.tierChain}
				s.tiers[t.name] = st
			}
			st.refs += n
		}
	}
	for _, pol := range p.pols {
		if n > 0 {
			if s.polPods[pol] == nil {
				s.polPods[pol] = map[string]struct{}{}
			}
			s.polPods[pol][id] = struct{}{}
		} else if delete(s.polPods[pol], id); len(s.polPods[pol]) == 0 {
			delete(s.polPods, pol)
		}
	}
}

// removePod takes p out of the store; its chains and counters go in the
// old table.
func (c *changer) removePod(p *builtPod) {
	c.pod(p, -1)
	delete(c.s.pods, p.pc.ID)
	for _, ch := range p.chains {
		name := ch.chain.chain.Name
		c.ch.old.chains = append(c.ch.old.chains, ch.chain)
		c.ch.old.counters = append(c.ch.old.counters, name)
		c.ch.old.pods[name] = c.s.counters[name]
		delete(c.s.counters, name)
	}
}

// addPod puts p in the store; its chains and counters go in the new
// table.
func (c *changer) addPod(p *builtPod) {
	c.pod(p, 1)
	c.s.pods[p.pc.ID] = p
	for _, ch := range p.chains {
		name := ch.chain.chain.Name
		k := CounterKey{PodID: p.pc.ID, Direction: ch.d}
		c.ch.def.chains = append(c.ch.def.chains, ch.chain)
		c.ch.def.counters = append(c.ch.def.counters, name)
		c.ch.def.pods[name] = k
		c.s.counters[name] = k
	}
}

// removePolicy takes p out of the store; its chain, sets and counters go
// in the old table.
func (c *changer) removePolicy(p *builtPolicy) {
	delete(c.s.pols, p.pc.ID)
	c.policy(c.ch.old, p)
	for _, n := range p.counters {
		delete(c.s.counters, n)
	}
}

// addPolicy puts p in the store; its chain, sets and counters go in the
// new table.
func (c *changer) addPolicy(p *builtPolicy) {
	c.s.pols[p.pc.ID] = p
	c.policy(c.ch.def, p)
	p.eachCounter(func(name string, k CounterKey) { c.s.counters[name] = k })
}

func (c *changer) policy(t *tableDef, p *builtPolicy) {
	t.sets = append(t.sets, p.sets...)
	if p.pc.Tier == policy.TierNetworkPolicy {
		t.chains = append(t.chains, p.chain)
	}
	p.eachCounter(func(name string, k CounterKey) {
		t.counters = append(t.counters, name)
		t.pods[name] = k
	})
}

// finishTiers settles the touched tier chains once the pods and policies
// are in: one no pod chain jumps to any more goes, one that comes or
// whose policies changed is made again (from the policies now stored).
func (c *changer) finishTiers() {
	s := c.s
	for _, name := range slices.Sorted(maps.Keys(c.tiers)) {
		before, t := c.tiers[name], s.tiers[name]
		if before != nil {
			c.ch.old.chains = append(c.ch.old.chains, *before)
		}
		if t == nil {
			continue
		}
		if t.refs <= 0 {
			delete(s.tiers, name)
			if before != nil {
				for _, id := range t.ids {
					if delete(s.polTiers[id], name); len(s.polTiers[id]) == 0 {
						delete(s.polTiers, id)
					}
				}
			}
			continue
		}
		if before == nil || c.rebuild[name] {
			t.chain = tierChainDef(name, t.tierChain, func(id string) *builtPolicy { return s.pols[id] })
		}
		if before == nil {
			for _, id := range t.ids {
				if s.polTiers[id] == nil {
					s.polTiers[id] = map[string]struct{}{}
				}
				s.polTiers[id][name] = struct{}{}
			}
		}
		c.ch.def.chains = append(c.ch.def.chains, t.chain)
	}
}

// finishElements puts the touched elements of the table's own sets and
// maps, before and after, in global (by set name: old, new), and tells
// whether the bridge table's isolated sets changed.
func (c *changer) finishElements(global map[string][2][]nftables.SetElement) {
	s := c.s
	put := func(name string, i int, e nftables.SetElement) {
		g := global[name]
		g[i] = append(g[i], e)
		global[name] = g
	}
	for a, before := range c.known {
		name := famName(setKnown, a.Is6())
		if before {
			put(name, 0, nftables.SetElement{Key: a.AsSlice()})
		}
		if s.known[a] > 0 {
			put(name, 1, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	for a, before := range c.judged {
		name := famName(setJudged, a.Is6())
		if after := s.isJudged(a); before != after {
			put(name, map[bool]int{true: 0, false: 1}[before], nftables.SetElement{Key: a.AsSlice()})
		}
	}
	dirs := [2]policy.Direction{policy.Ingress, policy.Egress}
	for k, before := range c.vmaps {
		after, name := first(s.vmaps[k.d][k.a]), mapName(dirs[k.d], k.a.Is6())
		if before == after {
			continue
		}
		if before != "" {
			put(name, 0, nftables.SetElement{Key: k.a.AsSlice(), VerdictData: jumpTo(PodChain(before, dirs[k.d]))})
		}
		if after != "" {
			put(name, 1, nftables.SetElement{Key: k.a.AsSlice(), VerdictData: jumpTo(PodChain(after, dirs[k.d]))})
		}
	}
	for k, before := range c.pmaps {
		after, name := first(s.pmaps[k.d][k.key]), portMapName(dirs[k.d])
		if before == after {
			continue
		}
		if before != "" {
			put(name, 0, nftables.SetElement{Key: []byte(k.key), VerdictData: jumpTo(PodChain(before, dirs[k.d]))})
		}
		if after != "" {
			put(name, 1, nftables.SetElement{Key: []byte(k.key), VerdictData: jumpTo(PodChain(after, dirs[k.d]))})
		}
	}
	for k, before := range c.bridge {
		if before != (s.bridgeIso[k.d][k.key] > 0) {
			c.ch.bridge = true
		}
	}
}

// isJudged tells whether a is in a verdict map (the judged sets).
func (s *store) isJudged(a netip.Addr) bool { return len(s.vmaps[0][a])+len(s.vmaps[1][a]) > 0 }

// knownChanges compares Known (in, as a delta has it) with the stored
// list (canonical: sortedAddrs'): del are the stored addresses in lacks,
// add those of in not stored, and list is in made canonical when they
// differ. When in is the stored list (most deltas keep Known or change
// it by a pod's addresses) it costs one comparison of three words per
// address and allocates nothing: only around an address that differs is
// in's order checked (the stored ones are sorted, and so are those of in
// equal to them).
func knownChanges(stored, in []netip.Addr) (del, add, list []netip.Addr) {
	ok := func(a netip.Addr) bool { return a.IsValid() && !a.Is4In6() && a.Zone() == "" }
	i, j := 0, 0
	sorted := true
	for i < len(stored) && j < len(in) {
		if stored[i] == in[j] {
			i++
			j++
			continue
		}
		a := in[j]
		if !ok(a) || (j > 0 && in[j-1].Compare(a) >= 0) || (j+1 < len(in) && a.Compare(in[j+1]) >= 0) {
			sorted = false
			break
		}
		if c := stored[i].Compare(a); c < 0 {
			del = append(del, stored[i])
			i++
		} else {
			add = append(add, a)
			j++
		}
	}
	if sorted {
		for k := j; k < len(in); k++ {
			if !ok(in[k]) || (k > 0 && in[k-1].Compare(in[k]) >= 0) {
				sorted = false
				break
			}
		}
	}
	if !sorted {
		list = sortedAddrs(in)
		del, add = sortedChanges(stored, list, netip.Addr.Compare)
		return del, add, list
	}
	del = append(del, stored[i:]...)
	add = append(add, in[j:]...)
	if len(del)+len(add) > 0 {
		list = slices.Clone(in)
	}
	return del, add, list
}

// sortedChanges compares two sorted lists without duplicates: del are
// those of before that after lacks, add those of after that before lacks.
func sortedChanges[T any](before, after []T, cmp func(a, b T) int) (del, add []T) {
	i, j := 0, 0
	for i < len(before) && j < len(after) {
		switch c := cmp(before[i], after[j]); {
		case c < 0:
			del = append(del, before[i])
			i++
		case c > 0:
			add = append(add, after[j])
			j++
		default:
			i++
			j++
		}
	}
	return append(del, before[i:]...), append(add, after[j:]...)
}

// assemble is the store's whole table: what build makes of the store's
// Ruleset.
func (s *store) assemble() *tableDef {
	def := &tableDef{pods: maps.Clone(s.counters)}
	def.counters = append(slices.Collect(maps.Keys(s.counters)), CounterUnknown)
	slices.Sort(def.counters)
	known := slices.SortedFunc(maps.Keys(s.known), netip.Addr.Compare)
	judged := slices.SortedFunc(maps.Keys(s.vmaps[0]), netip.Addr.Compare)
	for a := range s.vmaps[1] {
		if len(s.vmaps[0][a]) == 0 {
			judged = append(judged, a)
		}
	}
	slices.SortFunc(judged, netip.Addr.Compare)
	dirs := [2]policy.Direction{policy.Ingress, policy.Egress}
	def.sets = globalSets(func(name string) []nftables.SetElement {
		for i, v6 := range []bool{false, true} {
			switch name {
			case famName(setLocal, v6):
				return s.localElems[i]
			case famName(setKnown, v6):
				return nftutil.AddrElements(known, v6)
			case famName(setJudged, v6):
				return nftutil.AddrElements(judged, v6)
			}
		}
		if name == setPorts {
			return s.portElems
		}
		var out []nftables.SetElement
		for i, d := range dirs {
			if name == portMapName(d) {
				for _, k := range slices.Sorted(maps.Keys(s.pmaps[i])) {
					out = append(out, nftables.SetElement{Key: []byte(k), VerdictData: jumpTo(PodChain(s.pmaps[i][k][0], d))})
				}
				return out
			}
			for _, v6 := range []bool{false, true} {
				if name != mapName(d, v6) {
					continue
				}
				for _, a := range slices.SortedFunc(maps.Keys(s.vmaps[i]), netip.Addr.Compare) {
					if a.Is6() == v6 {
						out = append(out, nftables.SetElement{Key: a.AsSlice(), VerdictData: jumpTo(PodChain(s.vmaps[i][a][0], d))})
					}
				}
				return out
			}
		}
		return nil
	})
	def.chains = baseChains()
	for _, id := range slices.Sorted(maps.Keys(s.pols)) {
		p := s.pols[id]
		def.sets = append(def.sets, p.sets...)
		if p.pc.Tier == policy.TierNetworkPolicy {
			def.chains = append(def.chains, p.chain)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.tiers)) {
		def.chains = append(def.chains, s.tiers[name].chain)
	}
	for _, id := range slices.Sorted(maps.Keys(s.pods)) {
		for _, c := range s.pods[id].chains {
			def.chains = append(def.chains, c.chain)
		}
	}
	return def
}

// bridgeDef is the bridge table of the store's Ruleset (buildBridge's).
func (s *store) bridgeDef() *bridgeDef {
	iso := func(m map[string]int) []nftables.SetElement {
		e, _ := ifnameElements(slices.Sorted(maps.Keys(m))) // checked when the pods came
		return e
	}
	return &bridgeDef{ports: s.bportElems, in: iso(s.bridgeIso[0]), eg: iso(s.bridgeIso[1]), unfiltered: s.unfiltered}
}

// structure is a table's structure as nftutil.Structure reads it, by
// label, so that the read-back of a write (nftutil.StructurePatch of what
// it changed) replaces what it names without walking the rest.
type structure struct {
	objs  map[string]string   // by label ("set NAME", ...), rules aside
	rules map[string][]string // by chain, in order
	lines []string            // all of them, made when asked; nil: not since the last patch
}

func newStructure(lines []string) *structure {
	s := &structure{objs: map[string]string{}, rules: map[string][]string{}}
	for _, l := range lines {
		s.add(l)
	}
	s.lines = lines
	return s
}

func (s *structure) add(l string) {
	label, _, _ := strings.Cut(l, ": ")
	if rest, ok := strings.CutPrefix(label, "rule "); ok {
		if _, chain, ok := strings.Cut(rest, " of chain "); ok {
			s.rules[chain] = append(s.rules[chain], l)
			return
		}
	}
	s.objs[label] = l
}

// patch applies what a write changed (p) and what was read of it after
// (fresh: StructurePatch's lines of the objects p names).
func (s *structure) patch(p nftutil.Patch, fresh []string) {
	s.lines = nil
	for _, g := range p.Gone {
		delete(s.objs, g)
		if c, ok := strings.CutPrefix(g, "chain "); ok {
			delete(s.rules, c)
		}
	}
	for _, x := range []struct {
		kind  string
		names []string
	}{{"object ", p.Counters}, {"set ", p.Sets}, {"chain ", p.Chains}} {
		for _, n := range x.names {
			delete(s.objs, x.kind+n)
		}
	}
	for _, c := range p.Rules {
		delete(s.rules, c)
	}
	for _, l := range fresh {
		s.add(l)
	}
}

// all is every line (in no particular order: nftutil.StructureDiff
// compares by label).
func (s *structure) all() []string {
	if s.lines == nil {
		s.lines = slices.Collect(maps.Values(s.objs))
		for _, r := range s.rules {
			s.lines = append(s.lines, r...)
		}
	}
	return s.lines
}
