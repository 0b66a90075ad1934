// Package desired computes, without touching the kernel, what podnet-routed
// wants the node's dataplane to look like: one route per remote node
// PodCIDR (through the IPIP tunnel, the VXLAN device or directly), VXLAN
// neighbor and FDB entries, and a blackhole for the local PodCIDR. The
// dataplane layer diffs this against the kernel.
package desired

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// Encap is how traffic reaches a remote node's pods.
type Encap string

// Encapsulation modes.
const (
	IPIP  Encap = "ipip"
	VXLAN Encap = "vxlan"
	None  Encap = "none"
)

// Fixed device names (DESIGN.md §2).
const (
	TunnelDevice = "tunl0"
	VXLANDevice  = "podnet.vxlan"
)

// Overheads subtracted from the underlay MTU: an IPv4 outer header (20)
// plus, for VXLAN, UDP, VXLAN and the inner Ethernet header; over an IPv6
// underlay the outer header is 40.
const (
	IPIPOverhead   = 20
	VXLANOverhead  = 50
	VXLAN6Overhead = 70
)

// ParseEncap validates an --encap value.
func ParseEncap(s string) (Encap, error) {
	switch e := Encap(s); e {
	case IPIP, VXLAN, None:
		return e, nil
	}
	return "", fmt.Errorf("unknown encapsulation %q: use ipip, vxlan or none", s)
}

// OverheadOver is the per-packet cost of e over an underlay of the
// family of the node address ip (IPv4 when ip is not valid).
func (e Encap) OverheadOver(ip netip.Addr) int {
	if e == VXLAN && ip.Is6() && !ip.Is4In6() {
		return VXLAN6Overhead
	}
	return e.Overhead()
}

// Overhead is the per-packet cost of e over an IPv4 underlay.
func (e Encap) Overhead() int {
	switch e {
	case IPIP:
		return IPIPOverhead
	case VXLAN:
		return VXLANOverhead
	}
	return 0
}

// Node is what podnet-routed needs of a Kubernetes Node (ParseNode reads
// it from the object's fields).
type Node struct {
	Name     string
	PodCIDRs []netip.Prefix // masked; only the ones that parse
	IP       netip.Addr     // InternalIP, or the podnet.io/node-ip annotation when it is one of the Node's addresses
	// AltIP is the Node's first InternalIP of the other family than IP
	// (a dual-stack Node): the next hop of its PodCIDRs of that family
	// where they are routed directly (--encap=none, cross-subnet). It is
	// judged like IP (Validate), but a bad one only costs that family
	// its direct routes (AltProblem says why), never the Node.
	AltIP netip.Addr
	// AltProblem is why AltIP may not be used ("": it may); set by
	// validation on the Nodes it hands to ForNode.
	AltProblem string
	// Created (then Name: precedes) orders other Nodes for conflicts:
	// the older keeps a PodCIDR or address that two Nodes claim. UID
	// is the object's, for the record: random, it decides nothing.
	Created time.Time
	UID     string
	// Invalid says why a PodCIDR of the object could not be taken as
	// it is (does not parse, host bits set): the Node is refused.
	Invalid string
	// Note is a remark on the object that does not refuse it (an
	// annotation that was ignored), for the log.
	Note string
}

// Config is the daemon's configuration as far as desired state goes.
type Config struct {
	Self        string // this node's name
	Encap       Encap
	CrossSubnet bool
	// Underlay is the device that reaches other nodes directly.
	Underlay string
	// What validation holds PodCIDRs against (Validate): every PodCIDR
	// must lie inside a cluster CIDR, and overlap no service CIDR nor
	// hold an API server address.
	ClusterCIDRs []netip.Prefix
	ServiceCIDRs []netip.Prefix
	APIServers   []netip.Addr
}

// Kind says how a route forwards.
type Kind int

// Route kinds.
const (
	Via       Kind = iota // unicast via a next hop
	Blackhole             // drop: the local PodCIDR's unallocated addresses
)

// Route is one desired route. Routes are keyed by destination.
type Route struct {
	Dst    netip.Prefix
	Kind   Kind
	Gw     netip.Addr
	Dev    string
	OnLink bool
}

