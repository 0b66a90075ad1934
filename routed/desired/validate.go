package desired

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Reason says why a Node gets no route. The values are the label of
// podnet_nodes_refused and the first words of every refusal's log line.
type Reason string

// Refusal reasons, in the order they are checked: a Node that fails
// several is refused for the first.
const (
	// a PodCIDR that does not parse or has host bits set (one of a family
	// the encapsulation does not carry, IPv6 with IPIP, is skipped alone:
	// ForNode)
	InvalidPodCIDR Reason = "invalid-podcidr"
	// a PodCIDR overlapping loopback, link-local, multicast, unspecified
	// or reserved addresses (0.0.0.0/0 and 0.0.0.0/1 among them)
	ReservedRange Reason = "reserved-range"
	// a PodCIDR not inside any cluster CIDR
	OutsideClusterCIDR Reason = "outside-cluster-cidr"
	// a PodCIDR overlapping a service CIDR
	OverlapsServiceCIDR Reason = "overlaps-service-cidr"
	// a PodCIDR holding the API server's address
	OverlapsAPIServer Reason = "overlaps-apiserver"
	// a PodCIDR overlapping an address of this node or a route that is
	// not podnet's (the underlay, a connected network)
	OverlapsNodeNetwork Reason = "overlaps-node-network"
	// a PodCIDR overlapping this node's own PodCIDRs
	OverlapsOwnPodCIDR Reason = "overlaps-own-podcidr"
	// a PodCIDR overlapping that of a Node that keeps it (precedes)
	PodCIDRConflict Reason = "podcidr-conflict"
	// a node address of the wrong family, or inside a pod, cluster or
	// service CIDR, or loopback, link-local, multicast, unspecified
	InvalidNodeIP Reason = "invalid-node-ip"
	// a node address that is this node's own
	OwnNodeIP Reason = "own-node-ip"
	// a node address a Node that keeps it (precedes) has too
	NodeIPConflict Reason = "node-ip-conflict"
	// (--encap=vxlan only) a node address whose VXLAN MAC (VTEPMAC) is
	// that of a Node that keeps it (precedes) too: two IPv6 addresses whose hashes collide
	VTEPMACConflict Reason = "vtep-mac-conflict"
)

// Reasons lists every reason, in checking order.
var Reasons = []Reason{InvalidPodCIDR, ReservedRange, OutsideClusterCIDR, OverlapsServiceCIDR, OverlapsAPIServer,
	OverlapsNodeNetwork, OverlapsOwnPodCIDR, PodCIDRConflict, InvalidNodeIP, OwnNodeIP, NodeIPConflict, VTEPMACConflict}

func (r Reason) rank() int { return slices.Index(Reasons, r) }

// Refusal is a Node that gets no route, and why.
type Refusal struct {
	Node   string
	Reason Reason
	Detail string // a sentence a human can act on
}

// Local is what this node knows of itself that validation compares
// Nodes with: its own addresses and the routes that are not podnet's.
// It changes with the node's network (read again on every full apply).
type Local struct {
	Addrs []netip.Addr
	// Routes are the destinations of the main table's routes of other
	// protocols; Connected those of them the kernel made for an address
	// (the node's own subnets).
	Routes    []netip.Prefix
	Connected []netip.Prefix
}

// reserved are the ranges no PodCIDR may overlap and no node address may
// lie in.
var reserved = func() *prefixTrie {
	t := &prefixTrie{}
	for _, s := range []string{
		"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
		"::/96", "::1/128", "::ffff:0:0/96", "fe80::/10", "ff00::/8", // ::/96: IPv4-compatible (deprecated) and ::
	} {
		t.insert(netip.MustParsePrefix(s), s)
	}
	return t
}()

// Validation is the verdict on every Node, as Validate gives it.
type Validation struct {
	// Valid are the Nodes that may be routed (this node among them when
	// it is valid), in input order.
	Valid []Node
	// Refused are the others, with the first reason each fails.
	Refused map[string]Refusal
	// Self is this node when it is valid; SelfProblem otherwise says why
	// not (also when it is missing or has no PodCIDR or address yet).
	Self        *Node
	SelfProblem string
	// Conflicted are the Nodes that take part in a PodCIDR or address
	// conflict, winners and losers: a change to one of them can change
	// the verdict on another, so it is judged with every Node again.
	Conflicted map[string]bool
	// AltProblems says, by Node name, why a valid Node's AltIP may not be
	// used (its family then gets no direct route; the Node is not
	// refused for it).
	AltProblems map[string]string

	// claims is what Plan.Update judges one Node against
	claims *claimIndex
}

