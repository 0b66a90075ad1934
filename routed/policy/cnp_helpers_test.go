package policy

// Builders for ClusterNetworkPolicy tests, the nodes of the test cluster,
// and cnpOracle: an evaluator of the API semantics written straight from
// the API objects (NetworkPolicy and ClusterNetworkPolicy), independent of
// the model's parser, index, compiler and Matcher. It is slow and meant to
// be obviously right.

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

type cnp = cnpv1.ClusterNetworkPolicy

const (
	admin    = cnpv1.AdminTier
	baseline = cnpv1.BaselineTier
	accept   = cnpv1.ClusterNetworkPolicyRuleActionAccept
	deny     = cnpv1.ClusterNetworkPolicyRuleActionDeny
	pass     = cnpv1.ClusterNetworkPolicyRuleActionPass
	icmp6    = uint8(58)
)

func cnpol(name string, tier cnpv1.Tier, prio int32, subj cnpv1.ClusterNetworkPolicySubject, mods ...func(*cnp)) *cnp {
	c := &cnp{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subj}}
	for _, m := range mods {
		m(c)
	}
	return c
}

func subjNS(s *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Namespaces: s}
}

func subjPods(ns, pod *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *ns, PodSelector: *pod}}
}

type cpeer = cnpv1.ClusterNetworkPolicyEgressPeer
type cproto = cnpv1.ClusterNetworkPolicyProtocol

// cin adds an ingress rule; only the Namespaces and Pods of the peers are
// kept (an ingress peer has no other field).
func cin(action cnpv1.ClusterNetworkPolicyRuleAction, name string, protos []cproto, from ...cpeer) func(*cnp) {
	return func(c *cnp) {
		r := cnpv1.ClusterNetworkPolicyIngressRule{Name: name, Action: action, Protocols: protos}
		for _, p := range from {
			r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: p.Namespaces, Pods: p.Pods})
		}
		c.Spec.Ingress = append(c.Spec.Ingress, r)
	}
}

func ceg(action cnpv1.ClusterNetworkPolicyRuleAction, name string, protos []cproto, to ...cpeer) func(*cnp) {
	return func(c *cnp) {
		c.Spec.Egress = append(c.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{Name: name, Action: action, Protocols: protos, To: to})
	}
}

func cNS(s *metav1.LabelSelector) cpeer { return cpeer{Namespaces: s} }

func cPods(ns, pod *metav1.LabelSelector) cpeer {
	return cpeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *ns, PodSelector: *pod}}
}

func cNets(cidrs ...string) cpeer {
	p := cpeer{}
	for _, c := range cidrs {
		p.Networks = append(p.Networks, cnpv1.CIDR(c))
	}
	return p
}

func cNodes(s *metav1.LabelSelector) cpeer { return cpeer{Nodes: s} }

func cDomains(names ...string) cpeer {
	p := cpeer{}
	for _, n := range names {
		p.DomainNames = append(p.DomainNames, cnpv1.DomainName(n))
	}
	return p
}

func protos(ps ...cproto) []cproto { return ps }

func cport(n int32) *cnpv1.Port { return &cnpv1.Port{Number: n} }

func crange(from, to int32) *cnpv1.Port {
	return &cnpv1.Port{Range: &cnpv1.PortRange{Start: from, End: to}}
}

func cTCP(p *cnpv1.Port) cproto {
	return cproto{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: p}}
}

func cUDP(p *cnpv1.Port) cproto {
	return cproto{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: p}}
}

func cSCTP(p *cnpv1.Port) cproto {
	return cproto{SCTP: &cnpv1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: p}}
}

func cNamed(name string) cproto { return cproto{DestinationNamedPort: name} }

// badSel is a selector that does not parse (an unknown operator).
func badSel() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Foo"}}}
}

