package nft

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

func addr4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }

// TestBuildTrustsRanges: the writer takes a rule's ranges as the policy
// model hands them (canonical by contract: routed/policy's
// TestCompiledRangesCanonical), one element each, without normalising
// them again: two touching peer ranges stay two, two port elements stay
// two. An interval reaching the top of the address space is open.
func TestBuildTrustsRanges(t *testing.T) {
	top := netip.MustParseAddr("255.255.255.255")
	v4 := addr4(7)
	peers := []policy.Range{{From: addr4(1), To: addr4(4)}, {From: addr4(5), To: addr4(9)}, {From: netip.MustParseAddr("11.0.0.0"), To: top}}
	ports := []policy.PortRange{
		{Addrs: policy.Range{From: v4, To: v4}, Proto: policy.ProtoTCP, PortFrom: 80, PortTo: 80},
		{Addrs: policy.Range{From: v4, To: v4}, Proto: policy.ProtoTCP, PortFrom: 81, PortTo: 81},
	}
	rs := policy.Ruleset{
		Known:    []netip.Addr{v4},
		Pods:     []policy.PodChains{{ID: "p", Addrs: []netip.Addr{v4}, IngressIsolated: true, Ingress: []string{"a"}}},
		Policies: []policy.PolicyChain{{ID: "a", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: peers, Ports: ports}}}},
	}
	def, err := build(rs, buildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, s := range def.sets {
		n[s.name] = len(s.elems)
	}
	// 1-4 and 5-9: a start and an end each; 11.0.0.0-top: open
	if n["pol-a-r0-peers4"] != 5 || n["pol-a-r0-ports4"] != 2 {
		t.Errorf("peers4 %d elements (want 5), ports4 %d (want 2): the writer normalised", n["pol-a-r0-peers4"], n["pol-a-r0-ports4"])
	}
}

// TestEmptyFamilyNoRule: a rule gets a rule and sets only for the
// families in which its peers and ports sets would hold something; an
// IPv4-only rule writes no IPv6 rule or set, and a rule whose ports are
// of one family and peers of the other writes none at all.
func TestEmptyFamilyNoRule(t *testing.T) {
	v4, v6 := addr4(7), netip.MustParseAddr("fd00::7")
	anyV6 := policy.Range{From: netip.IPv6Unspecified(), To: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	tcp80 := func(a policy.Range) policy.PortRange {
		return policy.PortRange{Addrs: a, Proto: policy.ProtoTCP, PortFrom: 80, PortTo: 80}
	}
	rs := policy.Ruleset{
		Known: []netip.Addr{v4},
		Pods:  []policy.PodChains{{ID: "p", Addrs: []netip.Addr{v4}, IngressIsolated: true, Ingress: []string{"a", "b", "c", "d"}}},
		Policies: []policy.PolicyChain{
			// peers and ports IPv4 only: one rule, two sets
			{ID: "a", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: addr4(1), To: addr4(9)}}, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4})}}}},
			// IPv4 ports, IPv6 peers: no family can match
			{ID: "b", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: v6, To: v6}}, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4})}}}},
			// any peer, ports of both families: two rules, two sets
			{ID: "c", Direction: policy.Ingress, Rules: []policy.Rule{{AnyPeer: true, Ports: []policy.PortRange{tcp80(policy.Range{From: v4, To: v4}), tcp80(anyV6)}}}},
			// peers of both families, any port: two rules
			{ID: "d", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: []policy.Range{{From: addr4(1), To: addr4(1)}, {From: v6, To: v6}}, AnyPort: true}}},
		},
	}
	def, err := build(rs, buildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]int{}
	for _, c := range def.chains {
		rules[c.chain.Name] = len(c.rules)
	}
	sets := map[string]bool{}
	for _, s := range def.sets {
		sets[s.name] = true
	}
	for chain, want := range map[string]int{"pol-a": 1, "pol-b": 0, "pol-c": 2, "pol-d": 2} {
		if rules[chain] != want {
			t.Errorf("chain %s: %d rules, want %d", chain, rules[chain], want)
		}
	}
	for name, want := range map[string]bool{
		"pol-a-r0-peers4": true, "pol-a-r0-ports4": true, "pol-a-r0-peers6": false, "pol-a-r0-ports6": false,
		"pol-b-r0-peers4": false, "pol-b-r0-peers6": false, "pol-b-r0-ports4": false, "pol-b-r0-ports6": false,
		"pol-c-r0-ports4": true, "pol-c-r0-ports6": true,
		"pol-d-r0-peers4": true, "pol-d-r0-peers6": true,
	} {
		if sets[name] != want {
			t.Errorf("set %s written: %v, want %v", name, sets[name], want)
		}
	}
}

