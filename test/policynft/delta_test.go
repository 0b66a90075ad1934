package policynft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// deltaOf is the Delta from prev to next, worked out here by ID (not by
// the writer's own comparison): next's own fields, its pods and policy
// chains that are new or differ, the IDs of prev's that next lacks. With
// noise, it also names an entry that did not change and an ID that is
// not there: both change nothing.
func deltaOf(prev, next policy.Ruleset, noise *rand.Rand) policy.Delta {
	d := policy.Delta{LocalPodCIDRs: next.LocalPodCIDRs, Known: next.Known, Ports: next.Ports,
		BridgePorts: next.BridgePorts, BridgeUnfiltered: next.BridgeUnfiltered}
	pods := map[string]policy.PodChains{}
	for _, p := range prev.Pods {
		pods[p.ID] = p
	}
	inNext := map[string]bool{}
	for _, p := range next.Pods {
		inNext[p.ID] = true
		if o, ok := pods[p.ID]; !ok || !o.Equal(p) || noise.IntN(20) == 0 {
			d.Pods = append(d.Pods, p)
		}
	}
	for _, p := range prev.Pods {
		if !inNext[p.ID] {
			d.GonePods = append(d.GonePods, p.ID)
		}
	}
	pols := map[string]policy.PolicyChain{}
	for _, p := range prev.Policies {
		pols[p.ID] = p
	}
	inNext = map[string]bool{}
	for _, p := range next.Policies {
		inNext[p.ID] = true
		if o, ok := pols[p.ID]; !ok || !o.Equal(p) || noise.IntN(20) == 0 {
			d.Policies = append(d.Policies, p)
		}
	}
	for _, p := range prev.Policies {
		if !inNext[p.ID] {
			d.GonePolicies = append(d.GonePolicies, p.ID)
		}
	}
	if noise.IntN(10) == 0 {
		d.GonePods = append(d.GonePods, "no-such-pod")
	}
	return d
}

// share gives the pod after pod i (by position) pod i's IPv4 address
// and routed port too: two pods with one address in the verdict maps
// (the lower ID keeps it) and one port in the port maps.
func share(g *gen) {
	rs := &g.rs
	if len(rs.Pods) < 2 {
		return
	}
	i := g.r.IntN(len(rs.Pods) - 1)
	rs.Pods = slices.Clone(rs.Pods)
	p := rs.Pods[i+1]
	p.Addrs = append(slices.Clone(p.Addrs), rs.Pods[i].Addrs[0])
	if len(rs.Pods[i].Ports) > 0 {
		p.Ports = append(slices.Clone(p.Ports), rs.Pods[i].Ports[0])
	}
	rs.Pods[i+1] = p
}

// TestDeltaRandom applies hundreds of random Deltas (pods coming,
// changing, going, re-selected; NetworkPolicies and Admin and Baseline
// ClusterNetworkPolicies coming, changing, going; Known, Ports, bridge
// ports changing; addresses and ports two pods share) with ApplyDelta,
// and now and then the whole Ruleset with Apply: after each, Verify finds
// the kernel's table (structure and elements) and the writer's own what
// build makes of the Ruleset the sequence describes (policy.Ruleset.With),
// and every few steps the table equals one written whole in another
// netns. Nearly every write is incremental.
func TestDeltaRandom(t *testing.T) {
	incNS, fullNS := nettest.NewNetNS(t), nettest.NewNetNS(t)
	w, full := &nft.Writer{}, &nft.Writer{}
	t.Cleanup(w.Close)
	t.Cleanup(full.Close)
	g := &gen{r: rand.New(rand.NewPCG(34, 1))}
	noise := rand.New(rand.NewPCG(34, 2))
	var r policy.Ruleset // what the sequence describes
	steps, incremental := 300, 0
	for step := range steps {
		for step > 0 && len(g.rs.Pods) < 5 { // gen drifts to no pods over hundreds of steps
			g.rs.Pods = append(slices.Clone(g.rs.Pods), g.pod(20+g.r.IntN(100)))
			slices.SortFunc(g.rs.Pods, func(a, b policy.PodChains) int { return strings.Compare(a.ID, b.ID) })
			g.rs.Pods = slices.CompactFunc(g.rs.Pods, func(a, b policy.PodChains) bool { return a.ID == b.ID })
		}
		next := g.next()
		if step > 0 && g.r.IntN(4) == 0 {
			share(g)
			next = g.next()
		}
		var st nft.Stats
		if step%40 == 39 {
			// (a copy: gen changes its pods in place)
			r = next
			r.Pods, r.Policies = slices.Clone(next.Pods), slices.Clone(next.Policies)
			nettest.Do(t, incNS, func() error {
				var err error
				st, err = w.Apply(r)
				return err
			})
		} else {
			d := deltaOf(r, next, noise)
			r = r.With(d)
			nettest.Do(t, incNS, func() error {
				var err error
				st, err = w.ApplyDelta(d)
				if err != nil {
					err = fmt.Errorf("step %d: ApplyDelta: %w", step, err)
				}
				return err
			})
		}
		if !st.Full {
			incremental++
		}
		nettest.Do(t, incNS, func() error {
			d, err := w.Verify(r)
			if err == nil && d != "" {
				err = fmt.Errorf("step %d (%+v): Verify: %s", step, st, d)
			}
			return err
		})
		if step%10 == 9 {
			nettest.Do(t, fullNS, func() error { return full.ApplyFull(r) })
			if d := readTable(t, incNS).diff(readTable(t, fullNS)); d != "" {
				t.Fatalf("step %d: the table differs from one written whole: %s", step, d)
			}
		}
	}
	if incremental < steps-2 {
		t.Errorf("%d of %d writes were incremental", incremental, steps)
	}
	t.Logf("%d pods, %d policy chains at the end", len(r.Pods), len(r.Policies))
}

