package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestCompileShape checks what a node's Ruleset holds: its own pods only
// (an arriving one with its chains and no address), chains only for
// policies selecting one of them, merged peers, stable IDs.
func TestCompileShape(t *testing.T) {
	s := testState()
	// three consecutive addresses on n2 become one range
	s.SetPod(Pod{Namespace: "z", Name: "d", Node: "n2", Labels: map[string]string{"app": "c"}, IPs: []netip.Addr{a("10.0.2.4")}})
	s.SetPod(Pod{Namespace: "z", Name: "e", Node: "n2", Labels: map[string]string{"app": "c"}, IPs: []netip.Addr{a("10.0.2.5")}})
	for _, p := range []*pol{
		policy("x", "to-a", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "c")))),
		policy("x", "to-c", map[string]string{"app": "c"}, ptypes(pEgress)), // selects x/c, on n2 only
		policy("x", "nobody", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "nobody")))),
	} {
		if err := s.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	rs := s.Compile("n1", nodeCIDRs["n1"])
	checkRuleset(t, rs)
	wantKnown := []netip.Addr{a("10.0.1.1"), a("10.0.1.2"), a("10.0.1.3"), a("fd00::1:1"), a("fd00::1:2"), a("fd00::1:3")}
	if !slices.Equal(rs.Known, wantKnown) {
		t.Errorf("Known = %v, want %v (n1's pods, no hostNetwork, no pending)", rs.Known, wantKnown)
	}
	if !slices.Equal(rs.LocalPodCIDRs, nodeCIDRs["n1"]) {
		t.Errorf("LocalPodCIDRs = %v", rs.LocalPodCIDRs)
	}
	if len(rs.Pods) != 2 || rs.Pods[0].Namespace != "x" || rs.Pods[0].Name != "a" || rs.Pods[1].Name != "pending" {
		t.Fatalf("Pods = %+v, want x/a and x/pending (arriving: its chains before its addresses)", rs.Pods)
	}
	pa := rs.Pods[0]
	if pp := rs.Pods[1]; len(pp.Addrs) != 0 || !pp.IngressIsolated || pp.EgressIsolated || !slices.Equal(pp.Ingress, pa.Ingress) {
		t.Errorf("x/pending (app=a, arriving) %+v: want x/a's chains and no address", pp)
	}
	if pa.ID != PodID("x", "a") || !pa.IngressIsolated || pa.EgressIsolated ||
		!slices.Equal(pa.Ingress, []string{PolicyID("x", "nobody", Ingress), PolicyID("x", "to-a", Ingress)}) {
		t.Errorf("x/a chains %+v", pa)
	}
	if !slices.Equal(pa.Addrs, []netip.Addr{a("10.0.1.1"), a("fd00::1:1")}) {
		t.Errorf("x/a addrs %v", pa.Addrs)
	}
	if len(rs.Policies) != 2 {
		t.Fatalf("Policies = %+v, want x/nobody and x/to-a ingress (x/to-c selects no pod of n1)", rs.Policies)
	}
	nobody, toA := rs.Policies[0], rs.Policies[1]
	if nobody.Name != "nobody" || len(nobody.Rules) != 1 || nobody.Rules[0].AnyPeer || nobody.Rules[0].Peers != nil || !nobody.Rules[0].AnyPort {
		t.Errorf("a rule whose selector selects nothing is kept, empty: %+v", nobody)
	}
	want := []Range{{a("10.0.2.3"), a("10.0.2.5")}, {a("fd00::2:3"), a("fd00::2:3")}}
	if toA.Direction != Ingress || !reflect.DeepEqual(toA.Rules[0].Peers, want) {
		t.Errorf("to-a peers %v, want %v", toA.Rules[0].Peers, want)
	}
	// deterministic: compiling again gives the same Ruleset
	if again := s.Compile("n1", nodeCIDRs["n1"]); !reflect.DeepEqual(rs, again) {
		t.Errorf("two compiles differ:\n%+v\n%+v", rs, again)
	}
	rs2 := s.Compile("n2", nodeCIDRs["n2"])
	checkRuleset(t, rs2)
	var names []string
	for _, p := range rs2.Pods {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if !slices.Equal(names, []string{"x/c"}) || !rs2.Pods[0].EgressIsolated || rs2.Pods[0].IngressIsolated {
		t.Errorf("n2 pods %+v", rs2.Pods)
	}
}

// TestIDs checks IDs are short, nft-safe, stable and distinct per
// direction.
func TestIDs(t *testing.T) {
	in, eg := PolicyID("ns", "p", Ingress), PolicyID("ns", "p", Egress)
	if in == eg || len(in) != 12 || !validID(in) || PolicyID("ns", "p", Ingress) != in {
		t.Errorf("policy IDs %q %q", in, eg)
	}
	if PodID("ns", "p") == PodID("n", "sp") || len(PodID("ns", "p")) != 12 {
		t.Errorf("pod IDs")
	}
	ids := newIDs()
	x := ids.id("a")
	// force a collision: pretend another key took a's 12 digits
	ids2 := newIDs()
	ids2.used[x] = "other"
	if y := ids2.id("a"); y == x || !strings.HasPrefix(y, x) || len(y) != 16 {
		t.Errorf("collision gave %q", y)
	}
	if ids.id("a") != x {
		t.Errorf("not stable")
	}
}

// TestUnknownLocalAddress: a local PodCIDR address the engine does not
// know is dropped both ways; an address of another node's PodCIDR is not
// this node's business.
func TestUnknownLocalAddress(t *testing.T) {
	s := testState()
	m := NewMatcher(s.Compile("n1", nodeCIDRs["n1"]))
	for _, c := range []struct {
		src, dst string
		want     bool
	}{
		{"10.0.1.200", "8.8.8.8", false}, {"8.8.8.8", "10.0.1.200", false},
		{"fd00::1:99", "fd00::2:1", false}, {"10.0.1.1", "10.0.1.200", false},
		{"10.0.1.1", "8.8.8.8", true}, {"10.0.2.200", "10.0.1.1", true}, {"8.8.8.8", "10.0.2.200", true},
	} {
		if got := m.Allows(a(c.src), a(c.dst), tcp, 80); got != c.want {
			t.Errorf("%s -> %s: %v, want %v", c.src, c.dst, got, c.want)
		}
	}
}

// TestRefusedPolicy: an invalid policy is refused alone, with a reason; it
// isolates what its podSelector selects and allows nothing; others work.
func TestRefusedPolicy(t *testing.T) {
	tcpP := corev1.ProtocolTCP
	icmpP := corev1.Protocol("ICMP")
	named := intstr.FromString("http")
	p80 := intstr.FromInt32(80)
	p0 := intstr.FromInt32(0)
	p70k := intstr.FromInt32(70000)
	e79, e90 := int32(79), int32(90)
	cases := []struct {
		name  string
		p     *pol
		field string
	}{
		{"invalid cidr", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, blockPeer("10.0.0.0/33"))), "spec.ingress[0].from[0].ipBlock.cidr"},
		{"garbage cidr", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b")), blockPeer("nope"))), "spec.ingress[0].from[1].ipBlock.cidr"},
		{"invalid except", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, blockPeer("10.0.0.0/8", "10.1.0.0/16", "x"))), "spec.ingress[0].from[0].ipBlock.except[1]"},
		{"bad selector operator", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, podPeer(&metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}}))), "spec.ingress[0].from[0].podSelector"},
		{"bad label value", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "no spaces allowed")))), "spec.ingress[0].from[0].namespaceSelector"},
		{"ipBlock with a selector", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, networkingv1.NetworkPolicyPeer{
			IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: sel()})), "spec.ingress[0].from[0]"},
		{"empty peer", policy("x", "bad", map[string]string{"app": "a"}, ingress(nil, networkingv1.NetworkPolicyPeer{})), "spec.ingress[0].from[0]"},
		{"bad protocol", policy("x", "bad", map[string]string{"app": "a"}, ingress(ports(networkingv1.NetworkPolicyPort{Protocol: &icmpP}))), "spec.ingress[0].ports[0].protocol"},
		{"endPort with named port", policy("x", "bad", map[string]string{"app": "a"}, ingress(ports(networkingv1.NetworkPolicyPort{Protocol: &tcpP, Port: &named, EndPort: &e90}))), "spec.ingress[0].ports[0].endPort"},
		{"endPort below port", policy("x", "bad", map[string]string{"app": "a"}, ingress(ports(networkingv1.NetworkPolicyPort{Port: &p80, EndPort: &e79}))), "spec.ingress[0].ports[0].endPort"},
		{"port 0", policy("x", "bad", map[string]string{"app": "a"}, ingress(ports(networkingv1.NetworkPolicyPort{Port: &p0}))), "spec.ingress[0].ports[0].port"},
		{"port 70000", policy("x", "bad", map[string]string{"app": "a"}, egress(ports(networkingv1.NetworkPolicyPort{Port: &p70k}))), "spec.egress[0].ports[0].port"},
		{"endPort without port", policy("x", "bad", map[string]string{"app": "a"}, ingress(ports(networkingv1.NetworkPolicyPort{EndPort: &e90}))), "spec.ingress[0].ports[0].endPort"},
		{"bad policyType", policy("x", "bad", map[string]string{"app": "a"}, ptypes("Sideways"), ingress(nil)), "spec.policyTypes[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := testState()
			// x/b is open to x/c through a good policy; x/a through the
			// same good policy and the bad one
			if err := s.SetPolicy(policy("x", "good", nil, ingress(nil, podPeer(sel("app", "c"))))); err != nil {
				t.Fatal(err)
			}
			err := s.SetPolicy(c.p)
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Field != c.field || pe.Namespace != "x" || pe.Name != "bad" {
				t.Fatalf("SetPolicy: %v, want a PolicyError at %s", err, c.field)
			}
			if got := s.Refused(); len(got) != 1 || got["x/bad"] == nil {
				t.Errorf("Refused() = %v", got)
			}
			for _, n := range []string{"n1", "n2"} {
				checkRuleset(t, s.Compile(n, nodeCIDRs[n]))
			}
			for _, f := range []flow{
				{"x/c", "x/a", tcp, 80, true},  // the good policy still allows
				{"y/a", "x/a", tcp, 80, false}, // the bad one allows nothing
				{"x/c", "x/b", tcp, 80, true}, {"y/a", "x/b", tcp, 80, false},
				{"y/a", "y/b", tcp, 80, true}, // not selected
			} {
				src, dst := f.addrs(false)
				if got := clusterAllows(s, nodeCIDRs, src, dst, f.proto, f.port); got != f.allowed {
					t.Errorf("Ruleset %s -> %s: %v, want %v", f.src, f.dst, got, f.allowed)
				}
				if got := s.Explain(src, dst, f.proto, f.port).Allowed; got != f.allowed {
					t.Errorf("Explain %s -> %s: %v, want %v", f.src, f.dst, got, f.allowed)
				}
			}
			v := s.Explain(a("10.0.2.2"), a("10.0.1.1"), tcp, 80)
			if !strings.Contains(v.Ingress.Reason, "refused, allowing nothing: x/bad") {
				t.Errorf("Explain does not say the policy is refused: %s", v)
			}
			s.DeletePolicy("x", "bad")
			if len(s.Refused()) != 0 {
				t.Errorf("Refused() after the delete: %v", s.Refused())
			}
		})
	}
	// an invalid podSelector selects nothing: nothing is isolated by it
	s := testState()
	err := s.SetPolicy(&pol{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "badsel"}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}}}})
	if err == nil || !strings.Contains(err.Error(), "spec.podSelector") {
		t.Fatalf("bad podSelector: %v", err)
	}
	if rs := s.Compile("n1", nodeCIDRs["n1"]); len(rs.Pods) != 0 || len(rs.Policies) != 0 {
		t.Errorf("a policy whose podSelector does not parse isolated %+v", rs.Pods)
	}
}

