package policy

// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1): the cluster
// admin's tiers, parsed once when set, fail-closed where unreadable.

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// ClusterPolicyError is why a ClusterNetworkPolicy, or a part of it, is
// refused.
type ClusterPolicyError struct {
	Name string
	// Field is the path of the first unreadable field, e.g.
	// "spec.egress[2].to[0]".
	Field  string
	Reason string
	// Effect says what the engine does instead (fail closed).
	Effect string
}

func (e *ClusterPolicyError) Error() string {
	return fmt.Sprintf("ClusterNetworkPolicy %s refused in part: %s: %s (%s)", e.Name, e.Field, e.Reason, e.Effect)
}

// MaxPriority is the highest (least precedent) priority the API allows.
const MaxPriority = 1000

// parsedCNP is a ClusterNetworkPolicy parsed once, when it is set.
type parsedCNP struct {
	name     string
	tier     Tier
	priority int32
	err      *ClusterPolicyError
	// subject: nsSel selects namespaces; podSel (nil: every pod) the pods
	// in them. anySubject: the subject could not be read, the policy
	// applies to every pod (fail closed).
	nsSel, podSel labels.Selector
	rules         [2][]cnpRule
}

type cnpRule struct {
	name   string
	action Action
	parsedRule
	// nodes: the rule's nodes peers (egress only).
	nodes []labels.Selector
}

// Node is what the engine needs of a Node: its labels and the addresses of
// status.addresses, for ClusterNetworkPolicy's nodes peers.
type Node struct {
	Name   string
	Labels map[string]string
	IPs    []netip.Addr
}

// FromNode converts an informer's Node. Pure. Addresses that are no IP
// (a Hostname entry) are left out.
func FromNode(n *corev1.Node) Node {
	addrs := make([]string, 0, len(n.Status.Addresses))
	for _, a := range n.Status.Addresses {
		addrs = append(addrs, a.Address)
	}
	return NodeOf(n.Name, n.Labels, addrs)
}

// NodeOf is the Node of these fields: a Node's name, labels and the
// addresses of its status.addresses (FromNode). Pure.
func NodeOf(name string, labels map[string]string, addresses []string) Node {
	out := Node{Name: name, Labels: maps.Clone(labels)}
	for _, a := range addresses {
		if ip, err := netip.ParseAddr(strings.TrimSpace(a)); err == nil && ip.Zone() == "" {
			out.IPs = append(out.IPs, ip.Unmap())
		}
	}
	out.IPs = cleanIPs(out.IPs)
	slices.SortFunc(out.IPs, netip.Addr.Compare)
	return out
}

// SetNode adds or replaces a node. It reports whether a Ruleset can change
// (its labels or addresses changed, and a ClusterNetworkPolicy has a nodes
// peer).
func (s *State) SetNode(n Node) bool {
	n.IPs = cleanIPs(n.IPs)
	slices.SortFunc(n.IPs, netip.Addr.Compare)
	old := s.nodes[n.Name]
	s.nodes[n.Name] = &n
	if old != nil && maps.Equal(old.Labels, n.Labels) && slices.Equal(old.IPs, n.IPs) {
		return false
	}
	return s.nodePeers()
}

// DeleteNode removes a node; it reports whether a Ruleset can change.
func (s *State) DeleteNode(name string) bool {
	if _, ok := s.nodes[name]; !ok {
		return false
	}
	delete(s.nodes, name)
	return s.nodePeers()
}

// nodePeers drops the index when a ClusterNetworkPolicy has a nodes peer,
// and says so.
func (s *State) nodePeers() bool {
	for _, c := range s.cnps {
		for d := range 2 {
			for i := range c.rules[d] {
				if len(c.rules[d][i].nodes) > 0 {
					s.ix = nil
					return true
				}
			}
		}
	}
	return false
}

// SetClusterPolicy adds or replaces a ClusterNetworkPolicy. A non-nil error
// says what could not be read and what the engine does instead: an
// unreadable Accept rule (or peer, or protocol) matches nothing, an
// unreadable Deny or Pass rule denies everything, an unreadable priority
// is the tier's last (the API's "fail closed"). A policy whose tier or
// subject cannot be read cannot be placed: it is judged in the Admin tier
// and for every pod, and so that it can only close, its Deny rules stay,
// its Pass rules deny everything and its Accept rules match nothing.
// Every other policy is unaffected.
func (s *State) SetClusterPolicy(c *cnpv1.ClusterNetworkPolicy) error {
	if c == nil {
		return fmt.Errorf("ClusterNetworkPolicy refused: no object")
	}
	s.ix = nil
	pc := parseCNP(c)
	s.cnps[c.Name] = pc
	if pc.err != nil {
		return pc.err
	}
	return nil
}

