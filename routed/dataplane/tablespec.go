package dataplane

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/desired"
)

// TableSpec is what podnet-routed's nft table (contract.NFTable) holds:
// the masquerade of pod traffic leaving the cluster, and the tunnel filter
// that takes encapsulated packets from the cluster's nodes only. Table
// writes it.
type TableSpec struct {
	// Masquerade: traffic from LocalPodCIDRs to anything outside every
	// ClusterCIDR leaves with the node's address.
	Masquerade bool
	// MasqueradeIPv6 narrows Masquerade for IPv6 PodCIDRs (the zero
	// value is MasqueradeIPv6Auto).
	MasqueradeIPv6 MasqueradeIPv6
	LocalPodCIDRs  []netip.Prefix // this node's PodCIDRs
	ClusterCIDRs   []netip.Prefix
	// Encap is the node's encapsulation: with ipip or vxlan (cross-subnet
	// too) the table filters the tunnel; with none it does not.
	Encap     desired.Encap
	VXLANPort int // VXLAN's UDP port (vxlan only)
	// Peers are the underlay addresses of the remote Nodes this node
	// routes to: the only sources of encapsulated packets it accepts.
	Peers []netip.Addr
	// RemotePodCIDRs are the PodCIDRs of those Nodes: the inner sources
	// it accepts from the tunnel.
	RemotePodCIDRs []netip.Prefix
}

// MasqueradeIPv6 says which IPv6 PodCIDRs' traffic leaving the cluster
// is masqueraded (--masquerade-ipv6).
type MasqueradeIPv6 string

// The --masquerade-ipv6 values.
const (
	// MasqueradeIPv6Auto masquerades a unique local (fc00::/7) PodCIDR
	// only: the internet does not route ULA, while a global PodCIDR is
	// routable and keeps its address.
	MasqueradeIPv6Auto  MasqueradeIPv6 = "auto"
	MasqueradeIPv6True  MasqueradeIPv6 = "true"
	MasqueradeIPv6False MasqueradeIPv6 = "false"
)

// ulaRange is IPv6's unique local range (RFC 4193).
var ulaRange = netip.MustParsePrefix("fc00::/7")

// ParseMasqueradeIPv6 reads a --masquerade-ipv6 value.
func ParseMasqueradeIPv6(s string) (MasqueradeIPv6, error) {
	switch m := MasqueradeIPv6(s); m {
	case MasqueradeIPv6Auto, MasqueradeIPv6True, MasqueradeIPv6False:
		return m, nil
	}
	return "", fmt.Errorf("%q: want auto, true or false", s)
}

// masquerades tells whether traffic from the local PodCIDR p leaving the
// cluster is masqueraded (Masquerade is on).
func (s TableSpec) masquerades(p netip.Prefix) bool {
	if p.Addr().Is4() {
		return true
	}
	switch s.MasqueradeIPv6 {
	case MasqueradeIPv6True:
		return true
	case MasqueradeIPv6False:
		return false
	}
	return ulaRange.Bits() <= p.Bits() && ulaRange.Contains(p.Addr())
}

// tunnel tells whether the spec filters a tunnel.
func (s TableSpec) tunnel() bool { return s.Encap == desired.IPIP || s.Encap == desired.VXLAN }

// empty tells whether the spec wants no table at all.
func (s TableSpec) empty() bool { return !s.Masquerade && !s.tunnel() }

// canonical is s with what does not shape the table dropped and every
// list sorted and without duplicates, so that two specs that write the
// same table compare equal.
func (s TableSpec) canonical() TableSpec {
	if s.empty() {
		return TableSpec{}
	}
	out := TableSpec{
		Masquerade:    s.Masquerade,
		LocalPodCIDRs: sortedPrefixes(s.LocalPodCIDRs),
		ClusterCIDRs:  sortedPrefixes(s.ClusterCIDRs),
	}
	if s.Masquerade {
		out.MasqueradeIPv6 = s.MasqueradeIPv6
		if out.MasqueradeIPv6 == "" {
			out.MasqueradeIPv6 = MasqueradeIPv6Auto
		}
	}
	if s.tunnel() {
		out.Encap = s.Encap
		if s.Encap == desired.VXLAN {
			out.VXLANPort = s.VXLANPort
		}
		out.Peers = sortedAddrs(s.Peers)
		out.RemotePodCIDRs = sortedPrefixes(s.RemotePodCIDRs)
	}
	return out
}

