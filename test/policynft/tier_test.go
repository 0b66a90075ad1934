package policynft

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
)

// tierRuleset: ClusterNetworkPolicy tiers beside NetworkPolicy on one node.
//
//   - a, ingress: Admin A1 (priority 10: Deny from c TCP 8080, Pass from b
//     TCP 8081), Admin A2 (priority 20: Deny from b TCP 8081, which A1's
//     Pass skips; Accept from b TCP 8082-8090); a NetworkPolicy isolates
//     a, allowing b TCP 8081 only.
//   - b, ingress: Admin A3 (Accept from c TCP 9090); Baseline B1 (Pass
//     from c TCP 7070, Deny from c anything); no NetworkPolicy.
//   - b, egress: Baseline B3 (Deny to the node TCP 9001).
//   - c, egress: Admin A4 (Deny to the outside host, anything); a
//     NetworkPolicy isolates c, allowing the outside host, a, b, the
//     node TCP 9000; Baseline B2 (Deny everything), which the
//     NetworkPolicy's isolation keeps from being judged.
func tierRuleset(e *env) policy.Ruleset {
	a, b, c := e.pods["a"], e.pods["b"], e.pods["c"]
	tcp := func(from, to uint16) []policy.PortRange { return port(policy.ProtoTCP, from, to) }
	rs := policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6, c.v4, c.v6},
		Pods: []policy.PodChains{
			{ID: "a", Namespace: "default", Name: "a", Addrs: []netip.Addr{a.v4, a.v6},
				IngressIsolated: true, Ingress: []string{"a-in"},
				Admin: [2][]string{{"A1", "A2"}}},
			{ID: "b", Namespace: "default", Name: "b", Addrs: []netip.Addr{b.v4, b.v6},
				Admin: [2][]string{{"A3"}}, Baseline: [2][]string{{"B1"}, {"B3"}}},
			{ID: "c", Namespace: "default", Name: "c", Addrs: []netip.Addr{c.v4, c.v6},
				EgressIsolated: true, Egress: []string{"c-eg"},
				Admin: [2][]string{nil, {"A4"}}, Baseline: [2][]string{nil, {"B2"}}},
		},
		Policies: []policy.PolicyChain{
			{ID: "a-in", Namespace: "default", Name: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{
				{Peers: both(b), Ports: tcp(8081, 8081)},
			}},
			{ID: "c-eg", Namespace: "default", Name: "c-eg", Direction: policy.Egress, Rules: []policy.Rule{
				{Peers: extRanges, AnyPort: true},
				{Peers: join(both(a), both(b)), AnyPort: true},
				{Peers: nodeRanges, Ports: tcp(9000, 9000)},
			}},
			{ID: "A1", Name: "a1", Direction: policy.Ingress, Tier: policy.TierAdmin, Priority: 10, Rules: []policy.Rule{
				{Action: policy.ActionDeny, Peers: both(c), Ports: tcp(8080, 8080)},
				{Action: policy.ActionPass, Peers: both(b), Ports: tcp(8081, 8081)},
			}},
			{ID: "A2", Name: "a2", Direction: policy.Ingress, Tier: policy.TierAdmin, Priority: 20, Rules: []policy.Rule{
				{Action: policy.ActionDeny, Peers: both(b), Ports: tcp(8081, 8081)},
				{Action: policy.ActionAccept, Peers: both(b), Ports: tcp(8082, 8090)},
			}},
			{ID: "A3", Name: "a3", Direction: policy.Ingress, Tier: policy.TierAdmin, Rules: []policy.Rule{
				{Action: policy.ActionAccept, Peers: both(c), Ports: tcp(9090, 9090)},
			}},
			{ID: "A4", Name: "a4", Direction: policy.Egress, Tier: policy.TierAdmin, Rules: []policy.Rule{
				{Action: policy.ActionDeny, Peers: extRanges, AnyPort: true},
			}},
			{ID: "B1", Name: "b1", Direction: policy.Ingress, Tier: policy.TierBaseline, Rules: []policy.Rule{
				{Action: policy.ActionPass, Peers: both(c), Ports: tcp(7070, 7070)},
				{Action: policy.ActionDeny, Peers: both(c), AnyPort: true},
			}},
			{ID: "B2", Name: "b2", Direction: policy.Egress, Tier: policy.TierBaseline, Rules: []policy.Rule{
				{Action: policy.ActionDeny, AnyPeer: true, AnyPort: true},
			}},
			{ID: "B3", Name: "b3", Direction: policy.Egress, Tier: policy.TierBaseline, Rules: []policy.Rule{
				{Action: policy.ActionDeny, Peers: nodeRanges, Ports: tcp(9001, 9001)},
			}},
		},
	}
	for _, p := range rs.Policies {
		for i, r := range p.Rules {
			p.Rules[i] = r.Canonical() // as Compile hands them
		}
	}
	return rs
}

