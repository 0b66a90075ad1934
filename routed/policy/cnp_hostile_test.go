package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// TestCNPEveryPriority: a ClusterNetworkPolicy at every priority 0..1000,
// names in another order than priorities. Compile works, every pod's Admin
// list is in priority order, and the verdicts follow it.
func TestCNPEveryPriority(t *testing.T) {
	s := cnpTestState()
	nothing := sel("app", "none")
	for p := range int32(MaxPriority + 1) {
		name := fmt.Sprintf("p%04d", (p*7919)%1001) // a permutation of 0..1000
		c := cnpol(name, admin, p, subjNS(sel()), cin(deny, "", nil, cPods(sel(), nothing)))
		switch p {
		case 500:
			c = cnpol(name, admin, p, subjNS(sel()), cin(accept, "", nil, cNS(sel("team", "b"))))
		case 501:
			c = cnpol(name, admin, p, subjNS(sel()), cin(pass, "", nil, cNS(sel("team", "c"))))
		case 1000:
			c = cnpol(name, admin, p, subjNS(sel()), cin(deny, "", nil, cNS(sel())))
		}
		if err := s.SetClusterPolicy(c); err != nil {
			t.Fatal(err)
		}
	}
	if s.ClusterPolicies() != 1001 {
		t.Fatalf("%d policies", s.ClusterPolicies())
	}
	start := time.Now()
	rs := s.Compile("n1", nodeCIDRs["n1"])
	t.Logf("1001 policies: Compile in %v, %d chains", time.Since(start), len(rs.Policies))
	checkRuleset(t, rs)
	prio := map[string]int32{}
	for _, pc := range rs.Policies {
		prio[pc.ID] = pc.Priority
	}
	for _, p := range rs.Pods {
		ids := p.Admin[DirIndex(Ingress)]
		if len(ids) != 1001 {
			t.Fatalf("pod %s/%s: %d Admin chains", p.Namespace, p.Name, len(ids))
		}
		for i, id := range ids {
			if prio[id] != int32(i) {
				t.Fatalf("pod %s/%s: Admin chain %d has priority %d", p.Namespace, p.Name, i, prio[id])
			}
		}
	}
	for _, f := range []flow{
		{"y/a", "x/a", tcp, 80, true},  // 500 accepts
		{"z/c", "x/a", tcp, 80, true},  // 501 passes: no NP, no Baseline
		{"x/b", "x/a", tcp, 80, false}, // 1000 denies
	} {
		src, dst := f.addrs(false)
		if got := clusterAllows(s, nodeCIDRs, src, dst, f.proto, f.port); got != f.allowed {
			t.Errorf("%s -> %s: allowed=%v, want %v", f.src, f.dst, got, f.allowed)
		}
	}
}