// DeleteClusterPolicy removes a ClusterNetworkPolicy.
func (s *State) DeleteClusterPolicy(name string) {
	s.ix = nil
	delete(s.cnps, name)
}

// RefusedClusterPolicies lists the ClusterNetworkPolicies refused in part
// and why.
func (s *State) RefusedClusterPolicies() map[string]error {
	out := map[string]error{}
	for k, c := range s.cnps {
		if c.err != nil {
			out[k] = c.err
		}
	}
	return out
}

// ClusterPolicies is the number of ClusterNetworkPolicies.
func (s *State) ClusterPolicies() int { return len(s.cnps) }

type cnpParser struct {
	pc *parsedCNP
	// unplaced: the tier or the subject could not be read
	unplaced bool
}

func (p *cnpParser) fail(field, effect, format string, args ...any) {
	if p.pc.err == nil {
		p.pc.err = &ClusterPolicyError{Name: p.pc.name, Field: field, Reason: fmt.Sprintf(format, args...), Effect: effect}
	}
}

func parseCNP(c *cnpv1.ClusterNetworkPolicy) *parsedCNP {
	pc := &parsedCNP{name: c.Name, priority: c.Spec.Priority}
	p := &cnpParser{pc: pc}
	switch c.Spec.Tier {
	case cnpv1.AdminTier:
		pc.tier = TierAdmin
	case cnpv1.BaselineTier:
		pc.tier = TierBaseline
	default:
		pc.tier = TierAdmin
		p.unplaced = true
		p.fail("spec.tier", "judged in the Admin tier, its Deny rules only (Pass denies, Accept matches nothing)", "unknown tier %q (Admin or Baseline)", c.Spec.Tier)
	}
	if pc.priority < 0 || pc.priority > MaxPriority {
		p.fail("spec.priority", "judged last in its tier", "priority %d out of range 0-%d", pc.priority, MaxPriority)
		pc.priority = MaxPriority + 1
	}
	p.subject(c.Spec.Subject)
	for i, r := range c.Spec.Ingress {
		path := fmt.Sprintf("spec.ingress[%d]", i)
		peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		pc.rules[dirIn] = append(pc.rules[dirIn], p.rule(path, "from", r.Name, r.Action, peers, r.Protocols))
	}
	for i, r := range c.Spec.Egress {
		path := fmt.Sprintf("spec.egress[%d]", i)
		pc.rules[dirEg] = append(pc.rules[dirEg], p.rule(path, "to", r.Name, r.Action, r.To, r.Protocols))
	}
	if p.unplaced {
		// judged where it may not belong, for pods it may not select:
		// it may only close
		for d := range 2 {
			for i, r := range pc.rules[d] {
				switch r.action {
				case ActionAccept:
					pc.rules[d][i] = cnpRule{name: r.name, action: ActionAccept} // matches nothing
				case ActionPass:
					pc.rules[d][i] = denyAll(r.name)
				}
			}
		}
	}
	return pc
}

// subject reads spec.subject: exactly one of namespaces and pods.
func (p *cnpParser) subject(sub cnpv1.ClusterNetworkPolicySubject) {
	const effect = "it applies to every pod, its Deny rules only (Pass denies, Accept matches nothing)"
	all := func() { p.pc.nsSel, p.pc.podSel, p.unplaced = labels.Everything(), nil, true }
	switch {
	case sub.Namespaces != nil && sub.Pods == nil:
		s, err := metav1.LabelSelectorAsSelector(sub.Namespaces)
		if err != nil {
			p.fail("spec.subject.namespaces", effect, "%v", err)
			all()
			return
		}
		p.pc.nsSel = s
	case sub.Pods != nil && sub.Namespaces == nil:
		ns, err := metav1.LabelSelectorAsSelector(&sub.Pods.NamespaceSelector)
		if err != nil {
			p.fail("spec.subject.pods.namespaceSelector", effect, "%v", err)
			all()
			return
		}
		pod, err := metav1.LabelSelectorAsSelector(&sub.Pods.PodSelector)
		if err != nil {
			p.fail("spec.subject.pods.podSelector", effect, "%v", err)
			all()
			return
		}
		p.pc.nsSel = ns
		if !pod.Empty() {
			p.pc.podSel = pod
		}
	default:
		p.fail("spec.subject", effect, "exactly one of namespaces and pods must be set")
		all()
	}
}