// testNodes are the Node objects of the test cluster: n1 a worker in zone
// a, n2 the control plane in zone b, each with an IPv4 and an IPv6
// InternalIP, an ExternalIP, and a Hostname entry (no IP).
func testNodes() []*corev1.Node {
	mk := func(name string, l map[string]string, addrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name + ".example"})
		return n
	}
	return []*corev1.Node{
		mk("n1", map[string]string{"role": "worker", "zone": "a"}, "192.168.0.1", "fd00:ffff::1", "203.0.113.1"),
		mk("n2", map[string]string{"role": "control", "zone": "b"}, "192.168.0.2", "fd00:ffff::2"),
	}
}

// cnpTestState is testState with the nodes of testNodes.
func cnpTestState() *State {
	s := testState()
	for _, n := range testNodes() {
		s.SetNode(FromNode(n))
	}
	return s
}

// --- the oracle

// cnpOracle holds the cluster as API objects (pods and namespaces as the
// engine's plain input structs, which carry no logic).
type cnpOracle struct {
	pods  []Pod
	ns    map[string]map[string]string
	nodes []*corev1.Node
	nps   []*networkingv1.NetworkPolicy
	cnps  []*cnp
	// unsure is set when the oracle meets something it does not read
	// (a CIDR netip does not parse): its answer is then not to be used.
	unsure bool
}

// newOracle copies the pods and namespaces the State was given (input
// data only) and takes the policy objects as they were written.
func newOracle(s *State, nodes []*corev1.Node, nps []*networkingv1.NetworkPolicy, cnps []*cnp) *cnpOracle {
	o := &cnpOracle{ns: map[string]map[string]string{}, nodes: nodes, nps: nps, cnps: cnps}
	for _, p := range s.pods {
		o.pods = append(o.pods, *p)
	}
	slices.SortFunc(o.pods, func(a, b Pod) int { return strings.Compare(a.Key(), b.Key()) })
	for name, n := range s.namespaces {
		o.ns[name] = n.Labels
	}
	return o
}

// podAt is the pod (not hostNetwork) that has address x; nil if none.
func (o *cnpOracle) podAt(x netip.Addr) *Pod {
	for i := range o.pods {
		if !o.pods[i].HostNetwork && slices.Contains(o.pods[i].IPs, x) {
			return &o.pods[i]
		}
	}
	return nil
}

func (o *cnpOracle) nsLabels(ns string) labels.Set {
	out := labels.Set{}
	for k, v := range o.ns[ns] {
		out[k] = v
	}
	out["kubernetes.io/metadata.name"] = ns
	return out
}

func (o *cnpOracle) selects(s *metav1.LabelSelector, l labels.Set) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		o.unsure = true
		return false
	}
	return sel.Matches(l)
}

func (o *cnpOracle) cidr(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Is4In6() {
		o.unsure = true
		return netip.Prefix{}, false
	}
	return p, true
}

// allows: both the source's egress and the destination's ingress allow.
func (o *cnpOracle) allows(src, dst netip.Addr, proto uint8, port uint16) bool {
	eg, _ := o.judge(dirEg, src, dst, proto, port)
	in, _ := o.judge(dirIn, src, dst, proto, port)
	return eg && in
}

// judge is one direction: egress at the source pod, ingress at the
// destination pod. by says which tier decided: "", "self", "admin",
// "np", "baseline" or "default".
func (o *cnpOracle) judge(d int, src, dst netip.Addr, proto uint8, port uint16) (allowed bool, by string) {
	me, peer := src, dst
	if d == dirIn {
		me, peer = dst, src
	}
	pod := o.podAt(me)
	if pod == nil {
		return true, ""
	}
	if src == dst {
		return true, "self"
	}
	if v, ok := o.tier(admin, d, pod, peer, dst, proto, port); ok {
		return v, "admin"
	}
	if isolated, v := o.networkPolicies(d, pod, peer, dst, proto, port); isolated {
		return v, "np"
	}
	if v, ok := o.tier(baseline, d, pod, peer, dst, proto, port); ok {
		return v, "baseline"
	}
	return true, "default"
}

