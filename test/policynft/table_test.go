package policynft

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// tableContent is table inet podnet-policy as the kernel holds it: its
// structure (nftutil.Structure, sorted: creation order differs between a
// full and an incremental write) and every set's elements (sorted).
type tableContent struct {
	structure []string
	elements  map[string][]string
}

func readTable(t testing.TB, netns ns.NetNS) tableContent {
	t.Helper()
	var out tableContent
	nettest.Do(t, netns, func() error {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		out.structure, err = nftutil.Structure(conn, unix.NFPROTO_INET, nft.TableName)
		if err != nil {
			return err
		}
		slices.Sort(out.structure)
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName}
		sets, err := c.GetSets(tbl)
		if err != nil {
			return err
		}
		out.elements = map[string][]string{}
		for _, s := range sets {
			elems, err := c.GetSetElements(s)
			if err != nil {
				return err
			}
			keys := []string{}
			for _, e := range elems {
				k := hex.EncodeToString(e.Key)
				if e.IntervalEnd {
					k += "(end)"
				}
				k += "-" + hex.EncodeToString(e.KeyEnd) + ":" + hex.EncodeToString(e.Val)
				keys = append(keys, k)
			}
			slices.Sort(keys)
			out.elements[s.Name] = keys
		}
		return nil
	})
	return out
}

func (a tableContent) diff(b tableContent) string {
	var out []string
	if d := nftutil.StructureDiff(a.structure, b.structure); d != "" {
		out = append(out, d)
	}
	for name, ea := range a.elements {
		if eb, ok := b.elements[name]; !ok || !slices.Equal(ea, eb) {
			out = append(out, fmt.Sprintf("set %s: %d vs %d elements", name, len(ea), len(eb)))
		}
	}
	for name := range b.elements {
		if _, ok := a.elements[name]; !ok {
			out = append(out, "set "+name+" only in the second")
		}
	}
	return strings.Join(out, "; ")
}

// gen makes random Rulesets of a small node: 10 pods, 6 NetworkPolicies
// and 4 ClusterNetworkPolicies.
type gen struct {
	r  *rand.Rand
	rs policy.Ruleset
	// tiers: policies 6-9 are ClusterNetworkPolicies (next)
	tiers bool
}

func (g *gen) addr(v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(g.r.IntN(4)), byte(g.r.IntN(256)), byte(g.r.IntN(256))})
	}
	return netip.AddrFrom4([4]byte{10, byte(g.r.IntN(4)), byte(g.r.IntN(256)), byte(g.r.IntN(256))})
}

func (g *gen) rangeOf(v6 bool) policy.Range {
	a, b := g.addr(v6), g.addr(v6)
	if b.Less(a) {
		a, b = b, a
	}
	if g.r.IntN(2) == 0 {
		b = a
	}
	return policy.Range{From: a, To: b}
}

func (g *gen) rule() policy.Rule {
	r := policy.Rule{AnyPeer: g.r.IntN(5) == 0, AnyPort: g.r.IntN(4) == 0}
	if !r.AnyPeer {
		for range g.r.IntN(6) {
			r.Peers = append(r.Peers, g.rangeOf(g.r.IntN(2) == 0))
		}
	}
	if !r.AnyPort {
		for range g.r.IntN(4) {
			proto := []uint8{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP}[g.r.IntN(3)]
			from := uint16(g.r.IntN(2000))
			to := from + uint16(g.r.IntN(3)*50)
			v6 := g.r.IntN(2) == 0
			addrs := allFamily(v6)
			if g.r.IntN(2) == 0 {
				addrs = g.rangeOf(v6) // a named port: the pods that have it
			}
			r.Ports = append(r.Ports, policy.PortRange{Addrs: addrs, Proto: proto, PortFrom: from, PortTo: to})
		}
	}
	return r.Canonical() // as Compile hands them: the writer trusts it
}

