package nft

import (
	"bytes"
	"fmt"
	"github.com/google/nftables"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/routed/policy"
)

// storeGen makes random Rulesets and Deltas of a small node: policies of
// every tier, pods selected by them, addresses and ports two pods share.
type storeGen struct {
	r  *rand.Rand
	rs policy.Ruleset
}

func (g *storeGen) addr() netip.Addr {
	if g.r.IntN(3) == 0 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(g.r.IntN(4)), 15: byte(g.r.IntN(256))})
	}
	return netip.AddrFrom4([4]byte{10, byte(g.r.IntN(4)), 0, byte(g.r.IntN(256))})
}

func (g *storeGen) rule(tier policy.Tier) policy.Rule {
	r := policy.Rule{AnyPeer: g.r.IntN(5) == 0, AnyPort: g.r.IntN(4) == 0}
	for range g.r.IntN(4) {
		a := g.addr()
		r.Peers = append(r.Peers, policy.Range{From: a, To: a})
	}
	for range g.r.IntN(3) {
		a := g.addr()
		r.Ports = append(r.Ports, policy.PortRange{Addrs: policy.Range{From: a, To: a}, Proto: policy.ProtoTCP, PortFrom: uint16(1 + g.r.IntN(100)), PortTo: 200})
	}
	if tier != policy.TierNetworkPolicy {
		r.Action = []policy.Action{policy.ActionAccept, policy.ActionDeny, policy.ActionPass}[g.r.IntN(3)]
	}
	return r.Canonical()
}

// policy i: p0-p19 NetworkPolicies, c0-c5 Admin, c6-c9 Baseline; now
// and then a NetworkPolicy becomes a ClusterNetworkPolicy (a tier change).
func (g *storeGen) policy(id string) policy.PolicyChain {
	p := policy.PolicyChain{ID: id, Direction: policy.Ingress}
	if g.r.IntN(2) == 0 {
		p.Direction = policy.Egress
	}
	var n int
	if _, err := fmt.Sscanf(id, "c%d", &n); err == nil {
		p.Tier = policy.TierAdmin
		if n >= 6 {
			p.Tier = policy.TierBaseline
		}
		p.Priority = int32(n)
	}
	for range 1 + g.r.IntN(3) {
		p.Rules = append(p.Rules, g.rule(p.Tier))
	}
	return p
}

// pod i, selected by some of pols; pods 0-3 share an address with pod
// i+10 now and then, and ports with each other.
func (g *storeGen) pod(i int, pols []policy.PolicyChain) policy.PodChains {
	p := policy.PodChains{ID: fmt.Sprintf("pod%d", i), Namespace: "ns", Name: fmt.Sprintf("n%d", i),
		Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 64, 1, byte(i % 12)}), netip.AddrFrom16([16]byte{0xfd, 64, 15: byte(i)})}}
	if g.r.IntN(4) == 0 {
		p.Addrs = append(p.Addrs, netip.AddrFrom4([4]byte{10, 64, 2, byte(g.r.IntN(4))})) // shared
	}
	for _, pol := range pols {
		if g.r.IntN(4) != 0 {
			continue
		}
		d := policy.DirIndex(pol.Direction)
		switch pol.Tier {
		case policy.TierAdmin:
			p.Admin[d] = append(p.Admin[d], pol.ID)
		case policy.TierBaseline:
			p.Baseline[d] = append(p.Baseline[d], pol.ID)
		default:
			if d == 0 {
				p.IngressIsolated, p.Ingress = true, append(p.Ingress, pol.ID)
			} else {
				p.EgressIsolated, p.Egress = true, append(p.Egress, pol.ID)
			}
		}
	}
	if g.r.IntN(6) == 0 {
		p.EgressIsolated = true
	}
	if g.r.IntN(3) == 0 {
		p.Ports = []string{fmt.Sprintf("pnr%d", g.r.IntN(30))}
	}
	if g.r.IntN(3) == 0 {
		p.BridgePorts = []string{fmt.Sprintf("pnb%d", g.r.IntN(30))}
	}
	return p
}

