package nodestate

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/testns"
)

// addrVeths gives a netns n veth pairs whose first ends carry
// 10.60.<i/200>.<i%200+1>/32 and fd60::<i+1>/128 (as ptp gives each host
// end an address), and one pair whose end has the point-to-point address
// 10.61.0.1 peer 10.61.0.2. Callers are in the netns.
func addrVeths(n int) error {
	lo, err := netlinksafe.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for i := range n + 1 {
		name := fmt.Sprintf("la%d", i)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			return err
		}
		l, err := netlinksafe.LinkByName(name)
		if err != nil {
			return err
		}
		if i == n {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 61, 0, 1), Mask: net.CIDRMask(32, 32)},
				Peer: &net.IPNet{IP: net.IPv4(10, 61, 0, 2), Mask: net.CIDRMask(32, 32)}}
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			continue
		}
		v4 := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 60, byte(i/200), byte(i%200+1)), Mask: net.CIDRMask(32, 32)}}
		v6 := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd60::%x", i+1)), Mask: net.CIDRMask(128, 128)}}
		for _, a := range []*netlink.Addr{v4, v6} {
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// libraryLocalAddrs is what LocalAddrs answered through vishvananda's
// AddrList before: the reference its dump is held to.
func libraryLocalAddrs(family int) ([]netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(nil, family)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// TestLocalAddrs: the node's global unicast addresses of the families
// asked for, as the library lists them: loopback and link-local left
// out, a point-to-point address by its local end, not its peer.
func TestLocalAddrs(t *testing.T) {
	n := testns.New(t)
	err := n.Do(func(ns.NetNS) error {
		if err := addrVeths(20); err != nil {
			return err
		}
		for _, c := range []struct {
			v4, v6 bool
			family int
			count  int
		}{{true, false, netlink.FAMILY_V4, 21}, {false, true, netlink.FAMILY_V6, 20}, {true, true, netlink.FAMILY_ALL, 41}, {false, false, 0, 0}} {
			got, err := LocalAddrs(c.v4, c.v6)
			if err != nil {
				return err
			}
			var want []netip.Addr
			if c.v4 || c.v6 {
				if want, err = libraryLocalAddrs(c.family); err != nil {
					return err
				}
			}
			slices.SortFunc(got, netip.Addr.Compare)
			slices.SortFunc(want, netip.Addr.Compare)
			if !slices.Equal(got, want) || len(got) != c.count {
				t.Errorf("v4 %v v6 %v: %d addresses %v, want the library's %d %v (%d)", c.v4, c.v6, len(got), got, len(want), want, c.count)
			}
			if c.v4 && (!slices.Contains(got, netip.MustParseAddr("10.61.0.1")) || slices.Contains(got, netip.MustParseAddr("10.61.0.2"))) {
				t.Errorf("v4: the point-to-point address is %v: want its local end 10.61.0.1, not the peer", got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkLocalAddrs: the node's IPv4 addresses with 100 other veths
// carrying one each, read by LocalAddrs and by the library. Run as root:
//
//	go test -run '^$' -bench LocalAddrs ./internal/nodestate/
func BenchmarkLocalAddrs(b *testing.B) {
	n := testns.New(b)
	err := n.Do(func(ns.NetNS) error {
		if err := addrVeths(100); err != nil {
			return err
		}
		b.Run("LocalAddrs", func(b *testing.B) {
			for b.Loop() {
				if _, err := LocalAddrs(true, false); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("library", func(b *testing.B) {
			for b.Loop() {
				if _, err := libraryLocalAddrs(netlink.FAMILY_V4); err != nil {
					b.Fatal(err)
				}
			}
		})
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