// TestBuildRefusesCrossedTiers: a pod's NetworkPolicy jumps name only
// NetworkPolicy chains, its Admin and Baseline lists only chains of that
// tier: a ClusterNetworkPolicy is never written as a chain a pod jumps to,
// so a crossed reference would jump to nothing.
func TestBuildRefusesCrossedTiers(t *testing.T) {
	np := policy.PolicyChain{ID: "np", Direction: policy.Ingress, Rules: []policy.Rule{{AnyPeer: true, AnyPort: true}}}
	adm := policy.PolicyChain{ID: "adm", Direction: policy.Ingress, Tier: policy.TierAdmin, Rules: []policy.Rule{{Action: policy.ActionDeny, AnyPeer: true, AnyPort: true}}}
	pod := func(p policy.PodChains) policy.Ruleset {
		p.ID, p.Addrs = "p", []netip.Addr{netip.MustParseAddr("10.64.1.2")}
		return policy.Ruleset{Pods: []policy.PodChains{p}, Policies: []policy.PolicyChain{np, adm}}
	}
	for name, c := range map[string]struct {
		rs policy.Ruleset
		ok bool
	}{
		"NetworkPolicy jump":            {pod(policy.PodChains{IngressIsolated: true, Ingress: []string{"np"}}), true},
		"Admin list":                    {pod(policy.PodChains{Admin: [2][]string{{"adm"}}}), true},
		"NetworkPolicy jump to Admin":   {pod(policy.PodChains{IngressIsolated: true, Ingress: []string{"adm"}}), false},
		"Admin list of a NetworkPolicy": {pod(policy.PodChains{Admin: [2][]string{{"np"}}}), false},
		"Baseline list of an Admin":     {pod(policy.PodChains{Baseline: [2][]string{{"adm"}}}), false},
	} {
		_, err := build(c.rs, buildOptions{})
		if (err == nil) != c.ok {
			t.Errorf("%s: build error %v, want ok %v", name, err, c.ok)
		}
	}
}

// TestTrimCommonKeepsTheChanges: the changes between two lists of
// distinct elements are those between what is left of them once their
// common start and end are cut (tableDiff compares only that).
func TestTrimCommonKeepsTheChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pool := make([]nftables.SetElement, 12)
	for i := range pool {
		pool[i] = nftables.SetElement{Key: []byte{10, 0, 0, byte(i / 2)}, IntervalEnd: i%2 == 1}
	}
	keys := func(els []nftables.SetElement) []string {
		out := []string{}
		for _, e := range els {
			out = append(out, nftutil.ElementKey(e))
		}
		slices.Sort(out)
		return out
	}
	trimmed := 0
	for round := range 5000 {
		a := slices.Clone(pool[:r.IntN(len(pool)+1)])
		r.Shuffle(len(a), func(i, j int) { a[i], a[j] = a[j], a[i] })
		b := slices.Clone(a) // b: a with some elements out, some in
		for range r.IntN(3) {
			if len(b) > 0 {
				k := r.IntN(len(b))
				b = slices.Delete(b, k, k+1)
			}
		}
		for _, e := range pool {
			if r.IntN(6) == 0 && !slices.ContainsFunc(b, func(x nftables.SetElement) bool {
				return sameElements([]nftables.SetElement{x}, []nftables.SetElement{e})
			}) {
				b = slices.Insert(b, r.IntN(len(b)+1), e)
			}
		}
		ta, tb := trimCommon(a, b)
		if len(ta) < len(a) {
			trimmed++
		}
		wd, wa := nftutil.Changes(a, b)
		gd, ga := nftutil.Changes(ta, tb)
		if !slices.Equal(keys(wd), keys(gd)) || !slices.Equal(keys(wa), keys(ga)) {
			t.Fatalf("round %d: %v -> %v: trimmed deletes %v adds %v, want %v %v", round, keys(a), keys(b), keys(gd), keys(ga), keys(wd), keys(wa))
		}
	}
	if trimmed < 1000 {
		t.Errorf("only %d rounds had a common start or end to cut", trimmed)
	}
}
