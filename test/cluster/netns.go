package cluster

// Named network namespaces (test/nettest) and the underlay they hang on.
// The machine's own netns is never changed.

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/test/nettest"
)

// NetNSDir is where named network namespaces live (`ip netns` lists it).
const NetNSDir = nettest.NetNSDir

// NetNS is a named network namespace.
type NetNS = nettest.NetNS

// NetNSNames lists the named netns whose name starts with prefix.
func NetNSNames(prefix string) ([]string, error) { return nettest.NetNSNames(prefix) }

func newNetNS(name string) (*NetNS, error) { return nettest.NewNamedNetNS(name) }

func removeNetNS(name string) error { return nettest.RemoveNamedNetNS(name) }

// AddBridge creates an L2 segment of an underlay: bridge name (MTU mtu,
// up) in the underlay netns.
func AddBridge(underlay ns.NetNS, name string, mtu int) error {
	return underlay.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s: %w", name, err)
		}
		return netlink.LinkSetUp(br)
	})
}

// Port is one machine's attachment to an underlay bridge.
type Port struct {
	Bridge string       // the bridge in the underlay netns
	BrSide string       // the veth end on the bridge
	IfName string       // the other end, in the target netns
	Addr   netip.Prefix // IfName's address (none when invalid)
	GW     netip.Addr   // default route via GW (none when invalid)
	MTU    int          // both ends (default 1500)
}

// Plug connects target to an underlay bridge with a veth pair: p.BrSide
// in the underlay netns, p.IfName (MTU, address, default route) in
// target, both up.
func Plug(underlay, target ns.NetNS, p Port) error {
	if p.MTU == 0 {
		p.MTU = 1500
	}
	if err := underlay.Do(func(ns.NetNS) error {
		br, err := netlink.LinkByName(p.Bridge)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: p.BrSide, MTU: p.MTU, MasterIndex: br.Attrs().Index},
			PeerName:      p.IfName,
			PeerMTU:       uint32(p.MTU),
			PeerNamespace: netlink.NsFd(int(target.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s to %s: %w", p.BrSide, target.Path(), err)
		}
		return nettest.LinkUp(p.BrSide)
	}); err != nil {
		return err
	}
	return target.Do(func(ns.NetNS) error {
		if err := nettest.LinkUp("lo"); err != nil {
			return err
		}
		l, err := netlink.LinkByName(p.IfName)
		if err != nil {
			return err
		}
		if p.Addr.IsValid() {
			if err := netlink.AddrAdd(l, linkAddr(p.Addr)); err != nil {
				return fmt.Errorf("add %s to %s: %w", p.Addr, target.Path(), err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if p.GW.IsValid() {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: p.GW.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s in %s: %w", p.GW, target.Path(), err)
			}
		}
		return nil
	})
}

// linkAddr is addr for AddrAdd; an IPv6 one without duplicate address
// detection (nodad), so that it is usable at once (a server can bind it).
func linkAddr(addr netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: prefixIPNet(addr)}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// addAddr adds addr to link dev in target.
func addAddr(target *NetNS, dev string, addr netip.Prefix) error {
	return target.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, linkAddr(addr)); err != nil {
			return fmt.Errorf("add %s to %s in %s: %w", addr, dev, target.Name, err)
		}
		return nil
	})
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
