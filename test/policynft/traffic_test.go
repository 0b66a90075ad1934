package policynft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/internal/testns"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// allowedBy is the test's own reading of a Ruleset: whether a new flow is
// allowed (what the table must do, and what Revoke is given).
func allowedBy(rs policy.Ruleset) nft.Allowed {
	known := map[netip.Addr]bool{}
	for _, a := range rs.Known {
		known[a] = true
	}
	byAddr := map[netip.Addr]policy.PodChains{}
	for _, p := range rs.Pods {
		for _, a := range p.Addrs {
			byAddr[a] = p
			known[a] = true
		}
	}
	pols := map[string]policy.PolicyChain{}
	for _, p := range rs.Policies {
		pols[p.ID] = p
	}
	in := func(a netip.Addr, rs []policy.Range) bool {
		for _, r := range rs {
			if r.From.Is4() == a.Is4() && !a.Less(r.From) && !r.To.Less(a) {
				return true
			}
		}
		return false
	}
	allows := func(ids []string, peer, dst netip.Addr, proto uint8, port uint16) bool {
		for _, id := range ids {
			for _, r := range pols[id].Rules {
				if !r.AnyPeer && !in(peer, r.Peers) {
					continue
				}
				if r.AnyPort {
					return true
				}
				for _, pr := range r.Ports {
					if pr.Proto == proto && in(dst, []policy.Range{pr.Addrs}) && pr.PortFrom <= port && port <= pr.PortTo {
						return true
					}
				}
			}
		}
		return false
	}
	return func(src, dst netip.Addr, proto uint8, port uint16) bool {
		for _, p := range rs.LocalPodCIDRs {
			if (p.Contains(src) && !known[src]) || (p.Contains(dst) && !known[dst]) {
				return false
			}
		}
		if p, ok := byAddr[src]; ok && p.EgressIsolated && !allows(p.Egress, dst, dst, proto, port) {
			return false
		}
		if p, ok := byAddr[dst]; ok && p.IngressIsolated && !allows(p.Ingress, src, dst, proto, port) {
			return false
		}
		return true
	}
}

// both are the two addresses of each of pods ps, as single-address ranges.
func both(ps ...*pod) []policy.Range {
	var out []policy.Range
	for _, p := range ps {
		out = append(out, one(p.v4), one(p.v6))
	}
	return out
}

var (
	extRanges  = []policy.Range{{From: netip.MustParseAddr("10.99.0.0"), To: netip.MustParseAddr("10.99.0.255")}, {From: netip.MustParseAddr("fd99::"), To: netip.MustParseAddr("fd99::ffff:ffff:ffff:ffff")}}
	nodeRanges = []policy.Range{one(nodeAddr4), one(nodeAddr6)}
)

// trafficRuleset: pod a isolated for ingress (from b: TCP 8080 and UDP
// 5353; from the outside host: anything), pod c isolated for egress (to
// the outside host: anything; to b: TCP 8080; to the node: TCP 9000), b
// not isolated, u inside the PodCIDR but not known.
func trafficRuleset(e *env) policy.Ruleset {
	a, b, c := e.pods["a"], e.pods["b"], e.pods["c"]
	return policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6, c.v4, c.v6},
		Pods: []policy.PodChains{
			{ID: "a", Namespace: "default", Name: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, Ingress: []string{"a-in"}},
			{ID: "b", Namespace: "default", Name: "b", Addrs: []netip.Addr{b.v4, b.v6}},
			{ID: "c", Namespace: "default", Name: "c", Addrs: []netip.Addr{c.v4, c.v6}, EgressIsolated: true, Egress: []string{"c-eg"}},
		},
		Policies: []policy.PolicyChain{
			{ID: "a-in", Namespace: "default", Name: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{
				{Peers: both(b), Ports: join(port(policy.ProtoTCP, 8080, 8080), port(policy.ProtoUDP, 5353, 5353))},
				{Peers: extRanges, AnyPort: true},
			}},
			{ID: "c-eg", Namespace: "default", Name: "c-eg", Direction: policy.Egress, Rules: []policy.Rule{
				{Peers: extRanges, AnyPort: true},
				{Peers: both(b), Ports: port(policy.ProtoTCP, 8080, 8080)},
				{Peers: nodeRanges, Ports: port(policy.ProtoTCP, 9000, 9000)},
			}},
		},
	}
}

