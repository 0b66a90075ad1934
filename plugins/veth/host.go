package veth

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/rtproto"
)

// routedHostMAC returns hostMAC parsed.
func routedHostMAC() net.HardwareAddr { return mustParseMAC(hostMAC) }

// routedPodSide describes the pod end of a routed (Calico-style) attachment:
// every address as a host prefix, default routes via the link-local
// gateways, permanent neighbor entries for them.
func routedPodSide(ifName string, ips []net.IP, extra podSide) podSide {
	side := extra
	side.IfName = ifName
	side.Addrs = nil
	for _, ip := range ips {
		side.Addrs = append(side.Addrs, hostNet(ip))
	}
	side.GatewayV4 = net.ParseIP(gatewayV4).To4()
	side.GatewayV6 = net.ParseIP(GatewayV6)
	side.GatewayMAC = routedHostMAC()
	return side
}

// configureRoutedHost prepares the host veth to be the pod's gateway: proxy
// ARP answering for 169.254.1.1 without delay, forwarding, and with IPv6 the
// fixed link-local gateway address; then brings it up.
func configureRoutedHost(host netlink.Link, ipv6 bool) error {
	name := host.Attrs().Name
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
		if err := writeSysctl(s[0], s[1]); err != nil {
			return fmt.Errorf("host veth %s: %w", name, err)
		}
	}
	if ipv6 {
		ll := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(GatewayV6), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(host, ll); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s to host veth %s: %w", GatewayV6, name, err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("set host veth %s up: %w", name, err)
	}
	return nil
}

// hostRoute is the node's route to one pod address.
func hostRoute(host netlink.Link, ip net.IP) *netlink.Route {
	r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: hostNet(ip), Protocol: rtproto.Podnet, Table: unix.RT_TABLE_MAIN}
	if ip.To4() != nil {
		r.Scope = netlink.SCOPE_LINK
	}
	return r
}

// addHostRoutes routes every pod address to the host veth. An identical
// existing route is accepted; a route to the same address through another
// interface is an error that names it.
func addHostRoutes(host netlink.Link, ips []net.IP) error {
	for _, ip := range ips {
		r := hostRoute(host, ip)
		err := netlink.RouteAdd(r)
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

// checkRoutedHost verifies the host veth of a routed attachment: up, fixed
// MAC, proxy ARP, and a podnet route per pod address.
func checkRoutedHost(hostName string, ips []net.IP) (netlink.Link, error) {
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %s not found: %w", hostName, err)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("host veth %s is down", hostName)
	}
	if got := host.Attrs().HardwareAddr.String(); got != hostMAC {
		return nil, fmt.Errorf("host veth %s has MAC %s, want %s", hostName, got, hostMAC)
	}
	if v, err := readSysctl("net/ipv4/conf/" + hostName + "/proxy_arp"); err != nil || v != "1" {
		return nil, fmt.Errorf("host veth %s has proxy_arp=%q, want 1 (%v)", hostName, v, err)
	}
	for _, ip := range ips {
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
