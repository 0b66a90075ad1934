package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// genCluster is a random cluster: nodes n0..n(N-1), node i with PodCIDRs
// 10.i.0.0/16 and fd00:0:0:i::/64 and node IP 192.168.0.i+1; pods with
// consecutive addresses, random labels and named ports, a few hostNetwork
// and a few without IPs; random policies over all of the API.
type genCluster struct {
	r        *rand.Rand
	s        *State
	nodes    []string
	cidrs    map[string][]netip.Prefix
	podIPs   []netip.Addr // every pod address (not hostNetwork)
	nodeIPs  []netip.Addr
	nsNames  []string
	external []netip.Addr
}

var (
	genApps   = []string{"a", "b", "c", "d", "e"}
	genRoles  = []string{"fe", "be", "db"}
	genTeams  = []string{"a", "b", "c"}
	genNamed  = []string{"http", "dns", "metrics", "sctp", "nope"}
	genPorts  = []int{53, 80, 443, 7777, 8080, 9090}
	genProtos = []corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
)

func newGen(seed uint64, nodes, namespaces, pods, policies int) *genCluster {
	g := &genCluster{r: rand.New(rand.NewPCG(seed, 1)), s: NewState(), cidrs: map[string][]netip.Prefix{}}
	for i := range nodes {
		n := fmt.Sprintf("n%d", i)
		g.nodes = append(g.nodes, n)
		g.cidrs[n] = []netip.Prefix{
			netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16),
			netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 7: byte(i)}), 64),
		}
		g.nodeIPs = append(g.nodeIPs, netip.AddrFrom4([4]byte{192, 168, 0, byte(i + 1)}))
	}
	g.external = []netip.Addr{a("8.8.8.8"), a("1.1.1.1"), a("172.16.5.5"), a("2001:db8::1"), a("2001:db8::2")}
	for i := range namespaces {
		ns := fmt.Sprintf("ns%d", i)
		g.nsNames = append(g.nsNames, ns)
		l := map[string]string{}
		if g.r.IntN(4) > 0 {
			l["team"] = genTeams[g.r.IntN(len(genTeams))]
		}
		if g.r.IntN(2) == 0 {
			l["env"] = []string{"prod", "dev"}[g.r.IntN(2)]
		}
		g.s.SetNamespace(Namespace{Name: ns, Labels: l})
	}
	perNode := make([]int, nodes)
	for i := range pods {
		node := g.r.IntN(nodes)
		p := Pod{Namespace: g.nsNames[g.r.IntN(namespaces)], Name: fmt.Sprintf("p%d", i), Node: g.nodes[node],
			Labels: map[string]string{"app": genApps[g.r.IntN(len(genApps))]}}
		if g.r.IntN(3) > 0 {
			p.Labels["role"] = genRoles[g.r.IntN(len(genRoles))]
		}
		switch x := g.r.IntN(20); {
		case x == 0:
			p.HostNetwork = true
			p.IPs = []netip.Addr{g.nodeIPs[node]}
		case x == 1: // pending
		default:
			k := perNode[node] + 2
			perNode[node]++
			v4 := netip.AddrFrom4([4]byte{10, byte(node), byte(k >> 8), byte(k)})
			v6 := netip.AddrFrom16([16]byte{0xfd, 0, 7: byte(node), 14: byte(k >> 8), 15: byte(k)})
			switch g.r.IntN(4) {
			case 0:
				p.IPs = []netip.Addr{v4}
			case 1:
				p.IPs = []netip.Addr{v6}
			default:
				p.IPs = []netip.Addr{v4, v6}
			}
			g.podIPs = append(g.podIPs, p.IPs...)
		}
		for _, name := range genNamed[:4] {
			if g.r.IntN(2) == 0 {
				proto := map[string]uint8{"http": ProtoTCP, "dns": ProtoUDP, "metrics": ProtoTCP, "sctp": ProtoSCTP}[name]
				if g.r.IntN(6) == 0 {
					proto = ProtoUDP // a name whose protocol a policy may not ask for
				}
				p.Ports = append(p.Ports, NamedPort{Name: name, Protocol: proto, Port: uint16(genPorts[g.r.IntN(len(genPorts))])})
			}
		}
		g.s.SetPod(p)
	}
	for i := range policies {
		if err := g.s.SetPolicy(g.policy(i)); err != nil {
			panic(err)
		}
	}
	return g
}

func (g *genCluster) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

func (g *genCluster) selector(keys map[string][]string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		vals := keys[k]
		switch g.r.IntN(6) {
		case 0, 1:
			if s.MatchLabels == nil {
				s.MatchLabels = map[string]string{}
			}
			s.MatchLabels[k] = g.pick(vals)
		case 2:
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k,
				Operator: metav1.LabelSelectorOpIn, Values: []string{g.pick(vals), g.pick(vals)}})
		case 3:
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k,
				Operator: metav1.LabelSelectorOpNotIn, Values: []string{g.pick(vals)}})
		case 4:
			op := metav1.LabelSelectorOpExists
			if g.r.IntN(2) == 0 {
				op = metav1.LabelSelectorOpDoesNotExist
			}
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: op})
		}
	}
	return s
}

func (g *genCluster) podSelector() *metav1.LabelSelector {
	return g.selector(map[string][]string{"app": genApps, "role": genRoles})
}

