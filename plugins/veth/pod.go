package veth

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podSide describes how the pod end of a veth is addressed and routed.
type podSide struct {
	IfName string
	// Addrs are the pod's addresses with the prefix length they get on the
	// interface (/32 and /128 for routed pods).
	Addrs []*net.IPNet
	// GatewayV4 and GatewayV6 are the default gateways (nil: no default
	// route for that family).
	GatewayV4, GatewayV6 net.IP
	// GatewayMAC, when set, is installed as a permanent neighbor entry for
	// both gateways, and the IPv4 gateway gets a scope-link host route: the
	// routed mode, where the gateway is not inside any pod subnet.
	GatewayMAC net.HardwareAddr
	// Routes are extra routes (from IPAM); they go via the gateway of their
	// family.
	Routes []*types.Route
}

// configurePod sets up the pod end in one visit of the pod netns: its
// alias (owner's, which DEL's fallback looks for), then the "address"
// step (the interface up with its addresses) and the "route" step (the
// gateway neighbor entries, the default and extra routes); passed is
// called after each step and may stop the ADD there. It returns the pod
// interface for the result. IPv6 duplicate address detection is
// disabled: the addresses come from IPAM and are unique, and DAD would
// hold the address tentative for ~1 s.
func configurePod(podNS ns.NetNS, side podSide, alias string, passed func(step string) error) (*current.Interface, error) {
	var iface *current.Interface
	err := podNS.Do(func(ns.NetNS) error {
		// one netlink socket for the visit's ~8 requests, not one each
		h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netlink socket in netns %s: %w", podNS.Path(), err)
		}
		defer h.Close()
		link, err := h.LinkByName(side.IfName)
		if err != nil {
			return fmt.Errorf("look up %s in netns %s: %w", side.IfName, podNS.Path(), err)
		}
		if err := h.LinkSetAlias(link, alias); err != nil {
			return fmt.Errorf("set alias on %s in netns %s: %w", side.IfName, podNS.Path(), err)
		}
		if err := podAddresses(h.Handle, link, side); err != nil {
			return err
		}
		iface = &current.Interface{Name: side.IfName, Mac: link.Attrs().HardwareAddr.String(), Mtu: link.Attrs().MTU, Sandbox: podNS.Path()}
		if err := passed("address"); err != nil {
			return err
		}
		if err := podRoutes(h.Handle, link.Attrs().Index, side); err != nil {
			return err
		}
		return passed("route")
	})
	return iface, err
}

// podAddresses brings link, the pod interface, up with its addresses,
// through h, a netlink handle of the pod netns. Callers are in the pod
// netns (sysctls).
func podAddresses(h *netlink.Handle, link netlink.Link, side podSide) error {
	if hasIPv6(side.Addrs) {
		if err := writeSysctl("net/ipv6/conf/"+side.IfName+"/accept_dad", "0"); err != nil {
			return err
		}
	}
	// the link-local address the pod filter lets the pod send from is
	// the EUI-64 one of its MAC (podfilter.EUI64LinkLocal): make the
	// kernel derive exactly that one, whatever the netns's default
	// (stable-privacy, random). No IPv6 on the interface: nothing to do.
	if err := setAddrGenMode(h, link, addrGenModeEUI64); err != nil {
		return err
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", side.IfName, err)
	}
	for _, a := range side.Addrs {
		addr := &netlink.Addr{IPNet: a}
		if a.IP.To4() == nil {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add address %s to %s: %w", a, side.IfName, err)
		}
	}
	return nil
}

// podRoutes installs the gateway neighbor entries and the default and
// extra routes of the pod on the interface with index idx, through h, a
// netlink handle of the pod netns.
func podRoutes(h *netlink.Handle, idx int, side podSide) error {
	for _, gw := range side.gateways() {
		if side.GatewayMAC != nil {
			n := &netlink.Neigh{LinkIndex: idx, IP: gw, HardwareAddr: side.GatewayMAC, State: netlink.NUD_PERMANENT, Family: family(gw)}
			if err := h.NeighSet(n); err != nil {
				return fmt.Errorf("add permanent neighbor %s on %s: %w", gw, side.IfName, err)
			}
		}
	}
	for _, r := range side.routes(idx) {
		if err := h.RouteAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add route %s in pod: %w", describeRoute(r), err)
		}
	}
	return nil
}