// TestDeltaRefused: a Delta whose pod jumps to a policy chain the
// Ruleset lacks, one that takes away a policy chain a pod that stays
// jumps to, or one with a pod ID twice, is refused: nothing is written
// (the kernel's table is what it was) and the writer still holds the
// Ruleset before it (Verify), and the next Delta goes on from there.
func TestDeltaRefused(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	e.apply(rs)
	before := readTable(t, e.node)
	b := e.pods["b"]
	bad := []policy.Delta{
		{Pods: []policy.PodChains{{ID: "b", Addrs: []netip.Addr{b.v4, b.v6}, IngressIsolated: true, Ingress: []string{"missing"}}}},
		{GonePolicies: []string{"a-in"}},
		{Pods: []policy.PodChains{{ID: "b", IngressIsolated: true}, {ID: "b", EgressIsolated: true}}},
	}
	for _, d := range bad {
		d.LocalPodCIDRs, d.Known, d.Ports = rs.LocalPodCIDRs, rs.Known, rs.Ports
		e.do(func() error {
			st, err := e.w.ApplyDelta(d)
			if err == nil {
				return fmt.Errorf("ApplyDelta(%+v) = %+v, want an error", d, st)
			}
			t.Logf("refused: %v", err)
			if v, err := e.w.Verify(rs); err != nil || v != "" {
				return fmt.Errorf("Verify after a refused delta: %q, %v", v, err)
			}
			return nil
		})
		if diff := readTable(t, e.node).diff(before); diff != "" {
			t.Errorf("a refused delta changed the table: %s", diff)
		}
	}
	// the next delta goes on from rs: b isolated too
	d := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, Ports: rs.Ports,
		Pods: []policy.PodChains{{ID: "b", Addrs: []netip.Addr{b.v4, b.v6}, IngressIsolated: true}}}
	e.do(func() error {
		st, err := e.w.ApplyDelta(d)
		if err == nil && (st.Full || st.Chains != 1) {
			err = fmt.Errorf("ApplyDelta after refusals: %+v, want one chain incrementally", st)
		}
		if err == nil {
			if v, verr := e.w.Verify(rs.With(d)); verr != nil || v != "" {
				err = fmt.Errorf("Verify: %q, %v", v, verr)
			}
		}
		return err
	})
}