// delta is a random change of g.rs: a few pods and policies come, change
// or go (the pods that refer to a policy that goes or changes tier
// change with it), and the Ruleset's own fields now and then.
func (g *storeGen) delta() policy.Delta {
	rs := g.rs
	d := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, Ports: rs.Ports, BridgePorts: rs.BridgePorts, BridgeUnfiltered: rs.BridgeUnfiltered}
	pols := map[string]policy.PolicyChain{}
	for _, p := range rs.Policies {
		pols[p.ID] = p
	}
	lost, touched := map[string]bool{}, map[string]bool{}
	for range g.r.IntN(3) {
		id := fmt.Sprintf("p%d", g.r.IntN(20))
		if g.r.IntN(3) == 0 {
			id = fmt.Sprintf("c%d", g.r.IntN(10))
		}
		if touched[id] {
			continue
		}
		touched[id] = true
		switch o, ok := pols[id]; {
		case ok && g.r.IntN(4) == 0:
			d.GonePolicies = append(d.GonePolicies, id)
			delete(pols, id)
			lost[id] = true
		case ok && g.r.IntN(3) == 0: // one rule's peers only: elements
			p := o
			p.Rules = slices.Clone(p.Rules)
			k := g.r.IntN(len(p.Rules)) // the others stay (buildPolicyFrom keeps what they built)
			p.Rules[k].Peers = append(slices.Clone(p.Rules[k].Peers), policy.Range{From: g.addr(), To: g.addr()})
			p.Rules[k].Peers[len(p.Rules[k].Peers)-1].To = p.Rules[k].Peers[len(p.Rules[k].Peers)-1].From
			p.Rules[k] = p.Rules[k].Canonical()
			d.Policies = append(d.Policies, p)
			pols[id] = p
		default:
			p := g.policy(id)
			if ok && o.Tier != p.Tier {
				lost[id] = true
			}
			d.Policies = append(d.Policies, p)
			pols[id] = p
		}
	}
	ids := slices.Sorted(maps.Keys(pols))
	var all []policy.PolicyChain
	for _, id := range ids {
		all = append(all, pols[id])
	}
	changed := map[string]bool{}
	for _, p := range rs.Pods {
		refers := false
		for _, id := range slices.Concat(p.Ingress, p.Egress, p.Admin[0], p.Admin[1], p.Baseline[0], p.Baseline[1]) {
			refers = refers || lost[id]
		}
		if refers || g.r.IntN(12) == 0 {
			var n int
			fmt.Sscanf(p.ID, "pod%d", &n)
			if g.r.IntN(3) == 0 {
				d.GonePods = append(d.GonePods, p.ID)
			} else {
				d.Pods = append(d.Pods, g.pod(n, all))
			}
			changed[p.ID] = true
		}
	}
	for range g.r.IntN(3) {
		n := g.r.IntN(24)
		if id := fmt.Sprintf("pod%d", n); !changed[id] {
			d.Pods = append(d.Pods, g.pod(n, all))
			changed[id] = true
			d.GonePods = append(d.GonePods, id) // put back: d.Pods wins
		}
	}
	if g.r.IntN(3) == 0 {
		d.Known = append(slices.Clone(d.Known), netip.AddrFrom4([4]byte{10, 64, 3, byte(g.r.IntN(256))}))
		slices.SortFunc(d.Known, netip.Addr.Compare)
		d.Known = slices.Compact(d.Known)
	}
	if g.r.IntN(5) == 0 && len(d.Known) > 0 {
		d.Known = slices.Delete(slices.Clone(d.Known), 0, 1)
	}
	if g.r.IntN(6) == 0 {
		d.Ports = []string{fmt.Sprintf("pnr%d", g.r.IntN(30)), "pnx"}
		slices.Sort(d.Ports)
	}
	if g.r.IntN(6) == 0 {
		d.BridgePorts = []string{fmt.Sprintf("pnb%d", g.r.IntN(30))}
		d.BridgeUnfiltered = g.r.IntN(2) == 0
	}
	if g.r.IntN(20) == 0 {
		d.LocalPodCIDRs = []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.64.%d.0/24", g.r.IntN(4)))}
	}
	return d
}