// policy i: a NetworkPolicy; with g.tiers, 6-9 are ClusterNetworkPolicies
// (Admin, then Baseline) with rules of every action.
func (g *gen) policy(i int) policy.PolicyChain {
	p := policy.PolicyChain{ID: fmt.Sprintf("p%d", i), Direction: policy.Ingress}
	if i%2 == 1 {
		p.Direction = policy.Egress
	}
	switch {
	case !g.tiers || i >= 10:
	case i >= 8:
		p.Tier = policy.TierBaseline
	case i >= 6:
		p.Tier = policy.TierAdmin
	}
	for range 1 + g.r.IntN(3) {
		r := g.rule()
		if p.Tier != policy.TierNetworkPolicy {
			r.Action = []policy.Action{policy.ActionAccept, policy.ActionDeny, policy.ActionPass}[g.r.IntN(3)]
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}

func (g *gen) pod(i int) policy.PodChains {
	p := policy.PodChains{ID: fmt.Sprintf("pod%d", i), Addrs: []netip.Addr{
		netip.AddrFrom4([4]byte{10, 64, 1, byte(i + 2)}), netip.MustParseAddr(fmt.Sprintf("fd64:1::%x", i+2))}}
	for _, pol := range g.rs.Policies {
		if g.r.IntN(3) != 0 {
			continue
		}
		if pol.Tier != policy.TierNetworkPolicy {
			d := policy.DirIndex(pol.Direction)
			if pol.Tier == policy.TierAdmin {
				p.Admin[d] = append(p.Admin[d], pol.ID)
			} else {
				p.Baseline[d] = append(p.Baseline[d], pol.ID)
			}
			continue
		}
		if pol.Direction == policy.Ingress {
			p.IngressIsolated, p.Ingress = true, append(p.Ingress, pol.ID)
		} else {
			p.EgressIsolated, p.Egress = true, append(p.Egress, pol.ID)
		}
	}
	if g.r.IntN(6) == 0 {
		p.IngressIsolated = true // deny all ingress
	}
	// a routed host veth, a bridge port, both or none
	switch g.r.IntN(4) {
	case 0:
		p.Ports = []string{fmt.Sprintf("pnr%d", i)}
	case 1:
		p.BridgePorts = []string{fmt.Sprintf("pnb%d", i)}
	case 2:
		p.Ports, p.BridgePorts = []string{fmt.Sprintf("pnr%d", i)}, []string{fmt.Sprintf("pnb%d", i)}
	}
	return p
}

// next changes a few things of the last Ruleset: a policy rewritten, a
// pod re-selected, added or gone, a peer added, a known address.
func (g *gen) next() policy.Ruleset {
	rs := &g.rs
	if len(rs.Policies) == 0 {
		g.tiers = true
		rs.LocalPodCIDRs = localCIDRs
		for i := range 10 {
			rs.Policies = append(rs.Policies, g.policy(i))
		}
		for i := range 10 {
			rs.Pods = append(rs.Pods, g.pod(i))
		}
	} else {
		for range 1 + g.r.IntN(3) {
			switch g.r.IntN(5) {
			case 0:
				i := g.r.IntN(len(rs.Policies))
				rs.Policies[i] = g.policy(i)
			case 1:
				i := g.r.IntN(len(rs.Pods))
				n := 0
				fmt.Sscanf(rs.Pods[i].ID, "pod%d", &n)
				rs.Pods[i] = g.pod(n)
			case 2:
				i := g.r.IntN(len(rs.Pods))
				rs.Pods = slices.Delete(slices.Clone(rs.Pods), i, i+1)
			case 3:
				rs.Pods = append(slices.Clone(rs.Pods), g.pod(20+g.r.IntN(100)))
				slices.SortFunc(rs.Pods, func(a, b policy.PodChains) int { return strings.Compare(a.ID, b.ID) })
				rs.Pods = slices.CompactFunc(rs.Pods, func(a, b policy.PodChains) bool { return a.ID == b.ID })
			case 4:
				i := g.r.IntN(len(rs.Policies))
				p := rs.Policies[i]
				p.Rules = slices.Clone(p.Rules)
				j := g.r.IntN(len(p.Rules))
				r := p.Rules[j]
				r.Peers = append(slices.Clone(r.Peers), g.rangeOf(g.r.IntN(2) == 0))
				p.Rules[j] = r.Canonical()
				rs.Policies = slices.Clone(rs.Policies)
				rs.Policies[i] = p
			}
		}
		rs.Known = append(slices.Clone(rs.Known), netip.AddrFrom4([4]byte{10, 64, 1, byte(150 + g.r.IntN(100))}))
	}
	// the policies no pod jumps to are not in a Ruleset
	used := map[string]bool{}
	for _, p := range rs.Pods {
		for _, id := range slices.Concat(p.Ingress, p.Egress, p.Admin[0], p.Admin[1], p.Baseline[0], p.Baseline[1]) {
			used[id] = true
		}
	}
	rs.Ports, rs.BridgePorts = []string{"pnx0"}, []string{"pnx1"}
	for _, p := range rs.Pods {
		rs.Ports = append(rs.Ports, p.Ports...)
		rs.BridgePorts = append(rs.BridgePorts, p.BridgePorts...)
	}
	slices.Sort(rs.Ports)
	slices.Sort(rs.BridgePorts)
	rs.BridgeUnfiltered = g.r.IntN(5) == 0
	out := *rs
	out.Policies = nil
	for _, p := range rs.Policies {
		if used[p.ID] {
			out.Policies = append(out.Policies, p)
		}
	}
	return out
}

// TestIncrementalEqualsFull applies a sequence of random Rulesets, each a
// few changes from the last, incrementally in one netns, and each whole
// in another: the two tables are the same (structure and elements), the
// incremental writer's Verify finds nothing, and a change of elements
// only rewrites no chain.
func TestIncrementalEqualsFull(t *testing.T) {
	incNS, fullNS := nettest.NewNetNS(t), nettest.NewNetNS(t)
	inc, full := &nft.Writer{}, &nft.Writer{}
	t.Cleanup(inc.Close)
	t.Cleanup(full.Close)
	g := &gen{r: rand.New(rand.NewPCG(24, 1))}
	incremental := 0
	for step := range 25 {
		rs := g.next()
		var st nft.Stats
		nettest.Do(t, incNS, func() error {
			var err error
			st, err = inc.Apply(rs)
			return err
		})
		if !st.Full {
			incremental++
		}
		nettest.Do(t, fullNS, func() error { return full.ApplyFull(rs) })
		if d := readTable(t, incNS).diff(readTable(t, fullNS)); d != "" {
			t.Fatalf("step %d (%+v): incremental and full tables differ: %s", step, st, d)
		}
		nettest.Do(t, incNS, func() error {
			d, err := inc.Verify(rs)
			if err == nil && d != "" {
				err = fmt.Errorf("step %d: Verify after an incremental Apply: %s", step, d)
			}
			return err
		})
	}
	if incremental < 20 {
		t.Errorf("%d of 25 Applies were incremental", incremental)
	}
	// elements only: no chain written
	rs := g.rs
	rs.Known = append(slices.Clone(rs.Known), netip.MustParseAddr("10.64.1.99"))
	var st nft.Stats
	nettest.Do(t, incNS, func() error {
		var err error
		st, err = inc.Apply(rs)
		return err
	})
	if st.Full || st.Chains != 0 || st.Sets != 0 || st.Elements != 1 {
		t.Errorf("a known address added: %+v, want 1 element and nothing else", st)
	}
}

// TestRepair breaks the table in several ways behind the writer's back:
// Verify names each difference, Resync writes the table again (repaired)
// and then finds nothing.
func TestRepair(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := trafficRulesetAB(e)
	e.apply(rs)
	for _, tc := range []struct {
		name   string
		break_ []string
		want   string
	}{
		{"table deleted", []string{"delete table inet podnet-policy"}, "table missing"},
		{"policy chain flushed", []string{"flush chain inet podnet-policy pol-a-in"}, "rule 1 of chain pol-a-in missing"},
		{"rule added", []string{"add rule inet podnet-policy ingress-fwd accept"}, "added"},
		{"base chain's policy changed", []string{"add chain inet podnet-policy ingress-fwd { type filter hook forward priority 0; policy drop; }"}, "chain ingress-fwd changed"},
		{"element added", []string{"add element inet podnet-policy known4 { 10.64.1.77 }"}, "set known4: 1 element(s) not wanted"},
		{"map element deleted", []string{`delete element inet podnet-policy ingress-ports { "pna" }`}, "set ingress-ports: 1 element(s) missing"},
		{"map element changed", []string{`delete element inet podnet-policy ingress-ports { "pna" }`, `add element inet podnet-policy ingress-ports { "pna" : accept }`}, "1 element(s) not wanted (706e6100000000000000000000000000:1/)"},
		{"element added to a map by address", []string{"add element inet podnet-policy ingress6 { fd64:1::2 : accept }"}, "1 element(s) not wanted (fd640001000000000000000000000002:1/)"},
		{"hairpin element deleted", []string{`delete element inet podnet-policy hairpin4 { "pna" . 10.64.1.2 }`}, "set hairpin4: 1 element(s) missing"},
		{"peer deleted", []string{"delete element inet podnet-policy pol-a-in-r0-peers6 { fd64:1::3 }"}, "set pol-a-in-r0-peers6: "},
		{"counter deleted", []string{"flush chain inet podnet-policy pod-a-in", "delete counter inet podnet-policy pod-a-in"}, "object pod-a-in missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range tc.break_ {
				e.nft(strings.Fields(cmd)...)
			}
			e.do(func() error {
				d, err := e.w.Verify(e.withPorts(rs))
				if err != nil {
					return err
				}
				if !strings.Contains(d, tc.want) {
					t.Errorf("Verify = %q, want it to say %q", d, tc.want)
				}
				repaired, err := e.w.Resync(e.withPorts(rs))
				if err != nil {
					return err
				}
				if !repaired {
					t.Errorf("Resync did not repair")
				}
				if d, err := e.w.Verify(e.withPorts(rs)); err != nil || d != "" {
					t.Errorf("Verify after the repair: %q, %v", d, err)
				}
				if repaired, err := e.w.Resync(e.withPorts(rs)); err != nil || repaired {
					t.Errorf("second Resync: repaired %v, %v", repaired, err)
				}
				return nil
			})
		})
	}
	// a set deleted behind the writer's back: the next incremental
	// Apply fails in the kernel and writes the table whole instead
	e.nft("flush", "chain", "inet", nft.TableName, "pol-a-in")
	e.nft("delete", "set", "inet", nft.TableName, "pol-a-in-r0-peers4")
	// (the change adds a peer to that set)
	rs.Policies = slices.Clone(rs.Policies)
	rs.Policies[0].Rules = slices.Clone(rs.Policies[0].Rules)
	rs.Policies[0].Rules[0].Peers = append(slices.Clone(rs.Policies[0].Rules[0].Peers), one(netip.MustParseAddr("10.64.1.50")))
	if st := e.apply(rs); !st.Full {
		t.Errorf("Apply over a deleted set: %+v, want a full write", st)
	}
	e.do(func() error {
		if d, err := e.w.Verify(e.withPorts(rs)); err != nil || d != "" {
			t.Errorf("Verify after the full write: %q, %v", d, err)
		}
		return nil
	})
	// the repaired table filters
	a, b := e.pods["a"], e.pods["b"]
	server(t, a.ns, 8080)
	server(t, a.ns, 8081)
	runChecks(t, []check{
		{"b->a tcp:8080 after the repairs", true, func() error { return flow(b.ns, "tcp", a.v4, 8080) }},
		{"b->a tcp:8081 after the repairs", false, func() error { return flow(b.ns, "tcp", a.v4, 8081) }},
	})
}

