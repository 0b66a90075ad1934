package podfilter

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
)

// portMaker returns a func that creates, in the calling thread's netns, a
// veth whose host end is named and aliased as the plugins name theirs,
// and returns its Port (a MAC and an IPv4 and IPv6 address of its own).
func portMaker() func() (Port, error) {
	next := 0
	return func() (Port, error) {
		next++
		name := fmt.Sprintf("pn%011x", next)
		alias := contract.VethOwner{Network: "podnet", ContainerID: fmt.Sprintf("c%d", next), IfName: "eth0"}.Alias()
		la := netlink.LinkAttrs{Name: name, Alias: alias}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("pq%011x", next)}); err != nil {
			return Port{}, err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return Port{}, err
		}
		if l.Attrs().Alias != alias { // a kernel that ignores IFLA_IFALIAS at creation
			if err := netlink.LinkSetAlias(l, alias); err != nil {
				return Port{}, err
			}
		}
		return Port{Index: l.Attrs().Index, Name: name, Alias: alias, MAC: net.HardwareAddr{2, 0, 0, byte(next >> 16), byte(next >> 8), byte(next)},
			IPs: []net.IP{net.IPv4(10, byte(next>>16), byte(next>>8), byte(next)).To4(), net.ParseIP(fmt.Sprintf("fd00::1:%x", next))}}, nil
	}
}

// installPorts makes k ports (portMaker's) and installs each in g.
func installPorts(g Guard, k int) ([]Port, error) {
	port := portMaker()
	var ports []Port
	for range k {
		p, err := port()
		if err != nil {
			return nil, err
		}
		if err := g.Install(p); err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}