// checkStore: the store's table is build's of rs, rule for rule, and its
// bridge table and counters are those of rs.
func checkStore(t *testing.T, step int, s *store, rs policy.Ruleset) {
	t.Helper()
	want, err := build(rs, s.opt)
	if err != nil {
		t.Fatalf("step %d: build: %v", step, err)
	}
	got := s.assemble()
	if d := defDiff(got, want); d != "" {
		t.Fatalf("step %d: the store's table differs from build's: %s", step, d)
	}
	for i := range got.chains {
		if !reflect.DeepEqual(got.chains[i].rules, want.chains[i].rules) {
			t.Fatalf("step %d: chain %s's rules differ", step, got.chains[i].chain.Name)
		}
	}
	if !maps.Equal(got.pods, want.pods) {
		t.Fatalf("step %d: counters' keys differ", step)
	}
	bwant, err := buildBridge(rs)
	if err != nil {
		t.Fatalf("step %d: buildBridge: %v", step, err)
	}
	if !s.bridgeDef().equal(bwant) {
		t.Fatalf("step %d: the store's bridge table differs", step)
	}
}

// TestStoreEqualsBuild: over random sequences of Deltas (pods and policy
// chains of every tier coming, changing, going; Known, Ports, bridge
// ports, local CIDRs changing; addresses and ports two pods share), and
// of whole Rulesets now and then (deltaTo), the store's assembled table
// is build's of the Ruleset the sequence makes (policy.Ruleset.With),
// with and without drop logging, and the policy chains that did not
// change are not built again.
func TestStoreEqualsBuild(t *testing.T) {
	for _, opt := range []buildOptions{{}, {logDrops: true, logRate: 7}} {
		g := &storeGen{r: rand.New(rand.NewPCG(9, uint64(opt.logRate)))}
		s := newStore(opt)
		reused, total := 0, 0
		for step := range 400 {
			d := g.delta()
			prev := maps.Clone(s.pols)
			if step%25 == 24 { // a whole Ruleset
				var err error
				if d, err = s.deltaTo(g.rs.With(d)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.apply(d); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			g.rs = g.rs.With(d)
			checkStore(t, step, s, g.rs)
			for id, bp := range s.pols {
				total++
				if prev[id] == bp {
					reused++
				}
			}
		}
		if reused < total*8/10 {
			t.Errorf("%d of %d policy chains kept from the step before", reused, total)
		}
		if len(g.rs.Pods) < 5 || len(g.rs.Policies) < 5 {
			t.Errorf("the generator drifted to %d pods, %d policies", len(g.rs.Pods), len(g.rs.Policies))
		}
	}
}

// TestStoreRefuses: a delta build would refuse is refused and changes
// nothing: a pod jumping to a policy chain the store lacks, a policy
// chain that goes (or changes tier) while a pod that stays refers to it,
// a crossed tier, an ID twice, a name too long, a bad interface name.
func TestStoreRefuses(t *testing.T) {
	np := policy.PolicyChain{ID: "np", Direction: policy.Ingress, Rules: []policy.Rule{{AnyPeer: true, AnyPort: true}}}
	adm := policy.PolicyChain{ID: "adm", Direction: policy.Ingress, Tier: policy.TierAdmin, Rules: []policy.Rule{{Action: policy.ActionDeny, AnyPeer: true, AnyPort: true}}}
	a := policy.PodChains{ID: "a", Addrs: []netip.Addr{netip.MustParseAddr("10.64.1.2")}, IngressIsolated: true, Ingress: []string{"np"}}
	b := policy.PodChains{ID: "b", Addrs: []netip.Addr{netip.MustParseAddr("10.64.1.3")}, Admin: [2][]string{{"adm"}}}
	base := policy.Ruleset{Known: []netip.Addr{netip.MustParseAddr("10.64.1.9")}, Pods: []policy.PodChains{a, b}, Policies: []policy.PolicyChain{np, adm}}
	withPod := func(p policy.PodChains) policy.Delta {
		return policy.Delta{Known: base.Known, Pods: []policy.PodChains{p}}
	}
	npAdmin := np
	npAdmin.Tier = policy.TierAdmin
	long := strings.Repeat("x", 300)
	for name, d := range map[string]policy.Delta{
		"jump to a missing policy":   withPod(policy.PodChains{ID: "c", IngressIsolated: true, Ingress: []string{"missing"}}),
		"jump to an Admin chain":     withPod(policy.PodChains{ID: "c", IngressIsolated: true, Ingress: []string{"adm"}}),
		"Baseline list of an Admin":  withPod(policy.PodChains{ID: "c", Baseline: [2][]string{{"adm"}}}),
		"policy gone, pod stays":     {Known: base.Known, GonePolicies: []string{"np"}},
		"Admin gone, pod stays":      {Known: base.Known, GonePolicies: []string{"adm"}},
		"policy changes tier":        {Known: base.Known, Policies: []policy.PolicyChain{npAdmin}},
		"pod ID twice":               {Known: base.Known, Pods: []policy.PodChains{a, a}},
		"policy ID twice":            {Known: base.Known, Policies: []policy.PolicyChain{np, np}},
		"pod name too long":          withPod(policy.PodChains{ID: long, IngressIsolated: true}),
		"policy name too long":       {Known: base.Known, Policies: []policy.PolicyChain{{ID: long, Rules: []policy.Rule{{AnyPort: true, Peers: []policy.Range{{From: a.Addrs[0], To: a.Addrs[0]}}}}}}},
		"empty pod ID":               withPod(policy.PodChains{IngressIsolated: true}),
		"bad port":                   {Known: base.Known, Ports: []string{"a/b"}},
		"bad bridge port of a pod":   withPod(policy.PodChains{ID: "c", IngressIsolated: true, BridgePorts: []string{""}}),
		"bad bridge port of the set": {Known: base.Known, BridgePorts: []string{strings.Repeat("p", 20)}},
	} {
		s := newStore(buildOptions{})
		d0, err := s.deltaTo(base)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.apply(d0); err != nil {
			t.Fatal(err)
		}
		before := s.assemble()
		if _, err := s.apply(d); err == nil {
			t.Errorf("%s: applied", name)
			continue
		} else {
			t.Logf("%s: %v", name, err)
		}
		// (With takes an ID twice, build no bridge port)
		if _, err := build(base.With(d), buildOptions{}); err == nil && !strings.Contains(name, "bridge") && !strings.Contains(name, "twice") {
			t.Errorf("%s: build takes it", name)
		}
		if diff := defDiff(s.assemble(), before); diff != "" {
			t.Errorf("%s: the store changed: %s", name, diff)
		}
		checkStore(t, 0, s, base)
	}
	// the pods that refer to a policy going with it: fine
	s := newStore(buildOptions{})
	d0, _ := s.deltaTo(base)
	if _, err := s.apply(d0); err != nil {
		t.Fatal(err)
	}
	d := policy.Delta{Known: base.Known, GonePolicies: []string{"np", "adm"}, GonePods: []string{"a"}, Pods: []policy.PodChains{{ID: "b", Addrs: b.Addrs}}}
	if _, err := s.apply(d); err != nil {
		t.Fatal(err)
	}
	checkStore(t, 1, s, base.With(d))
}

// TestStoreSharedAddress: two pods with one address: the lower ID's
// chain has it in the verdict map, whichever came first, and the other
// takes it when it goes; the same for a port.
func TestStoreSharedAddress(t *testing.T) {
	x := netip.MustParseAddr("10.64.1.2")
	pod := func(id string) policy.PodChains {
		// bridged too: judged by its address (byAddress)
		return policy.PodChains{ID: id, Addrs: []netip.Addr{x}, Ports: []string{"pn0"}, BridgePorts: []string{"pnbr0"}, IngressIsolated: true}
	}
	s := newStore(buildOptions{})
	var rs policy.Ruleset
	for _, d := range []policy.Delta{
		{Pods: []policy.PodChains{pod("b")}},
		{Pods: []policy.PodChains{pod("a")}},
		{Pods: []policy.PodChains{pod("c")}},
		{GonePods: []string{"a"}},
		{Pods: []policy.PodChains{pod("a")}, GonePods: []string{"b"}},
	} {
		ch, err := s.apply(d)
		if err != nil {
			t.Fatal(err)
		}
		rs = rs.With(d)
		checkStore(t, 0, s, rs)
		_ = ch
	}
	owner := func(name string) string {
		for _, set := range s.assemble().sets {
			if set.name == name && len(set.elems) == 1 {
				return set.elems[0].VerdictData.Chain
			}
		}
		return ""
	}
	if o, p := owner("ingress4"), owner(mapIngressPorts); o != "pod-a-in" || p != "pod-a-in" {
		t.Errorf("ingress4 jumps to %q, ingress-ports to %q; want pod-a-in", o, p)
	}
}

// TestStoreRoutedByPort: a pod whose host veths are all routed is judged
// by its port: its addresses are judged and in the hairpin set with its
// port, not in the verdict maps by address, so that its addresses coming
// add no verdict; a bridged pod is judged by its addresses.
func TestStoreRoutedByPort(t *testing.T) {
	x, y := netip.MustParseAddr("10.64.1.2"), netip.MustParseAddr("fd64::2")
	s := newStore(buildOptions{})
	elems := func(name string) []nftables.SetElement {
		for _, set := range s.assemble().sets {
			if set.name == name {
				return set.elems
			}
		}
		t.Fatalf("no set %s", name)
		return nil
	}
	apply := func(d policy.Delta, rs *policy.Ruleset) change {
		t.Helper()
		ch, err := s.apply(d)
		if err != nil {
			t.Fatal(err)
		}
		*rs = rs.With(d)
		checkStore(t, 0, s, *rs)
		return *ch
	}
	var rs policy.Ruleset
	routed := policy.PodChains{ID: "a", Ports: []string{"pna"}, IngressIsolated: true, EgressIsolated: true}
	apply(policy.Delta{Pods: []policy.PodChains{routed}}, &rs) // arriving: no address yet
	if len(elems(mapIngressPorts)) != 1 || len(elems("hairpin4")) != 0 {
		t.Fatalf("arriving pod: ingress-ports %v, hairpin4 %v", elems(mapIngressPorts), elems("hairpin4"))
	}
	routed.Addrs = []netip.Addr{x, y}
	ch := apply(policy.Delta{Pods: []policy.PodChains{routed}}, &rs)
	for _, m := range []string{"ingress4", "egress4", "ingress6", "egress6"} {
		if e := elems(m); len(e) != 0 {
			t.Errorf("%s holds %v for a pod judged by its port", m, e)
		}
	}
	if e := elems("hairpin4"); len(e) != 1 || !bytes.Equal(e[0].Key, hairpinKey("pna", x)) {
		t.Errorf("hairpin4 %v, want pna . %s", e, x)
	}
	if e := elems("hairpin6"); len(e) != 1 || !bytes.Equal(e[0].Key, hairpinKey("pna", y)) {
		t.Errorf("hairpin6 %v, want pna . %s", e, y)
	}
	if e := elems("judged4"); len(e) != 1 {
		t.Errorf("judged4 %v, want %s", e, x)
	}
	for _, set := range ch.def.sets {
		if set.kind.isMap() && len(set.elems) > 0 {
			t.Errorf("the addresses' change adds %d elements to verdict map %s", len(set.elems), set.name)
		}
	}
	sigs := map[string]string{}
	for _, c := range ch.old.chains {
		sigs[c.chain.Name] = c.sig
	}
	for _, c := range ch.def.chains {
		if sig, ok := sigs[c.chain.Name]; !ok || sig != c.sig {
			t.Errorf("the addresses' change writes chain %s", c.chain.Name)
		}
	}
	bridged := policy.PodChains{ID: "b", Addrs: []netip.Addr{netip.MustParseAddr("10.64.1.3")}, BridgePorts: []string{"pnb"}, IngressIsolated: true}
	apply(policy.Delta{Pods: []policy.PodChains{bridged}}, &rs)
	if e := elems("ingress4"); len(e) != 1 || e[0].VerdictData.Chain != "pod-b-in" {
		t.Errorf("ingress4 %v, want 10.64.1.3 : jump pod-b-in (bridged)", e)
	}
	apply(policy.Delta{GonePods: []string{"a", "b"}}, &rs)
	for _, m := range []string{"hairpin4", "hairpin6", "judged4", "ingress4", mapIngressPorts} {
		if e := elems(m); len(e) != 0 {
			t.Errorf("pods gone: %s holds %v", m, e)
		}
	}
}