// TestCNPManyRulesManyPeers: 25 ingress and 25 egress rules of 25 peers
// each (namespaces, pods, networks, nodes; overlapping networks), every
// action, in both tiers: the Ruleset is well formed and agrees with the
// oracle on every pair of addresses the test cluster has.
func TestCNPManyRulesManyPeers(t *testing.T) {
	s := cnpTestState()
	actions := []cnpv1.ClusterNetworkPolicyRuleAction{accept, deny, pass}
	teams := []string{"a", "b", "c"}
	apps := []string{"a", "b", "c"}
	var cnps []*cnp
	for k, tier := range []cnpv1.Tier{admin, baseline} {
		c := cnpol(fmt.Sprintf("big-%d", k), tier, 7, subjNS(sel()))
		for i := range 25 {
			var in, eg []cpeer
			for j := range 25 {
				switch (i + j) % 4 {
				case 0:
					in = append(in, cPods(sel("team", teams[(i*j)%3]), sel("app", apps[(i+j)%3])))
					eg = append(eg, cNets(fmt.Sprintf("10.0.%d.0/%d", (i+j)%3, 24+j%9), fmt.Sprintf("fd00::%d:0/%d", (i+j)%3, 112+j%17)))
				case 1:
					in = append(in, cPods(sel("team", teams[(i+j)%3]), sel("app", apps[j%3])))
					eg = append(eg, cPods(sel("team", teams[(i+j)%3]), sel("app", apps[j%3])))
				case 2:
					in = append(in, cPods(sel(), sel("app", apps[(i+2*j)%3])))
					eg = append(eg, cNodes(sel("role", []string{"worker", "control"}[j%2])))
				default:
					in = append(in, cPods(sel("kubernetes.io/metadata.name", []string{"x", "y", "z"}[j%3]), sel("app", apps[(i*j+1)%3])))
					eg = append(eg, cNets(fmt.Sprintf("10.0.%d.%d/31", (i+j)%3, i%4), fmt.Sprintf("10.0.%d.0/30", j%3), fmt.Sprintf("10.0.%d.%d/32", j%3, i%4)))
				}
			}
			var ps []cproto
			switch i % 5 {
			case 0:
				ps = protos(cTCP(cport(80)))
			case 1:
				ps = protos(cTCP(cport(int32(80+i))), cUDP(crange(50, int32(50+i))), cNamed("http"), cSCTP(crange(1, 65535)))
			case 3:
				ps = protos(cSCTP(crange(1, 65535)), cUDP(cport(70)))
			case 4:
				ps = protos(cTCP(crange(81, 82)), cNamed("http"))
			}
			in, eg = in[:25], eg[:25]
			cin(actions[(i+k+1)%3], fmt.Sprintf("in-%d", i), ps, in...)(c)
			ceg(actions[(i+2*k)%3], fmt.Sprintf("eg-%d", i), ps, eg...)(c)
		}
		cnps = append(cnps, c)
	}
	// the egress rules with named ports and networks or nodes peers are
	// invalid by the API's CEL rule; keep the test to valid objects
	for _, c := range cnps {
		for i := range c.Spec.Egress {
			c.Spec.Egress[i].Protocols = slices.DeleteFunc(slices.Clone(c.Spec.Egress[i].Protocols), func(p cproto) bool { return p.DestinationNamedPort != "" })
		}
		if err := s.SetClusterPolicy(c); err != nil {
			t.Fatal(err)
		}
	}
	for n, c := range nodeCIDRs {
		checkRuleset(t, s.Compile(n, c))
	}
	o := newOracle(s, testNodes(), nil, cnps)
	addrs := []netip.Addr{a("8.8.8.8"), a("192.168.0.1"), a("192.168.0.2"), a("2001:db8::1"), a("fd00:ffff::2")}
	for _, x := range podAddr4 {
		addrs = append(addrs, x)
	}
	for _, x := range podAddr4 {
		addrs = append(addrs, netip.AddrFrom16([16]byte{0xfd, 0, 13: x.As4()[2], 15: x.As4()[3]}))
	}
	var allowed, denied int
	for _, src := range addrs {
		for _, dst := range addrs {
			if src.Is4() != dst.Is4() {
				continue
			}
			for _, pp := range [][2]int{{int(tcp), 80}, {int(tcp), 81}, {int(udp), 53}, {int(udp), 70}, {int(sctp), 9}, {1, 0}} {
				want := o.allows(src, dst, uint8(pp[0]), uint16(pp[1]))
				if got := clusterAllows(s, nodeCIDRs, src, dst, uint8(pp[0]), uint16(pp[1])); got != want {
					t.Errorf("%s -> %s %d/%d: compiled %v, oracle %v", src, dst, pp[0], pp[1], got, want)
				}
				if v := s.Explain(src, dst, uint8(pp[0]), uint16(pp[1])); v.Allowed != want {
					t.Errorf("%s -> %s %d/%d: Explain %v, oracle %v\n%s", src, dst, pp[0], pp[1], v.Allowed, want, v)
				}
				if want {
					allowed++
				} else {
					denied++
				}
			}
		}
	}
	if o.unsure {
		t.Fatalf("oracle unsure")
	}
	t.Logf("%d allowed, %d denied", allowed, denied)
}

// brokenCase is one unreadable ClusterNetworkPolicy: the field its error
// must name, and flows showing the fail-closed effect. Every case runs on
// the test cluster with x's pods isolated by a deny-all NetworkPolicy
// (ingress) unless open is set.
type brokenCase struct {
	name  string
	c     *cnp
	field string
	flows []flow
}