func (s TableSpec) equal(o TableSpec) bool {
	return s.Masquerade == o.Masquerade && s.MasqueradeIPv6 == o.MasqueradeIPv6 && s.Encap == o.Encap && s.VXLANPort == o.VXLANPort &&
		slices.Equal(s.LocalPodCIDRs, o.LocalPodCIDRs) && slices.Equal(s.ClusterCIDRs, o.ClusterCIDRs) &&
		slices.Equal(s.Peers, o.Peers) && slices.Equal(s.RemotePodCIDRs, o.RemotePodCIDRs)
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func sortedPrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if p.IsValid() {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked())
		}
	}
	slices.SortFunc(out, comparePrefixes)
	return slices.Compact(out)
}

// unmapBits is what a ::ffff:a.b.c.d/n prefix loses when made IPv4.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

func sortedAddrs(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(in))
	for _, a := range in {
		if a.IsValid() {
			out = append(out, a.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Set names, per family: "peers4" holds the IPv4 peers, and so on.
const (
	setPeers   = "peers"   // remote Nodes' underlay addresses
	setRemote  = "remote"  // remote Nodes' PodCIDRs (intervals)
	setLocal   = "local"   // this node's PodCIDRs (intervals)
	setCluster = "cluster" // the cluster CIDRs (intervals)
)

// addrSet is a named set of addresses (interval: of prefixes) of one
// family, without elements.
func addrSet(name string, v6, interval bool) nftutil.Set {
	key := nftables.TypeIPAddr
	if v6 {
		key = nftables.TypeIP6Addr
	}
	return nftutil.Set{Def: nftables.Set{Name: name, KeyType: key, Interval: interval}}
}

// elems is s with elements e.
func elems(s nftutil.Set, e []nftables.SetElement) nftutil.Set {
	s.Elems = e
	return s
}

func setName(base string, v6 bool) string {
	if v6 {
		return base + "6"
	}
	return base + "4"
}

// tunnelSets are the sets of the tunnel filter for spec (canonical), in
// the order they are written.
func tunnelSets(spec TableSpec) []nftutil.Set {
	var out []nftutil.Set
	for _, v6 := range []bool{false, true} {
		out = append(out,
			elems(addrSet(setName(setPeers, v6), v6, false), nftutil.AddrElements(spec.Peers, v6)),
			elems(addrSet(setName(setRemote, v6), v6, true), intervalElements(spec.RemotePodCIDRs, v6)),
			elems(addrSet(setName(setLocal, v6), v6, true), intervalElements(spec.LocalPodCIDRs, v6)),
			elems(addrSet(setName(setCluster, v6), v6, true), intervalElements(spec.ClusterCIDRs, v6)),
		)
	}
	return out
}

// intervalElements are the elements of an interval set holding prefixes
// (sorted) of the family v6 says: for each prefix its first address, and
// the address after its last flagged as the interval's end (none when the
// prefix reaches the top of the address space: the interval is then
// open). A prefix inside another is left out: the kernel refuses
// overlapping intervals, and the outer one covers it.
func intervalElements(prefixes []netip.Prefix, v6 bool) []nftables.SetElement {
	var out []nftables.SetElement
	var last netip.Prefix
	for _, p := range prefixes {
		if p.Addr().Is6() != v6 {
			continue
		}
		if last.IsValid() && last.Overlaps(p) {
			continue // sorted: p is inside last
		}
		last = p
		out = append(out, nftables.SetElement{Key: p.Addr().AsSlice()})
		if end, ok := afterPrefix(p); ok {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// afterPrefix is the first address after p, or false at the top of the
// address space.
func afterPrefix(p netip.Prefix) (netip.Addr, bool) {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	last, _ := netip.AddrFromSlice(b)
	next := last.Next()
	return next, next.IsValid()
}