// trafficChecks are the flows the traffic test tries, each with its
// verdict under rs per the test's own reading (allowedBy), checked
// against the expectation written out here.
func trafficChecks(t *testing.T, e *env, rs policy.Ruleset, policyOn bool) []check {
	a, b, c, u := e.pods["a"], e.pods["b"], e.pods["c"], e.pods["u"]
	allowed := allowedBy(rs)
	var checks []check
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
		nodeAddr, extAddr := nodeAddr4, extAddr4
		if v6 {
			nodeAddr, extAddr = nodeAddr6, extAddr6
		}
		add := func(what string, from ns.NetNS, fromAddr netip.Addr, network string, dst netip.Addr, port int, want bool) {
			proto := map[string]uint8{"tcp": policy.ProtoTCP, "udp": policy.ProtoUDP, "icmp": 1}[network]
			if !policyOn {
				want = true
			} else if fromAddr.IsValid() && allowed(fromAddr, dst, proto, uint16(port)) != want {
				t.Fatalf("the test's reading of the ruleset disagrees with its expectation for %s", what)
			}
			try := func() error { return flow(from, network, dst, port) }
			if network == "icmp" {
				try = func() error { return ping(from, dst) }
			}
			checks = append(checks, check{what: fmt.Sprintf("%s %s %s:%d", fam, what, network, port), allow: want, try: try})
		}
		add("b->a", b.ns, b.addr(v6), "tcp", a.addr(v6), 8080, true)
		add("b->a", b.ns, b.addr(v6), "tcp", a.addr(v6), 8081, false)
		add("b->a", b.ns, b.addr(v6), "udp", a.addr(v6), 5353, true)
		add("b->a", b.ns, b.addr(v6), "udp", a.addr(v6), 5354, false)
		add("b->a (rule with ports)", b.ns, b.addr(v6), "icmp", a.addr(v6), 0, false)
		add("c->a (peer not allowed)", c.ns, c.addr(v6), "tcp", a.addr(v6), 8080, false)
		add("ext->a (rule without ports)", e.ext, extAddr, "icmp", a.addr(v6), 0, true)
		add("ext->a (rule without ports)", e.ext, extAddr, "tcp", a.addr(v6), 8081, true)
		add("node->a (output hook)", e.node, netip.Addr{}, "tcp", a.addr(v6), 8081, true)
		add("node->a (output hook)", e.node, netip.Addr{}, "icmp", a.addr(v6), 0, true)
		add("c->ext (rule without ports)", c.ns, c.addr(v6), "icmp", extAddr, 0, true)
		add("c->b (rule with ports)", c.ns, c.addr(v6), "icmp", b.addr(v6), 0, false)
		add("c->b", c.ns, c.addr(v6), "tcp", b.addr(v6), 8080, true)
		add("c->b", c.ns, c.addr(v6), "tcp", b.addr(v6), 8081, false)
		add("c->node (input hook)", c.ns, c.addr(v6), "tcp", nodeAddr, 9000, true)
		add("c->node (input hook)", c.ns, c.addr(v6), "tcp", nodeAddr, 9001, false)
		add("b->node (not isolated)", b.ns, b.addr(v6), "tcp", nodeAddr, 9001, true)
		add("a->b (not isolated)", a.ns, a.addr(v6), "tcp", b.addr(v6), 8081, true)
		add("b->c (c isolated for egress only)", b.ns, b.addr(v6), "tcp", c.addr(v6), 8081, true)
		add("u->ext (unknown local address)", u.ns, u.addr(v6), "icmp", extAddr, 0, false)
		add("u->b (unknown local address)", u.ns, u.addr(v6), "tcp", b.addr(v6), 8080, false)
		add("u->node (unknown local address, input)", u.ns, u.addr(v6), "tcp", nodeAddr, 9001, false)
		add("ext->u (unknown local address)", e.ext, extAddr, "tcp", u.addr(v6), 8080, false)
	}
	return checks
}