// TestCNPBroken: unreadable parts never panic, return a
// *ClusterPolicyError naming the field, and fail closed: an unreadable
// Deny or Pass rule denies everything, an unreadable Accept rule (peer,
// protocol) matches less, an unreadable subject applies to every pod, an
// unreadable tier is Admin, an unreadable priority the tier's last.
func TestCNPBroken(t *testing.T) {
	all := sel()
	teamB := sel("team", "b")
	subj := subjNS(sel("team", "a"))
	num := func(n int32) *cnpv1.Port { return &cnpv1.Port{Number: n} }
	cases := []brokenCase{
		{"priority -1: last in its tier", cnpol("p", admin, -1, subj, cin(deny, "", nil, cNS(all))), "spec.priority", []flow{
			{"y/a", "x/a", udp, 5353, true}, // the valid Admin Accept at 1000 first
			{"z/c", "x/a", tcp, 80, false},
		}},
		{"priority 1001: last in its tier", cnpol("p", admin, 1001, subj, cin(deny, "", nil, cNS(all))), "spec.priority", []flow{
			{"y/a", "x/a", udp, 5353, true}, {"z/c", "x/a", tcp, 80, false},
		}},
		{"priority 2^31-1", cnpol("p", admin, 1<<31-1, subj, cin(deny, "", nil, cNS(all))), "spec.priority", []flow{
			{"y/a", "x/a", udp, 5353, true}, {"z/c", "x/a", tcp, 80, false},
		}},
		{"unknown tier: Admin", cnpol("p", "Tier0", 10, subj, cin(deny, "", nil, cNS(all))), "spec.tier", []flow{
			{"y/b", "y/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, false}, {"x/a", "x/b", tcp, 80, false},
		}},
		{"unknown action: the rule denies everything", cnpol("p", admin, 10, subj, cin("Allow", "", nil, cNS(sel("team", "none")))), "spec.ingress[0].action", []flow{
			{"y/a", "x/a", tcp, 80, false}, {"x/b", "x/c", icmp, 0, false}, {"x/a", "y/a", tcp, 80, true},
		}},
		{"empty action", cnpol("p", admin, 10, subj, ceg("", "", nil, cNS(all))), "spec.egress[0].action", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"Deny peer with no field set: denies everything", cnpol("p", admin, 10, subj, cin(deny, "", nil, cpeer{})), "spec.ingress[0].from[0]", []flow{
			{"y/a", "x/a", tcp, 80, false}, {"z/c", "x/b", udp, 53, false},
		}},
		{"Pass peer with no field set: denies everything", cnpol("p", admin, 10, subj, ceg(pass, "", protos(cTCP(num(1))), cNS(all), cpeer{})), "spec.egress[0].to[1]", []flow{
			{"x/a", "8.8.8.8", udp, 53, false}, {"x/a", "y/a", tcp, 80, false},
		}},
		{"Accept peer with no field set: the peer matches nothing", cnpol("p", admin, 10, subj, cin(accept, "", nil, cpeer{}, cNS(teamB))), "spec.ingress[0].from[0]", []flow{
			{"y/a", "x/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, false},
		}},
		{"Deny peer with two fields set", cnpol("p", admin, 10, subj, ceg(deny, "", nil, cpeer{Namespaces: teamB, Networks: []cnpv1.CIDR{"10.9.0.0/16"}})), "spec.egress[0].to[0]", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"Accept peer with two fields set", cnpol("p", admin, 10, subj, cin(accept, "", nil, cpeer{Namespaces: teamB, Pods: &cnpv1.NamespacedPod{}})), "spec.ingress[0].from[0]", []flow{
			{"y/a", "x/a", tcp, 80, false},
		}},
		{"Deny protocol with none set", cnpol("p", admin, 10, subj, cin(deny, "", protos(cproto{}), cNS(teamB))), "spec.ingress[0].protocols[0]", []flow{
			{"y/a", "x/a", udp, 9, false}, {"z/c", "x/a", icmp, 0, false},
		}},
		{"Accept protocol with none set: matches less", cnpol("p", admin, 10, subj, cin(accept, "", protos(cproto{}, cUDP(num(53))), cNS(teamB))), "spec.ingress[0].protocols[0]", []flow{
			{"y/a", "x/a", udp, 53, true}, {"y/a", "x/a", tcp, 80, false},
		}},
		{"Accept protocol with two set", cnpol("p", admin, 10, subj, cin(accept, "", protos(cproto{TCP: cTCP(num(80)).TCP, UDP: cUDP(num(80)).UDP}), cNS(teamB))), "spec.ingress[0].protocols[0]", []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "x/a", udp, 80, false},
		}},
		{"Accept tcp without a port", cnpol("p", admin, 10, subj, cin(accept, "", protos(cTCP(nil), cUDP(num(53))), cNS(teamB))), "spec.ingress[0].protocols[0].tcp.destinationPort", []flow{
			{"y/a", "x/a", udp, 53, true}, {"y/a", "x/a", tcp, 80, false},
		}},
		{"Deny port 0", cnpol("p", admin, 10, subj, cin(deny, "", protos(cTCP(num(0))), cNS(teamB))), "spec.ingress[0].protocols[0].tcp.destinationPort", []flow{
			{"y/a", "x/b", udp, 1, false},
		}},
		{"Accept port 70000", cnpol("p", admin, 10, subj, cin(accept, "", protos(cUDP(num(70000)), cTCP(num(80))), cNS(teamB))), "spec.ingress[0].protocols[0].udp.destinationPort", []flow{
			{"y/a", "x/a", udp, 70000 - 65536, false}, {"y/a", "x/a", tcp, 80, true},
		}},
		{"Pass range reversed", cnpol("p", admin, 10, subj, cin(pass, "", protos(cSCTP(crange(90, 80))), cNS(teamB))), "spec.ingress[0].protocols[0].sctp.destinationPort.range", []flow{
			{"y/a", "x/a", tcp, 443, false},
		}},
		{"Accept range beyond 65535", cnpol("p", admin, 10, subj, cin(accept, "", protos(cTCP(crange(1, 65536))), cNS(teamB))), "spec.ingress[0].protocols[0].tcp.destinationPort.range", []flow{
			{"y/a", "x/a", tcp, 80, false},
		}},
		{"Deny number and range both set", cnpol("p", admin, 10, subj, cin(deny, "", protos(cTCP(&cnpv1.Port{Number: 80, Range: &cnpv1.PortRange{Start: 1, End: 2}})), cNS(teamB))), "spec.ingress[0].protocols[0].tcp.destinationPort", []flow{
			{"y/a", "x/a", udp, 53, false},
		}},
		{"Deny destinationNamedPort too long", cnpol("p", admin, 10, subj, cin(deny, "", protos(cNamed(strings.Repeat("n", 16))), cNS(teamB))), "spec.ingress[0].protocols[0].destinationNamedPort", []flow{
			{"y/a", "x/a", tcp, 80, false},
		}},
		{"Deny peer selector with a bad operator", cnpol("p", admin, 10, subj, cin(deny, "", nil, cNS(badSel()))), "spec.ingress[0].from[0].namespaces", []flow{
			{"y/a", "x/a", tcp, 80, false},
		}},
		{"Accept pods peer with a bad pod selector", cnpol("p", admin, 10, subj, cin(accept, "", nil, cPods(teamB, badSel()), cNS(sel("team", "c")))), "spec.ingress[0].from[0].pods.podSelector", []flow{
			{"y/a", "x/a", tcp, 80, false}, {"z/c", "x/a", tcp, 80, true},
		}},
		{"Deny nodes peer with a bad selector", cnpol("p", admin, 10, subj, ceg(deny, "", nil, cNodes(badSel()))), "spec.egress[0].to[0].nodes", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"Deny networks with a bad CIDR", cnpol("p", admin, 10, subj, ceg(deny, "", nil, cNets("10.0.0.0/8", "10.0.0.0/33"))), "spec.egress[0].to[0].networks[1]", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"Accept networks with a bad CIDR: the rest of the peer stays", cnpol("p", admin, 10, subj,
			ceg(accept, "", nil, cNets("no-cidr", "8.8.8.0/24")), ceg(deny, "", nil, cNets("0.0.0.0/0"))), "spec.egress[0].to[0].networks[0]", []flow{
			{"x/a", "8.8.8.8", tcp, 443, true}, {"x/a", "1.1.1.1", tcp, 443, false},
		}},
		{"Pass domainNames: denies everything", cnpol("p", admin, 10, subj, ceg(pass, "", nil, cDomains("example.com"))), "spec.egress[0].to[0].domainNames", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"Deny rule with an empty from", cnpol("p", admin, 10, subj, cin(deny, "", nil)), "spec.ingress[0].from", []flow{
			{"y/a", "x/a", tcp, 80, false},
		}},
		{"Accept rule with an empty to: matches nothing", cnpol("p", admin, 10, subj, ceg(accept, "", nil), ceg(deny, "", nil, cNets("0.0.0.0/0"))), "spec.egress[0].to", []flow{
			{"x/a", "8.8.8.8", tcp, 443, false},
		}},
		{"subject with no field set: every pod", cnpol("p", admin, 10, cnpv1.ClusterNetworkPolicySubject{}, cin(deny, "", nil, cNS(sel("team", "c")))), "spec.subject", []flow{
			{"z/c", "y/a", tcp, 80, false}, {"z/c", "x/a", tcp, 80, false}, {"x/b", "y/a", tcp, 80, true},
		}},
		{"subject with both fields set: every pod", cnpol("p", admin, 10, cnpv1.ClusterNetworkPolicySubject{Namespaces: teamB, Pods: &cnpv1.NamespacedPod{}},
			cin(deny, "", nil, cNS(sel("team", "c")))), "spec.subject", []flow{
			{"z/c", "y/a", tcp, 80, false}, {"z/c", "x/b", tcp, 80, false},
		}},
		{"subject with a bad namespace selector: every pod", cnpol("p", admin, 10, subjNS(badSel()), cin(deny, "", nil, cNS(sel("team", "c")))), "spec.subject.namespaces", []flow{
			{"z/c", "y/a", tcp, 80, false},
		}},
		{"subject pods with a bad namespace selector", cnpol("p", admin, 10, subjPods(badSel(), all), cin(deny, "", nil, cNS(sel("team", "c")))), "spec.subject.pods.namespaceSelector", []flow{
			{"z/c", "y/a", tcp, 80, false},
		}},
		{"subject pods with a bad pod selector", cnpol("p", admin, 10, subjPods(all, badSel()), cin(deny, "", nil, cNS(sel("team", "c")))), "spec.subject.pods.podSelector", []flow{
			{"z/c", "y/a", tcp, 80, false},
		}},
		{"nothing at all", &cnp{}, "spec.tier", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := cnpTestState()
			if err := s.SetPolicy(policy("x", "deny", nil)); err != nil {
				t.Fatal(err)
			}
			// a valid Admin policy at the last priority, Accepting UDP 5353
			// from team b into x
			if err := s.SetClusterPolicy(cnpol("valid", admin, 1000, subjNS(sel("team", "a")), cin(accept, "", protos(cUDP(num(5353))), cNS(teamB)))); err != nil {
				t.Fatal(err)
			}
			err := s.SetClusterPolicy(c.c)
			var ce *ClusterPolicyError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T), want a *ClusterPolicyError", err, err)
			}
			if !strings.Contains(err.Error(), c.field) || !strings.HasPrefix(ce.Field, c.field) || ce.Effect == "" {
				t.Errorf("error %q (field %q), want field %q", err, ce.Field, c.field)
			}
			if s.RefusedClusterPolicies()[c.c.Name] == nil || len(s.RefusedClusterPolicies()) != 1 {
				t.Errorf("refused: %v", s.RefusedClusterPolicies())
			}
			for n, cidrs := range nodeCIDRs {
				checkRuleset(t, s.Compile(n, cidrs))
			}
			for _, f := range c.flows {
				src, dst := f.addrs(false)
				if got := clusterAllows(s, nodeCIDRs, src, dst, f.proto, f.port); got != f.allowed {
					t.Errorf("%s -> %s %d/%d: allowed=%v, want %v", src, dst, f.proto, f.port, got, f.allowed)
				}
				if v := s.Explain(src, dst, f.proto, f.port); v.Allowed != f.allowed {
					t.Errorf("Explain %s -> %s %d/%d: allowed=%v, want %v\n%s", src, dst, f.proto, f.port, v.Allowed, f.allowed, v)
				}
			}
		})
	}
}

