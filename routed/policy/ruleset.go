// Package policy enforces networking.k8s.io/v1 NetworkPolicy on one node.
//
// It is shaped like podnet-routed's routes: informers (Pods, Namespaces,
// NetworkPolicies) feed a pure compiler that turns them into a Ruleset, the
// desired state of one nftables table, and one writer puts that Ruleset in
// the kernel in atomic transactions. The same pure model answers
// --explain-policy and decides which conntrack entries a change revokes.
//
// The dataplane (table inet podnet-policy) in short:
//
//   - base chains on forward (pod to pod, pod to outside, outside to pod)
//     and input (pod to this node), with established and related traffic
//     accepted first: only a connection's first packet is judged;
//   - an egress base chain and an ingress base chain, so that a packet
//     from a local pod to a local pod passes both;
//   - a verdict map per family and direction, keyed by the local pod's
//     address, jumps to that pod's chain; a pod not isolated in a
//     direction has no element there;
//   - a pod's chain jumps to the chain of each policy that selects it (one
//     chain per policy and direction, shared by every pod it selects), then
//     counts and drops;
//   - a policy's chain holds one rule per policy rule and family: the
//     peer's address in an interval set and the (address . protocol . port)
//     in a concatenated interval set, so that no rule is written per peer or
//     per port;
//   - a local pod address (inside this node's PodCIDRs) that the engine
//     does not know yet is dropped in both directions: a new pod is isolated
//     from its first packet until its policy is in the kernel.
//
// Traffic from the node itself (kubelet's probes, hostNetwork pods) leaves
// through the output hook, which the table does not filter: it is always
// allowed, as the API requires.
package policy

import (
	"net/netip"
	"slices"
)

// Direction is ingress (to the selected pod) or egress (from it).
type Direction string

const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// Ruleset is the desired state of table inet podnet-policy. It is pure data:
// compared with Equal, and written in full or as a diff against the last
// one written.
type Ruleset struct {
	// LocalPodCIDRs are this node's PodCIDRs: a source or destination in
	// them that is not in Known is dropped.
	LocalPodCIDRs []netip.Prefix
	// Known are the addresses of this node's pods that the engine has
	// compiled, isolated or not.
	Known []netip.Addr
	// Ports are the routed host veths (podnet) and BridgePorts the bridge
	// ports (podnet-bridge) of the pods in Known, sorted: traffic through
	// any other host-side pod interface is dropped (a pod the engine does
	// not know yet).
	Ports       []string
	BridgePorts []string
	// BridgeUnfiltered: bridged traffic does not reach the inet hooks
	// (br_netfilter cannot be turned on), so IP between bridge ports is
	// dropped rather than left unjudged.
	BridgeUnfiltered bool
	// Pods are this node's pods isolated in at least one direction.
	Pods []PodChains
	// Policies are the (policy, direction) chains that at least one pod in
	// Pods jumps to.
	Policies []PolicyChain
}

// PodChains is one local pod's entry: its addresses go in the verdict map of
// each direction it is isolated in, pointing at its chain for that
// direction.
type PodChains struct {
	// ID names the pod's chains ("pod-<ID>-in", "pod-<ID>-eg"): short,
	// stable for the pod (namespace/name), valid in an nft name.
	ID        string
	Namespace string
	Name      string
	Addrs     []netip.Addr
	// Ports are the pod's routed host veths and BridgePorts its bridge
	// ports: a packet through them is the pod's, whatever its addresses.
	Ports       []string
	BridgePorts []string
	// Ingress and Egress are the IDs of the PolicyChains the pod's chain
	// jumps to, in order, for each direction it is isolated in; IngressIsolated
	// with an empty Ingress means "deny all ingress".
	IngressIsolated bool
	Ingress         []string
	EgressIsolated  bool
	Egress          []string
	// Admin and Baseline are the IDs of the ClusterNetworkPolicy chains
	// (PolicyChain.Tier Admin or Baseline) that select the pod, by
	// direction (Ingress 0, Egress 1), in evaluation order: priority, then
	// name. The Admin tier is judged before NetworkPolicy, the Baseline
	// tier only when no NetworkPolicy isolates the pod in that direction.
	Admin    [2][]string
	Baseline [2][]string
}

// Judged tells whether the pod has a chain for d: a NetworkPolicy
// isolates it there, or a ClusterNetworkPolicy of either tier selects it.
func (p PodChains) Judged(d Direction) bool {
	i := dirIndex(d)
	isolated, jumps := p.IngressIsolated, p.Ingress
	if i == dirEg {
		isolated, jumps = p.EgressIsolated, p.Egress
	}
	return isolated || len(jumps) > 0 || len(p.Admin[i]) > 0 || len(p.Baseline[i]) > 0
}

