package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// TestPodNDPFloodChangesNothing (issue 23 "Must show" 5): on a node of
// IPv4-only pods (IPv6 forwarding off: where the kernel accepts Router
// Advertisements by default) and on a dual-stack one, in both modes, one
// pod floods Router Advertisements (default router lifetime, hop limit,
// autonomous and on-link prefix, route information for ::/0 and a /48,
// MTU 1280), Redirects and unsolicited override Neighbor Advertisements
// claiming the gateway, the other pods' and the node's addresses: to
// ff02::1 and to the node's, the gateway's and the other pods' link-local
// addresses, from its own link-local address and from the gateway's
// (forged). Then the node's routes (both families, every table),
// addresses, link MTUs, IPv6 sysctls (forwarding, accept_ra, hop_limit,
// mtu of every interface) and neighbor entries are what they were, and so
// are every other pod's (its gateway still resolving to the gateway's
// MAC: ee:ee:ee:ee:ee:ee in the routed mode); the other pods still reach
// each other and the node in every family they have.
func TestPodNDPFloodChangesNothing(t *testing.T) {
	for i, m := range spoofModes {
		for j, dual := range []bool{false, true} {
			name := m.name + map[bool]string{false: "/ipv4-only", true: "/dual-stack"}[dual]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ndpFlood(t, m, 44+2*i+j, dual)
			})
		}
	}
}