// TestNamespaceRelabel: a namespace's labels change between compiles.
func TestNamespaceRelabel(t *testing.T) {
	s := testState()
	if err := s.SetPolicy(policy("x", "p", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "b"))))); err != nil {
		t.Fatal(err)
	}
	src, dst := a("10.0.2.3"), a("10.0.1.1") // z/c -> x/a
	if clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) || s.Explain(src, dst, tcp, 80).Allowed {
		t.Fatal("z/c allowed before the relabel")
	}
	before := s.Compile("n1", nodeCIDRs["n1"])
	s.SetNamespace(Namespace{Name: "z", Labels: map[string]string{"team": "b"}})
	if !clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) || !s.Explain(src, dst, tcp, 80).Allowed {
		t.Error("z/c denied after z got team=b")
	}
	s.SetNamespace(Namespace{Name: "y", Labels: nil})
	if clusterAllows(s, nodeCIDRs, a("10.0.2.2"), dst, tcp, 80) || s.Explain(a("10.0.2.2"), dst, tcp, 80).Allowed {
		t.Error("y/a allowed after y lost team=b")
	}
	s.SetNamespace(Namespace{Name: "y", Labels: map[string]string{"team": "b"}})
	s.SetNamespace(Namespace{Name: "z", Labels: map[string]string{"team": "c"}})
	if after := s.Compile("n1", nodeCIDRs["n1"]); !reflect.DeepEqual(before, after) {
		t.Errorf("relabelled back, the Ruleset differs")
	}
	// a namespace deleted (or not delivered yet) still has its name label
	s.DeleteNamespace("z")
	if err := s.SetPolicy(policy("x", "q", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("kubernetes.io/metadata.name", "z"))))); err != nil {
		t.Fatal(err)
	}
	if !clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) || !s.Explain(src, dst, tcp, 80).Allowed {
		t.Error("z/c denied: a namespace without its object lost kubernetes.io/metadata.name")
	}
}