// dirIndex is d's index in [2] arrays (Ingress 0, Egress 1).
func dirIndex(d Direction) int {
	if d == Egress {
		return dirEg
	}
	return dirIn
}

// DirIndex is d's index in PodChains.Admin and Baseline.
func DirIndex(d Direction) int { return dirIndex(d) }

// PolicyChain is one NetworkPolicy's rules for one direction, shared by
// every local pod the policy selects.
type PolicyChain struct {
	// ID names the chain ("pol-<ID>") and its sets ("pol-<ID>-r<N>-..."):
	// short, stable for (namespace, name, direction), valid in an nft name.
	ID        string
	Namespace string
	Name      string
	Direction Direction
	// Tier is "" for a NetworkPolicy (every rule accepts; the chain is
	// jumped to), Admin or Baseline for a ClusterNetworkPolicy (Namespace
	// ""): its rules, with their actions, are written inline into the
	// tier chain of each list of policies some pod has, in order.
	Tier     Tier
	Priority int32
	Rules    []Rule
}

// Tier is a ClusterNetworkPolicy's tier; "" is the NetworkPolicy tier.
type Tier string

const (
	TierNetworkPolicy Tier = ""
	TierAdmin         Tier = "Admin"
	TierBaseline      Tier = "Baseline"
)

// Action is what a matching rule does. A NetworkPolicy rule accepts.
type Action string

const (
	// ActionAccept ends the direction's judgement: allowed.
	ActionAccept Action = ""
	// ActionDeny ends it: dropped.
	ActionDeny Action = "Deny"
	// ActionPass skips the rest of the tier: the next tier judges.
	ActionPass Action = "Pass"
)

// String is the API's name of the action.
func (a Action) String() string {
	if a == ActionAccept {
		return "Accept"
	}
	return string(a)
}

// Rule is one ingress or egress rule of a policy, compiled: a packet matches
// when its peer (the source for ingress, the destination for egress) is in
// Peers and its (address, protocol, port) is in Ports. A Rule that can match
// nothing (no peer at all, e.g. a selector matching no pod) is kept with
// empty sets: the chain's shape does not depend on which pods exist.
type Rule struct {
	// Action is the rule's verdict when it matches (a NetworkPolicy's
	// rules accept); Name is a ClusterNetworkPolicy rule's name, if any.
	Action Action
	Name   string
	// AnyPeer: the rule has no from/to, every peer matches.
	AnyPeer bool
	// Peers are the peer addresses as inclusive ranges (pod IPs are
	// single-address ranges; an ipBlock minus its excepts is one or more
	// ranges), both families, merged and sorted.
	Peers []Range
	// AnyPort: the rule has no ports, every protocol and port matches
	// (ICMP too).
	AnyPort bool
	// Ports are what the rule's ports allow, both families, disjoint, in
	// disjointPorts' canonical layout (by protocol and family; numbered
	// and named ports port-major: each port with the merged addresses
	// that have it, so that a pod's named port is a point of its own in
	// the kernel's set). The address part is always the packet's destination: the
	// local pod for ingress (a named port resolves against the selected
	// pod), the peer for egress (it resolves against the destination pod);
	// a numbered port covers every address of its family. So the match is
	// one lookup of (daddr . l4proto . dport) in a concatenated interval set.
	Ports []PortRange
}

// Range is an inclusive range of addresses of one family.
type Range struct {
	From, To netip.Addr
}

// PortRange is one element of a rule's port set: addresses From..To (one
// family), protocol Proto (6 TCP, 17 UDP, 132 SCTP), ports PortFrom..PortTo.
type PortRange struct {
	Addrs    Range
	Proto    uint8
	PortFrom uint16
	PortTo   uint16
}

// Protocol numbers of the protocols NetworkPolicy names.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Equal tells whether r and o make the same table: the same content,
// without telling a nil list from an empty one. It is what the engine
// compares after each compile (reflect.DeepEqual costs tens of
// milliseconds on a Ruleset of 1,000 pods and policies).
func (r Ruleset) Equal(o Ruleset) bool {
	return slices.Equal(r.LocalPodCIDRs, o.LocalPodCIDRs) && slices.Equal(r.Known, o.Known) &&
		slices.Equal(r.Ports, o.Ports) && slices.Equal(r.BridgePorts, o.BridgePorts) &&
		r.BridgeUnfiltered == o.BridgeUnfiltered && r.ChainsEqual(o)
}

// ChainsEqual tells whether r and o have the same pod and policy chains:
// what a connection may do is the same in both (Known aside).
func (r Ruleset) ChainsEqual(o Ruleset) bool {
	return slices.EqualFunc(r.Pods, o.Pods, PodChains.Equal) &&
		slices.EqualFunc(r.Policies, o.Policies, PolicyChain.Equal)
}

