// The changer: what one Delta changes in the store, as the old and new
// halves of a table diff that holds only the objects and elements it
// touches.

package nft

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

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
	// hairpin: by key, whether the hairpin sets held it
	hairpin map[string]bool
	vmaps   map[vmapKey]string
	pmaps   map[pmapKey]string
	bridge  map[pmapKey]bool
	tiers   map[string]*tierDef
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

// hairpins adds (n 1) or removes (n -1) p's hairpin elements: its ports
// and addresses, when it is judged by its ports.
func (c *changer) hairpins(p *builtPod, n int) {
	if byAddress(p.pc) {
		return
	}
	s := c.s
	for _, port := range p.pc.Ports {
		for _, a := range p.addrs {
			k := string(hairpinKey(port, a))
			if _, ok := c.hairpin[k]; !ok {
				c.hairpin[k] = s.hairpin[k] > 0
			}
			if s.hairpin[k] += n; s.hairpin[k] <= 0 {
				delete(s.hairpin, k)
			}
		}
	}
}

func (c *changer) touchTier(name string) {
	if _, ok := c.tiers[name]; ok {
		return
	}
	var before *tierDef
	if t, ok := c.s.tiers[name]; ok && t.refs > 0 {
		before = &t.def
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
	c.hairpins(p, n)
	for _, ch := range p.chains {
		i := policy.DirIndex(ch.d)
		for _, a := range p.addrs {
			if _, ok := c.judged[a]; !ok {
				c.judged[a] = s.isJudged(a)
			}
			if l := owners(s.vmaps[i][a], id, n > 0); len(l) > 0 {
				s.vmaps[i][a] = l
			} else {
				delete(s.vmaps[i], a)
			}
			if !byAddress(p.pc) {
				continue
			}
			k := vmapKey{i, a}
			if _, ok := c.vmaps[k]; !ok {
				c.vmaps[k] = first(s.avmaps[i][a])
			}
			if l := owners(s.avmaps[i][a], id, n > 0); len(l) > 0 {
				s.avmaps[i][a] = l
			} else {
				delete(s.avmaps[i], a)
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
			c.ch.old.chains = append(c.ch.old.chains, before.chains...)
			c.ch.old.sets = append(c.ch.old.sets, before.sets...)
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
			t.def = tierChainDef(name, t.tierChain, s.opt.segmentRules(), func(id string) *builtPolicy { return s.pols[id] })
		}
		if before == nil {
			for _, id := range t.ids {
				if s.polTiers[id] == nil {
					s.polTiers[id] = map[string]struct{}{}
				}
				s.polTiers[id][name] = struct{}{}
			}
		}
		c.ch.def.chains = append(c.ch.def.chains, t.def.chains...)
		c.ch.def.sets = append(c.ch.def.sets, t.def.sets...)
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
	for k, before := range c.hairpin {
		if after := s.hairpin[k] > 0; before != after {
			put(famName(setHairpin, hairpinV6(k)), map[bool]int{true: 0, false: 1}[before], nftables.SetElement{Key: []byte(k)})
		}
	}
	dirs := [2]policy.Direction{policy.Ingress, policy.Egress}
	for k, before := range c.vmaps {
		after, name := first(s.avmaps[k.d][k.a]), mapName(dirs[k.d], k.a.Is6())
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
