package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Verdict is Explain's answer for one connection: allowed when both
// directions allow it.
type Verdict struct {
	Allowed bool
	Egress  DirectionVerdict
	Ingress DirectionVerdict
}

// DirectionVerdict is one direction's part: egress concerns the source
// pod, ingress the destination pod.
type DirectionVerdict struct {
	Direction Direction
	// Pod is "namespace/name" of the pod the direction concerns; "" when
	// the address is no pod's (outside the cluster, a node, a hostNetwork
	// pod): such an end is never isolated.
	Pod     string
	Allowed bool
	// Isolating are the policies ("namespace/name") that select Pod for
	// this direction.
	Isolating []string
	// AllowedBy are the rules that allow the connection, as
	// "namespace/name rule N" (N counts from 0 in spec.ingress or
	// spec.egress).
	AllowedBy []string
	// Tier is the tier that decided: "Admin" or "Baseline" (a
	// ClusterNetworkPolicy rule's Accept or Deny), "NetworkPolicy" (the
	// pod is isolated by one), "" (nothing judged it: allowed).
	Tier string
	// DecidedBy is the ClusterNetworkPolicy rule that decided, as
	// "name rule N" (or "name rule N (rule name)"), when Tier is Admin or
	// Baseline.
	DecidedBy string
	// Passed are the Pass rules that handed the decision down a tier.
	Passed []string
	// Reason is one line for a human.
	Reason string
}

// String is the verdict on three lines.
func (v Verdict) String() string {
	word := "denied"
	if v.Allowed {
		word = "allowed"
	}
	return fmt.Sprintf("%s\n  egress:  %s\n  ingress: %s", word, v.Egress.Reason, v.Ingress.Reason)
}

// Explain says whether the cluster's policies allow a connection from src
// to dst on (proto, port), and why, per direction. It reads the policy
// objects directly (selectors against labels, ipBlocks against prefixes,
// named ports against the destination pod's container ports) rather than a
// compiled Ruleset: it is the oracle Compile is tested against. For a pod
// that exists, Explain(src, dst).Allowed equals the AND of the Allows of
// the Rulesets of src's node and dst's node. It does not know PodCIDRs, so
// it does not model the drop of a local address the engine does not know
// yet.
func (s *State) Explain(src, dst netip.Addr, proto uint8, port uint16) Verdict {
	src, dst = src.Unmap(), dst.Unmap()
	ix := s.index()
	srcE, dstE := ix.owner[src], ix.owner[dst]
	v := Verdict{
		Egress:  s.explainDir(ix, dirEg, srcE, src, dst, dstE, proto, port),
		Ingress: s.explainDir(ix, dirIn, dstE, src, dst, dstE, proto, port),
	}
	v.Allowed = v.Egress.Allowed && v.Ingress.Allowed
	return v
}

// explainDir judges one direction for target (the source pod for egress,
// the destination pod for ingress; nil when that address is no pod's).
func (s *State) explainDir(ix *index, d int, target *entry, src, dst netip.Addr, dstE *entry, proto uint8, port uint16) DirectionVerdict {
	dv := DirectionVerdict{Direction: dirs[d]}
	addr, peerAddr, peerE := src, dst, dstE
	if d == dirIn {
		addr, peerAddr, peerE = dst, src, ix.owner[src]
	}
	if target == nil {
		dv.Allowed = true
		dv.Reason = fmt.Sprintf("%s is no pod's address (outside the cluster, a node or a hostNetwork pod): not isolated, allowed", addr)
		return dv
	}
	dv.Pod = target.pod.Key()
	if src == dst {
		dv.Allowed = true
		dv.Reason = dv.Pod + " reaching itself is always allowed"
		return dv
	}
	q := tierQuery{d: d, target: target, peerAddr: peerAddr, peerE: peerE, dstE: dstE, proto: proto, port: port}
	if s.explainTier(ix, TierAdmin, q, &dv) {
		return dv
	}
	var pols []*parsedPolicy
	for _, pp := range s.policies {
		if pp.namespace == target.pod.Namespace && pp.types[d] && pp.selector != nil &&
			pp.selector.Matches(labels.Set(target.pod.Labels)) {
			pols = append(pols, pp)
		}
	}
	slices.SortFunc(pols, func(a, b *parsedPolicy) int { return strings.Compare(a.key(), b.key()) })
	if len(pols) == 0 {
		if s.explainTier(ix, TierBaseline, q, &dv) {
			return dv
		}
		dv.Allowed = true
		dv.Reason = passedNote(dv.Passed) + fmt.Sprintf("no policy selects %s for %s: allowed", dv.Pod, dirs[d])
		return dv
	}
	dv.Tier = "NetworkPolicy"
	var refused []string
	for _, pp := range pols {
		dv.Isolating = append(dv.Isolating, pp.key())
		if pp.err != nil {
			refused = append(refused, pp.key())
		}
		for i := range pp.rules[d] {
			if s.ruleAllows(pp.namespace, &pp.rules[d][i], peerAddr, peerE, dstE, proto, port) {
				dv.AllowedBy = append(dv.AllowedBy, fmt.Sprintf("%s rule %d", pp.key(), i))
			}
		}
	}
	isolated := fmt.Sprintf("%s isolated for %s by %s", dv.Pod, dirs[d], strings.Join(dv.Isolating, ", "))
	if len(refused) > 0 {
		isolated += fmt.Sprintf(" (refused, allowing nothing: %s)", strings.Join(refused, ", "))
	}
	isolated = passedNote(dv.Passed) + isolated
	switch {
	case len(dv.AllowedBy) > 0:
		dv.Allowed = true
		dv.Reason = isolated + "; allowed by " + strings.Join(dv.AllowedBy, ", ")
	default:
		dv.Reason = isolated + fmt.Sprintf("; no rule allows %s %s port %d: denied", peerAddr, protoName(proto), port)
	}
	return dv
}

