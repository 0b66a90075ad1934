package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/podnet/podnet/routed/policy"
)

// benchRuleset: pods isolated pods, policies policies (one rule each,
// alternating ingress and egress), each pod jumping to two.
func benchRuleset(pods, policies int) policy.Ruleset {
	rs := policy.Ruleset{LocalPodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/16")}}
	for i := range policies {
		d := policy.Ingress
		if i%2 == 1 {
			d = policy.Egress
		}
		a := netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})
		rs.Policies = append(rs.Policies, policy.PolicyChain{ID: fmt.Sprintf("p%d", i), Direction: d, Rules: []policy.Rule{
			{Peers: []policy.Range{{From: a, To: a}}, Ports: []policy.PortRange{{Addrs: policy.Range{From: netip.IPv4Unspecified(), To: netip.MustParseAddr("255.255.255.255")}, Proto: policy.ProtoTCP, PortFrom: 80, PortTo: 80}}},
		}})
	}
	for i := range pods {
		a := netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)})
		b := netip.AddrFrom16([16]byte{0xfd, 0x64, 14: byte(i >> 8), 15: byte(i)})
		k := (i * 2) % policies
		rs.Pods = append(rs.Pods, policy.PodChains{ID: fmt.Sprintf("pod%d", i), Addrs: []netip.Addr{a, b},
			IngressIsolated: true, Ingress: []string{rs.Policies[k].ID}, EgressIsolated: true, Egress: []string{rs.Policies[k+1].ID}})
		rs.Known = append(rs.Known, a, b)
	}
	slices.SortFunc(rs.Known, netip.Addr.Compare)
	return rs
}

// BenchmarkStoreOnePod: the writer's user-space share of a new pod at
// 1,000 policies and 500 pods, without the kernel: the delta applied to
// the store (one pod, Known) and the transaction queued, and the same
// pod taken away again (two deltas per loop).
func BenchmarkStoreOnePod(b *testing.B) {
	rs := benchRuleset(500, 1000)
	s := newStore(buildOptions{})
	d0, _ := s.deltaTo(rs)
	if _, err := s.apply(d0); err != nil {
		b.Fatal(err)
	}
	a := netip.MustParseAddr("10.65.0.1")
	p := policy.PodChains{ID: "new", Addrs: []netip.Addr{a}, IngressIsolated: true, Ingress: []string{"p0"}, EgressIsolated: true, Egress: []string{"p1"}}
	known := slices.Clone(rs.Known)
	j, _ := slices.BinarySearchFunc(known, a, netip.Addr.Compare)
	known = slices.Insert(known, j, a)
	add := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: known, Pods: []policy.PodChains{p}}
	del := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, GonePods: []string{"new"}}
	c := &nftables.Conn{} // queued only, never flushed
	for b.Loop() {
		for _, d := range []policy.Delta{add, del} {
			ch, err := s.apply(d)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := newTableDiff(ch.old, ch.def).queue(c); err != nil {
				b.Fatal(err)
			}
			c = &nftables.Conn{}
		}
	}
}

// BenchmarkStoreApplyWhole: Apply's user-space share for the same
// change: the whole Ruleset compared with the store (deltaTo).
func BenchmarkStoreApplyWhole(b *testing.B) {
	rs := benchRuleset(500, 1000)
	s := newStore(buildOptions{})
	d0, _ := s.deltaTo(rs)
	if _, err := s.apply(d0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		d, err := s.deltaTo(rs)
		if err != nil || !d.Empty() {
			b.Fatal(err, d.Empty())
		}
	}
}

// BenchmarkStorePatchedRules: the writer's user-space share of what a
// new pod's wait writes when the pod is a peer of many big rules: 50
// policy chains whose rule holds 1,000 scattered peers and 1,000 named
// port elements each get one address more (as the compile's patches make
// them), then lose it again (two deltas per loop).
func BenchmarkStorePatchedRules(b *testing.B) {
	const chains, peers = 50, 1000
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 64, byte(i >> 7), byte(i<<1) | 1}) }
	rule := func(extra bool) policy.Rule {
		var r policy.Rule
		for i := range peers {
			a := addr(i)
			if extra && i == peers/2 {
				e := a.Next()
				r.Peers = append(r.Peers, policy.Range{From: a, To: a}, policy.Range{From: e, To: e})
				r.Ports = append(r.Ports, policy.PortRange{Addrs: policy.Range{From: a, To: e}, Proto: policy.ProtoTCP, PortFrom: 8080, PortTo: 8080})
				continue
			}
			r.Peers = append(r.Peers, policy.Range{From: a, To: a})
			r.Ports = append(r.Ports, policy.PortRange{Addrs: policy.Range{From: a, To: a}, Proto: policy.ProtoTCP, PortFrom: 8080, PortTo: 8080})
		}
		return r
	}
	base, more := rule(false), rule(true)
	var rs policy.Ruleset
	var with, without []policy.PolicyChain
	for i := range chains {
		pc := policy.PolicyChain{ID: fmt.Sprintf("p%d", i), Direction: policy.Ingress, Rules: []policy.Rule{base}}
		rs.Policies = append(rs.Policies, pc)
		without = append(without, pc)
		pc.Rules = []policy.Rule{more}
		with = append(with, pc)
	}
	s := newStore(buildOptions{})
	d0, _ := s.deltaTo(rs)
	if _, err := s.apply(d0); err != nil {
		b.Fatal(err)
	}
	elements := 0
	for b.Loop() {
		for _, d := range []policy.Delta{{Policies: with}, {Policies: without}} {
			ch, err := s.apply(d)
			if err != nil {
				b.Fatal(err)
			}
			st, err := newTableDiff(ch.old, ch.def).queue(&nftables.Conn{})
			if err != nil {
				b.Fatal(err)
			}
			elements += st.Elements
		}
	}
	b.ReportMetric(float64(elements)/float64(b.N), "elements/op")
}