// TestRepairAcrossWrites: edits made behind the writer's back survive
// the incremental writes that follow them (which read back only what
// they change) and the next resync still finds and repairs them: a chain
// added, a policy chain's rules flushed, a counter's chain rewritten by
// the writer itself meanwhile. A commit to another table changes nothing.
func TestRepairAcrossWrites(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := trafficRulesetAB(e)
	e.apply(rs)
	e.nft("add", "table", "inet", "someone-else")
	e.do(func() error {
		if repaired, err := e.w.Resync(e.withPorts(rs)); err != nil || repaired {
			t.Errorf("Resync after a commit to another table: repaired %v, %v", repaired, err)
		}
		return nil
	})
	e.nft("add", "chain", "inet", nft.TableName, "stray")
	e.nft("flush", "chain", "inet", nft.TableName, "pol-a-in")
	// an element-only change, then one that rewrites pod a's chains
	rs.Known = append(slices.Clone(rs.Known), netip.MustParseAddr("10.64.1.99"))
	if st := e.apply(rs); st.Full {
		t.Fatalf("element change after the edits: %+v, want incremental", st)
	}
	rs.Pods = slices.Clone(rs.Pods)
	rs.Pods[0].EgressIsolated = true
	if st := e.apply(rs); st.Full || st.Chains == 0 {
		t.Fatalf("pod a egress-isolated: %+v, want an incremental write of chains", st)
	}
	e.do(func() error {
		d, err := e.w.Verify(e.withPorts(rs))
		if err != nil {
			return err
		}
		for _, want := range []string{"chain stray added", "rule 1 of chain pol-a-in missing"} {
			if !strings.Contains(d, want) {
				t.Errorf("Verify = %q, want it to say %q", d, want)
			}
		}
		repaired, err := e.w.Resync(e.withPorts(rs))
		if err != nil || !repaired {
			t.Errorf("Resync: repaired %v, %v; want repaired", repaired, err)
		}
		if d, err := e.w.Verify(e.withPorts(rs)); err != nil || d != "" {
			t.Errorf("Verify after the repair: %q, %v", d, err)
		}
		return nil
	})
	if strings.Contains(e.nft("list", "table", "inet", nft.TableName), "chain stray") {
		t.Errorf("chain stray survived the repair")
	}
	a, b := e.pods["a"], e.pods["b"]
	server(t, a.ns, 8080)
	runChecks(t, []check{{"b->a tcp:8080 after the repair", true, func() error { return flow(b.ns, "tcp", a.v4, 8080) }}})
}