// TestTierTraffic writes a Ruleset with Admin and Baseline tiers beside
// NetworkPolicies and sends real TCP and ICMP (IPv4 and IPv6): each
// expectation is written out here, and the product's Matcher must agree
// with it before the kernel is asked. The Admin tier decides before
// NetworkPolicy (Accept past a NetworkPolicy's isolation, Deny past its
// allow), Pass leaves the whole Admin tier (a later Admin Deny is not
// judged), the Baseline tier judges only pods no NetworkPolicy isolates
// (its Pass falls to the default allow), and the Deny rules count.
func TestTierTraffic(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	a, b, c := e.pods["a"], e.pods["b"], e.pods["c"]
	for _, port := range []int{7070, 8080, 8081, 8085, 8091, 9090} {
		for _, p := range e.pods {
			server(t, p.ns, port)
		}
	}
	server(t, e.node, 9000)
	server(t, e.node, 9001)
	rs := tierRuleset(e)
	m := policy.NewMatcher(rs)
	var checks []check
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
		nodeAddr, extAddr := nodeAddr4, extAddr4
		if v6 {
			nodeAddr, extAddr = nodeAddr6, extAddr6
		}
		add := func(what string, from *pod, network string, dst netip.Addr, port int, want bool) {
			proto := map[string]uint8{"tcp": policy.ProtoTCP, "icmp": 1}[network]
			if got := m.Allows(from.addr(v6), dst, proto, uint16(port)); got != want {
				t.Errorf("%s %s: the Matcher says %v, the test %v", fam, what, got, want)
			}
			var fromNS ns.NetNS = from.ns
			try := func() error { return flow(fromNS, network, dst, port) }
			if network == "icmp" {
				try = func() error { return ping(fromNS, dst) }
			}
			checks = append(checks, check{what: fmt.Sprintf("%s %s %s:%d", fam, what, network, port), allow: want, try: try})
		}
		add("c->a: Admin Deny", c, "tcp", a.addr(v6), 8080, false)
		add("b->a: Admin Pass, then the NetworkPolicy allows (A2's Deny skipped)", b, "tcp", a.addr(v6), 8081, true)
		add("b->a: Admin Accept past the NetworkPolicy's isolation", b, "tcp", a.addr(v6), 8085, true)
		add("b->a: no Admin rule, the NetworkPolicy isolates", b, "tcp", a.addr(v6), 8091, false)
		add("b->a: ICMP, the NetworkPolicy isolates", b, "icmp", a.addr(v6), 0, false)
		add("c->b: Admin Accept past a Baseline Deny", c, "tcp", b.addr(v6), 9090, true)
		add("c->b: Baseline Pass, default allow", c, "tcp", b.addr(v6), 7070, true)
		add("c->b: Baseline Deny", c, "tcp", b.addr(v6), 8080, false)
		add("a->b: no rule matches, allowed", a, "tcp", b.addr(v6), 8080, true)
		add("b->node: Baseline Deny (egress, input hook)", b, "tcp", nodeAddr, 9001, false)
		add("b->node: allowed", b, "tcp", nodeAddr, 9000, true)
		add("c->ext: Admin Deny past the NetworkPolicy's allow", c, "icmp", extAddr, 0, false)
		add("c->node: NetworkPolicy allows, Baseline not judged", c, "tcp", nodeAddr, 9000, true)
		add("c->node: NetworkPolicy isolates", c, "tcp", nodeAddr, 9001, false)
	}
	if t.Failed() {
		t.FailNow()
	}
	all := make([]check, len(checks))
	for i, ch := range checks {
		all[i] = check{what: ch.what, allow: true, try: ch.try}
	}
	runChecks(t, all)
	if t.Failed() {
		t.Fatal("the network does not work without the policy table")
	}
	if st := e.apply(rs); !st.Full {
		t.Errorf("first Apply: %+v, want a full write", st)
	}
	runChecks(t, checks)

	var drops map[nft.CounterKey]uint64
	e.do(func() error {
		var err error
		drops, _, err = e.w.DropCounters()
		return err
	})
	for _, k := range []nft.CounterKey{
		{PolicyID: "A1", Rule: 0, Direction: policy.Ingress}, {PolicyID: "B1", Rule: 1, Direction: policy.Ingress},
		{PolicyID: "A4", Rule: 0, Direction: policy.Egress}, {PolicyID: "B3", Rule: 0, Direction: policy.Egress},
	} {
		if drops[k] == 0 {
			t.Errorf("drop counter of %s rule %d %s is 0: %v", k.PolicyID, k.Rule, k.Direction, drops)
		}
	}
	if n, ok := drops[nft.CounterKey{PolicyID: "B2", Direction: policy.Egress}]; ok && n != 0 {
		t.Errorf("B2 (never judged: c is isolated by a NetworkPolicy) counted %d drops", n)
	}
	t.Logf("drops %v", drops)

	// The tier chains are repaired whole like the rest: a tier chain
	// flushed (its rules gone: Pass, Deny and Accept with them) and then
	// the table deleted are each put back by the resync, and the verdicts
	// hold again.
	for _, breakIt := range [][]string{
		{"flush", "chain", "inet", nft.TableName, nft.TierChain(policy.TierAdmin, policy.Ingress, []string{"A1", "A2"})},
		{"delete", "table", "inet", nft.TableName},
	} {
		e.nft(breakIt...)
		e.do(func() error {
			repaired, err := e.w.Resync(e.withPorts(rs))
			if err == nil && !repaired {
				err = fmt.Errorf("nft %v: the resync repaired nothing", breakIt)
			}
			return err
		})
		runChecks(t, checks)
	}
}