// TestPolicyTraffic writes a Ruleset and sends real TCP, UDP and ICMP
// (IPv4 and IPv6) through the node: allowed and refused by port, peer
// and protocol (ICMP allowed by a rule without ports, refused by one with
// ports), egress to the node through the input hook, node to pod always
// allowed, a local address the engine does not know dropped both ways.
// Every flow is first shown to pass without the table, so that a refused
// one is the table's doing; the drop counters count the refusals.
func TestPolicyTraffic(t *testing.T) {
	e := newEnv(t, "a", "b", "c", "u")
	for _, p := range e.pods {
		for _, port := range []int{8080, 8081, 5353, 5354} {
			server(t, p.ns, port)
		}
	}
	server(t, e.node, 9000)
	server(t, e.node, 9001)
	server(t, e.ext, 8080)
	rs := trafficRuleset(e)

	runChecks(t, trafficChecks(t, e, rs, false))
	if t.Failed() {
		t.Fatal("the network does not work without the policy table")
	}
	if st := e.apply(rs); !st.Full {
		t.Errorf("first Apply: %+v, want a full write", st)
	}
	runChecks(t, trafficChecks(t, e, rs, true))

	var drops map[nft.CounterKey]uint64
	var unknown uint64
	e.do(func() error {
		var err error
		drops, unknown, err = e.w.DropCounters()
		return err
	})
	if drops[nft.CounterKey{PodID: "a", Direction: policy.Ingress}] == 0 || drops[nft.CounterKey{PodID: "c", Direction: policy.Egress}] == 0 {
		t.Errorf("drop counters %v: want a's ingress and c's egress counted", drops)
	}
	if _, ok := drops[nft.CounterKey{PodID: "b", Direction: policy.Ingress}]; ok {
		t.Errorf("drop counters %v: b is not isolated, it has no counter", drops)
	}
	if unknown == 0 {
		t.Errorf("unknown_dropped is 0 after u's packets")
	}
	t.Logf("drops %v, unknown %d", drops, unknown)

	// u becomes known (its pod compiled, not isolated): it talks
	rs.Known = append(rs.Known, e.pods["u"].v4, e.pods["u"].v6)
	if st := e.apply(rs); st.Full || st.Chains != 0 || st.Elements != 3 {
		t.Errorf("Apply with u known: %+v, want 3 elements (known4, known6, its host veth in ports) and no chain written", st)
	}
	runChecks(t, []check{
		{"u->b tcp:8080", true, func() error { return flow(e.pods["u"].ns, "tcp", e.pods["b"].v4, 8080) }},
		{"IPv6 u->b tcp:8080", true, func() error { return flow(e.pods["u"].ns, "tcp", e.pods["b"].v6, 8080) }},
	})
}

// TestRevoke: a connection established while a rule allowed it keeps
// going when the rule goes (established traffic is accepted first), new
// ones are refused; a scan (Conntrack.Revoke) then deletes its conntrack
// entries and it stops, while another connection the new ruleset still
// allows keeps running and keeps its entry. The scans share one socket.
func TestRevoke(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	a, b, c := e.pods["a"], e.pods["b"], e.pods["c"]
	server(t, a.ns, 8080)
	rs := func(peers ...*pod) policy.Ruleset {
		return policy.Ruleset{
			LocalPodCIDRs: localCIDRs,
			Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6, c.v4, c.v6},
			Pods:          []policy.PodChains{{ID: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, Ingress: []string{"a-in"}}},
			Policies: []policy.PolicyChain{{ID: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{
				{Peers: both(peers...), Ports: port(policy.ProtoTCP, 8080, 8080)},
			}}},
		}
	}
	e.apply(rs(b, c))
	dial := func(from *pod, v6 bool) net.Conn {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := nettest.DialIn(from.ns)(ctx, "tcp", net.JoinHostPort(a.addr(v6).String(), "8080"))
		if err != nil {
			t.Fatalf("%s -> a: %v", from.name, err)
		}
		t.Cleanup(func() { conn.Close() })
		if err := echo(conn); err != nil {
			t.Fatalf("%s -> a: %v", from.name, err)
		}
		return conn
	}
	fromB := []net.Conn{dial(b, false), dial(b, true)}
	fromC := []net.Conn{dial(c, false), dial(c, true)}

	// b's rule goes: b's connections keep going, new ones are refused
	narrowed := rs(c)
	e.apply(narrowed)
	var checks []check
	for i, conn := range append(fromB, fromC...) {
		checks = append(checks, check{fmt.Sprintf("established connection %d (%s)", i, conn.LocalAddr()), true, func() error { return echo(conn) }})
	}
	for _, v6 := range []bool{false, true} {
		checks = append(checks, check{fmt.Sprintf("new b->a %s", a.addr(v6)), false, func() error { return flow(b.ns, "tcp", a.addr(v6), 8080) }})
	}
	runChecks(t, checks)

	// the scans on one lasting socket (podnet-routed's Conntrack): it
	// stays open from one scan to the next, and Close closes it
	var scans nft.Conntrack
	var deleted int
	e.do(func() error {
		before := testns.NetfilterSockets(t)
		if n, err := scans.Revoke(allowedBy(rs(b, c))); n != 0 || err != nil {
			t.Errorf("a scan the ruleset in force allows all of: %d deleted, %v", n, err)
		}
		open := testns.NetfilterSockets(t)
		var err error
		deleted, err = scans.Revoke(allowedBy(narrowed))
		if got := testns.NetfilterSockets(t); open != before+1 || got != open {
			t.Errorf("netfilter sockets of the node netns: %d before the scans, %d after the first, %d after the second; want 1 more, then the same", before, open, got)
		}
		scans.Close()
		if got := testns.NetfilterSockets(t); got != before {
			t.Errorf("netfilter sockets after Close: %d, want %d", got, before)
		}
		return err
	})
	if deleted != 2 {
		t.Errorf("Revoke deleted %d entries, want 2 (b's IPv4 and IPv6 connections)", deleted)
	}
	checks = nil
	for i, conn := range fromB {
		checks = append(checks, check{fmt.Sprintf("revoked connection %d (%s)", i, conn.LocalAddr()), false, func() error { return echo(conn) }})
	}
	for i, conn := range fromC {
		checks = append(checks, check{fmt.Sprintf("still allowed connection %d (%s)", i, conn.LocalAddr()), true, func() error { return echo(conn) }})
	}
	runChecks(t, checks)
	ct, err := nettest.ExecIn(context.Background(), e.node, "conntrack", "-L", "-f", "ipv4", "-p", "tcp", "--dport", "8080")
	if err != nil {
		t.Logf("conntrack -L: %v", err)
	}
	if !strings.Contains(ct, "src="+c.v4.String()) {
		t.Errorf("c's conntrack entry is gone:\n%s", ct)
	}
}