// cnpFuzzSeeds are JSON ClusterNetworkPolicies: valid ones over the whole
// API and broken ones.
var cnpFuzzSeeds = []string{
	`{"metadata":{"name":"a"},"spec":{"tier":"Admin","priority":10,"subject":{"namespaces":{}},"ingress":[{"action":"Deny","from":[{"namespaces":{"matchLabels":{"team":"b"}}}]}]}}`,
	`{"metadata":{"name":"b"},"spec":{"tier":"Baseline","priority":0,"subject":{"pods":{"namespaceSelector":{},"podSelector":{"matchLabels":{"app":"a"}}}},"egress":[{"name":"r","action":"Accept","to":[{"networks":["10.0.0.0/8","fd00::/8"]},{"nodes":{"matchExpressions":[{"key":"role","operator":"In","values":["control"]}]}}],"protocols":[{"tcp":{"destinationPort":{"number":443}}},{"udp":{"destinationPort":{"range":{"start":50,"end":60}}}}]}]}}`,
	`{"metadata":{"name":"c"},"spec":{"tier":"Admin","priority":1000,"subject":{"namespaces":{"matchLabels":{"team":"a"}}},"ingress":[{"action":"Pass","from":[{"pods":{"namespaceSelector":{},"podSelector":{}}}],"protocols":[{"destinationNamedPort":"http"},{"sctp":{"destinationPort":{"number":9999}}}]}],"egress":[{"action":"Deny","to":[{"namespaces":{}}]}]}}`,
	`{"metadata":{"name":"d"},"spec":{"tier":"Tier0","priority":-4,"subject":{},"ingress":[{"action":"Allow","from":[{}]}],"egress":[{"action":"Pass","to":[{"domainNames":["example.com"]}]}]}}`,
	`{"metadata":{"name":"e"},"spec":{"tier":"Admin","priority":3,"subject":{"namespaces":{"matchExpressions":[{"key":"a","operator":"Foo"}]}},"egress":[{"action":"Accept","to":[{"networks":["10.0.0.0/33","::ffff:10.0.0.0/104","010.0.0.0/8"]}],"protocols":[{},{"tcp":{"destinationPort":{"number":0}}},{"tcp":{"destinationPort":{"range":{"start":9,"end":1}}}},{"udp":{}, "tcp":{}}]}]}}`,
	`{"metadata":{"name":"f"},"spec":{"tier":"Baseline","priority":5,"subject":{"namespaces":{}},"ingress":[{"action":"Deny","from":[]}],"egress":[{"action":"Accept","to":[{"namespaces":{},"pods":{"podSelector":{}}}]}]}}`,
	`{}`,
}

