package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PolicyError is why a policy is refused.
type PolicyError struct {
	Namespace, Name string
	// Field is the path of the first invalid field, e.g.
	// "spec.ingress[0].from[2].ipBlock.cidr".
	Field  string
	Reason string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("NetworkPolicy %s/%s refused: %s: %s (it isolates the pods it selects and allows nothing)",
		e.Namespace, e.Name, e.Field, e.Reason)
}

// parsedPolicy is a NetworkPolicy parsed once, when it is set.
type parsedPolicy struct {
	namespace, name string
	err             *PolicyError
	// selector is spec.podSelector; nil when it does not parse: the
	// policy then selects no pod.
	selector labels.Selector
	// types: which directions the policy isolates the pods it selects in.
	types [2]bool
	rules [2][]parsedRule
}

func (p *parsedPolicy) key() string { return p.namespace + "/" + p.name }

const (
	dirIn = 0
	dirEg = 1
)

var dirs = [2]Direction{Ingress, Egress}

type parsedRule struct {
	anyPeer bool
	peers   []parsedPeer
	// blocks is the union of the rule's ipBlock peers, merged.
	blocks  []Range
	anyPort bool
	ports   []parsedPort
}

// parsedPeer is one from/to entry: an ipBlock, or selectors.
type parsedPeer struct {
	isBlock bool
	cidr    netip.Prefix
	except  []netip.Prefix
	// podSel nil: every pod (namespaceSelector alone).
	podSel labels.Selector
	// nsSel nil: the policy's own namespace.
	nsSel labels.Selector
	// cacheKey identifies the set of pods the selectors select.
	cacheKey string
}

type parsedPort struct {
	proto uint8
	// name, when the port is named; else from..to.
	name     string
	from, to uint16
}

func parsePolicy(np *networkingv1.NetworkPolicy) *parsedPolicy {
	pp := &parsedPolicy{namespace: np.Namespace, name: np.Name}
	fail := func(field, format string, args ...any) {
		if pp.err == nil {
			pp.err = &PolicyError{Namespace: np.Namespace, Name: np.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		fail("spec.podSelector", "%v", err)
	} else {
		pp.selector = sel
	}
	if len(np.Spec.PolicyTypes) == 0 {
		pp.types[dirIn] = true
		pp.types[dirEg] = len(np.Spec.Egress) > 0
	}
	for i, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			pp.types[dirIn] = true
		case networkingv1.PolicyTypeEgress:
			pp.types[dirEg] = true
		default:
			fail(fmt.Sprintf("spec.policyTypes[%d]", i), "unsupported value %q (Ingress or Egress)", t)
		}
	}
	if !pp.types[dirIn] && !pp.types[dirEg] {
		pp.types[dirIn] = true
	}
	if pp.types[dirIn] {
		for i, r := range np.Spec.Ingress {
			path := fmt.Sprintf("spec.ingress[%d]", i)
			pp.rules[dirIn] = append(pp.rules[dirIn], parseRule(np.Namespace, r.From, r.Ports, path, "from", fail))
		}
	}
	if pp.types[dirEg] {
		for i, r := range np.Spec.Egress {
			path := fmt.Sprintf("spec.egress[%d]", i)
			pp.rules[dirEg] = append(pp.rules[dirEg], parseRule(np.Namespace, r.To, r.Ports, path, "to", fail))
		}
	}
	if pp.err != nil {
		// fail closed: keep the isolation, allow nothing
		pp.rules = [2][]parsedRule{}
	}
	return pp
}

func parseRule(namespace string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort,
	path, peerField string, fail func(field, format string, args ...any)) parsedRule {
	var r parsedRule
	r.anyPeer = len(peers) == 0
	for i, p := range peers {
		ppath := fmt.Sprintf("%s.%s[%d]", path, peerField, i)
		r.peers = append(r.peers, parsePeer(namespace, p, ppath, fail))
	}
	for _, p := range r.peers {
		if p.isBlock {
			r.blocks = append(r.blocks, blockRanges(p.cidr, p.except)...)
		}
	}
	r.blocks = mergeRanges(r.blocks)
	r.anyPort = len(ports) == 0
	for i, p := range ports {
		r.ports = append(r.ports, parsePort(p, fmt.Sprintf("%s.ports[%d]", path, i), fail))
	}
	return r
}

