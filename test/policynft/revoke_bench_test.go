package policynft

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// BenchmarkRevokeScan: the conntrack scan that follows a narrowing change,
// over a node's table of 20,000 TCP entries of which none is revoked
// (the common case: a pod deleted that had no connections). "podnet" is
// nft.Revoke; "generic" the same judgement through vishvananda/netlink's
// ConntrackDeleteFilters, which decodes every attribute of every entry
// (what Revoke did before). "of-N" is RevokeOf for N addresses gone (one
// of them with an entry): one dump, only their entries judged.
func BenchmarkRevokeScan(b *testing.B) {
	node := nettest.NewNetNS(b)
	const entries = 20000
	nettest.Do(b, node, func() error {
		for i := range entries {
			f := &vnl.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 600,
				Forward:   vnl.IPTuple{Protocol: unix.IPPROTO_TCP, SrcIP: net.IPv4(10, 244, byte(i>>8), byte(i)).To4(), DstIP: net.IPv4(10, 245, 0, 1).To4(), SrcPort: uint16(10000 + i%50000), DstPort: 8080},
				Reverse:   vnl.IPTuple{Protocol: unix.IPPROTO_TCP, DstIP: net.IPv4(10, 244, byte(i>>8), byte(i)).To4(), SrcIP: net.IPv4(10, 245, 0, 1).To4(), DstPort: uint16(10000 + i%50000), SrcPort: 8080},
				ProtoInfo: &vnl.ProtoInfoTCP{State: 3}}
			if err := vnl.ConntrackCreate(vnl.ConntrackTable, unix.AF_INET, f); err != nil {
				return err
			}
		}
		return nil
	})
	all := func(src, dst netip.Addr, proto uint8, dport uint16) bool { return true }
	b.Run("podnet", func(b *testing.B) {
		nettest.Do(b, node, func() error {
			for b.Loop() {
				if n, err := nft.Revoke(all); err != nil || n != 0 {
					b.Fatalf("Revoke: %d, %v", n, err)
				}
			}
			return nil
		})
	})
	for _, n := range []int{1, 4, 16} {
		gone := []netip.Addr{netip.MustParseAddr("10.244.0.7")}
		for i := 1; i < n; i++ {
			gone = append(gone, netip.AddrFrom4([4]byte{10, 246, 0, byte(i)}))
		}
		b.Run(fmt.Sprintf("of-%d", n), func(b *testing.B) {
			nettest.Do(b, node, func() error {
				for b.Loop() {
					if n, err := nft.RevokeOf(gone, all); err != nil || n != 0 {
						b.Fatalf("RevokeOf: %d, %v", n, err)
					}
				}
				return nil
			})
		})
	}
	b.Run("generic", func(b *testing.B) {
		nettest.Do(b, node, func() error {
			for b.Loop() {
				for _, fam := range []vnl.InetFamily{unix.AF_INET, unix.AF_INET6} {
					if _, err := vnl.ConntrackDeleteFilters(vnl.ConntrackTable, fam, keepAll{}); err != nil {
						return err
					}
				}
			}
			return nil
		})
	})
	nettest.Do(b, node, func() error {
		flows, err := vnl.ConntrackTableList(vnl.ConntrackTable, unix.AF_INET)
		if err == nil && len(flows) != entries {
			b.Fatalf("%d entries at the end, want %d", len(flows), entries)
		}
		return err
	})
}

type keepAll struct{}

func (keepAll) MatchConntrackFlow(*vnl.ConntrackFlow) bool { return false }
