package policy

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// cnpGen is a genCluster with Node objects, the NetworkPolicy objects kept,
// and random ClusterNetworkPolicies.
type cnpGen struct {
	*genCluster
	nodeObjs []*corev1.Node
	nps      []*pol
	cnps     []*cnp
}

func newCNPGen(seed uint64, nodes, namespaces, pods, policies, cnps int) *cnpGen {
	g := &cnpGen{genCluster: newGen(seed, nodes, namespaces, pods, 0)}
	for i, n := range g.nodes {
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{
			"role": []string{"control", "worker"}[min(i, 1)], "zone": g.pick([]string{"a", "b"})}}}
		for _, x := range []string{g.nodeIPs[i].String(), fmt.Sprintf("fd00:ffff::%d", i+1)} {
			obj.Status.Addresses = append(obj.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: x})
		}
		g.nodeObjs = append(g.nodeObjs, obj)
		g.s.SetNode(FromNode(obj))
	}
	for i := range policies {
		p := g.policy(i)
		if err := g.s.SetPolicy(p); err != nil {
			panic(err)
		}
		g.nps = append(g.nps, p)
	}
	for i := range cnps {
		c := g.cnp(i)
		if err := g.s.SetClusterPolicy(c); err != nil {
			panic(err)
		}
		g.cnps = append(g.cnps, c)
	}
	return g
}

var cnpActions = []cnpv1.ClusterNetworkPolicyRuleAction{accept, deny, pass}

// cnp is a random valid ClusterNetworkPolicy: both tiers, priorities
// from a small set (ties), every kind of subject, peer and protocol.
func (g *cnpGen) cnp(i int) *cnp {
	tier := admin
	if g.r.IntN(2) == 0 {
		tier = baseline
	}
	prio := []int32{0, 1, 5, 5, 10, 500, 1000}[g.r.IntN(7)]
	var subj cnpv1.ClusterNetworkPolicySubject
	if g.r.IntN(2) == 0 {
		subj = subjNS(g.nsSelector())
	} else {
		subj = subjPods(g.nsSelector(), g.podSelector())
	}
	c := cnpol(fmt.Sprintf("cnp%d", i), tier, prio, subj)
	for range g.r.IntN(4) {
		var peers []cpeer
		for range 1 + g.r.IntN(3) {
			peers = append(peers, g.cnpPeer(false))
		}
		cin(cnpActions[g.r.IntN(3)], "", g.cnpProtos(true), peers...)(c)
	}
	for range g.r.IntN(4) {
		var peers []cpeer
		named := true
		for range 1 + g.r.IntN(3) {
			p := g.cnpPeer(true)
			named = named && (p.Namespaces != nil || p.Pods != nil)
			peers = append(peers, p)
		}
		// the API forbids named ports with networks or nodes peers
		ceg(cnpActions[g.r.IntN(3)], "", g.cnpProtos(named), peers...)(c)
	}
	return c
}

func (g *cnpGen) cnpPeer(egress bool) cpeer {
	n := 2
	if egress {
		n = 4
	}
	switch g.r.IntN(n) {
	case 0:
		return cNS(g.nsSelector())
	case 1:
		return cPods(g.nsSelector(), g.podSelector())
	case 2:
		var cidrs []string
		for range 1 + g.r.IntN(3) {
			cidrs = append(cidrs, g.network())
		}
		return cNets(cidrs...)
	}
	return cNodes(g.selector(map[string][]string{"role": {"control", "worker"}, "zone": {"a", "b"}}))
}

func (g *cnpGen) network() string {
	node := g.r.IntN(len(g.nodes))
	switch g.r.IntN(8) {
	case 0:
		return "0.0.0.0/0"
	case 1:
		return "::/0"
	case 2:
		return g.cidrs[g.nodes[node]][0].String()
	case 3:
		return g.cidrs[g.nodes[node]][1].String()
	case 4:
		return "8.0.0.0/7"
	case 5:
		return "192.168.0.0/30"
	}
	pa := g.podIPs[g.r.IntN(len(g.podIPs))]
	if pa.Is4() {
		return g.prefix(pa, 24+g.r.IntN(9))
	}
	return g.prefix(pa, 112+g.r.IntN(17))
}