// FuzzClusterPolicy: any ClusterNetworkPolicy (JSON into the v1beta1
// type) next to a valid one and a NetworkPolicy: SetClusterPolicy,
// Compile and Allows never panic, errors are *ClusterPolicyError, Compile
// is deterministic (again, and on a fresh State), and a policy accepted
// without error agrees with the oracle.
func FuzzClusterPolicy(f *testing.F) {
	for _, s := range cnpFuzzSeeds {
		f.Add([]byte(s))
	}
	flows := []flow{
		{"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", udp, 53, false}, {"x/a", "z/c", sctp, 9999, false},
		{"10.0.1.1", "8.8.8.8", tcp, 443, false}, {"10.0.1.1", "192.168.0.2", tcp, 6443, false},
		{"8.8.8.8", "10.0.1.2", icmp, 0, false}, {"x/c", "y/b", tcp, 8080, false},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c cnp
		if json.Unmarshal(data, &c) != nil {
			return
		}
		if c.Name == "" {
			c.Name = "fuzz"
		}
		build := func() (*State, error) {
			s := cnpTestState()
			if err := s.SetPolicy(policy("x", "allow-b", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b"))))); err != nil {
				t.Fatal(err)
			}
			if err := s.SetClusterPolicy(cnpol("valid", baseline, 500, subjNS(sel()), cin(deny, "", nil, cNS(sel("team", "c"))))); err != nil {
				t.Fatal(err)
			}
			return s, s.SetClusterPolicy(c.DeepCopy())
		}
		s, err := build()
		var ce *ClusterPolicyError
		if err != nil && !errors.As(err, &ce) {
			t.Fatalf("error %v (%T)", err, err)
		}
		s2, _ := build()
		for n, cidrs := range nodeCIDRs {
			rs := s.Compile(n, cidrs)
			checkRuleset(t, rs)
			s.ix = nil
			if again := s.Compile(n, cidrs); !reflect.DeepEqual(rs, again) {
				t.Fatalf("node %s: recompiling differs", n)
			}
			if other := s2.Compile(n, cidrs); !reflect.DeepEqual(rs, other) {
				t.Fatalf("node %s: a fresh State compiles differently", n)
			}
		}
		var o *cnpOracle
		if err == nil {
			o = newOracle(s, testNodes(), []*pol{policy("x", "allow-b", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b"))))},
				[]*cnp{cnpol("valid", baseline, 500, subjNS(sel()), cin(deny, "", nil, cNS(sel("team", "c")))), &c})
		}
		for _, fl := range flows {
			for _, v6 := range []bool{false, true} {
				src, dst := fl.addrs(v6)
				if src.Is4() != dst.Is4() {
					continue
				}
				got := clusterAllows(s, nodeCIDRs, src, dst, fl.proto, fl.port)
				if v := s.Explain(src, dst, fl.proto, fl.port); v.Allowed != got {
					t.Fatalf("%s -> %s %d/%d: compiled %v, Explain %v\n%s", src, dst, fl.proto, fl.port, got, v.Allowed, v)
				}
				if o != nil {
					if want := o.allows(src, dst, fl.proto, fl.port); !o.unsure && got != want {
						t.Fatalf("%s -> %s %d/%d: compiled %v, oracle %v", src, dst, fl.proto, fl.port, got, want)
					}
				}
			}
		}
	})
}

// the JSON seeds must be what they say: the valid ones accepted, the
// broken ones refused.
func TestCNPFuzzSeeds(t *testing.T) {
	for i, js := range cnpFuzzSeeds {
		var c cnp
		if err := json.Unmarshal([]byte(js), &c); err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		err := cnpTestState().SetClusterPolicy(&c)
		if (err == nil) != (i < 3) {
			t.Errorf("seed %d: error %v", i, err)
		}
	}
}

// TestFromNodeHostile: a Node's status.addresses are whatever its kubelet
// (or anyone with node rights) wrote: hostnames, garbage, zoned and mapped
// addresses, duplicates. Only plain IPs become nodes-peer addresses, and
// a node whose addresses are all garbage selects nothing.
func TestFromNodeHostile(t *testing.T) {
	n := FromNode(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"role": "infra"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node-1"},
			{Type: corev1.NodeInternalIP, Address: "not-an-ip"},
			{Type: corev1.NodeInternalIP, Address: "fe80::1%eth0"},
			{Type: corev1.NodeInternalIP, Address: "::ffff:10.0.0.1"},
			{Type: corev1.NodeExternalIP, Address: " 10.0.0.1 "},
			{Type: corev1.NodeInternalIP, Address: "10.0.0.1/24"},
			{Type: corev1.NodeInternalIP, Address: ""},
			{Type: corev1.NodeInternalIP, Address: "fd00::1"},
		}},
	})
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	if !slices.Equal(n.IPs, want) {
		t.Fatalf("FromNode IPs %v, want %v", n.IPs, want)
	}
	s := NewState()
	if s.SetNode(n) {
		t.Error("SetNode says a Ruleset can change with no nodes peer anywhere")
	}
	garbage := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "g", Labels: map[string]string{"role": "infra"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "999.1.1.1"}}}})
	s.SetNode(garbage)
	if got := s.nodeRanges([]labels.Selector{labels.SelectorFromSet(labels.Set{"role": "infra"})}); !slices.Equal(got, PrefixRanges([]netip.Prefix{
		netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("fd00::1/128")})) {
		t.Fatalf("nodes peer ranges %v: want n's two addresses only", got)
	}
}
