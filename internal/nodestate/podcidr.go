package nodestate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
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
// for those). The dump is read with the standard library's netlink
// helpers and only each address is decoded: a node whose other veths
// carry addresses (another plugin's pods: ptp gives each host end the
// pod's gateway address) answers with a message per veth, and
// vishvananda's full decode of each cost an ADD 0.14 ms at 100 of them.
func LocalAddrs(v4, v6 bool) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range []struct {
		want   bool
		family int
	}{{v4, unix.AF_INET}, {v6, unix.AF_INET6}} {
		if !f.want {
			continue
		}
		addrs, err := dumpAddrs(f.family)
		if err != nil {
			return nil, fmt.Errorf("list the node's addresses: %w", err)
		}
		out = append(out, addrs...)
	}
	return out, nil
}

// dumpAttempts is how often dumpAddrs dumps when the kernel says the dump
// was interrupted (an address changed under it).
const dumpAttempts = 5

// dumpAddrs dumps the addresses of one family and returns the global
// unicast ones: an address's IFA_LOCAL, else its IFA_ADDRESS (on a
// point-to-point link IFA_ADDRESS is the peer's).
func dumpAddrs(family int) ([]netip.Addr, error) {
	for range dumpAttempts {
		rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, family)
		if err != nil {
			return nil, fmt.Errorf("RTM_GETADDR dump: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(rib)
		if err != nil {
			return nil, fmt.Errorf("RTM_GETADDR dump: %w", err)
		}
		out, interrupted, err := addrsOf(msgs, family)
		if err != nil || !interrupted {
			return out, err
		}
	}
	return nil, fmt.Errorf("RTM_GETADDR dump interrupted %d times in a row", dumpAttempts)
}

// addrsOf is the global unicast addresses of family in the messages of an
// RTM_GETADDR dump, and whether the kernel marked the dump interrupted. A
// message too short for its header or of another family is skipped; an
// NLMSG_ERROR with an errno, or attributes that do not parse, fail it.
func addrsOf(msgs []syscall.NetlinkMessage, family int) ([]netip.Addr, bool, error) {
	var out []netip.Addr
	interrupted := false
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
			interrupted = true
		}
		switch m.Header.Type {
		case syscall.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
					return nil, false, fmt.Errorf("RTM_GETADDR dump: %w", syscall.Errno(errno))
				}
			}
			continue
		case syscall.RTM_NEWADDR:
		default:
			continue
		}
		if len(m.Data) < syscall.SizeofIfAddrmsg || int(m.Data[0]) != family {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return nil, false, fmt.Errorf("RTM_GETADDR dump: %w", err)
		}
		var local, address []byte
		for _, a := range attrs {
			switch a.Attr.Type {
			case syscall.IFA_LOCAL:
				local = a.Value
			case syscall.IFA_ADDRESS:
				address = a.Value
			}
		}
		if local == nil {
			local = address
		}
		if ip, ok := netip.AddrFromSlice(local); ok {
			if ip = ip.Unmap(); ip.IsGlobalUnicast() {
				out = append(out, ip)
			}
		}
	}
	return out, interrupted, nil
}
