package veth

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
)

// Routed returns the verbs of the podnet plugin: the routed (Calico-style)
// mode.
func Routed() skel.CNIFuncs { return newRoutedPlugin().funcs() }

func newRoutedPlugin() *plugin {
	return &plugin{
		name:    "podnet",
		newMode: func([]byte, *netConf) (mode, error) { return routed{}, nil },
	}
}

// routedHostMAC is the fixed MAC address of every routed host veth. The pod
// always resolves its gateway to it, so a host veth can be recreated without
// the pod having to re-learn a neighbor.
const routedHostMAC = "ee:ee:ee:ee:ee:ee"

// gatewayV4 is the link-local IPv4 gateway every routed pod uses. Nothing
// owns it: the host veth answers for it by proxy ARP, and the pod also gets a
// permanent neighbor entry for it.
const gatewayV4 = "169.254.1.1"

// GatewayV6 is the link-local address of every routed host veth, the EUI-64
// address of routedHostMAC. It is the pod's IPv6 default gateway.
const GatewayV6 = "fe80::ecee:eeff:feee:eeee"

// routed is podnet's mode: proxy-ARP host veth with a fixed MAC, /32 and
// /128 pod addresses, and a node route per pod address.
type routed struct{}

func (routed) hostMAC() net.HardwareAddr { return mustParseMAC(routedHostMAC) }

// describePod gives the pod every address as a host prefix, default routes
// via the link-local gateways and permanent neighbor entries for them.
func (r routed) describePod(ifName string, alloc *current.Result) (podSide, error) {
	side := podSide{
		IfName:     ifName,
		GatewayV4:  net.ParseIP(gatewayV4).To4(),
		GatewayV6:  net.ParseIP(GatewayV6),
		GatewayMAC: r.hostMAC(),
		Routes:     alloc.Routes,
	}
	for _, c := range alloc.IPs {
		side.Addrs = append(side.Addrs, hostNet(c.Address.IP))
	}
	return side, nil
}

func (routed) prepareNode(podSide, int) error { return nil }

func (routed) attachHost(*netlink.Handle, netlink.Link) error { return nil }

func (routed) guard() podfilter.Guard { return podfilter.Routed }

// setupHost prepares the host veth to be the pod's gateway: no Router
// Advertisement, SLAAC or redirect taken from the pod (hostIfaceSettings),
// proxy ARP answering for 169.254.1.1 without delay, forwarding, and with
// IPv6 the fixed link-local gateway address; then brings it up.
func (routed) setupHost(h *netlink.Handle, host netlink.Link, side podSide) error {
	ipv6 := side.hasIPv6()
	name := host.Attrs().Name
	// one directory opened per family and setting kind, not a walk of
	// /proc/sys per setting (sysctlWriter)
	var w sysctlWriter
	defer w.close()
	if err := hardenHostIfaceWith(&w, name); err != nil {
		return fmt.Errorf("host veth %s: %w", name, err)
	}
	// the pod's IPv6 gateway is GatewayV6, added below
	if err := noKernelLinkLocal(h, host); err != nil {
		return fmt.Errorf("host veth %s: %w", name, err)
	}
	settings := [][2]string{
		{"net/ipv4/conf/" + name + "/proxy_arp", "1"},
		{"net/ipv4/neigh/" + name + "/proxy_delay", "0"},
		{"net/ipv4/conf/" + name + "/forwarding", "1"},
	}
	if ipv6 {
		settings = append(settings,
			[2]string{"net/ipv6/conf/" + name + "/accept_dad", "0"},
			[2]string{"net/ipv6/conf/all/forwarding", "1"},
			[2]string{"net/ipv6/conf/" + name + "/forwarding", "1"},
		)
	}
	for _, s := range settings {
		if err := w.write(s[0], s[1]); err != nil {
			return fmt.Errorf("host veth %s: %w", name, err)
		}
	}
	if ipv6 {
		ll := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(GatewayV6), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(host, ll); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s to host veth %s: %w", GatewayV6, name, err)
		}
	}
	if err := h.LinkSetUp(host); err != nil {
		return fmt.Errorf("set host veth %s up: %w", name, err)
	}
	return nil
}