// TestResyncStaleWant: a resync running beside the write loop may be
// handed a Ruleset older than the last Apply; it checks and keeps what the
// last Apply wrote and never writes the older one back (that re-isolated
// pods in the bench until the next change).
func TestResyncStaleWant(t *testing.T) {
	e := newEnv(t, "a", "b")
	old := trafficRulesetAB(e)
	e.apply(old)
	open := old
	open.Pods, open.Policies = nil, nil
	e.apply(open)
	e.do(func() error {
		repaired, err := e.w.Resync(e.withPorts(old))
		if err != nil || repaired {
			t.Errorf("Resync(older Ruleset): repaired %v, %v; want nothing done", repaired, err)
		}
		if d, err := e.w.Verify(e.withPorts(open)); err != nil || d != "" {
			t.Errorf("Verify(last Apply's Ruleset) after a stale Resync: %q, %v", d, err)
		}
		// and a repair, when one is due, writes the last Apply's
		e.nft("delete", "table", "inet", nft.TableName)
		if repaired, err := e.w.Resync(e.withPorts(old)); err != nil || !repaired {
			t.Errorf("Resync after the table was deleted: repaired %v, %v", repaired, err)
		}
		if d, err := e.w.Verify(e.withPorts(open)); err != nil || d != "" {
			t.Errorf("Verify after the repair: %q, %v", d, err)
		}
		return nil
	})
	a, b := e.pods["a"], e.pods["b"]
	server(t, a.ns, 8081)
	runChecks(t, []check{{"b->a tcp:8081 (no policy)", true, func() error { return flow(b.ns, "tcp", a.v4, 8081) }}})
}

