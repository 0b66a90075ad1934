// The underlay: the link carrying this node's address, the overlay MTU
// it allows, and whether an address is on-link.

package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/routed/desired"
)

// Underlay finds the link carrying the node's own address.
func Underlay(nodeIP netip.Addr) (netlink.Link, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("link of %s: %w", nodeIP, err)
			}
			return l, nil
		}
	}
	return nil, fmt.Errorf("no interface in this netns has the node address %s", nodeIP)
}

// UnderlayToward is the link of the route to the first of addrs that has
// one without a gateway of podnet's (the underlay when this node's own
// address is not known); nil when addrs is empty.
func UnderlayToward(addrs []netip.Addr) (netlink.Link, error) {
	var errs []error
	for _, a := range addrs {
		routes, err := netlink.RouteGet(a.AsSlice())
		if err != nil || len(routes) == 0 {
			errs = append(errs, fmt.Errorf("route to %s: %v", a, err))
			continue
		}
		l, err := netlink.LinkByIndex(routes[0].LinkIndex)
		if err != nil {
			errs = append(errs, fmt.Errorf("link of the route to %s: %w", a, err))
			continue
		}
		if n := l.Attrs().Name; n == desired.TunnelDevice || n == desired.VXLANDevice {
			continue
		}
		return l, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("no underlay link toward the other nodes: %w", errors.Join(errs...))
	}
	return nil, nil
}

// OverlayMTU is the MTU pods get: the configured one, else the underlay's
// minus the encapsulation overhead (cross-subnet nodes may encapsulate, so
// the overhead applies there too).
func (d *Netlink) OverlayMTU(underlay netlink.Link) int {
	overhead := d.Encap.OverheadOver(d.UnderlayIP)
	if max := underlay.Attrs().MTU - overhead; d.MTU > max {
		if !d.warnedMTU {
			d.warnedMTU = true
			d.Log.Warn("--mtu is larger than the underlay allows; using the largest that fits", "mtu", d.MTU, "max", max, "underlay", underlay.Attrs().Name)
		}
		return max
	}
	if d.MTU > 0 {
		return d.MTU
	}
	return underlay.Attrs().MTU - overhead
}

// OnLink reports whether ip is reachable without a gateway.
func OnLink(ip netip.Addr) bool {
	routes, err := netlink.RouteGet(ip.AsSlice())
	if err != nil || len(routes) == 0 {
		return false
	}
	return routes[0].Gw == nil
}

// NodeUnderlay finds the underlay of this node (cfg.Self) among nodes,
// names it in cfg.Underlay, and returns it (nil: none found). It is the
// link of the node's address, or of last's (the node as last known: its
// pods are still there while its Node is bad or gone), and d.UnderlayIP
// is set to that address (VXLAN over IPv6 costs 20 bytes more). Nothing
// being known of the node's address (its Node gone, and a restart
// meanwhile), it is the link toward the other nodes (UnderlayToward).
func (d *Netlink) NodeUnderlay(cfg *desired.Config, nodes []desired.Node, last *desired.Node) (netlink.Link, error) {
	selfIP := netip.Addr{}
	if n := findNode(nodes, cfg.Self); n != nil && n.IP.IsValid() {
		selfIP = n.IP
	} else if last != nil {
		selfIP = last.IP
	}
	var link netlink.Link
	var err error
	if selfIP.IsValid() {
		d.UnderlayIP = selfIP
		link, err = Underlay(selfIP)
	} else {
		link, err = UnderlayToward(nodeAddrs(nodes, cfg.Self))
	}
	if link != nil {
		cfg.Underlay = link.Attrs().Name
	}
	return link, err
}

// nodeAddrs are the addresses of the nodes other than self.
func nodeAddrs(nodes []desired.Node, self string) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		if n.Name != self && n.IP.IsValid() {
			out = append(out, n.IP)
		}
	}
	return out
}

func findNode(nodes []desired.Node, name string) *desired.Node {
	for i := range nodes {
		if nodes[i].Name == name {
			return &nodes[i]
		}
	}
	return nil
}
