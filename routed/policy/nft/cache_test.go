package nft

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/podnet/podnet/routed/policy"
)

// TestBuildCache: over random sequences of Rulesets (policies changed,
// added, removed, mutated in place by the caller, options switched),
// build with the cache carried along makes exactly what build without it
// makes, and reuses the policy chains that did not change.
func TestBuildCache(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	addr := func() netip.Addr {
		if r.IntN(3) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(r.IntN(4)), 15: byte(r.IntN(256))})
		}
		return netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), 0, byte(r.IntN(256))})
	}
	rule := func() policy.Rule {
		ru := policy.Rule{AnyPeer: r.IntN(5) == 0, AnyPort: r.IntN(4) == 0}
		for range r.IntN(4) {
			a := addr()
			ru.Peers = append(ru.Peers, policy.Range{From: a, To: a})
		}
		for range r.IntN(3) {
			a := addr()
			ru.Ports = append(ru.Ports, policy.PortRange{Addrs: policy.Range{From: a, To: a}, Proto: policy.ProtoTCP, PortFrom: uint16(1 + r.IntN(100)), PortTo: 200})
		}
		return ru
	}
	pol := func(i int) policy.PolicyChain {
		p := policy.PolicyChain{ID: fmt.Sprintf("p%d", i), Direction: policy.Ingress}
		if r.IntN(2) == 0 {
			p.Direction = policy.Egress
		}
		for range 1 + r.IntN(3) {
			p.Rules = append(p.Rules, rule())
		}
		return p
	}
	var pols []policy.PolicyChain
	for i := range 30 {
		pols = append(pols, pol(i))
	}
	cache := &buildCache{}
	reused, total := 0, 0
	for step := range 300 {
		switch r.IntN(5) {
		case 0:
			pols[r.IntN(len(pols))] = pol(r.IntN(40))
		case 1: // the caller changes a rule in place
			p := &pols[r.IntN(len(pols))]
			p.Rules[0] = rule()
		case 2: // or a peer in place
			p := &pols[r.IntN(len(pols))]
			if len(p.Rules[0].Peers) > 0 {
				p.Rules[0].Peers[0] = policy.Range{From: addr(), To: addr()}
				if p.Rules[0].Peers[0].To.Less(p.Rules[0].Peers[0].From) || p.Rules[0].Peers[0].From.Is4() != p.Rules[0].Peers[0].To.Is4() {
					p.Rules[0].Peers[0].To = p.Rules[0].Peers[0].From
				}
			}
		case 3:
			p := &pols[r.IntN(len(pols))]
			p.Direction = map[policy.Direction]policy.Direction{policy.Ingress: policy.Egress, policy.Egress: policy.Ingress}[p.Direction]
		}
		// the Ruleset: each pod jumps to two policies; IDs unique
		seen := map[string]bool{}
		rs := policy.Ruleset{LocalPodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		for _, p := range pols {
			if !seen[p.ID] {
				seen[p.ID] = true
				rs.Policies = append(rs.Policies, p)
			}
		}
		for i := range 5 {
			a := netip.AddrFrom4([4]byte{10, 9, 0, byte(i + 1)})
			pc := policy.PodChains{ID: fmt.Sprintf("pod%d", i), Addrs: []netip.Addr{a}}
			for _, p := range rs.Policies[i*2 : i*2+2] {
				if p.Direction == policy.Ingress {
					pc.IngressIsolated, pc.Ingress = true, append(pc.Ingress, p.ID)
				} else {
					pc.EgressIsolated, pc.Egress = true, append(pc.Egress, p.ID)
				}
			}
			rs.Known = append(rs.Known, a)
			rs.Pods = append(rs.Pods, pc)
		}
		opt := buildOptions{logDrops: step%50 >= 40, logRate: 10}
		prev := maps.Clone(cache.pols)
		got, err := build(rs, opt, cache)
		if err != nil {
			t.Fatal(err)
		}
		want, err := build(rs, opt, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := defDiff(got, want); d != "" {
			t.Fatalf("step %d: with the cache: %s", step, d)
		}
		for i := range got.chains {
			if !reflect.DeepEqual(got.chains[i].rules, want.chains[i].rules) {
				t.Fatalf("step %d: chain %s's rules differ with the cache", step, got.chains[i].chain.Name)
			}
		}
		// a policy chain taken from the cache is the very one built before
		for _, c := range got.chains {
			id, isPolicy := strings.CutPrefix(c.chain.Name, "pol-")
			if !isPolicy || len(c.rules) == 0 {
				continue // a chain without rules cannot show where it came from
			}
			total++
			if b, ok := prev[id]; ok && len(b.chain.rules) > 0 && &c.rules[0] == &b.chain.rules[0] {
				reused++
			}
		}
	}
	// about one policy in 30 changes per step
	if reused < total*8/10 {
		t.Errorf("%d of %d policy chains taken from the cache", reused, total)
	}
}