// checkPod verifies that the pod interface exists, is the end of the veth
// whose host end has index hostIndex, and has the addresses and routes of
// side. It returns the pod interface's MAC.
func checkPod(podNS ns.NetNS, side podSide, hostIndex int) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(side.IfName)
		if err != nil {
			return fmt.Errorf("pod interface %s not found in netns %s: %w", side.IfName, podNS.Path(), err)
		}
		veth, ok := link.(*netlink.Veth)
		if !ok {
			return fmt.Errorf("pod interface %s is a %s, expected a veth", side.IfName, link.Type())
		}
		if hostIndex > 0 {
			peer, err := netlink.VethPeerIndex(veth)
			if err != nil {
				return fmt.Errorf("read peer of %s: %w", side.IfName, err)
			}
			if peer != hostIndex {
				return fmt.Errorf("pod interface %s is not paired with the expected host veth (peer index %d, want %d)", side.IfName, peer, hostIndex)
			}
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("pod interface %s is down", side.IfName)
		}
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", side.IfName, err)
		}
		for _, want := range side.Addrs {
			if !containsAddr(addrs, want) {
				return fmt.Errorf("pod interface %s is missing address %s", side.IfName, want)
			}
		}
		for _, want := range side.routes(link.Attrs().Index) {
			if err := checkRoute(want); err != nil {
				return fmt.Errorf("pod %s: %w", side.IfName, err)
			}
		}
		mac = link.Attrs().HardwareAddr
		return nil
	})
	return mac, err
}

func (side podSide) gateways() []net.IP {
	var gws []net.IP
	if side.GatewayV4 != nil && hasFamily(side.Addrs, netlink.FAMILY_V4) {
		gws = append(gws, side.GatewayV4)
	}
	if side.GatewayV6 != nil && hasFamily(side.Addrs, netlink.FAMILY_V6) {
		gws = append(gws, side.GatewayV6)
	}
	return gws
}

// routes returns the pod routes in the order they must be added.
func (side podSide) routes(linkIndex int) []*netlink.Route {
	var out []*netlink.Route
	if side.GatewayMAC != nil && side.GatewayV4 != nil && hasFamily(side.Addrs, netlink.FAMILY_V4) {
		out = append(out, &netlink.Route{LinkIndex: linkIndex, Dst: hostNet(side.GatewayV4), Scope: netlink.SCOPE_LINK})
	}
	for _, gw := range side.gateways() {
		out = append(out, &netlink.Route{LinkIndex: linkIndex, Dst: defaultNet(gw), Gw: gw})
	}
	for _, r := range side.Routes {
		if r.Dst.IP == nil || isDefault(&r.Dst) {
			continue // the default routes are already there
		}
		gw := side.GatewayV4
		if r.Dst.IP.To4() == nil {
			gw = side.GatewayV6
		}
		if gw == nil {
			continue
		}
		dst := r.Dst
		out = append(out, &netlink.Route{LinkIndex: linkIndex, Dst: &dst, Gw: gw})
	}
	return out
}

// checkRoute looks for a route with want's destination, device and gateway.
func checkRoute(want *netlink.Route) error {
	filter := &netlink.Route{LinkIndex: want.LinkIndex, Table: unix.RT_TABLE_MAIN}
	got, err := netlinksafe.RouteListFiltered(family(want.Dst.IP), filter, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list routes of link %d: %w", want.LinkIndex, err)
	}
	for _, r := range got {
		if sameDst(r.Dst, want.Dst) && (want.Gw == nil || want.Gw.Equal(r.Gw)) {
			return nil
		}
	}
	return fmt.Errorf("route %s is missing", describeRoute(want))
}

// sameDst compares route destinations, a nil destination being the default.
func sameDst(a, b *net.IPNet) bool {
	if a == nil || b == nil {
		return (a == nil || isDefault(a)) && (b == nil || isDefault(b))
	}
	return a.IP.Equal(b.IP) && a.Mask.String() == b.Mask.String()
}

func describeRoute(r *netlink.Route) string {
	s := r.Dst.String()
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	return s
}

func containsAddr(addrs []netlink.Addr, want *net.IPNet) bool {
	for _, a := range addrs {
		if a.IPNet != nil && a.IP.Equal(want.IP) && a.Mask.String() == want.Mask.String() {
			return true
		}
	}
	return false
}

func family(ip net.IP) int {
	if ip.To4() != nil {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func hasFamily(addrs []*net.IPNet, fam int) bool {
	for _, a := range addrs {
		if family(a.IP) == fam {
			return true
		}
	}
	return false
}

func hasIPv6(addrs []*net.IPNet) bool { return hasFamily(addrs, netlink.FAMILY_V6) }

// hostNet is ip/32 or ip/128.
func hostNet(ip net.IP) *net.IPNet {
	if v4 := ip.To4(); v4 != nil {
		return &net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return &net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}
}

func defaultNet(ip net.IP) *net.IPNet {
	if ip.To4() != nil {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// ips are the pod's addresses without prefix.
func (side podSide) ips() []net.IP {
	ips := make([]net.IP, 0, len(side.Addrs))
	for _, a := range side.Addrs {
		ips = append(ips, a.IP)
	}
	return ips
}

// hasIPv6 reports whether the pod has an IPv6 address.
func (side podSide) hasIPv6() bool { return hasIPv6(side.Addrs) }
