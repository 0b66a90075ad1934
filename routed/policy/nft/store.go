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
	// judged there holding it, sorted by ID (the judged sets hold the
	// addresses with any); in avmaps the verdict map's element jumps to
	// the first one's chain (build walks the pods by ID, and the first
	// keeps an address). pmaps the same for the port maps, by
	// interface name key (ifnameKey).
	vmaps [2]map[netip.Addr][]string
	pmaps [2]map[string][]string
	// avmaps are vmaps' pods judged by their addresses (byAddress): the
	// verdict maps by address hold theirs
	avmaps [2]map[netip.Addr][]string
	// hairpin counts, by key (hairpinKey), the pods holding it: the
	// hairpin sets hold those above 0
	hairpin map[string]int
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
	refs int
	def  tierDef
}

func newStore(opt buildOptions) *store {
	s := &store{opt: opt, pods: map[string]*builtPod{}, pols: map[string]*builtPolicy{},
		tiers: map[string]*storedTier{}, polPods: map[string]map[string]struct{}{}, hairpin: map[string]int{},
		polTiers: map[string]map[string]struct{}{}, known: map[netip.Addr]int{},
		counters: map[string]CounterKey{}}
	for i := range 2 {
		s.vmaps[i] = map[netip.Addr][]string{}
		s.avmaps[i] = map[netip.Addr][]string{}
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
	p, err := s.plan(d)
	if err != nil {
		return nil, err
	}
	b, err := s.buildPlan(p, d)
	if err != nil {
		return nil, err
	}
	return s.commit(p, b, d), nil
}

// applyPlan is what a Delta changes in the store: its pod entries and
// policy chains that are new or differ from the stored ones, and the
// stored ones it takes away.
type applyPlan struct {
	pods     []*policy.PodChains
	moving   map[string]bool
	gonePods []string
	pols     []*policy.PolicyChain
	gonePols []string
	tierOf   func(id string) (policy.Tier, bool)
}

// builtPlan is what apply builds for a plan before it changes anything.
type builtPlan struct {
	builtPols                     []*builtPolicy
	builtPods                     []*builtPod
	portsChanged, bportsChanged   bool
	portElems, bportElems         []nftables.SetElement
	localChanged, knownChanged    bool
	knownDel, knownAdd, knownList []netip.Addr
}

// plan finds what d changes (apply's first step).
func (s *store) plan(d policy.Delta) (*applyPlan, error) {
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

	return &applyPlan{pods: pods, moving: moving, gonePods: gonePods, pols: pols, gonePols: gonePols, tierOf: tierOf}, nil
}

// buildPlan builds what comes and refuses what cannot be written
// (apply's second step: the store is not changed yet).
func (s *store) buildPlan(p *applyPlan, d policy.Delta) (*builtPlan, error) {
	pods, pols, gonePols, moving, tierOf := p.pods, p.pols, p.gonePols, p.moving, p.tierOf
	// build what comes, refuse what cannot be written
	builtPols := make([]*builtPolicy, len(pols))
	for i, p := range pols {
		bp := buildPolicyFrom(*p, s.pols[p.ID], s.opt)
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

	return &builtPlan{builtPols: builtPols, builtPods: builtPods, portsChanged: portsChanged, bportsChanged: bportsChanged,
		portElems: portElems, bportElems: bportElems, localChanged: localChanged, knownChanged: knownChanged,
		knownDel: knownDel, knownAdd: knownAdd, knownList: knownList}, nil
}

// commit changes the store by a plan and what was built for it and
// returns what changed (apply's last step: nothing fails).
func (s *store) commit(p *applyPlan, b *builtPlan, d policy.Delta) *change {
	pods, gonePods, pols, gonePols := p.pods, p.gonePods, p.pols, p.gonePols
	builtPols, builtPods := b.builtPols, b.builtPods
	// from here on nothing fails: the store changes
	c := &changer{s: s, ch: &change{old: &tableDef{pods: map[string]CounterKey{}}, def: &tableDef{pods: map[string]CounterKey{}}},
		known: map[netip.Addr]bool{}, judged: map[netip.Addr]bool{}, hairpin: map[string]bool{}, vmaps: map[vmapKey]string{}, pmaps: map[pmapKey]string{},
		bridge: map[pmapKey]bool{}, tiers: map[string]*tierDef{}, rebuild: map[string]bool{}}
	ch := c.ch
	ch.changed = len(pods)+len(gonePods)+len(pols)+len(gonePols) > 0 || b.portsChanged || b.bportsChanged ||
		b.localChanged || b.knownChanged || d.BridgeUnfiltered != s.unfiltered
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
	if b.knownChanged {
		for _, a := range b.knownDel {
			c.addKnown(a, -1)
		}
		for _, a := range b.knownAdd {
			c.addKnown(a, 1)
		}
		s.knownList = b.knownList
	}
	global := map[string][2][]nftables.SetElement{} // old and new touched elements, by set name
	if b.localChanged {
		r := policy.PrefixRanges(d.LocalPodCIDRs)
		for i, v6 := range []bool{false, true} {
			e := rangeElements(r, v6)
			global[famName(setLocal, v6)] = [2][]nftables.SetElement{s.localElems[i], e}
			s.localElems[i] = e
		}
		s.local = slices.Clone(d.LocalPodCIDRs)
	}
	if b.portsChanged {
		del, add := sortedChanges(s.portElems, b.portElems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		global[setPorts] = [2][]nftables.SetElement{del, add}
		s.ports, s.portElems = slices.Clone(d.Ports), b.portElems
	}
	if b.bportsChanged {
		ch.bridge = true
		s.bports, s.bportElems = slices.Clone(d.BridgePorts), b.bportElems
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
	return ch
}

// globalSets are the table's own sets and maps, in build's order, with
// the elements elems gives.
func globalSets(elems func(name string) []nftables.SetElement) []setDef {
	var out []setDef
	for _, v6 := range []bool{false, true} {
		out = append(out,
			setDef{name: famName(setLocal, v6), kind: kindInterval, v6: v6, elems: elems(famName(setLocal, v6))},
			setDef{name: famName(setKnown, v6), kind: kindAddrs, v6: v6, elems: elems(famName(setKnown, v6))},
			setDef{name: famName(setJudged, v6), kind: kindAddrs, v6: v6, elems: elems(famName(setJudged, v6))},
			setDef{name: famName(setHairpin, v6), kind: kindIfAddrs, v6: v6, elems: elems(famName(setHairpin, v6))})
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

// isJudged tells whether a is in a verdict map (the judged sets).
func (s *store) isJudged(a netip.Addr) bool { return len(s.vmaps[0][a])+len(s.vmaps[1][a]) > 0 }

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
			case famName(setHairpin, v6):
				var out []nftables.SetElement
				for k := range s.hairpin {
					if hairpinV6(k) == v6 {
						out = append(out, nftables.SetElement{Key: []byte(k)})
					}
				}
				return sortedElements(out)
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
				for _, a := range slices.SortedFunc(maps.Keys(s.avmaps[i]), netip.Addr.Compare) {
					if a.Is6() == v6 {
						out = append(out, nftables.SetElement{Key: a.AsSlice(), VerdictData: jumpTo(PodChain(s.avmaps[i][a][0], d))})
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
		def.chains = append(def.chains, s.tiers[name].def.chains...)
		def.sets = append(def.sets, s.tiers[name].def.sets...)
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