func (r Route) String() string {
	if r.Kind == Blackhole {
		return "blackhole " + r.Dst.String()
	}
	s := fmt.Sprintf("%s via %s dev %s", r.Dst, r.Gw, r.Dev)
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// Neighbor is a permanent VXLAN neighbor entry: the remote VTEP address
// resolves to the remote device's MAC.
type Neighbor struct {
	IP  netip.Addr
	MAC string
}

// FDB sends frames for MAC to the remote node's underlay address.
type FDB struct {
	MAC string
	Dst netip.Addr
}

// Skip is a node left out, and why.
type Skip struct {
	Node   string
	Reason string
}

// State is the whole desired dataplane.
type State struct {
	Routes    []Route // sorted by Dst
	Neighbors []Neighbor
	FDBs      []FDB
	// Self is this node, when it is known and has PodCIDRs.
	Self *Node
	// VTEPs are the addresses of this node's VXLAN device (one per
	// local PodCIDR family: the PodCIDR's network address).
	VTEPs   []netip.Prefix
	Skipped []Skip
	// Refused are the Nodes validation refuses (Validate), by name;
	// SelfProblem says why this node itself cannot be used ("" when it
	// can: Self is set).
	Refused     map[string]Refusal
	SelfProblem string
}

// OnLink tells whether a node address is reachable without a gateway on
// the underlay (decided by the dataplane with a route lookup).
type OnLink func(netip.Addr) bool

// Compute derives the desired state from the nodes: Validate with
// nothing known of this node's network, then the routes of the valid
// Nodes (NewPlan is the same with this node's network).
func Compute(cfg Config, nodes []Node, onLink OnLink) State {
	_, st := NewPlan(cfg, Local{}, nodes, onLink)
	return st
}

// routable is what compute turns into routes: the Nodes v does not
// refuse (this node only when it is valid; Nodes without a PodCIDR or an
// address yet stay, for ForNode to report them skipped).
func routable(cfg Config, v Validation, nodes []Node) []Node {
	out := make([]Node, 0, len(nodes))
	for _, n := range nodes {
		if _, refused := v.Refused[n.Name]; refused || (n.Name == cfg.Self && v.Self == nil) {
			continue
		}
		out = append(out, v.WithAltProblem(n))
	}
	return out
}

// compute is the routes of nodes (validated: no two claim a PodCIDR),
// handing each remote node's contribution to each as well (NewPlan keeps
// them).
func compute(cfg Config, nodes []Node, onLink OnLink, each func(string, Contribution)) State {
	var st State
	sorted := slices.Clone(nodes)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, n := range sorted {
		if n.Name == cfg.Self && len(n.PodCIDRs) > 0 {
			self := n
			st.Self = &self
			for _, p := range n.PodCIDRs {
				st.Routes = append(st.Routes, Route{Dst: p.Masked(), Kind: Blackhole})
				st.VTEPs = append(st.VTEPs, netip.PrefixFrom(p.Masked().Addr(), p.Addr().BitLen()))
			}
		}
	}
	for _, n := range sorted {
		if n.Name == cfg.Self {
			continue
		}
		c := ForNode(cfg, n, onLink)
		if each != nil {
			each(n.Name, c)
		}
		for _, r := range c.Routes {
			st.Routes = append(st.Routes, r)
			if cfg.Encap == VXLAN && r.Dev == VXLANDevice {
				i := slices.IndexFunc(c.Neighbors, func(nb Neighbor) bool { return nb.IP == r.Gw })
				st.Neighbors = append(st.Neighbors, c.Neighbors[i])
				st.FDBs = append(st.FDBs, FDB{MAC: c.Neighbors[i].MAC, Dst: n.IP})
			}
		}
		st.Skipped = append(st.Skipped, c.Skipped...)
	}
	sortByDst(st.Routes)
	st.FDBs = dedupFDB(st.FDBs)
	return st
}

// Contribution is what one remote node adds to the desired state: its
// routes (one per PodCIDR it can be reached for), the VXLAN entries that
// go with them, and why any of its PodCIDRs is left out.
type Contribution struct {
	Routes    []Route
	Neighbors []Neighbor
	FDBs      []FDB
	Skipped   []Skip
}

// ForNode is the contribution of node n, seen from cfg.Self. This node's
// own blackholes are Compute's; ForNode treats every node as remote.
func ForNode(cfg Config, n Node, onLink OnLink) Contribution {
	var c Contribution
	if len(n.PodCIDRs) == 0 {
		c.Skipped = append(c.Skipped, Skip{n.Name, "no spec.podCIDRs yet"})
		return c
	}
	if !n.IP.IsValid() {
		c.Skipped = append(c.Skipped, Skip{n.Name, "no InternalIP address (or podnet.io/node-ip annotation) yet"})
		return c
	}
	for _, p := range n.PodCIDRs {
		p = p.Masked()
		// the next hop of a direct route: the node address of p's
		// family (IP, or on a dual-stack Node AltIP)
		hop, why := n.IP, ""
		if p.Addr().Is4() != n.IP.Is4() {
			hop = n.AltIP
			switch {
			case n.AltProblem != "":
				hop, why = netip.Addr{}, n.AltProblem
			case !hop.IsValid() || hop.Is4() != p.Addr().Is4():
				hop, why = netip.Addr{}, "the Node has no InternalIP of that family"
			}
		}
		encap := cfg.Encap
		if encap != None && cfg.CrossSubnet && hop.IsValid() && onLink != nil && onLink(hop) {
			// Cross-subnet: a node on our L2 subnet is reached
			// directly, in each family whose address is on it.
			encap = None
		}
		if !hop.IsValid() && encap != VXLAN {
			// IPIP and direct routes need a next hop of the same
			// family; VXLAN carries either family over IP.
			c.Skipped = append(c.Skipped, Skip{n.Name, fmt.Sprintf("PodCIDR %s has no node address of its family: %s", p, why)})
			continue
		}
		if encap == IPIP && !p.Addr().Is4() {
			// tunl0 is IPv4-in-IPv4: it drops anything else.
			c.Skipped = append(c.Skipped, Skip{n.Name, fmt.Sprintf("PodCIDR %s: IPIP carries IPv4 only (use vxlan or none)", p)})
			continue
		}
		switch encap {
		case IPIP:
			c.Routes = append(c.Routes, Route{Dst: p, Gw: n.IP, Dev: TunnelDevice, OnLink: true})
		case None:
			c.Routes = append(c.Routes, Route{Dst: p, Gw: hop, Dev: cfg.Underlay})
		case VXLAN:
			vtep := p.Addr() // the remote PodCIDR's network address
			mac := VTEPMAC(n.IP)
			c.Routes = append(c.Routes, Route{Dst: p, Gw: vtep, Dev: VXLANDevice, OnLink: true})
			c.Neighbors = append(c.Neighbors, Neighbor{IP: vtep, MAC: mac})
			c.FDBs = append(c.FDBs, FDB{MAC: mac, Dst: n.IP})
		}
	}
	c.FDBs = dedupFDB(c.FDBs)
	return c
}

// Equal tells whether a and b route the same way and are judged the same
// way.
func (a Node) Equal(b Node) bool {
	return a.Name == b.Name && a.IP == b.IP && a.AltIP == b.AltIP && a.AltProblem == b.AltProblem && slices.Equal(a.PodCIDRs, b.PodCIDRs) &&
		a.Created.Equal(b.Created) && a.UID == b.UID && a.Invalid == b.Invalid && a.Note == b.Note
}

// sortByDst sorts routes by the text of their destination. Each key is
// formatted once (formatting inside the comparator cost O(N log N)
// allocations: most of an apply's time at 5,000 Nodes).
func sortByDst(routes []Route) {
	type keyed struct {
		key string
		r   Route
	}
	ks := make([]keyed, len(routes))
	for i, r := range routes {
		ks[i] = keyed{r.Dst.String(), r}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	for i := range ks {
		routes[i] = ks[i].r
	}
}

// VTEPMAC is the MAC of a node's VXLAN device, derived from its underlay
// address so every node can compute every other node's without extra
// annotations. Both spaces are locally administered unicast and apart
// (first byte 0x0e or 0x0a):
//   - IPv4: 0e:70 + the 4 bytes of the address, one to one (the MACs of
//     every podnet before IPv6 underlays: a rolling upgrade keeps them);
//   - IPv6: 0a + the first 5 bytes of the SHA-256 of the whole address
//     (the low 4 bytes alone collide between subnets). A collision of 40
//     bits cannot be ruled out: Validate refuses the younger of two
//     Nodes whose MACs are equal (vtep-mac-conflict).
func VTEPMAC(nodeIP netip.Addr) string {
	nodeIP = nodeIP.Unmap()
	if nodeIP.Is4() {
		b := nodeIP.As4()
		return net.HardwareAddr{0x0e, 0x70, b[0], b[1], b[2], b[3]}.String()
	}
	b := nodeIP.As16()
	h := sha256.Sum256(b[:])
	return net.HardwareAddr{0x0a, h[0], h[1], h[2], h[3], h[4]}.String()
}

func dedupFDB(in []FDB) []FDB {
	seen := make(map[FDB]bool, len(in))
	out := in[:0]
	for _, f := range in {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// Diff compares desired routes with the routes podnet owns in the kernel
// (actual) and returns what to add or replace and what to delete.
func Diff(want, actual []Route) (upsert, remove []Route) {
	have := make(map[netip.Prefix]Route, len(actual))
	for _, r := range actual {
		have[r.Dst] = r
	}
	wanted := make(map[netip.Prefix]bool, len(want))
	for _, r := range want {
		wanted[r.Dst] = true
		if cur, ok := have[r.Dst]; !ok || cur != r {
			upsert = append(upsert, r)
		}
	}
	for _, r := range actual {
		if !wanted[r.Dst] {
			remove = append(remove, r)
		}
	}
	return upsert, remove
}
