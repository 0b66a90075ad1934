package policynft

import (
	"fmt"
	"net/netip"
	"strings"
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
	// the tier chains as written (none long enough to be cut), then cut
	// in segments of 2 and 3 rules (every tier chain of more is): the
	// verdicts, the counters and the repairs are the same
	for _, seg := range []int{0, 2, 3} {
		parent := e.t
		t.Run(fmt.Sprintf("segment=%d", seg), func(t *testing.T) {
			e.t = t
			if seg != 0 { // a new Writer and no table
				e.nft("delete", "table", "inet", nft.TableName)
				e.w = &nft.Writer{TierSegment: seg}
				parent.Cleanup(e.w.Close)
			}
			tierRun(t, e, rs, checks, seg)
		})
		e.t = parent
	}
}

// tierRun writes rs with a Writer that cuts tier chains in segments of
// seg rules (0: the default), runs the checks, reads the drop counters,
// breaks the table in ways that skip or lose tier rules and runs the
// checks again after each resync.
func tierRun(t *testing.T, e *env, rs policy.Ruleset, checks []check, seg int) {
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
	// flushed (its rules gone: Pass, Deny and Accept with them), a
	// segment chain flushed and a segment's guard set emptied (every
	// packet then skips the segment's rules), and then the table
	// deleted are each put back by the resync, and the verdicts hold
	// again.
	a1a2 := nft.TierChain(policy.TierAdmin, policy.Ingress, []string{"A1", "A2"})
	breaks := [][]string{{"flush", "chain", "inet", nft.TableName, a1a2}}
	if seg == 2 { // A1's Deny (s1), A1's Pass inline, A2's Deny (s2) and Accept (s3)
		breaks = append(breaks,
			[]string{"flush", "chain", "inet", nft.TableName, a1a2 + "-s3"},
			[]string{"flush", "set", "inet", nft.TableName, a1a2 + "-s3-g4"},
			[]string{"flush", "set", "inet", nft.TableName, a1a2 + "-s1-g6"})
	}
	breaks = append(breaks, []string{"delete", "table", "inet", nft.TableName})
	for _, breakIt := range breaks {
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

// TestLongTierChain: an Admin tier of 32 ClusterNetworkPolicies in front
// of a pod (64 rules, both families), cut in segments of two rules: a
// Pass near its end still leaves the whole tier (the Deny after it is
// not judged), and a Deny of the peer among the unrelated rules still
// drops.
func TestLongTierChain(t *testing.T) {
	e := newEnv(t, "a", "b")
	e.w = &nft.Writer{TierSegment: 2}
	t.Cleanup(e.w.Close)
	a, b := e.pods["a"], e.pods["b"]
	for _, port := range []int{8081, 8082, 8083} {
		server(t, a.ns, port)
	}
	tcp := func(p uint16) []policy.PortRange { return port(policy.ProtoTCP, p, p) }
	rs := policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6},
		Pods: []policy.PodChains{
			{ID: "a", Namespace: "default", Name: "a", Addrs: []netip.Addr{a.v4, a.v6},
				IngressIsolated: true, Ingress: []string{"a-in"}},
			{ID: "b", Namespace: "default", Name: "b", Addrs: []netip.Addr{b.v4, b.v6}},
		},
		Policies: []policy.PolicyChain{
			{ID: "a-in", Namespace: "default", Name: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{
				{Peers: both(b), Ports: port(policy.ProtoTCP, 8081, 8082)},
			}},
		},
	}
	var admin []string
	for i := range 32 {
		id := fmt.Sprintf("L%02d", i)
		r := policy.Rule{Action: policy.ActionDeny, Peers: extRanges, Ports: tcp(1)}
		switch i {
		case 10: // a Deny of b among the unrelated ones
			r = policy.Rule{Action: policy.ActionDeny, Peers: both(b), Ports: tcp(8082)}
		case 29:
			r = policy.Rule{Action: policy.ActionPass, Peers: both(b), Ports: tcp(8081)}
		case 30: // after the Pass: never judged for 8081
			r = policy.Rule{Action: policy.ActionDeny, Peers: both(b), Ports: tcp(8081)}
		}
		admin = append(admin, id)
		rs.Policies = append(rs.Policies, policy.PolicyChain{ID: id, Name: id, Direction: policy.Ingress,
			Tier: policy.TierAdmin, Priority: int32(i), Rules: []policy.Rule{r.Canonical()}})
	}
	rs.Pods[0].Admin[0] = admin
	rs.Policies[0].Rules[0] = rs.Policies[0].Rules[0].Canonical()
	e.apply(rs)
	var checks []check
	for _, v6 := range []bool{false, true} {
		dst := a.addr(v6)
		checks = append(checks,
			check{what: fmt.Sprintf("v6=%t b->a 8081: Pass near the end, the NetworkPolicy allows", v6), allow: true,
				try: func() error { return flow(b.ns, "tcp", dst, 8081) }},
			check{what: fmt.Sprintf("v6=%t b->a 8082: the Admin Deny among unrelated rules", v6), allow: false,
				try: func() error { return flow(b.ns, "tcp", dst, 8082) }},
			check{what: fmt.Sprintf("v6=%t b->a 8083: no Admin rule, the NetworkPolicy isolates", v6), allow: false,
				try: func() error { return flow(b.ns, "tcp", dst, 8083) }})
	}
	runChecks(t, checks)
	chains := strings.Count(e.nft("list", "table", "inet", nft.TableName), "\n\tchain adm-")
	if chains < 32 {
		t.Errorf("%d Admin tier chains in the table, want the tier cut in segments (at least 32)", chains)
	}
}