// TestRevokeServiceConnections: connections to a Service's virtual IP,
// DNATed to a backend pod in the node netns as kube-proxy does, are
// judged as the table judges them, by the backend: when a's ingress rule
// for b goes, b's connection through the virtual IP is revoked and c's is
// kept; and an egress-isolated client allowed to reach the backend keeps
// its connection through the virtual IP at every scan.
func TestRevokeServiceConnections(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	a, b, c := e.pods["a"], e.pods["b"], e.pods["c"]
	server(t, a.ns, 8080)
	const vip = "10.96.0.10"
	for _, args := range [][]string{
		{"add", "table", "ip", "svc"},
		{"add", "chain", "ip", "svc", "pre", "{ type nat hook prerouting priority dstnat; }"},
		{"add", "rule", "ip", "svc", "pre", "ip", "daddr", vip, "tcp", "dport", "80", "dnat", "to", a.v4.String() + ":8080"},
	} {
		if out, err := nettest.ExecIn(context.Background(), e.node, "nft", args...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	ingress := func(peers ...*pod) policy.Ruleset {
		return policy.Ruleset{
			LocalPodCIDRs: localCIDRs,
			Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6, c.v4, c.v6},
			Pods: []policy.PodChains{
				{ID: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, Ingress: []string{"a-in"}},
				// c may send only to a, port 8080
				{ID: "c", Addrs: []netip.Addr{c.v4, c.v6}, EgressIsolated: true, Egress: []string{"c-out"}},
			},
			Policies: []policy.PolicyChain{
				{ID: "a-in", Direction: policy.Ingress, Rules: []policy.Rule{{Peers: both(peers...), Ports: port(policy.ProtoTCP, 8080, 8080)}}},
				{ID: "c-out", Direction: policy.Egress, Rules: []policy.Rule{{Peers: both(a), Ports: port(policy.ProtoTCP, 8080, 8080)}}},
			},
		}
	}
	e.apply(ingress(b, c))
	dial := func(from *pod) net.Conn {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := nettest.DialIn(from.ns)(ctx, "tcp", net.JoinHostPort(vip, "80"))
		if err != nil {
			t.Fatalf("%s -> %s:80: %v", from.name, vip, err)
		}
		t.Cleanup(func() { conn.Close() })
		if err := echo(conn); err != nil {
			t.Fatalf("%s -> %s:80: %v", from.name, vip, err)
		}
		return conn
	}
	fromB, fromC := dial(b), dial(c)

	// a scan with nothing narrowed keeps both (c's egress allows a:8080,
	// which its connection to the virtual IP is)
	revoke := func(rs policy.Ruleset) int {
		var deleted int
		e.do(func() error {
			var err error
			deleted, err = nft.Revoke(allowedBy(rs))
			return err
		})
		return deleted
	}
	if n := revoke(ingress(b, c)); n != 0 {
		t.Errorf("a scan by the Ruleset in force deleted %d entries, want 0", n)
	}
	runChecks(t, []check{
		{"b's connection through the virtual IP", true, func() error { return echo(fromB) }},
		{"c's connection through the virtual IP", true, func() error { return echo(fromC) }},
	})

	// b's rule goes: b's connection through the virtual IP is revoked
	narrowed := ingress(c)
	e.apply(narrowed)
	if n := revoke(narrowed); n != 1 {
		t.Errorf("Revoke deleted %d entries, want 1 (b's connection to a through %s)", n, vip)
	}
	runChecks(t, []check{
		{"b's revoked connection through the virtual IP", false, func() error { return echo(fromB) }},
		{"c's connection through the virtual IP", true, func() error { return echo(fromC) }},
	})
}

// TestICMPAndPorts: the same peer, one rule with ports and one without,
// each alone: ICMP goes through the rule without ports only.
func TestICMPAndPorts(t *testing.T) {
	e := newEnv(t, "a", "b")
	a, b := e.pods["a"], e.pods["b"]
	rs := func(rule policy.Rule) policy.Ruleset {
		return policy.Ruleset{
			LocalPodCIDRs: localCIDRs,
			Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6},
			Pods:          []policy.PodChains{{ID: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, Ingress: []string{"p"}}},
			Policies:      []policy.PolicyChain{{ID: "p", Direction: policy.Ingress, Rules: []policy.Rule{rule}}},
		}
	}
	for _, tc := range []struct {
		rule  policy.Rule
		allow bool
	}{
		{policy.Rule{Peers: both(b), AnyPort: true}, true},
		{policy.Rule{Peers: both(b), Ports: join(port(policy.ProtoTCP, 0, 65535), port(policy.ProtoUDP, 0, 65535))}, false},
		{policy.Rule{AnyPeer: true, AnyPort: true}, true},
		{policy.Rule{AnyPeer: true, Ports: port(policy.ProtoTCP, 1, 65535)}, false},
	} {
		e.apply(rs(tc.rule))
		runChecks(t, []check{
			{fmt.Sprintf("IPv4 ping with %+v", tc.rule), tc.allow, func() error { return ping(b.ns, a.v4) }},
			{fmt.Sprintf("IPv6 ping with %+v", tc.rule), tc.allow, func() error { return ping(b.ns, a.v6) }},
		})
	}
}