func ndpFlood(t *testing.T, m spoofMode, subnet int, dual bool) {
	rt := m.runtime(t, subnet, dual, nil)
	attacker := addSpoofPod(t, rt, "ndp-attacker")
	others := []*spoofPod{addSpoofPod(t, rt, "ndp-other-1"), addSpoofPod(t, rt, "ndp-other-2")}
	if v, err := nettest.ReadSysctl(rt.Node.NS, "net/ipv6/conf/all/forwarding"); err != nil || v != map[bool]string{false: "0", true: "1"}[dual] {
		t.Fatalf("node net.ipv6.conf.all.forwarding = %q (%v): this case is about forwarding %v", v, err, dual)
	}
	waitIPv6Settled(t, rt.Node.NS)
	for _, p := range append([]*spoofPod{attacker}, others...) {
		waitIPv6Settled(t, p.NS)
	}
	// every path the test checks afterwards works before, and the node and
	// the pods have their neighbor entries for each other
	reach := func(when string) {
		for i, p := range others {
			q := others[1-i]
			dsts := []string{q.v4.String(), nettest.NodeAddr}
			if dual {
				dsts = append(dsts, q.v6.String(), nettest.NodeAddr6)
			}
			for _, d := range dsts {
				if err := nettest.Ping(p.NS, d); err != nil {
					t.Errorf("%s: %v", when, err)
				}
			}
		}
	}
	reach("before the flood")
	for _, p := range others {
		for _, ip := range []net.IP{p.v4, p.v6} {
			if ip != nil {
				if err := nettest.Ping(rt.Node.NS, ip.String()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	// the node's side of the pods' link: the routed gateway, or the bridge
	nodeLL := []net.IP{net.ParseIP(veth.GatewayV6)}
	nodeAddrs := []net.IP{net.ParseIP(nettest.NodeAddr6)}
	if len(m.hostIfaces) > 0 {
		nodeLL = nil
		rt.Node.Do(func() error {
			br, err := netlink.LinkByName(veth.DefaultBridge)
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(br, netlink.FAMILY_V6)
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() {
					nodeLL = append(nodeLL, a.IP)
				} else {
					nodeAddrs = append(nodeAddrs, a.IP)
				}
			}
			return err
		})
	}
	gwMAC := map[string]string{}
	for _, p := range others {
		for fam, gw := range podGateways(t, p) {
			if gw.To4() == nil && !slices.ContainsFunc(nodeAddrs, gw.Equal) && !slices.ContainsFunc(nodeLL, gw.Equal) {
				nodeAddrs = append(nodeAddrs, gw) // the bridge's IPv6 gateway
			}
			if mac := neighborMAC(t, p, gw); mac != "" {
				gwMAC[fam] = mac
			}
		}
	}
	if len(m.hostIfaces) == 0 {
		// the routed gateways resolve to the fixed host veth MAC
		for fam, mac := range gwMAC {
			if mac != "ee:ee:ee:ee:ee:ee" {
				t.Fatalf("routed pod's %s gateway resolves to %s", fam, mac)
			}
		}
	}

	nodeBefore := netnsState(t, rt.Node.NS, nil)
	othersBefore := make([][]string, len(others))
	for i, p := range others {
		othersBefore[i] = netnsState(t, p.NS, nil)
	}

	// the flood
	own := podLinkLocal(t, attacker)
	var otherLL, targets []net.IP
	for _, p := range others {
		otherLL = append(otherLL, podLinkLocal(t, p))
		targets = append(targets, podLinkLocal(t, p))
		if p.v6 != nil {
			targets = append(targets, p.v6)
		}
	}
	targets = append(targets, nodeLL...)
	targets = append(targets, nodeAddrs...)
	dsts := append(append([]net.IP{net.ParseIP("ff02::1")}, nodeLL...), otherLL...)
	// own, then forged: the node's link-local addresses and gateways
	srcs := append([]net.IP{own}, nodeLL...)
	for _, a := range nodeAddrs[1:] {
		srcs = append(srcs, a)
	}
	ra := routerAdvertisementFull(attacker.mac)
	var msgs []icmp6Msg
	for _, src := range srcs {
		for _, dst := range dsts {
			msgs = append(msgs, icmp6Msg{src, dst, ra})
			for _, target := range targets {
				// "use me (own) for target", and "target is at my MAC"
				msgs = append(msgs, icmp6Msg{src, dst, redirect(own, target, attacker.mac)})
				msgs = append(msgs, icmp6Msg{src, dst, neighborAdvertisementFlags(target, attacker.mac, 0xa0)})
			}
		}
	}
	const rounds = 10
	sent := sendICMPv6Flood(t, attacker, msgs, rounds)
	time.Sleep(time.Second) // let the node and the pods process them

	// nothing changed, anywhere but in the attacker
	ignore := []net.IP{attacker.v4, attacker.v6, own}
	if got := netnsState(t, rt.Node.NS, ignore); !slices.Equal(stateWithout(nodeBefore, ignore), got) {
		t.Errorf("the node's state changed after %d NDP messages from a pod:\n%s", sent, stateDiff(stateWithout(nodeBefore, ignore), got))
	}
	for i, p := range others {
		if got := netnsState(t, p.NS, ignore); !slices.Equal(stateWithout(othersBefore[i], ignore), got) {
			t.Errorf("pod %s's state changed after %d NDP messages from another pod:\n%s", p.RT.ContainerID, sent, stateDiff(stateWithout(othersBefore[i], ignore), got))
		}
		for fam, gw := range podGateways(t, p) {
			if mac := neighborMAC(t, p, gw); mac != gwMAC[fam] {
				t.Errorf("pod %s: the %s gateway %s resolves to %q after the flood, want %s", p.RT.ContainerID, fam, gw, mac, gwMAC[fam])
			}
		}
	}
	reach("after the flood")
	t.Logf("%d messages (%d kinds × %d rounds) from %s and forged from %v", sent, len(msgs), rounds, own, nodeLL)
}

// icmp6Msg is one ICMPv6 message to send: from src (the pod's own
// link-local address or a forged one) to dst, on the pod's eth0.
type icmp6Msg struct {
	src, dst net.IP
	msg      []byte
}

// sendICMPv6Flood sends every message rounds times as fast as the pod can
// (no pause), with hop limit 255 as NDP requires, and returns how many
// were sent. A forged source is bound with IPV6_FREEBIND. Messages to a
// link-local destination the pod cannot resolve (another pod in the
// routed mode, on a link of its own) die in the pod: also fine.
func sendICMPv6Flood(t *testing.T, p *spoofPod, msgs []icmp6Msg, rounds int) int {
	t.Helper()
	bySrc := map[string][]icmp6Msg{}
	var order []string
	for _, m := range msgs {
		k := m.src.String()
		if _, ok := bySrc[k]; !ok {
			order = append(order, k)
		}
		bySrc[k] = append(bySrc[k], m)
	}
	sent := 0
	nettest.Do(t, p.NS, func() error {
		for _, k := range order {
			fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
			if err != nil {
				return fmt.Errorf("raw ICMPv6 socket: %w", err)
			}
			defer unix.Close(fd)
			for _, opt := range [][2]int{{unix.IPV6_MULTICAST_HOPS, 255}, {unix.IPV6_UNICAST_HOPS, 255}, {unix.IPV6_MULTICAST_IF, p.ifIndex}, {unix.IPV6_FREEBIND, 1}} {
				if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, opt[0], opt[1]); err != nil {
					return err
				}
			}
			// a full socket buffer must not stop the flood
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
			from := &unix.SockaddrInet6{ZoneId: uint32(p.ifIndex)}
			copy(from.Addr[:], net.ParseIP(k).To16())
			if err := unix.Bind(fd, from); err != nil {
				return fmt.Errorf("bind %s: %w", k, err)
			}
			for range rounds {
				for _, m := range bySrc[k] {
					to := &unix.SockaddrInet6{ZoneId: uint32(p.ifIndex)}
					copy(to.Addr[:], m.dst.To16())
					switch err := unix.Sendto(fd, m.msg, unix.MSG_DONTWAIT, to); err {
					case nil:
						sent++
					case unix.EAGAIN, unix.ENOBUFS:
						time.Sleep(time.Millisecond)
					default:
						return fmt.Errorf("send ICMPv6 type %d from %s to %s: %w", m.msg[0], k, m.dst, err)
					}
				}
			}
		}
		return nil
	})
	return sent
}

// routerAdvertisementFull is everything a rogue router sets: current hop
// limit 7, managed and other flags, default router lifetime 1800 s,
// reachable time and retransmit timer, its link-layer address, MTU 1280,
// an autonomous on-link prefix 2001:db8:bad::/64, and route information
// (high preference) for ::/0 and 2001:db8:beef::/48.
func routerAdvertisementFull(mac net.HardwareAddr) []byte {
	ra := []byte{134, 0, 0, 0, 7, 0xc0, 0x07, 0x08}
	ra = binary.BigEndian.AppendUint32(ra, 1000) // reachable time, ms
	ra = binary.BigEndian.AppendUint32(ra, 100)  // retransmit timer, ms
	ra = append(ra, 1, 1)
	ra = append(ra, mac...)
	ra = append(ra, 5, 1, 0, 0)
	ra = binary.BigEndian.AppendUint32(ra, 1280)
	pio := []byte{3, 4, 64, 0xc0}
	pio = binary.BigEndian.AppendUint32(pio, 86400)
	pio = binary.BigEndian.AppendUint32(pio, 14400)
	pio = append(pio, 0, 0, 0, 0)
	pio = append(pio, net.ParseIP("2001:db8:bad::").To16()...)
	ra = append(ra, pio...)
	ra = append(ra, 24, 1, 0, 0x08) // route information ::/0, preference high
	ra = binary.BigEndian.AppendUint32(ra, 1800)
	ra = append(ra, 24, 2, 48, 0x08)
	ra = binary.BigEndian.AppendUint32(ra, 1800)
	return append(ra, net.ParseIP("2001:db8:beef::").To16()[:8]...)
}

// redirect tells the receiver to send to dest through target, whose
// link-layer address is mac.
func redirect(target, dest net.IP, mac net.HardwareAddr) []byte {
	r := []byte{137, 0, 0, 0, 0, 0, 0, 0}
	r = append(r, target.To16()...)
	r = append(r, dest.To16()...)
	r = append(r, 2, 1)
	return append(r, mac...)
}

// neighborAdvertisementFlags is an unsolicited NA for target with mac and
// flags (0x20 override, 0x80 router).
func neighborAdvertisementFlags(target net.IP, mac net.HardwareAddr, flags byte) []byte {
	na := neighborAdvertisement(target, mac)
	na[4] = flags
	return na
}

// podGateways are the gateways of the pod's default routes, by family.
func podGateways(t *testing.T, p *spoofPod) map[string]net.IP {
	t.Helper()
	out := map[string]net.IP{}
	nettest.Do(t, p.NS, func() error {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				if r.Gw != nil {
					out[map[bool]string{true: "ipv4", false: "ipv6"}[r.Gw.To4() != nil]] = r.Gw
				}
			}
		}
		return err
	})
	return out
}