// Validate decides which Nodes may become routes, seen from cfg.Self:
//   - a PodCIDR must parse with its host bits zero, lie inside a
//     cluster CIDR, and overlap none
//     of: reserved ranges, the service CIDRs, the API server's address,
//     this node's addresses and non-podnet routes, this node's PodCIDRs;
//   - the next hop must be of the underlay's family, not this node's,
//     and inside no cluster, pod or service CIDR nor a reserved range;
//   - when two Nodes claim overlapping PodCIDRs (equal or not) or one
//     address, this node's own Node keeps them against any other, and
//     between two other Nodes the older (creationTimestamp, then the
//     name: precedes) keeps them; the other is refused for as long as
//     the conflict lasts.
//
// The checks that do not depend on this node (all but the API server,
// this node's network and its own PodCIDRs and address) are decided, and
// conflicts between two other Nodes resolved, the same way on every
// node. A conflict with this node's own Node is not: each of two Nodes
// in conflict keeps its claim on its own node, and every third node
// gives it to the one that precedes. Nodes without a
// PodCIDR or an address yet are neither valid nor refused (ForNode skips
// them). The cost is O(N log N) for N Nodes: a sort and trie lookups.
func Validate(cfg Config, local Local, nodes []Node) Validation {
	v := Validation{Refused: map[string]Refusal{}, Conflicted: map[string]bool{}, AltProblems: map[string]string{}}
	var selfNode *Node
	for i := range nodes {
		if nodes[i].Name == cfg.Self {
			selfNode = &nodes[i]
		}
	}
	ix := newClaimIndex(cfg, underlayFamily(selfNode))
	v.claims = ix
	// 1. checks of each Node alone that every node decides alike
	candidates := v.candidates(cfg, nodes)
	// 2. conflicts between them: this node's own Node keeps what it
	// claims, then the older Node keeps what both claim (precedes)
	winners, conflict := v.resolveConflicts(cfg, candidates)
	v.altClaims(cfg, candidates, winners)
	if selfNode != nil && len(selfNode.PodCIDRs) > 0 {
		if r, lost := conflict[cfg.Self]; lost {
			v.SelfProblem = r.Detail
		} else if v.SelfProblem == "" {
			self := *selfNode
			v.Self = &self
		}
	} else if selfNode == nil {
		v.SelfProblem = fmt.Sprintf("this node's Node object %q does not exist (deleted, or --node-name is wrong)", cfg.Self)
	}
	// 3. what only this node can judge, and the reason each loser is
	// given (the first in checking order)
	if v.Self != nil {
		ix.own = &prefixTrie{}
		for _, p := range v.Self.PodCIDRs {
			ix.own.insert(p, cfg.Self)
		}
	}
	ix.local = newLocalChecks(cfg, local, v.Self)
	valid := v.localVerdicts(cfg, candidates, winners, conflict)
	for _, n := range nodes {
		if valid[n.Name] {
			v.Valid = append(v.Valid, n)
		}
	}
	return v
}

// candidates are the Nodes that are ready (this node: with a PodCIDR) and
// pass the checks every node decides alike; the others are refused.
func (v *Validation) candidates(cfg Config, nodes []Node) []*Node {
	var candidates []*Node
	for i := range nodes {
		n := &nodes[i]
		isSelf := n.Name == cfg.Self
		if !ready(*n) && n.Invalid == "" && (!isSelf || len(n.PodCIDRs) == 0) {
			// this node without an address yet still has its PodCIDR
			// (blackhole, node.json); others need both for a route
			if isSelf {
				v.SelfProblem = notReady(*n)
			}
			continue
		}
		if r, bad := globalChecks(cfg, v.claims.family, *n); bad {
			v.refuse(cfg, r)
			continue
		}
		candidates = append(candidates, n)
	}
	return candidates
}