func parsePeer(namespace string, p networkingv1.NetworkPolicyPeer, path string, fail func(field, format string, args ...any)) parsedPeer {
	var out parsedPeer
	if p.IPBlock != nil {
		if p.PodSelector != nil || p.NamespaceSelector != nil {
			fail(path, "ipBlock may not be combined with a selector")
		}
		out.isBlock = true
		c, err := parseCIDR(p.IPBlock.CIDR)
		if err != nil {
			fail(path+".ipBlock.cidr", "%v", err)
			return out
		}
		out.cidr = c
		for j, e := range p.IPBlock.Except {
			x, err := parseCIDR(e)
			if err != nil {
				fail(fmt.Sprintf("%s.ipBlock.except[%d]", path, j), "%v", err)
				continue
			}
			// an except outside the cidr (or of the other family)
			// removes nothing
			out.except = append(out.except, x)
		}
		return out
	}
	if p.PodSelector == nil && p.NamespaceSelector == nil {
		fail(path, "a peer needs a podSelector, a namespaceSelector or an ipBlock")
		out.podSel = labels.Nothing()
		out.nsSel = labels.Nothing()
		return out
	}
	nsKey := "=" + namespace
	if p.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
		if err != nil {
			fail(path+".namespaceSelector", "%v", err)
			s = labels.Nothing()
		}
		out.nsSel = s
		nsKey = "~" + s.String()
	}
	podKey := "*"
	if p.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.PodSelector)
		if err != nil {
			fail(path+".podSelector", "%v", err)
			s = labels.Nothing()
		}
		if !s.Empty() {
			out.podSel = s
			podKey = "~" + s.String()
		}
	}
	out.cacheKey = nsKey + "|" + podKey
	return out
}

func parsePort(p networkingv1.NetworkPolicyPort, path string, fail func(field, format string, args ...any)) parsedPort {
	var proto corev1.Protocol
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	n, ok := protoNumber(proto)
	if !ok {
		fail(path+".protocol", "unsupported protocol %q (TCP, UDP or SCTP)", proto)
	}
	out := parsedPort{proto: n, from: 0, to: 65535}
	if p.Port == nil {
		if p.EndPort != nil {
			fail(path+".endPort", "endPort needs a numbered port")
		}
		return out
	}
	if p.Port.Type == intstr.String {
		if p.EndPort != nil {
			fail(path+".endPort", "endPort needs a numbered port, not %q", p.Port.StrVal)
		}
		if p.Port.StrVal == "" || len(p.Port.StrVal) > 15 {
			fail(path+".port", "invalid port name %q", p.Port.StrVal)
		}
		out.name = p.Port.StrVal
		return out
	}
	v := p.Port.IntVal
	if v < 1 || v > 65535 {
		fail(path+".port", "port %d out of range 1-65535", v)
		return out
	}
	out.from, out.to = uint16(v), uint16(v)
	if p.EndPort != nil {
		e := *p.EndPort
		if e < v || e > 65535 {
			fail(path+".endPort", "endPort %d not in %d-65535", e, v)
			return out
		}
		out.to = uint16(e)
	}
	return out
}

// parseCIDR parses an ipBlock CIDR as the API server does (legacy leading
// zeros in IPv4 are decimal; host bits are ignored; an IPv4-mapped IPv6
// prefix is the IPv4 one).
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		p, err = netip.ParsePrefix(stripLeadingZeros(s))
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
		}
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

func stripLeadingZeros(s string) string {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return s
	}
	parts := strings.Split(addr, ".")
	if len(parts) != 4 {
		return s
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return s
		}
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, ".") + "/" + bits
}

// blockRanges is cidr minus the excepts, as merged ranges.
func blockRanges(cidr netip.Prefix, except []netip.Prefix) []Range {
	holes := make([]Range, 0, len(except))
	for _, e := range except {
		holes = append(holes, prefixRange(e))
	}
	return subtractRanges([]Range{prefixRange(cidr)}, mergeRanges(holes))
}
