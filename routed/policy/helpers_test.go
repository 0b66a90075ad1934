package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// test cluster: two nodes, three namespaces.
//
//	node n1: PodCIDRs 10.0.1.0/24, fd00::1:0/112; node IP 192.168.0.1
//	node n2: PodCIDRs 10.0.2.0/24, fd00::2:0/112; node IP 192.168.0.2
var nodeCIDRs = map[string][]netip.Prefix{
	"n1": {netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd00::1:0/112")},
	"n2": {netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("fd00::2:0/112")},
}

var a = netip.MustParseAddr

func testState() *State {
	s := NewState()
	s.SetNamespace(Namespace{Name: "x", Labels: map[string]string{"team": "a"}})
	s.SetNamespace(Namespace{Name: "y", Labels: map[string]string{"team": "b"}})
	s.SetNamespace(Namespace{Name: "z", Labels: map[string]string{"team": "c"}})
	s.SetPod(Pod{Namespace: "x", Name: "a", Node: "n1", Labels: map[string]string{"app": "a"},
		IPs:   []netip.Addr{a("10.0.1.1"), a("fd00::1:1")},
		Ports: []NamedPort{{"http", ProtoTCP, 80}, {"dns", ProtoUDP, 53}, {"sctp", ProtoSCTP, 9999}}})
	s.SetPod(Pod{Namespace: "x", Name: "b", Node: "n1", Labels: map[string]string{"app": "b"},
		IPs: []netip.Addr{a("10.0.1.2"), a("fd00::1:2")}, Ports: []NamedPort{{"http", ProtoTCP, 8080}}})
	s.SetPod(Pod{Namespace: "x", Name: "c", Node: "n2", Labels: map[string]string{"app": "c"},
		IPs: []netip.Addr{a("10.0.2.1"), a("fd00::2:1")}, Ports: []NamedPort{{"http", ProtoTCP, 81}}})
	s.SetPod(Pod{Namespace: "y", Name: "a", Node: "n2", Labels: map[string]string{"app": "a"},
		IPs: []netip.Addr{a("10.0.2.2"), a("fd00::2:2")}})
	s.SetPod(Pod{Namespace: "y", Name: "b", Node: "n1", Labels: map[string]string{"app": "b"},
		IPs: []netip.Addr{a("10.0.1.3"), a("fd00::1:3")}})
	s.SetPod(Pod{Namespace: "z", Name: "c", Node: "n2", Labels: map[string]string{"app": "c"},
		IPs: []netip.Addr{a("10.0.2.3"), a("fd00::2:3")}})
	// hostNetwork pods: the nodes' addresses, labelled like x/a
	s.SetPod(Pod{Namespace: "x", Name: "host1", Node: "n1", Labels: map[string]string{"app": "a"},
		IPs: []netip.Addr{a("192.168.0.1")}, HostNetwork: true, Ports: []NamedPort{{"http", ProtoTCP, 80}}})
	s.SetPod(Pod{Namespace: "x", Name: "host2", Node: "n2", Labels: map[string]string{"app": "a"},
		IPs: []netip.Addr{a("192.168.0.2")}, HostNetwork: true, Ports: []NamedPort{{"http", ProtoTCP, 80}}})
	// a pending pod, no address yet
	s.SetPod(Pod{Namespace: "x", Name: "pending", Node: "n1", Labels: map[string]string{"app": "a"}})
	return s
}

// podAddr is the test cluster's address of pod ns/name, v4 or v6.
var podAddr4 = map[string]netip.Addr{
	"x/a": a("10.0.1.1"), "x/b": a("10.0.1.2"), "x/c": a("10.0.2.1"),
	"y/a": a("10.0.2.2"), "y/b": a("10.0.1.3"), "z/c": a("10.0.2.3"),
}

// nodeOf finds which node's Ruleset has addr as a local pod's.
func (s *State) nodeOf(addr netip.Addr) string {
	for _, p := range s.pods {
		if !p.HostNetwork && slices.Contains(p.IPs, addr) {
			return p.Node
		}
	}
	return ""
}

// clusterAllows is the compiled answer: the AND of the Allows of the
// Rulesets of the nodes of src and dst (one node when both are there or
// only one is a pod).
func clusterAllows(s *State, cidrs map[string][]netip.Prefix, src, dst netip.Addr, proto uint8, port uint16) bool {
	nodes := map[string]bool{}
	for _, x := range []netip.Addr{src, dst} {
		if n := s.nodeOf(x); n != "" {
			nodes[n] = true
		}
	}
	for n := range nodes {
		rs := s.Compile(n, cidrs[n])
		if !rs.Allows(src, dst, proto, port) {
			return false
		}
	}
	return true
}

// --- policy builders

type pol = networkingv1.NetworkPolicy

func policy(ns, name string, sel map[string]string, mod ...func(*pol)) *pol {
	p := &pol{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}}}
	for _, m := range mod {
		m(p)
	}
	return p
}

func ptypes(ts ...networkingv1.PolicyType) func(*pol) {
	return func(p *pol) { p.Spec.PolicyTypes = ts }
}