// resolveConflicts sorts the candidates (precedes) and gives each what it
// claims unless a Node before it holds it already. It returns the Nodes
// that hold their claims, and the lost conflicts by loser.
func (v *Validation) resolveConflicts(cfg Config, candidates []*Node) ([]*Node, map[string]conflictRefusal) {
	slices.SortStableFunc(candidates, func(a, b *Node) int { return precedes(cfg.Self, *a, *b) })
	byName := make(map[string]*Node, len(candidates))
	for _, n := range candidates {
		byName[n.Name] = n
	}
	keeps := func(loser Node, owner string) string { return whyKept(cfg.Self, *byName[owner], loser) }
	var winners []*Node
	conflict := map[string]conflictRefusal{}
	for _, n := range candidates {
		if r, lost := v.claims.conflict(*n, keeps); lost {
			conflict[n.Name] = r
			v.claims.lose(*n)
			v.Conflicted[n.Name] = true
			v.Conflicted[r.owner] = true
			continue
		}
		v.claims.hold(*n)
		winners = append(winners, n)
	}
	return winners, conflict
}

// altClaims gives the winners their other-family addresses: one that is
// another Node's address (primary, or an older Node's other-family one)
// is nobody's to route to; the Nodes keep their primary family.
func (v *Validation) altClaims(cfg Config, candidates, winners []*Node) {
	primaries := map[netip.Addr]string{}
	for _, n := range candidates {
		if n.IP.IsValid() {
			primaries[n.IP] = n.Name
		}
	}
	for _, n := range winners {
		if !n.AltIP.IsValid() {
			continue
		}
		if why := altGlobalProblem(cfg, *n); why != "" {
			v.AltProblems[n.Name] = why
			continue
		}
		owner, hit := primaries[n.AltIP]
		if !hit {
			owner, hit = v.claims.altIPs[n.AltIP]
		}
		if hit {
			v.AltProblems[n.Name] = fmt.Sprintf("its other-family address %s is also Node %s's", n.AltIP, owner)
			v.Conflicted[n.Name], v.Conflicted[owner] = true, true
			continue
		}
		v.claims.holdAlt(*n)
	}
}

// localVerdicts makes the checks only this node can make: it refuses the
// winners that fail them, gives each loser of a conflict the first reason
// in checking order, and returns the valid Nodes by name.
func (v *Validation) localVerdicts(cfg Config, candidates, winners []*Node, conflict map[string]conflictRefusal) map[string]bool {
	lc, own := v.claims.local, v.claims.own
	for _, n := range winners {
		if why := lc.altProblem(*n); why != "" && v.AltProblems[n.Name] == "" {
			v.AltProblems[n.Name] = why
		}
	}
	valid := map[string]bool{}
	for _, n := range winners {
		if n.Name == cfg.Self {
			valid[n.Name] = true
			continue
		}
		if r, bad := lc.check(*n, own); bad {
			v.refuse(cfg, r)
			continue
		}
		valid[n.Name] = true
	}
	for name, r := range conflict {
		if name == cfg.Self {
			continue
		}
		n := nodeNamed(candidates, name)
		rr := r.Refusal
		if lr, bad := lc.check(*n, own); bad && lr.Reason.rank() < rr.Reason.rank() {
			rr = lr
		}
		v.refuse(cfg, rr)
	}
	return valid
}

// altGlobalProblem is why n's other-family address may not be a next
// hop, by the checks every node decides alike (those of the primary
// address, but its family): "" when it may.
func altGlobalProblem(cfg Config, n Node) string {
	ip := n.AltIP
	switch {
	case ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.IsInterfaceLocalMulticast():
		return fmt.Sprintf("its other-family address %s is loopback, link-local, multicast or unspecified", ip)
	}
	if _, q, hit := reserved.contains(ip); hit {
		return fmt.Sprintf("its other-family address %s lies in the reserved range %s", ip, q)
	}
	for _, list := range [][]netip.Prefix{cfg.ClusterCIDRs, cfg.ServiceCIDRs, n.PodCIDRs} {
		for _, p := range list {
			if p.Contains(ip) {
				return fmt.Sprintf("its other-family address %s lies inside %s (a pod, cluster or service CIDR)", ip, p)
			}
		}
	}
	return ""
}

// WithAltProblem is n as ForNode must route it: AltProblem set from v.
func (v Validation) WithAltProblem(n Node) Node {
	n.AltProblem = v.AltProblems[n.Name]
	return n
}

func (v *Validation) refuse(cfg Config, r Refusal) {
	if r.Node == cfg.Self {
		v.SelfProblem = r.Detail
		return
	}
	v.Refused[r.Node] = r
}

