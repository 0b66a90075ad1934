package nft

import (
	"errors"
	"fmt"
	"net/netip"

	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Allowed tells whether a connection, by its original direction, is
// allowed by the policy now in force: source and destination address,
// IP protocol, destination port (0 for protocols without ports).
type Allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool

// Revoke deletes the conntrack entries (both families, the calling
// thread's netns) whose original direction allowed no longer allows, and
// returns how many it deleted. The table accepts established traffic
// before any policy: a connection a change no longer allows keeps going
// until its entry goes. The next packet of such a TCP connection is then
// picked up as new (nf_conntrack_tcp_loose) and judged, and dropped.
// Entries allowed keeps are not touched: the table is dumped once per
// family and only the revoked entries are deleted, one request each.
func Revoke(allowed Allowed) (int, error) {
	deleted := 0
	var errs []error
	for _, fam := range []vnl.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := vnl.ConntrackDeleteFilters(vnl.ConntrackTable, fam, revoked{allowed})
		deleted += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("revoke conntrack entries (family %d): %w", fam, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// revoked matches the entries allowed no longer allows.
type revoked struct{ allowed Allowed }

func (r revoked) MatchConntrackFlow(f *vnl.ConntrackFlow) bool {
	src, ok1 := netip.AddrFromSlice(f.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(f.Forward.DstIP)
	if !ok1 || !ok2 {
		return false
	}
	port := uint16(0)
	switch f.Forward.Protocol {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_UDPLITE, unix.IPPROTO_DCCP:
		port = f.Forward.DstPort
	}
	return !r.allowed(src.Unmap(), dst.Unmap(), f.Forward.Protocol, port)
}