// Equal tells whether p and o are the same pod entry.
func (p PodChains) Equal(o PodChains) bool {
	return p.ID == o.ID && p.Namespace == o.Namespace && p.Name == o.Name &&
		slices.Equal(p.Addrs, o.Addrs) && slices.Equal(p.Ports, o.Ports) && slices.Equal(p.BridgePorts, o.BridgePorts) &&
		p.IngressIsolated == o.IngressIsolated && slices.Equal(p.Ingress, o.Ingress) &&
		p.EgressIsolated == o.EgressIsolated && slices.Equal(p.Egress, o.Egress) &&
		slices.Equal(p.Admin[0], o.Admin[0]) && slices.Equal(p.Admin[1], o.Admin[1]) &&
		slices.Equal(p.Baseline[0], o.Baseline[0]) && slices.Equal(p.Baseline[1], o.Baseline[1])
}

// Equal tells whether p and o are the same policy chain.
func (p PolicyChain) Equal(o PolicyChain) bool {
	return p.ID == o.ID && p.Namespace == o.Namespace && p.Name == o.Name &&
		p.Direction == o.Direction && p.Tier == o.Tier && p.Priority == o.Priority &&
		slices.EqualFunc(p.Rules, o.Rules, Rule.Equal)
}

// Equal tells whether r and o are the same rule.
func (r Rule) Equal(o Rule) bool {
	return r.Action == o.Action && r.Name == o.Name && r.AnyPeer == o.AnyPeer && r.AnyPort == o.AnyPort &&
		slices.Equal(r.Peers, o.Peers) && slices.Equal(r.Ports, o.Ports)
}

// Delta is a change of a node's Ruleset, as an incremental compile
// (Incremental.Flush) finds it: the Ruleset's own fields whole, and only
// the pod and policy entries that came, changed or went. Applied to the
// Ruleset it was computed from (Ruleset.With), it gives the new one.
type Delta struct {
	LocalPodCIDRs    []netip.Prefix
	Known            []netip.Addr
	Ports            []string
	BridgePorts      []string
	BridgeUnfiltered bool
	// Pods are the pod entries that came or changed; GonePods the IDs of
	// those that went.
	Pods     []PodChains
	GonePods []string
	// Policies are the policy chains that came or changed; GonePolicies
	// the IDs of those that went.
	Policies     []PolicyChain
	GonePolicies []string
}

// Empty tells whether d changes no pod or policy entry (the Ruleset's own
// fields may still differ from the last ones).
func (d Delta) Empty() bool {
	return len(d.Pods)+len(d.GonePods)+len(d.Policies)+len(d.GonePolicies) == 0
}

// With is r changed by d: its own fields replaced, the entries of d put
// in (by ID) or taken out. The order of r's entries is kept; new ones
// come last (a compile's order is not a Ruleset's meaning: the table
// sorts by ID).
func (r Ruleset) With(d Delta) Ruleset {
	out := Ruleset{
		LocalPodCIDRs: slices.Clone(d.LocalPodCIDRs), Known: slices.Clone(d.Known),
		Ports: slices.Clone(d.Ports), BridgePorts: slices.Clone(d.BridgePorts),
		BridgeUnfiltered: d.BridgeUnfiltered,
	}
	gonePods := map[string]bool{}
	for _, id := range d.GonePods {
		gonePods[id] = true
	}
	newPods := map[string]int{}
	for i, p := range d.Pods {
		newPods[p.ID] = i
	}
	for _, p := range r.Pods {
		if i, ok := newPods[p.ID]; ok {
			out.Pods = append(out.Pods, d.Pods[i])
			delete(newPods, p.ID)
		} else if !gonePods[p.ID] {
			out.Pods = append(out.Pods, p)
		}
	}
	for _, p := range d.Pods {
		if _, ok := newPods[p.ID]; ok {
			out.Pods = append(out.Pods, p)
		}
	}
	gonePols := map[string]bool{}
	for _, id := range d.GonePolicies {
		gonePols[id] = true
	}
	newPols := map[string]int{}
	for i, p := range d.Policies {
		newPols[p.ID] = i
	}
	for _, p := range r.Policies {
		if i, ok := newPols[p.ID]; ok {
			out.Policies = append(out.Policies, d.Policies[i])
			delete(newPols, p.ID)
		} else if !gonePols[p.ID] {
			out.Policies = append(out.Policies, p)
		}
	}
	for _, p := range d.Policies {
		if _, ok := newPols[p.ID]; ok {
			out.Policies = append(out.Policies, p)
		}
	}
	return out
}