func nodeNamed(nodes []*Node, name string) *Node {
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ready tells whether a Node has what a route needs: PodCIDRs and an
// address. One without is skipped, not refused: kube-controller-manager
// and the kubelet fill them in.
func ready(n Node) bool { return len(n.PodCIDRs) > 0 && n.IP.IsValid() }

func notReady(n Node) string {
	if len(n.PodCIDRs) == 0 {
		return fmt.Sprintf("this node's Node %q has no spec.podCIDRs yet (is kube-controller-manager running with --allocate-node-cidrs?)", n.Name)
	}
	return fmt.Sprintf("this node's Node %q has no InternalIP in status.addresses yet", n.Name)
}

// underlayFamily is the family of this node's address: next hops must
// be of it. Without it (this node unknown), any family.
func underlayFamily(self *Node) int {
	if self == nil || !self.IP.IsValid() {
		return 0
	}
	return self.IP.BitLen()
}

// precedes orders Nodes for conflicts, the one that keeps a contested
// PodCIDR or address first:
//   - this node's own Node (self) before any other: its pods hold
//     addresses from its PodCIDRs, so yielding them to another Node would
//     route part of its own pods' range away from them (the other Nodes
//     decide by age: a Node they refuse keeps its range here alone);
//   - then the older Node by creationTimestamp;
//   - within the same second (the timestamp's resolution), the Node whose
//     name sorts first. A name is unique, the same on every node, stable
//     across updates and visible to the operator, so a tie is decided
//     alike everywhere and predictably; the UID, random, would make each
//     tie a coin flip that a Node created again and again wins sooner or
//     later.
func precedes(self string, a, b Node) int {
	switch {
	case a.Name == b.Name:
		return 0
	case a.Name == self:
		return -1
	case b.Name == self:
		return 1
	}
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// whyKept says why winner keeps what loser claims too (precedes), for
// the loser's refusal.
func whyKept(self string, winner, loser Node) string {
	const stamp = time.RFC3339
	switch {
	case winner.Name == self:
		return "this node's own Node, which never yields its own PodCIDRs or address to another Node"
	case winner.Created.Before(loser.Created):
		return fmt.Sprintf("older (created %s, Node %s %s), which keeps it", winner.Created.UTC().Format(stamp), loser.Name, loser.Created.UTC().Format(stamp))
	}
	return fmt.Sprintf("created in the same second (%s) and keeps it: on a tie the name that sorts first wins, on every node alike", winner.Created.UTC().Format(stamp))
}

func refusal(n Node, r Reason, format string, args ...any) (Refusal, bool) {
	return Refusal{Node: n.Name, Reason: r, Detail: fmt.Sprintf("Node %s: ", n.Name) + fmt.Sprintf(format, args...)}, true
}

// globalChecks are the checks of one Node that depend only on the
// cluster's configuration, so every node decides them alike.
func globalChecks(cfg Config, family int, n Node) (Refusal, bool) {
	if n.Invalid != "" {
		return refusal(n, InvalidPodCIDR, "%s", n.Invalid)
	}
	for _, p := range n.PodCIDRs {
		if p.Bits() == 0 {
			return refusal(n, ReservedRange, "PodCIDR %s is a default route", p)
		}
		if q, _, hit := reserved.overlap(p); hit {
			return refusal(n, ReservedRange, "PodCIDR %s overlaps the reserved range %s (loopback, link-local, multicast or unspecified)", p, q)
		}
		if !insideAny(p, cfg.ClusterCIDRs) {
			return refusal(n, OutsideClusterCIDR, "PodCIDR %s is not inside the cluster CIDR (%s)", p, prefixList(cfg.ClusterCIDRs))
		}
		for _, s := range cfg.ServiceCIDRs {
			if s.Overlaps(p) {
				return refusal(n, OverlapsServiceCIDR, "PodCIDR %s overlaps the service CIDR %s", p, s)
			}
		}
	}
	ip := n.IP
	if !ip.IsValid() {
		return Refusal{}, false // this node without an address yet
	}
	switch {
	case family != 0 && ip.BitLen() != family:
		return refusal(n, InvalidNodeIP, "node address %s is not of the underlay's family (this node's address is IPv%d)", ip, map[int]int{32: 4, 128: 6}[family])
	case ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.IsInterfaceLocalMulticast():
		return refusal(n, InvalidNodeIP, "node address %s is loopback, link-local, multicast or unspecified", ip)
	}
	if _, q, hit := reserved.contains(ip); hit {
		return refusal(n, InvalidNodeIP, "node address %s lies in the reserved range %s", ip, q)
	}
	for _, list := range [][]netip.Prefix{cfg.ClusterCIDRs, cfg.ServiceCIDRs, n.PodCIDRs} {
		for _, p := range list {
			if p.Contains(ip) {
				return refusal(n, InvalidNodeIP, "node address %s lies inside %s (a pod, cluster or service CIDR)", ip, p)
			}
		}
	}
	return Refusal{}, false
}

// conflictRefusal is a lost conflict and the Node that won it.
type conflictRefusal struct {
	Refusal
	owner string
}

// conflicts checks n against the Nodes already accepted (all preceding
// it: precedes): their PodCIDRs, addresses and (macs not nil: vxlan) VTEP
// MACs. keeps says why the owner keeps it (nil: only the verdict is
// wanted).
func conflicts(n Node, taken *prefixTrie, ips map[netip.Addr]string, macs map[string]string, keeps func(loser Node, owner string) string) (conflictRefusal, bool) {
	why := func(owner string) string {
		if keeps == nil {
			return "which keeps it"
		}
		return keeps(n, owner)
	}
	for _, p := range n.PodCIDRs {
		if q, owner, hit := taken.overlap(p); hit {
			r, _ := refusal(n, PodCIDRConflict, "PodCIDR %s overlaps PodCIDR %s of Node %s, %s", p, q, owner, why(owner))
			return conflictRefusal{r, owner}, true
		}
	}
	if owner, hit := ips[n.IP]; hit && n.IP.IsValid() {
		r, _ := refusal(n, NodeIPConflict, "node address %s is also Node %s's, %s", n.IP, owner, why(owner))
		return conflictRefusal{r, owner}, true
	}
	if macs != nil && n.IP.IsValid() {
		mac := VTEPMAC(n.IP)
		if owner, hit := macs[mac]; hit && owner != n.Name {
			r, _ := refusal(n, VTEPMACConflict, "the VXLAN MAC %s derived from node address %s is also Node %s's, %s (the two addresses' hashes collide: give this node another address)", mac, n.IP, owner, why(owner))
			return conflictRefusal{r, owner}, true
		}
	}
	return conflictRefusal{}, false
}

// CheckClusterCIDR refuses a cluster CIDR that would let a PodCIDR take
// a default route or a reserved range (--cluster-cidr is an operator's
// input too).
func CheckClusterCIDR(p netip.Prefix) error {
	if p.Bits() == 0 {
		return fmt.Errorf("%s is a default route: give the cluster's pod CIDR, e.g. 10.244.0.0/16", p)
	}
	if q, _, hit := reserved.overlap(p); hit {
		return fmt.Errorf("%s overlaps the reserved range %s (loopback, link-local, multicast or unspecified)", p, q)
	}
	return nil
}

func insideAny(p netip.Prefix, list []netip.Prefix) bool {
	for _, c := range list {
		if c.Bits() <= p.Bits() && c.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func prefixList(list []netip.Prefix) string {
	if len(list) == 0 {
		return "none configured: pass --cluster-cidr"
	}
	s := make([]string, len(list))
	for i, p := range list {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// MissingFamily says, when the cluster CIDRs hold both families and Node
// n has PodCIDRs of one only, what its pods lack ("" otherwise). Such a
// Node is not refused: its family still routes.
func MissingFamily(clusterCIDRs []netip.Prefix, n Node) string {
	if len(n.PodCIDRs) == 0 {
		return ""
	}
	has := func(list []netip.Prefix, v6 bool) bool {
		return slices.ContainsFunc(list, func(p netip.Prefix) bool { return p.Addr().Is6() == v6 })
	}
	for _, v6 := range []bool{false, true} {
		if has(clusterCIDRs, v6) && has(clusterCIDRs, !v6) && !has(n.PodCIDRs, v6) {
			fam := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
			return fmt.Sprintf("Node %s has no %s PodCIDR but the cluster CIDRs are %s: its pods get no %s address; is kube-controller-manager running with both --cluster-cidr families?",
				n.Name, fam, prefixList(clusterCIDRs), fam)
		}
	}
	return ""
}