// tier: the tier's policies that select pod, by priority then name; the
// first matching rule's Accept or Deny decides, a Pass ends the tier.
func (o *cnpOracle) tier(t cnpv1.Tier, d int, pod *Pod, peer, dst netip.Addr, proto uint8, port uint16) (allowed, decided bool) {
	var cs []*cnp
	for _, c := range o.cnps {
		if c.Spec.Tier == t && o.subjectSelects(c, pod) {
			cs = append(cs, c)
		}
	}
	slices.SortStableFunc(cs, func(a, b *cnp) int {
		if a.Spec.Priority != b.Spec.Priority {
			return int(a.Spec.Priority) - int(b.Spec.Priority)
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, c := range cs {
		type rule struct {
			action cnpv1.ClusterNetworkPolicyRuleAction
			peers  []cpeer
			protos []cproto
		}
		var rules []rule
		if d == dirIn {
			for _, r := range c.Spec.Ingress {
				var ps []cpeer
				for _, f := range r.From {
					ps = append(ps, cpeer{Namespaces: f.Namespaces, Pods: f.Pods})
				}
				rules = append(rules, rule{r.Action, ps, r.Protocols})
			}
		} else {
			for _, r := range c.Spec.Egress {
				rules = append(rules, rule{r.Action, r.To, r.Protocols})
			}
		}
		for _, r := range rules {
			if !o.peersMatch(r.peers, peer) || !o.protosMatch(r.protos, dst, proto, port) {
				continue
			}
			switch r.action {
			case accept:
				return true, true
			case deny:
				return false, true
			case pass:
				return false, false
			}
		}
	}
	return false, false
}

func (o *cnpOracle) subjectSelects(c *cnp, pod *Pod) bool {
	if pod.HostNetwork {
		return false
	}
	sub := c.Spec.Subject
	if sub.Namespaces != nil {
		return o.selects(sub.Namespaces, o.nsLabels(pod.Namespace))
	}
	return o.selects(&sub.Pods.NamespaceSelector, o.nsLabels(pod.Namespace)) &&
		o.selects(&sub.Pods.PodSelector, pod.Labels)
}

func (o *cnpOracle) peersMatch(peers []cpeer, x netip.Addr) bool {
	for _, p := range peers {
		switch {
		case p.Namespaces != nil:
			if pp := o.podAt(x); pp != nil && o.selects(p.Namespaces, o.nsLabels(pp.Namespace)) {
				return true
			}
		case p.Pods != nil:
			if pp := o.podAt(x); pp != nil && o.selects(&p.Pods.NamespaceSelector, o.nsLabels(pp.Namespace)) &&
				o.selects(&p.Pods.PodSelector, pp.Labels) {
				return true
			}
		case p.Nodes != nil:
			for _, n := range o.nodes {
				if !o.selects(p.Nodes, n.Labels) {
					continue
				}
				for _, na := range n.Status.Addresses {
					if ip, err := netip.ParseAddr(na.Address); err == nil && ip == x {
						return true
					}
				}
			}
		case len(p.Networks) > 0:
			for _, c := range p.Networks {
				if pfx, ok := o.cidr(string(c)); ok && pfx.Contains(x) {
					return true
				}
			}
		}
		// domainNames: podnet matches nothing
	}
	return false
}

func (o *cnpOracle) protosMatch(ps []cproto, dst netip.Addr, proto uint8, port uint16) bool {
	if len(ps) == 0 {
		return true
	}
	inPort := func(p *cnpv1.Port) bool {
		switch {
		case p == nil:
			return true
		case p.Range != nil:
			return int32(port) >= p.Range.Start && int32(port) <= p.Range.End
		}
		return int32(port) == p.Number
	}
	for _, p := range ps {
		switch {
		case p.TCP != nil:
			if proto == ProtoTCP && inPort(p.TCP.DestinationPort) {
				return true
			}
		case p.UDP != nil:
			if proto == ProtoUDP && inPort(p.UDP.DestinationPort) {
				return true
			}
		case p.SCTP != nil:
			if proto == ProtoSCTP && inPort(p.SCTP.DestinationPort) {
				return true
			}
		case p.DestinationNamedPort != "":
			if pod := o.podAt(dst); pod != nil && slices.ContainsFunc(pod.Ports, func(np NamedPort) bool {
				return np.Name == p.DestinationNamedPort && np.Protocol == proto && np.Port == port
			}) {
				return true
			}
		}
	}
	return false
}

// networkPolicies: whether a NetworkPolicy isolates pod in direction d,
// and if so whether one of their rules allows.
func (o *cnpOracle) networkPolicies(d int, pod *Pod, peer, dst netip.Addr, proto uint8, port uint16) (isolated, allowed bool) {
	for _, np := range o.nps {
		if np.Namespace != pod.Namespace || !o.selects(&np.Spec.PodSelector, pod.Labels) {
			continue
		}
		in, eg := false, false
		if len(np.Spec.PolicyTypes) == 0 {
			in, eg = true, len(np.Spec.Egress) > 0
		}
		for _, t := range np.Spec.PolicyTypes {
			in = in || t == networkingv1.PolicyTypeIngress
			eg = eg || t == networkingv1.PolicyTypeEgress
		}
		if (d == dirIn && !in) || (d == dirEg && !eg) {
			continue
		}
		isolated = true
		type rule struct {
			peers []networkingv1.NetworkPolicyPeer
			ports []networkingv1.NetworkPolicyPort
		}
		var rules []rule
		if d == dirIn {
			for _, r := range np.Spec.Ingress {
				rules = append(rules, rule{r.From, r.Ports})
			}
		} else {
			for _, r := range np.Spec.Egress {
				rules = append(rules, rule{r.To, r.Ports})
			}
		}
		for _, r := range rules {
			if o.npPeers(np, r.peers, peer) && o.npPorts(r.ports, dst, proto, port) {
				allowed = true
			}
		}
	}
	return isolated, allowed
}

func (o *cnpOracle) npPeers(np *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer, x netip.Addr) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			c, ok := o.cidr(p.IPBlock.CIDR)
			if !ok || !c.Contains(x) {
				continue
			}
			out := false
			for _, e := range p.IPBlock.Except {
				if ec, ok := o.cidr(e); ok && ec.Contains(x) {
					out = true
				}
			}
			if !out {
				return true
			}
			continue
		}
		pp := o.podAt(x)
		if pp == nil {
			continue
		}
		nsOK := pp.Namespace == np.Namespace
		if p.NamespaceSelector != nil {
			nsOK = o.selects(p.NamespaceSelector, o.nsLabels(pp.Namespace))
		}
		if nsOK && (p.PodSelector == nil || o.selects(p.PodSelector, pp.Labels)) {
			return true
		}
	}
	return false
}

func (o *cnpOracle) npPorts(ports []networkingv1.NetworkPolicyPort, dst netip.Addr, proto uint8, port uint16) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want := ProtoTCP
		if p.Protocol != nil {
			switch *p.Protocol {
			case corev1.ProtocolUDP:
				want = ProtoUDP
			case corev1.ProtocolSCTP:
				want = ProtoSCTP
			}
		}
		if want != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal != "":
			if pod := o.podAt(dst); pod != nil && slices.ContainsFunc(pod.Ports, func(np NamedPort) bool {
				return np.Name == p.Port.StrVal && np.Protocol == proto && np.Port == port
			}) {
				return true
			}
		default:
			end := p.Port.IntVal
			if p.EndPort != nil {
				end = *p.EndPort
			}
			if int32(port) >= p.Port.IntVal && int32(port) <= end {
				return true
			}
		}
	}
	return false
}