func (g *genCluster) nsSelector() *metav1.LabelSelector {
	if g.r.IntN(5) == 0 {
		return sel("kubernetes.io/metadata.name", g.pick(g.nsNames))
	}
	return g.selector(map[string][]string{"team": genTeams, "env": {"prod", "dev"}})
}

func (g *genCluster) prefix(p netip.Addr, bits int) string {
	return netip.PrefixFrom(p, bits).Masked().String()
}

func (g *genCluster) ipBlock() networkingv1.NetworkPolicyPeer {
	var cidr string
	var inside func() netip.Addr
	node := g.r.IntN(len(g.nodes))
	switch g.r.IntN(6) {
	case 0:
		cidr = "0.0.0.0/0"
	case 1:
		cidr = "::/0"
	case 2:
		cidr = g.cidrs[g.nodes[node]][0].String()
	case 3:
		cidr = g.cidrs[g.nodes[node]][1].String()
	case 4:
		cidr = "8.0.0.0/7"
	default:
		pa := g.podIPs[g.r.IntN(len(g.podIPs))]
		if pa.Is4() {
			cidr = g.prefix(pa, 24+g.r.IntN(9))
		} else {
			cidr = g.prefix(pa, 112+g.r.IntN(17))
		}
	}
	c := netip.MustParsePrefix(cidr)
	inside = func() netip.Addr {
		for range 50 {
			x := g.podIPs[g.r.IntN(len(g.podIPs))]
			if c.Contains(x) {
				return x
			}
		}
		return c.Addr()
	}
	var except []string
	for range g.r.IntN(4) {
		x := inside()
		var e string
		if x.Is4() {
			e = g.prefix(x, max(c.Bits()+1, 24+g.r.IntN(9)))
		} else {
			e = g.prefix(x, max(c.Bits()+1, 112+g.r.IntN(17)))
		}
		if c.Bits() < x.BitLen() {
			except = append(except, e)
		}
	}
	if g.r.IntN(10) == 0 {
		except = append(except, "203.0.113.0/24") // outside: ignored
	}
	return blockPeer(cidr, except...)
}

func (g *genCluster) peers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range g.r.IntN(4) {
		switch g.r.IntN(4) {
		case 0:
			out = append(out, podPeer(g.podSelector()))
		case 1:
			out = append(out, nsPeer(g.nsSelector()))
		case 2:
			out = append(out, bothPeer(g.nsSelector(), g.podSelector()))
		default:
			out = append(out, g.ipBlock())
		}
	}
	return out
}

func (g *genCluster) ports() []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range g.r.IntN(4) {
		p := networkingv1.NetworkPolicyPort{}
		if pr := genProtos[g.r.IntN(len(genProtos))]; pr != "" {
			p.Protocol = &pr
		}
		switch g.r.IntN(5) {
		case 0: // every port of the protocol
		case 1:
			x := intstr.FromString(g.pick(genNamed))
			p.Port = &x
		case 2:
			from := genPorts[g.r.IntN(len(genPorts))]
			x := intstr.FromInt32(int32(from))
			end := int32(from + g.r.IntN(100))
			p.Port, p.EndPort = &x, &end
		default:
			x := intstr.FromInt32(int32(genPorts[g.r.IntN(len(genPorts))]))
			p.Port = &x
		}
		out = append(out, p)
	}
	return out
}

func (g *genCluster) policy(i int) *pol {
	p := &pol{ObjectMeta: metav1.ObjectMeta{Namespace: g.pick(g.nsNames), Name: fmt.Sprintf("pol%d", i)}}
	if g.r.IntN(5) > 0 {
		p.Spec.PodSelector = *g.podSelector()
	}
	switch g.r.IntN(4) {
	case 1:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{pIngress}
	case 2:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{pEgress}
	case 3:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{pIngress, pEgress}
	}
	for range g.r.IntN(3) {
		p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: g.peers(), Ports: g.ports()})
	}
	for range g.r.IntN(3) {
		p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: g.peers(), Ports: g.ports()})
	}
	return p
}

// flowAddrs picks a source and destination of one family among pod
// addresses, node addresses and outside addresses.
func (g *genCluster) flowAddrs() (netip.Addr, netip.Addr) {
	pick := func(v4 bool) netip.Addr {
		for {
			var x netip.Addr
			switch n := g.r.IntN(10); {
			case n < 7:
				x = g.podIPs[g.r.IntN(len(g.podIPs))]
			case n < 8:
				x = g.nodeIPs[g.r.IntN(len(g.nodeIPs))]
			default:
				x = g.external[g.r.IntN(len(g.external))]
			}
			if x.Is4() == v4 {
				return x
			}
		}
	}
	v4 := g.r.IntN(2) == 0
	src := pick(v4)
	if g.r.IntN(50) == 0 {
		return src, src
	}
	return src, pick(v4)
}

func (g *genCluster) flowPort(v4 bool) (uint8, uint16) {
	switch g.r.IntN(10) {
	case 0:
		if v4 {
			return 1, 0
		}
		return 58, 0
	case 1, 2:
		return ProtoUDP, uint16(genPorts[g.r.IntN(len(genPorts))])
	case 3:
		return ProtoSCTP, uint16(genPorts[g.r.IntN(len(genPorts))])
	case 4:
		return ProtoTCP, uint16(1 + g.r.IntN(65535))
	case 5:
		return ProtoTCP, uint16(genPorts[g.r.IntN(len(genPorts))] + g.r.IntN(120))
	}
	return ProtoTCP, uint16(genPorts[g.r.IntN(len(genPorts))])
}