func (g *cnpGen) cnpProtos(named bool) []cproto {
	var out []cproto
	for range g.r.IntN(4) {
		var port *cnpv1.Port
		switch g.r.IntN(3) {
		case 0:
			port = cport(int32(genPorts[g.r.IntN(len(genPorts))]))
		case 1:
			from := int32(genPorts[g.r.IntN(len(genPorts))])
			port = crange(from, from+1+int32(g.r.IntN(100)))
		default:
			port = crange(1, 65535) // the API needs a port: every port
		}
		switch x := g.r.IntN(5); {
		case x == 0:
			out = append(out, cTCP(port))
		case x == 1:
			out = append(out, cUDP(port))
		case x == 2:
			out = append(out, cSCTP(port))
		case x == 3 && named:
			out = append(out, cNamed(g.pick(genNamed)))
		default:
			out = append(out, cTCP(cport(int32(genPorts[g.r.IntN(len(genPorts))]))))
		}
	}
	return out
}

// flow picks a flow among pods, nodes (both families) and outside.
func (g *cnpGen) flow() (src, dst netip.Addr, proto uint8, port uint16) {
	src, dst = g.flowAddrs()
	if g.r.IntN(10) == 0 {
		v6 := netip.MustParseAddr(fmt.Sprintf("fd00:ffff::%d", 1+g.r.IntN(len(g.nodes))))
		if src.Is6() {
			dst = v6
		} else if g.r.IntN(2) == 0 {
			dst = g.nodeIPs[g.r.IntN(len(g.nodeIPs))]
		}
	}
	proto, port = g.flowPort(src.Is4())
	return
}

// TestCNPAgreesWithOracle: random clusters with NetworkPolicies and
// ClusterNetworkPolicies of both tiers; for random flows the AND of the
// two nodes' compiled Rulesets, and Explain, agree with the oracle, which
// reads the API objects. Every tier must decide both ways often enough (over all seeds).
func TestCNPAgreesWithOracle(t *testing.T) {
	stats := map[string]int{}
	for seed := range uint64(8) {
		g := newCNPGen(seed, 3, 4, 80, 12, 14)
		o := newOracle(g.s, g.nodeObjs, g.nps, g.cnps)
		matchers := map[string]*Matcher{}
		for _, n := range g.nodes {
			rs := g.s.Compile(n, g.cidrs[n])
			checkRuleset(t, rs)
			matchers[n] = NewMatcher(rs)
		}
		for range 5000 {
			src, dst, proto, port := g.flow()
			want := o.allows(src, dst, proto, port)
			got := true
			for _, x := range []netip.Addr{src, dst} {
				if n := g.s.nodeOf(x); n != "" {
					got = got && matchers[n].Allows(src, dst, proto, port)
				}
			}
			if got != want {
				eg, egBy := o.judge(dirEg, src, dst, proto, port)
				in, inBy := o.judge(dirIn, src, dst, proto, port)
				t.Fatalf("seed %d: %s -> %s proto %d port %d: compiled %v, oracle %v (egress %v by %s, ingress %v by %s)",
					seed, src, dst, proto, port, got, want, eg, egBy, in, inBy)
			}
			if v := g.s.Explain(src, dst, proto, port); v.Allowed != want {
				t.Fatalf("seed %d: %s -> %s proto %d port %d: Explain %v, oracle %v\n%s", seed, src, dst, proto, port, v.Allowed, want, v)
			}
			for _, d := range []int{dirEg, dirIn} {
				v, by := o.judge(d, src, dst, proto, port)
				stats[fmt.Sprintf("%s %v", by, v)]++
			}
		}
		if o.unsure {
			t.Fatalf("seed %d: the oracle met something it does not read", seed)
		}
	}
	t.Logf("verdicts by direction, by deciding tier: %v", stats)
	for _, k := range []string{"admin true", "admin false", "np true", "np false", "baseline true", "baseline false", "default true"} {
		if stats[k] < 500 {
			t.Errorf("the generator is lopsided: %q %d times", k, stats[k])
		}
	}
}