// neighborMAC is the pod's neighbor entry for ip on eth0 ("" when none).
func neighborMAC(t *testing.T, p *spoofPod, ip net.IP) string {
	t.Helper()
	mac := ""
	nettest.Do(t, p.NS, func() error {
		neighs, err := netlink.NeighList(p.ifIndex, netlink.FAMILY_ALL)
		for _, n := range neighs {
			if n.IP.Equal(ip) && n.HardwareAddr != nil {
				mac = n.HardwareAddr.String()
			}
		}
		return err
	})
	return mac
}

// netnsState is what a pod must not change in a netns, as sorted text:
// every route of every table (both families), every address, every link's
// MTU, the IPv6 sysctls RAs set (forwarding, accept_ra, hop_limit, mtu of
// all, default and every link) and IPv4 forwarding, and the neighbor
// entries that have a link-layer address (IP -> MAC; their state comes and
// goes with traffic) for IPs not in ignore.
func netnsState(t *testing.T, netns ns.NetNS, ignore []net.IP) []string {
	t.Helper()
	var out []string
	nettest.Do(t, netns, func() error {
		names, err := nettest.LinkIndexNames()
		if err != nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, fmt.Sprintf("route %v via %v dev %s table %d type %d proto %d metric %d mtu %d hoplimit %d flags %d",
				r.Dst, r.Gw, names[r.LinkIndex], r.Table, r.Type, r.Protocol, r.Priority, r.MTU, r.Hoplimit, r.Flags))
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			out = append(out, fmt.Sprintf("addr %s dev %s", a.IPNet, names[a.LinkIndex]))
		}
		neighs, err := netlink.NeighList(0, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, n := range neighs {
			if n.HardwareAddr == nil || slices.ContainsFunc(ignore, n.IP.Equal) {
				continue
			}
			out = append(out, fmt.Sprintf("neigh %s dev %s lladdr %s router %v", n.IP, names[n.LinkIndex], n.HardwareAddr, n.Flags&netlink.NTF_ROUTER != 0))
		}
		links := []string{"all", "default"}
		for idx, name := range names {
			out = append(out, fmt.Sprintf("link %s mtu %d", name, linkMTUOf(idx)))
			links = append(links, name)
		}
		for _, l := range links {
			for _, s := range []string{"forwarding", "accept_ra", "hop_limit", "mtu"} {
				p := filepath.Join("/proc/sys/net/ipv6/conf", l, s)
				if b, err := os.ReadFile(p); err == nil {
					out = append(out, fmt.Sprintf("sysctl %s = %s", p, strings.TrimSpace(string(b))))
				}
			}
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil {
			out = append(out, "sysctl ip_forward = "+strings.TrimSpace(string(b)))
		}
		return nil
	})
	slices.Sort(out)
	return out
}

func linkMTUOf(idx int) int {
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return -1
	}
	return l.Attrs().MTU
}

// stateWithout drops from a netnsState the neighbor entries of ignore
// (the attacker's own may come and go).
func stateWithout(state []string, ignore []net.IP) []string {
	return slices.DeleteFunc(slices.Clone(state), func(s string) bool {
		for _, ip := range ignore {
			if ip != nil && strings.HasPrefix(s, "neigh "+ip.String()+" ") {
				return true
			}
		}
		return false
	})
}

// stateDiff shows the lines only before (-) and only after (+).
func stateDiff(before, after []string) string {
	var b strings.Builder
	for _, s := range before {
		if !slices.Contains(after, s) {
			fmt.Fprintf(&b, "  - %s\n", s)
		}
	}
	for _, s := range after {
		if !slices.Contains(before, s) {
			fmt.Fprintf(&b, "  + %s\n", s)
		}
	}
	return b.String()
}