// TestPodChanges: pods move in and out of selection, gain and lose IPs.
func TestPodChanges(t *testing.T) {
	s := testState()
	if err := s.SetPolicy(policy("x", "p", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("role", "client"))))); err != nil {
		t.Fatal(err)
	}
	src, dst := a("10.0.1.2"), a("10.0.1.1")
	if clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) {
		t.Fatal("allowed before the label")
	}
	s.SetPod(Pod{Namespace: "x", Name: "b", Node: "n1", Labels: map[string]string{"role": "client"}, IPs: []netip.Addr{src}})
	if !clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) || !s.Explain(src, dst, tcp, 80).Allowed {
		t.Error("denied after the label")
	}
	s.DeletePod("x", "b")
	// the address is no pod's now: n1 drops it as an unknown local address
	if clusterAllows(s, nodeCIDRs, src, dst, tcp, 80) {
		t.Error("allowed after the delete")
	}
	// a pod without IPs, then with: the pending x/pending (app=a) on n1
	s.SetPod(Pod{Namespace: "x", Name: "pending", Node: "n1", Labels: map[string]string{"app": "a"}, IPs: []netip.Addr{a("10.0.1.9")}})
	rs := s.Compile("n1", nodeCIDRs["n1"])
	if !slices.Contains(rs.Known, a("10.0.1.9")) || !slices.ContainsFunc(rs.Pods, func(p PodChains) bool { return p.Name == "pending" }) {
		t.Errorf("pending pod with an IP not compiled: %+v", rs.Pods)
	}
	// two pods claim one address: the first by namespace/name owns it
	s.SetPod(Pod{Namespace: "z", Name: "dup", Node: "n1", Labels: map[string]string{"role": "client"}, IPs: []netip.Addr{a("10.0.1.9")}})
	rs = s.Compile("n1", nodeCIDRs["n1"])
	checkRuleset(t, rs)
	for _, p := range rs.Pods {
		if p.Name == "dup" {
			t.Errorf("z/dup got x/pending's address")
		}
	}
}