// rule reads one rule. What cannot be read fails closed: an Accept rule
// loses the peer or protocol (it matches less), a Deny or Pass rule
// becomes "deny everything".
func (p *cnpParser) rule(path, peerField, name string, action cnpv1.ClusterNetworkPolicyRuleAction,
	peers []cnpv1.ClusterNetworkPolicyEgressPeer, protos []cnpv1.ClusterNetworkPolicyProtocol) cnpRule {
	r := cnpRule{name: name}
	switch action {
	case cnpv1.ClusterNetworkPolicyRuleActionAccept:
		r.action = ActionAccept
	case cnpv1.ClusterNetworkPolicyRuleActionDeny:
		r.action = ActionDeny
	case cnpv1.ClusterNetworkPolicyRuleActionPass:
		r.action = ActionPass
	default:
		p.fail(path+".action", "the rule denies everything", "unknown action %q (Accept, Deny or Pass)", action)
		return denyAll(name)
	}
	broken := false
	effect := "the peer matches nothing"
	if r.action != ActionAccept {
		effect = "the rule denies everything"
	}
	bad := func(field, format string, args ...any) {
		p.fail(field, effect, format, args...)
		broken = true
	}
	if len(peers) == 0 {
		bad(path+"."+peerField, "a rule needs at least one peer")
	}
	for i, peer := range peers {
		p.peer(&r, peer, fmt.Sprintf("%s.%s[%d]", path, peerField, i), bad)
	}
	r.blocks = mergeRanges(r.blocks)
	r.anyPort = len(protos) == 0
	for i, pr := range protos {
		p.protocol(&r, pr, fmt.Sprintf("%s.protocols[%d]", path, i), bad)
	}
	if broken && r.action != ActionAccept {
		return denyAll(name)
	}
	// an Accept rule whose peers (or protocols) were all unreadable
	// matches nothing: no peer, no port
	return r
}

// denyAll is the fail-closed rule: every peer, every port, Deny.
func denyAll(name string) cnpRule {
	return cnpRule{name: name, action: ActionDeny, parsedRule: parsedRule{anyPeer: true, anyPort: true}}
}

// peer reads one peer: exactly one of namespaces, pods, nodes, networks
// (domainNames is refused: see below).
func (p *cnpParser) peer(r *cnpRule, peer cnpv1.ClusterNetworkPolicyEgressPeer, path string, bad func(string, string, ...any)) {
	n := 0
	for _, set := range []bool{peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, len(peer.Networks) > 0, len(peer.DomainNames) > 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		bad(path, "exactly one of namespaces, pods, nodes, networks and domainNames must be set (%d are)", n)
		return
	}
	switch {
	case peer.Namespaces != nil:
		s, err := metav1.LabelSelectorAsSelector(peer.Namespaces)
		if err != nil {
			bad(path+".namespaces", "%v", err)
			return
		}
		r.peers = append(r.peers, parsedPeer{nsSel: s, cacheKey: "~" + s.String() + "|*"})
	case peer.Pods != nil:
		ns, err := metav1.LabelSelectorAsSelector(&peer.Pods.NamespaceSelector)
		if err != nil {
			bad(path+".pods.namespaceSelector", "%v", err)
			return
		}
		pod, err := metav1.LabelSelectorAsSelector(&peer.Pods.PodSelector)
		if err != nil {
			bad(path+".pods.podSelector", "%v", err)
			return
		}
		pp := parsedPeer{nsSel: ns, cacheKey: "~" + ns.String() + "|*"}
		if !pod.Empty() {
			pp.podSel = pod
			pp.cacheKey = "~" + ns.String() + "|~" + pod.String()
		}
		r.peers = append(r.peers, pp)
	case peer.Nodes != nil:
		s, err := metav1.LabelSelectorAsSelector(peer.Nodes)
		if err != nil {
			bad(path+".nodes", "%v", err)
			return
		}
		r.nodes = append(r.nodes, s)
	case len(peer.Networks) > 0:
		for i, c := range peer.Networks {
			pfx, err := parseCIDR(string(c))
			if err != nil {
				bad(fmt.Sprintf("%s.networks[%d]", path, i), "%v", err)
				continue
			}
			r.blocks = append(r.blocks, prefixRange(pfx))
		}
	default:
		// DNS answers would have to be read on the packet path (or
		// every resolver's traffic parsed in userspace) to turn names
		// into addresses with their TTLs; podnet keeps no userspace on
		// the packet path, so a domainNames peer matches nothing
		// (domainNames is only allowed in Accept rules: the rule
		// allows less, never more).
		bad(path+".domainNames", "domainNames peers are not supported by podnet (they need DNS inspection on the packet path)")
	}
}