// TestHairpinSelf: a pod cannot block itself. Pod a, isolated in both
// directions with nothing allowed, reaches itself through a Service
// address (DNAT back to a and masquerade, as kube-proxy does for a
// hairpin), while its connections to b stay refused. Without the pod
// chains' own-address rule the hairpin is dropped twice over (a's egress
// and a's ingress).
func TestHairpinSelf(t *testing.T) {
	e := newEnv(t, "a", "b")
	a, b := e.pods["a"], e.pods["b"]
	server(t, a.ns, 8080)
	server(t, b.ns, 8080)
	svc := netip.MustParseAddr("10.96.0.10")
	e.nft("add", "table", "ip", "hairpin")
	e.nft("add", "chain", "ip", "hairpin", "pre", "{ type nat hook prerouting priority dstnat; }")
	e.nft("add", "chain", "ip", "hairpin", "post", "{ type nat hook postrouting priority srcnat; }")
	e.nft("add", "rule", "ip", "hairpin", "pre", "ip", "daddr", svc.String(), "tcp", "dport", "80", "dnat", "to", a.v4.String()+":8080")
	e.nft("add", "rule", "ip", "hairpin", "post", "ip", "saddr", a.v4.String(), "ip", "daddr", a.v4.String(), "masquerade")
	hairpin := check{"a -> Service -> a (hairpin)", true, func() error { return flow(a.ns, "tcp", svc, 80) }}
	runChecks(t, []check{hairpin, {"a -> b before any policy", true, func() error { return flow(a.ns, "tcp", b.v4, 8080) }}})
	e.apply(policy.Ruleset{
		LocalPodCIDRs: localCIDRs,
		Known:         []netip.Addr{a.v4, a.v6, b.v4, b.v6},
		Pods:          []policy.PodChains{{ID: "a", Addrs: []netip.Addr{a.v4, a.v6}, IngressIsolated: true, EgressIsolated: true}},
	})
	runChecks(t, []check{
		hairpin,
		{"a -> b (a isolated for egress)", false, func() error { return flow(a.ns, "tcp", b.v4, 8080) }},
		{"b -> a (a isolated for ingress)", false, func() error { return flow(b.ns, "tcp", a.v4, 8080) }},
	})
}
