package nodestate

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// ErrBadPodCIDR is wrapped by every error of CheckPodCIDR and
// PodCIDRPrefixes.
var ErrBadPodCIDR = errors.New("not usable as a node's pod range")

// PodCIDR bounds. A node's pod range is one node's share of a cluster
// range, so:
//   - IPv4: /8 at most: that is already 16 million pods, and a /0-/7
//     range spans more than any private block (and mostly public space);
//   - IPv6: /48 at most: a /48 is what a whole site is assigned (RFC 6177),
//     Kubernetes hands nodes /64s by default and allows a node mask at most
//     16 bits shorter than a cluster's, so a shorter node range is a
//     mistake or an attack, never a plan;
//   - at least one address to hand out besides the network address, the
//     gateway and (IPv4) the broadcast address: /30 and /126, the smallest
//     ranges podnet-ipam's allocator accepts.
const (
	MinPodCIDRBitsV4 = 8
	MaxPodCIDRBitsV4 = 30
	MinPodCIDRBitsV6 = 48
	MaxPodCIDRBitsV6 = 126
)

// specialRange is an address block that can never hold pod addresses.
type specialRange struct {
	prefix netip.Prefix
	what   string
}

var specialRanges = []specialRange{
	{netip.MustParsePrefix("0.0.0.0/8"), `the "this network" range (with the unspecified address 0.0.0.0)`},
	{netip.MustParsePrefix("127.0.0.0/8"), "the loopback range"},
	{netip.MustParsePrefix("169.254.0.0/16"), "the link-local range"},
	{netip.MustParsePrefix("224.0.0.0/4"), "the multicast range"},
	{netip.MustParsePrefix("240.0.0.0/4"), "the reserved range (with the broadcast address 255.255.255.255)"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "the loopback address"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "the IPv4-mapped range (write IPv4 ranges in IPv4 form)"},
	{netip.MustParsePrefix("fe80::/10"), "the link-local range"},
	{netip.MustParsePrefix("ff00::/8"), "the multicast range"},
}

// CheckPodCIDR refuses a prefix that cannot be a node's pod range: one
// shorter than /8 (IPv4) or /48 (IPv6), one too small to hand out an
// address, and one that overlaps the unspecified, loopback, link-local,
// multicast or reserved blocks. Host bits are allowed (they are masked off,
// as host-local does). Whether the range covers an address of the node
// itself is decided by the IPAM, which knows which addresses it would hand
// out. It is the one check of the node state's PodCIDRs and of podnet-ipam's
// configured subnets.
func CheckPodCIDR(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("%w: not a valid prefix", ErrBadPodCIDR)
	}
	p = p.Masked()
	minBits, maxBits, fam := MinPodCIDRBitsV4, MaxPodCIDRBitsV4, "IPv4"
	if p.Addr().Is6() {
		minBits, maxBits, fam = MinPodCIDRBitsV6, MaxPodCIDRBitsV6, "IPv6"
	}
	// A shorter prefix overlaps a special block anyway; the size is the
	// clearer reason, so it comes first.
	if p.Bits() < minBits {
		return fmt.Errorf("%w: %s is far too large for the pods of one node (an %s pod range is /%d or longer)", ErrBadPodCIDR, p, fam, minBits)
	}
	for _, s := range specialRanges {
		if s.prefix.Overlaps(p) {
			return fmt.Errorf("%w: %s overlaps %s %s", ErrBadPodCIDR, p, s.what, s.prefix)
		}
	}
	if p.Bits() > maxBits {
		return fmt.Errorf("%w: %s is too small to hand out an address (an %s pod range is /%d or shorter)", ErrBadPodCIDR, p, fam, maxBits)
	}
	return nil
}

// LocalAddrs lists the global unicast addresses (private ones included) of
// the network namespace the calling thread is in: for the plugins, which run
// in the node's netns, the node's own addresses.
//
// Only the families asked for are listed: the dump of one family costs a
// message per address of that family, and a node with many pods has an
// IPv6 link-local address per host veth (ADD of an IPv4 pod must not pay
// for those).
func LocalAddrs(v4, v6 bool) ([]netip.Addr, error) {
	family := netlink.FAMILY_ALL
	switch {
	case v4 && !v6:
		family = netlink.FAMILY_V4
	case v6 && !v4:
		family = netlink.FAMILY_V6
	case !v4 && !v6:
		return nil, nil
	}
	addrs, err := netlinksafe.AddrList(nil, family)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		if ip = ip.Unmap(); ip.IsGlobalUnicast() {
			out = append(out, ip)
		}
	}
	return out, nil
}