// TestDeltaRepairsDeletedSet: a set deleted behind the writer's back
// makes the next ApplyDelta that touches it fail in the kernel; the
// writer then writes the whole table from its store (Stats.Full), and
// the table is the Ruleset's again. A Delta that does not touch it
// writes incrementally and leaves it to the resync, which repairs it.
func TestDeltaRepairsDeletedSet(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	e.apply(rs)
	peer := func(rs policy.Ruleset, a netip.Addr) policy.Delta {
		p := rs.Policies[0]
		p.Rules = slices.Clone(p.Rules)
		p.Rules[0].Peers = append(slices.Clone(p.Rules[0].Peers), one(a))
		p.Rules[0] = p.Rules[0].Canonical()
		return policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, Ports: rs.Ports, Policies: []policy.PolicyChain{p}}
	}
	// untouched by the next delta: incremental, then the resync repairs
	e.nft("flush", "chain", "inet", nft.TableName, "pol-a-in")
	e.nft("delete", "set", "inet", nft.TableName, "pol-a-in-r0-ports4")
	known := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: append(slices.Clone(rs.Known), netip.MustParseAddr("10.64.1.99")), Ports: rs.Ports}
	e.do(func() error {
		st, err := e.w.ApplyDelta(known)
		if err == nil && st.Full {
			err = fmt.Errorf("a delta that does not touch the deleted set: %+v, want incremental", st)
		}
		return err
	})
	rs = rs.With(known)
	e.do(func() error {
		if v, err := e.w.Verify(rs); err != nil || !strings.Contains(v, "pol-a-in") {
			t.Errorf("Verify with the set deleted: %q, %v", v, err)
		}
		if repaired, err := e.w.Resync(rs); err != nil || !repaired {
			t.Errorf("Resync: repaired %v, %v", repaired, err)
		}
		return nil
	})
	// touched by the next delta: it fails in the kernel, written whole
	e.nft("flush", "chain", "inet", nft.TableName, "pol-a-in")
	e.nft("delete", "set", "inet", nft.TableName, "pol-a-in-r0-peers4")
	d := peer(rs, netip.MustParseAddr("10.64.1.50"))
	e.do(func() error {
		st, err := e.w.ApplyDelta(d)
		if err == nil && !st.Full {
			err = fmt.Errorf("ApplyDelta over a deleted set: %+v, want a whole write", st)
		}
		return err
	})
	rs = rs.With(d)
	e.do(func() error {
		if v, err := e.w.Verify(rs); err != nil || v != "" {
			t.Errorf("Verify after the whole write: %q, %v", v, err)
		}
		return nil
	})
	a, b := e.pods["a"], e.pods["b"]
	server(t, a.ns, 8080)
	server(t, a.ns, 8081)
	runChecks(t, []check{
		{"b->a tcp:8080 after the repairs", true, func() error { return flow(b.ns, "tcp", a.v4, 8080) }},
		{"b->a tcp:8081 after the repairs", false, func() error { return flow(b.ns, "tcp", a.v4, 8081) }},
	})
}

// TestDeltaSplitsAndMergesPeerRanges: a rule's peers set holds merged
// ranges (adjacent pods' addresses). Taking an address out of the middle
// of one, moving its ends and filling a gap are each written
// incrementally: the kernel refuses an interval's end or start added
// inside an interval it holds, so the Writer replaces the intervals a
// change touches whole (it fell back to a whole write, dozens of times a
// phase, on a remote node of the policy bench).
func TestDeltaSplitsAndMergesPeerRanges(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	e.apply(rs)
	base := slices.Clone(rs.Policies[0].Rules[0].Peers)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 64, 1, byte(i)}) }
	peers := func(rs policy.Ruleset, addrs ...int) policy.Delta {
		p := rs.Policies[0]
		p.Rules = slices.Clone(p.Rules)
		p.Rules[0].Peers = slices.Clone(base)
		for _, i := range addrs {
			p.Rules[0].Peers = append(p.Rules[0].Peers, one(addr(i)))
		}
		p.Rules[0] = p.Rules[0].Canonical()
		return policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, Ports: rs.Ports, Policies: []policy.PolicyChain{p}}
	}
	for step, addrs := range [][]int{
		{50, 51, 52, 53, 54},     // one merged range
		{50, 51, 53, 54},         // 52 out of its middle: split
		{50, 51, 52, 53, 54, 55}, // back, and the end moves
		{51, 52, 53, 54, 55},     // the start moves
		{51, 53, 55},             // two holes at once
		{51, 52, 53, 54, 55, 60}, // filled, and a range of its own
		{49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60}, // all one
		{49, 60}, // the middle gone
		{},
	} {
		d := peers(rs, addrs...)
		e.do(func() error {
			st, err := e.w.ApplyDelta(d)
			if err == nil && st.Full {
				err = fmt.Errorf("step %d (%v): written whole, want incremental", step, addrs)
			}
			return err
		})
		rs = rs.With(d)
		e.do(func() error {
			if v, err := e.w.Verify(rs); err != nil || v != "" {
				t.Errorf("step %d (%v): Verify: %q, %v", step, addrs, v, err)
			}
			return nil
		})
	}
}