// protocol reads one protocol entry: exactly one of tcp, udp, sctp,
// destinationNamedPort.
func (p *cnpParser) protocol(r *cnpRule, pr cnpv1.ClusterNetworkPolicyProtocol, path string, bad func(string, string, ...any)) {
	n := 0
	for _, set := range []bool{pr.TCP != nil, pr.UDP != nil, pr.SCTP != nil, pr.DestinationNamedPort != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		bad(path, "exactly one of tcp, udp, sctp and destinationNamedPort must be set (%d are)", n)
		return
	}
	var proto uint8
	var port *cnpv1.Port
	var field string
	switch {
	case pr.TCP != nil:
		proto, port, field = ProtoTCP, pr.TCP.DestinationPort, "tcp"
	case pr.UDP != nil:
		proto, port, field = ProtoUDP, pr.UDP.DestinationPort, "udp"
	case pr.SCTP != nil:
		proto, port, field = ProtoSCTP, pr.SCTP.DestinationPort, "sctp"
	default:
		name := pr.DestinationNamedPort
		if len(name) > 15 {
			bad(path+".destinationNamedPort", "invalid port name %q", name)
			return
		}
		// a named port names a container port of any protocol
		for _, pro := range []uint8{ProtoTCP, ProtoUDP, ProtoSCTP} {
			r.ports = append(r.ports, parsedPort{proto: pro, name: name})
		}
		return
	}
	out := parsedPort{proto: proto, from: 0, to: 65535}
	if port == nil {
		bad(path+"."+field+".destinationPort", "a %s protocol needs a destinationPort", field)
		return
	}
	{
		fpath := path + "." + field + ".destinationPort"
		switch {
		case port.Range != nil && port.Number == 0:
			if port.Range.Start < 1 || port.Range.End > 65535 || port.Range.Start > port.Range.End {
				bad(fpath+".range", "range %d-%d not within 1-65535", port.Range.Start, port.Range.End)
				return
			}
			out.from, out.to = uint16(port.Range.Start), uint16(port.Range.End)
		case port.Range == nil && port.Number >= 1 && port.Number <= 65535:
			out.from, out.to = uint16(port.Number), uint16(port.Number)
		default:
			bad(fpath, "exactly one of number (1-65535) and range must be set")
			return
		}
	}
	r.ports = append(r.ports, out)
}

// selectsPod tells whether the policy's subject selects pod e.
func (c *parsedCNP) selectsPod(s *State, p *Pod) bool {
	if p.HostNetwork {
		return false
	}
	if !c.nsSel.Matches(labels.Set(s.nsLabels(p.Namespace))) {
		return false
	}
	return c.podSel == nil || c.podSel.Matches(labels.Set(p.Labels))
}

// sortedCNPs are the policies of tier t in evaluation order: priority,
// then name (the API leaves ties to the implementation; a name keeps it
// stable).
func (s *State) sortedCNPs(t Tier) []*parsedCNP {
	var out []*parsedCNP
	for _, c := range s.cnps {
		if c.tier == t {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *parsedCNP) int {
		if a.priority != b.priority {
			return int(a.priority - b.priority)
		}
		return strings.Compare(a.name, b.name)
	})
	return out
}

// nodeRanges are the addresses of the nodes sels select, as ranges.
func (s *State) nodeRanges(sels []labels.Selector) []Range {
	if len(sels) == 0 {
		return nil
	}
	var out []Range
	for _, n := range s.nodes {
		for _, sel := range sels {
			if sel.Matches(labels.Set(n.Labels)) {
				for _, a := range n.IPs {
					out = append(out, single(a))
				}
				break
			}
		}
	}
	return mergeRanges(out)
}