// TestCheck: nft.Check (what --explain-policy runs on a node) finds the
// table the Writer wrote the same as the Ruleset, names what differs from
// another Ruleset or after an edit, says when there is no table, and
// leaves the calling thread in its own network namespace (the table is
// still there to read afterwards).
func TestCheck(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	e.apply(rs)
	more := rs
	more.Known = append(slices.Clone(rs.Known), netip.MustParseAddr("10.64.1.99"))
	e.do(func() error {
		for _, tc := range []struct {
			rs   policy.Ruleset
			want string
		}{{rs, ""}, {more, "set known4: 1 element(s) missing (0a400163)"}} {
			d, err := nft.Check(tc.rs, false, 0)
			if err != nil {
				return err
			}
			if d != tc.want {
				t.Errorf("Check = %q, want %q", d, tc.want)
			}
		}
		if d, err := nft.Check(rs, true, 10); err != nil || !strings.Contains(d, "chain pod-a-in changed") {
			t.Errorf("Check with drop logging on (the table has none) = %q, %v; want pod-a-in's rules to differ", d, err)
		}
		return nil
	})
	e.nft("flush", "chain", "inet", nft.TableName, "pol-a-in")
	e.do(func() error {
		if d, err := nft.Check(rs, false, 0); err != nil || !strings.HasPrefix(d, "rule 1 of chain pol-a-in missing") {
			t.Errorf("Check after a flush = %q, %v", d, err)
		}
		// still in the node netns: the Writer reads the same table
		if d, err := e.w.Verify(e.withPorts(rs)); err != nil || !strings.HasPrefix(d, "rule 1 of chain pol-a-in missing") {
			t.Errorf("Verify after Check = %q, %v", d, err)
		}
		return nil
	})
	nettest.Do(t, nettest.NewNetNS(t), func() error {
		if d, err := nft.Check(rs, false, 0); err != nil || d != "table missing" {
			t.Errorf("Check without a table = %q, %v", d, err)
		}
		return nil
	})
}