func TestFromPod(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1",
			InitContainers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "side", ContainerPort: 15000}}}},
			Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
				{ContainerPort: 9000}, {Name: "bad", ContainerPort: 70000}, {Name: "sctp", ContainerPort: 7, Protocol: corev1.ProtocolSCTP},
			}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}, {IP: "junk"}}},
	}
	got := FromPod(p)
	want := Pod{Namespace: "ns", Name: "p", UID: "u1", Node: "n1", Labels: map[string]string{"app": "web"},
		IPs:   []netip.Addr{a("10.0.0.5"), a("fd00::5")},
		Ports: []NamedPort{{"http", ProtoTCP, 8080}, {"dns", ProtoUDP, 53}, {"sctp", ProtoSCTP, 7}, {"side", ProtoTCP, 15000}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromPod:\n got %+v\nwant %+v", got, want)
	}
	p.Labels["app"] = "changed"
	if got.Labels["app"] != "web" {
		t.Error("FromPod kept a reference to the labels")
	}
	p.Status.PodIPs = nil
	if got := FromPod(p); !slices.Equal(got.IPs, []netip.Addr{a("10.0.0.5")}) {
		t.Errorf("podIP fallback: %v", got.IPs)
	}
	p.Status.Phase = corev1.PodSucceeded
	if got := FromPod(p); got.IPs != nil {
		t.Errorf("a terminated pod keeps IPs %v", got.IPs)
	}
	p.Spec.HostNetwork = true
	if !FromPod(p).HostNetwork {
		t.Error("hostNetwork lost")
	}
	ns := FromNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}})
	if !reflect.DeepEqual(ns, Namespace{Name: "ns", Labels: map[string]string{"a": "b"}}) {
		t.Errorf("FromNamespace %+v", ns)
	}
}