func ingress(ports []networkingv1.NetworkPolicyPort, from ...networkingv1.NetworkPolicyPeer) func(*pol) {
	return func(p *pol) {
		p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports, From: from})
	}
}

func egress(ports []networkingv1.NetworkPolicyPort, to ...networkingv1.NetworkPolicyPeer) func(*pol) {
	return func(p *pol) {
		p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{Ports: ports, To: to})
	}
}

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func podPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}

func nsPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func bothPeer(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func blockPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func port(proto string, p any, end ...int32) networkingv1.NetworkPolicyPort {
	out := networkingv1.NetworkPolicyPort{}
	if proto != "" {
		pr := corev1.Protocol(proto)
		out.Protocol = &pr
	}
	switch v := p.(type) {
	case int:
		x := intstr.FromInt32(int32(v))
		out.Port = &x
	case string:
		x := intstr.FromString(v)
		out.Port = &x
	case nil:
	default:
		panic(fmt.Sprintf("port %T", p))
	}
	if len(end) > 0 {
		out.EndPort = &end[0]
	}
	return out
}

func ports(ps ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return ps }

// flow is one connection's first packet.
type flow struct {
	src, dst string // "ns/name" of a test pod (IPv4 address), or an address
	proto    uint8
	port     uint16
	allowed  bool
}

func (f flow) addrs(v6 bool) (netip.Addr, netip.Addr) {
	return resolve(f.src, v6), resolve(f.dst, v6)
}

func resolve(s string, v6 bool) netip.Addr {
	if x, ok := podAddr4[s]; ok {
		if v6 {
			b := x.As4()
			return netip.AddrFrom16([16]byte{0xfd, 0, 13: b[2], 15: b[3]})
		}
		return x
	}
	return a(s)
}

// checkRuleset asserts the shape the writer relies on: merged sorted
// peers, disjoint sorted port elements, chains that exist, IDs valid.
func checkRuleset(t *testing.T, rs Ruleset) {
	t.Helper()
	ids := map[string]bool{}
	for _, pc := range rs.Policies {
		if !validID(pc.ID) || ids[pc.ID] {
			t.Errorf("policy %s/%s %s: bad or duplicate ID %q", pc.Namespace, pc.Name, pc.Direction, pc.ID)
		}
		ids[pc.ID] = true
		for i, r := range pc.Rules {
			if r.AnyPeer && len(r.Peers) > 0 || r.AnyPort && len(r.Ports) > 0 {
				t.Errorf("%s rule %d: Any with elements", pc.ID, i)
			}
			for j := 1; j < len(r.Peers); j++ {
				p, q := r.Peers[j-1], r.Peers[j]
				if p.From.Is4() == q.From.Is4() && (q.From.Compare(p.To) <= 0 || (!lastOfFamily(p.To) && p.To.Next() == q.From)) {
					t.Errorf("%s rule %d: peers %v %v overlap or touch (not merged)", pc.ID, i, p, q)
				}
				if q.From.Compare(p.From) <= 0 {
					t.Errorf("%s rule %d: peers not sorted", pc.ID, i)
				}
			}
			for _, p := range r.Peers {
				if p.From.Is4() != p.To.Is4() || p.From.Compare(p.To) > 0 {
					t.Errorf("%s rule %d: bad range %v", pc.ID, i, p)
				}
			}
			for j := range r.Ports {
				for k := j + 1; k < len(r.Ports); k++ {
					p, q := r.Ports[j], r.Ports[k]
					if p.Proto == q.Proto && p.Addrs.From.Is4() == q.Addrs.From.Is4() &&
						p.Addrs.From.Compare(q.Addrs.To) <= 0 && q.Addrs.From.Compare(p.Addrs.To) <= 0 &&
						p.PortFrom <= q.PortTo && q.PortFrom <= p.PortTo {
						t.Errorf("%s rule %d: port elements %v and %v overlap", pc.ID, i, p, q)
					}
				}
			}
		}
	}
	for _, p := range rs.Pods {
		if !validID(p.ID) || ids[p.ID] {
			t.Errorf("pod %s/%s: bad or duplicate ID %q", p.Namespace, p.Name, p.ID)
		}
		ids[p.ID] = true
		for _, id := range append(slices.Clone(p.Ingress), p.Egress...) {
			if !slices.ContainsFunc(rs.Policies, func(pc PolicyChain) bool { return pc.ID == id }) {
				t.Errorf("pod %s/%s jumps to missing chain %s", p.Namespace, p.Name, id)
			}
		}
		for _, x := range p.Addrs {
			if _, ok := slices.BinarySearchFunc(rs.Known, x, netip.Addr.Compare); !ok {
				t.Errorf("pod %s/%s address %s not in Known", p.Namespace, p.Name, x)
			}
		}
	}
	if !slices.IsSortedFunc(rs.Known, netip.Addr.Compare) {
		t.Errorf("Known not sorted")
	}
}

func validID(id string) bool {
	if len(id) < 10 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