// finishHost routes every pod address to the host veth. An identical
// existing route is accepted; a route to the same address through another
// interface is an error that names it.
func (routed) finishHost(h *netlink.Handle, host netlink.Link, side podSide) error {
	for _, ip := range side.ips() {
		r := hostRoute(host, ip)
		err := h.RouteAdd(r)
		if err == nil {
			continue
		}
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add host route %s dev %s: %w", r.Dst, host.Attrs().Name, err)
		}
		other, err := routeOwner(r)
		if err != nil {
			return err
		}
		if other != host.Attrs().Name {
			return fmt.Errorf("a route to %s already exists via interface %s (another pod, or a leftover of one, holds this address)", r.Dst, other)
		}
	}
	return nil
}

// checkHost verifies the host veth of a routed attachment: up, fixed MAC,
// proxy ARP, and a podnet route per pod address.
func (routed) checkHost(hostName string, side podSide) (netlink.Link, error) {
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %s not found: %w", hostName, err)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("host veth %s is down", hostName)
	}
	if got := host.Attrs().HardwareAddr.String(); got != routedHostMAC {
		return nil, fmt.Errorf("host veth %s has MAC %s, want %s", hostName, got, routedHostMAC)
	}
	if v, err := readSysctl("net/ipv4/conf/" + hostName + "/proxy_arp"); err != nil || v != "1" {
		return nil, fmt.Errorf("host veth %s has proxy_arp=%q, want 1 (%v)", hostName, v, err)
	}
	if side.hasIPv6() {
		// the IPv6 half: the pod's gateway is the host veth's link-local
		// address, and the host veth forwards
		addrs, err := netlinksafe.AddrList(host, netlink.FAMILY_V6)
		if err != nil {
			return nil, fmt.Errorf("list addresses of host veth %s: %w", hostName, err)
		}
		gw := net.ParseIP(GatewayV6)
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(gw) }) {
			return nil, fmt.Errorf("host veth %s is missing the pod's IPv6 gateway address %s", hostName, GatewayV6)
		}
		if v, err := readSysctl("net/ipv6/conf/" + hostName + "/forwarding"); err != nil || v != "1" {
			return nil, fmt.Errorf("host veth %s has IPv6 forwarding=%q, want 1 (%v)", hostName, v, err)
		}
	}
	for _, ip := range side.ips() {
		want := hostRoute(host, ip)
		filter := &netlink.Route{Dst: want.Dst, Table: unix.RT_TABLE_MAIN}
		got, err := netlinksafe.RouteListFiltered(family(ip), filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes to %s: %w", want.Dst, err)
		}
		found := false
		for _, r := range got {
			if r.LinkIndex == want.LinkIndex {
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("host route %s dev %s is missing", want.Dst, hostName)
		}
	}
	return host, nil
}

// result is the ADD result of a routed attachment: prevResult's content
// (when chained) followed by the host veth and the pod interface, the pod
// addresses as configured, and the routes the pod got.
func (routed) result(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result {
	result := chainedBase(prev)
	result.Interfaces = append(result.Interfaces, &current.Interface{Name: hostName, Mac: routedHostMAC}, podIface)
	addPodIPsAndRoutes(result, len(result.Interfaces)-1, side)
	return result
}

// hostRoute is the node's route to one pod address.
func hostRoute(host netlink.Link, ip net.IP) *netlink.Route {
	r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: hostNet(ip), Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if ip.To4() != nil {
		r.Scope = netlink.SCOPE_LINK
	}
	return r
}

// routeOwner names the interface of the existing main-table route to r.Dst.
func routeOwner(r *netlink.Route) (string, error) {
	filter := &netlink.Route{Dst: r.Dst, Table: unix.RT_TABLE_MAIN}
	got, err := netlinksafe.RouteListFiltered(family(r.Dst.IP), filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return "", fmt.Errorf("list routes to %s: %w", r.Dst, err)
	}
	for _, existing := range got {
		if existing.LinkIndex == r.LinkIndex {
			return linkName(existing.LinkIndex), nil
		}
	}
	if len(got) > 0 {
		return linkName(got[0].LinkIndex), nil
	}
	return "", fmt.Errorf("add host route %s: kernel reports it exists but no such route is listed", r.Dst)
}

func linkName(index int) string {
	if index == 0 {
		return "(none: blackhole or unreachable route)"
	}
	l, err := netlink.LinkByIndex(index)
	if err != nil {
		return fmt.Sprintf("ifindex %d", index)
	}
	return l.Attrs().Name
}

func mustParseMAC(s string) net.HardwareAddr {
	mac, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return mac
}