// trafficRulesetAB: a isolated for ingress, b allowed to it on TCP 8080.
func trafficRulesetAB(e *env) policy.Ruleset {
	a, b := e.pods["a"], e.pods["b"]
	return policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6},
		Pods:          []policy.PodChains{{ID: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, Ingress: []string{"a-in"}}},
		Policies: []policy.PolicyChain{{ID: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{
			{Peers: both(b), Ports: port(policy.ProtoTCP, 8080, 8080)},
		}}},
	}
}

// TestSCTPRendered: this kernel has no SCTP module, so no SCTP traffic;
// the rule's port set holds sctp . port as nft shows it, next to TCP and
// UDP and a port range.
func TestSCTPRendered(t *testing.T) {
	node := nettest.NewNetNS(t)
	w := &nft.Writer{}
	t.Cleanup(w.Close)
	rs := policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Pods:          []policy.PodChains{{ID: "a", Addrs: []netip.Addr{netip.MustParseAddr("10.64.1.2")}, IngressIsolated: true, Ingress: []string{"p"}}},
		Policies: []policy.PolicyChain{{ID: "p", Direction: policy.Ingress, Rules: []policy.Rule{{
			AnyPeer: true,
			Ports:   join(port(policy.ProtoSCTP, 9000, 9000), port(policy.ProtoTCP, 8000, 8100), port(policy.ProtoUDP, 53, 53)),
		}}}},
	}
	nettest.Do(t, node, func() error { _, err := w.Apply(rs); return err })
	out, err := nettest.ExecIn(context.Background(), node, "nft", "list", "set", "inet", nft.TableName, "pol-p-r0-ports4")
	if err != nil {
		t.Fatalf("nft list set: %v\n%s", err, out)
	}
	for _, want := range []string{"0.0.0.0/0 . sctp . 9000", "0.0.0.0/0 . tcp . 8000-8100", "0.0.0.0/0 . udp . 53"} {
		if !strings.Contains(out, want) {
			t.Errorf("ports4 lacks %q:\n%s", want, out)
		}
	}
	out, _ = nettest.ExecIn(context.Background(), node, "nft", "list", "chain", "inet", nft.TableName, "pol-p")
	if !strings.Contains(out, "ip daddr . meta l4proto . th dport @pol-p-r0-ports4 accept") {
		t.Errorf("chain pol-p:\n%s", out)
	}
}

// TestDelete: Delete removes the table, and the next Apply writes it
// whole again.
func TestDelete(t *testing.T) {
	node := nettest.NewNetNS(t)
	w := &nft.Writer{}
	t.Cleanup(w.Close)
	rs := policy.Ruleset{LocalPodCIDRs: localCIDRs}
	tables := func() string {
		out, err := nettest.ExecIn(context.Background(), node, "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	nettest.Do(t, node, func() error { _, err := w.Apply(rs); return err })
	if !strings.Contains(tables(), "inet "+nft.TableName) {
		t.Fatalf("no table after Apply: %s", tables())
	}
	nettest.Do(t, node, w.Delete)
	if strings.Contains(tables(), nft.TableName) {
		t.Fatalf("table after Delete: %s", tables())
	}
	nettest.Do(t, node, w.Delete) // none: fine
	nettest.Do(t, node, func() error {
		st, err := w.Apply(rs)
		if err == nil && !st.Full {
			err = fmt.Errorf("Apply after Delete: %+v, want a full write", st)
		}
		return err
	})
	if !strings.Contains(tables(), "inet "+nft.TableName) {
		t.Fatalf("no table after Apply: %s", tables())
	}
}

// largeRuleset: one policy selecting every one of pods local pods for
// ingress, allowing peers /32 ranges (and their IPv6 twins), on TCP 80.
func largeRuleset(pods, peers int) policy.Ruleset {
	rs := policy.Ruleset{LocalPodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd64::/64")}}
	var ranges []policy.Range
	for i := range peers / 2 {
		a := netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0})
		ranges = append(ranges, policy.Range{From: a, To: netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 127})})
		b := netip.AddrFrom16([16]byte{0xfd, 0x11, byte(i >> 8), byte(i)})
		ranges = append(ranges, policy.Range{From: b, To: netip.AddrFrom16([16]byte{0xfd, 0x11, byte(i >> 8), byte(i), 0, 0, 0, 0, 0xff})})
	}
	rs.Policies = []policy.PolicyChain{{ID: "big", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: ranges, Ports: port(policy.ProtoTCP, 80, 80)}}}}
	for i := range pods {
		a := netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)})
		b := netip.AddrFrom16([16]byte{0xfd, 0x64, 14: byte(i >> 8), 15: byte(i)})
		rs.Known = append(rs.Known, a, b)
		rs.Pods = append(rs.Pods, policy.PodChains{ID: fmt.Sprintf("p%d", i), Addrs: []netip.Addr{a, b}, IngressIsolated: true, Ingress: []string{"big"}})
	}
	return rs
}