// ruleAllows evaluates one rule straight from its parsed fields.
func (s *State) ruleAllows(policyNS string, r *parsedRule, peerAddr netip.Addr, peerE, dstE *entry,
	proto uint8, port uint16) bool {
	peerOK := r.anyPeer || (policyNS == "" && rangesContain(r.blocks, peerAddr))
	for i := 0; !peerOK && i < len(r.peers); i++ {
		p := &r.peers[i]
		if p.isBlock {
			peerOK = p.cidr.Contains(peerAddr) && !slices.ContainsFunc(p.except, func(e netip.Prefix) bool {
				return e.Contains(peerAddr)
			})
			continue
		}
		if peerE == nil {
			continue
		}
		pod := peerE.pod
		nsOK := pod.Namespace == policyNS
		if p.nsSel != nil {
			nsOK = p.nsSel.Matches(labels.Set(s.nsLabels(pod.Namespace)))
		}
		peerOK = nsOK && (p.podSel == nil || p.podSel.Matches(labels.Set(pod.Labels)))
	}
	if !peerOK {
		return false
	}
	if r.anyPort {
		return true
	}
	for _, p := range r.ports {
		if p.proto != proto {
			continue
		}
		if p.name == "" {
			if p.from <= port && port <= p.to {
				return true
			}
			continue
		}
		if dstE != nil && slices.ContainsFunc(dstE.pod.Ports, func(np NamedPort) bool {
			return np.Name == p.name && np.Protocol == proto && np.Port == port
		}) {
			return true
		}
	}
	return false
}

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	case 1:
		return "ICMP"
	case 58:
		return "ICMPv6"
	}
	return fmt.Sprintf("protocol %d", p)
}

// tierQuery is one direction's question to a ClusterNetworkPolicy tier.
type tierQuery struct {
	d           int
	target      *entry
	peerAddr    netip.Addr
	peerE, dstE *entry
	proto       uint8
	port        uint16
}

// explainTier judges tier t's policies that select q.target, in order:
// true when a rule's Accept or Deny decided (dv filled in); a Pass is
// noted in dv.Passed and leaves the tier undecided.
func (s *State) explainTier(ix *index, t Tier, q tierQuery, dv *DirectionVerdict) bool {
	for _, c := range s.sortedCNPs(t) {
		if len(c.rules[q.d]) == 0 || !c.selectsPod(s, q.target.pod) {
			continue
		}
		for i := range c.rules[q.d] {
			r := &c.rules[q.d][i]
			if !s.cnpRuleMatches(r, q) {
				continue
			}
			what := fmt.Sprintf("%s rule %d", c.name, i)
			if r.name != "" {
				what += " (" + r.name + ")"
			}
			if r.action == ActionPass {
				dv.Passed = append(dv.Passed, fmt.Sprintf("%s tier: %s passes", t, what))
				return false
			}
			dv.Tier, dv.DecidedBy = string(t), what
			dv.Allowed = r.action == ActionAccept
			verdict := "denied"
			if dv.Allowed {
				verdict = "allowed"
			}
			verb := "denies"
			if dv.Allowed {
				verb = "accepts"
			}
			dv.Reason = passedNote(dv.Passed) + fmt.Sprintf("%s for %s: %s tier ClusterNetworkPolicy %s %s %s %s port %d: %s",
				dv.Pod, dirs[q.d], t, what, verb, q.peerAddr, protoName(q.proto), q.port, verdict)
			return true
		}
	}
	return false
}

// cnpRuleMatches evaluates one ClusterNetworkPolicy rule from its parsed
// fields.
func (s *State) cnpRuleMatches(r *cnpRule, q tierQuery) bool {
	if len(r.nodes) > 0 && !r.anyPeer && rangesContain(s.nodeRanges(r.nodes), q.peerAddr) {
		// a nodes peer matched: the rest is the protocols
		return s.ruleAllows("", &parsedRule{anyPeer: true, anyPort: r.anyPort, ports: r.ports}, q.peerAddr, q.peerE, q.dstE, q.proto, q.port)
	}
	return s.ruleAllows("", &r.parsedRule, q.peerAddr, q.peerE, q.dstE, q.proto, q.port)
}

// passedNote is the Pass rules that handed the decision down, for a
// Reason.
func passedNote(passed []string) string {
	if len(passed) == 0 {
		return ""
	}
	return strings.Join(passed, "; ") + "; "
}