// TestLargeRuleset: 10,000 peer ranges and 1,000 pods go in one
// transaction (the time is BenchmarkApplyLarge's), read back whole; one
// pod more is a small incremental change.
func TestLargeRuleset(t *testing.T) {
	node := nettest.NewNetNS(t)
	w := &nft.Writer{}
	t.Cleanup(w.Close)
	rs := largeRuleset(1000, 10000)
	start := time.Now()
	nettest.Do(t, node, func() error { _, err := w.Apply(rs); return err })
	t.Logf("full write of 1,000 pods and 10,000 peer ranges: %v", time.Since(start))
	content := readTable(t, node)
	if n := len(content.elements["pol-big-r0-peers4"]) + len(content.elements["pol-big-r0-peers6"]); n != 20000 {
		t.Errorf("peer sets hold %d elements, want 20,000 (10,000 ranges: start and end)", n)
	}
	if n := len(content.elements["ingress4"]) + len(content.elements["ingress6"]); n != 2000 {
		t.Errorf("ingress maps hold %d elements, want 2,000", n)
	}
	rs2 := largeRuleset(1001, 10000)
	start = time.Now()
	var st nft.Stats
	nettest.Do(t, node, func() error {
		var err error
		st, err = w.Apply(rs2)
		return err
	})
	t.Logf("one pod added: %+v in %v", st, time.Since(start))
	if st.Full || st.Chains != 1 || st.Elements != 6 {
		t.Errorf("one pod added: %+v, want 1 chain and 6 elements (2 known, 2 judged, 2 map)", st)
	}
	start = time.Now()
	nettest.Do(t, node, func() error {
		d, err := w.Verify(rs2)
		if err == nil && d != "" {
			err = fmt.Errorf("Verify: %s", d)
		}
		return err
	})
	t.Logf("Verify: %v", time.Since(start))
}

// TestDropLog: with LogDrops each pod chain logs its drops, rate-limited,
// with the pod and direction in the prefix, and the table still reads
// back equal to what was written; without it there is no log rule.
func TestDropLog(t *testing.T) {
	node := nettest.NewNetNS(t)
	rs := policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{netip.MustParseAddr("10.64.1.2")},
		Pods: []policy.PodChains{{ID: "a", Namespace: "shop", Name: "db-0", Addrs: []netip.Addr{netip.MustParseAddr("10.64.1.2")},
			IngressIsolated: true, EgressIsolated: true}},
	}
	chain := func(name string) string {
		out, err := nettest.ExecIn(context.Background(), node, "nft", "list", "chain", "inet", nft.TableName, name)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	plain := &nft.Writer{}
	t.Cleanup(plain.Close)
	nettest.Do(t, node, func() error { _, err := plain.Apply(rs); return err })
	if out := chain(nft.PodChain("a", policy.Ingress)); strings.Contains(out, "log") {
		t.Fatalf("a log rule without LogDrops:\n%s", out)
	}
	logging := &nft.Writer{LogDrops: true, LogRate: 20}
	t.Cleanup(logging.Close)
	nettest.Do(t, node, func() error { _, err := logging.Apply(rs); return err })
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		out := chain(nft.PodChain("a", d))
		want := fmt.Sprintf(`limit rate 20/second log prefix "podnet-policy drop shop/db-0 %s: "`, d)
		if !strings.Contains(out, want) {
			t.Errorf("%s chain lacks %q:\n%s", d, want, out)
		}
	}
	nettest.Do(t, node, func() error {
		diff, err := logging.Verify(rs)
		if err == nil && diff != "" {
			err = fmt.Errorf("Verify after a write with LogDrops: %s", diff)
		}
		return err
	})
}
