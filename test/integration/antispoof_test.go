package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// The pod filter (internal/podfilter) and the settings of the
// host-side interfaces, for both plugins: a pod sends only as itself
// (source address, MAC, ARP sender, Neighbor Advertisement target), and no
// pod changes its node's routes or addresses with Router Advertisements.
// Each mode uses its own 10.244.4x.0/24 (podnet) or 10.210.4x.0/24
// (podnet-bridge) and fd00:244:4x::/64 or fd00:210:4x::/64.

// spoofMode is one plugin as these tests drive it.
type spoofMode struct {
	name   string
	family nftables.TableFamily // of the pod filter's table
	// list renders the conflist over subnets; extra holds more plugin keys.
	list  func(t *testing.T, dataDir string, extra map[string]any, subnets ...string) string
	paths func(t *testing.T) []string
	// prefix is the first three octets of the mode's IPv4 subnets and the
	// first two groups of its IPv6 ones ("10.244", "fd00:244").
	v4, v6 string
	// hostIfaces are the node interfaces the plugin creates besides the
	// host veths.
	hostIfaces []string
}

var spoofModes = []spoofMode{
	{
		name: "podnet", family: nftables.TableFamilyINet, v4: "10.244", v6: "fd00:244",
		list: func(t *testing.T, dataDir string, extra map[string]any, subnets ...string) string {
			withState := map[string]any{"stateDir": t.TempDir()}
			for k, v := range extra {
				withState[k] = v
			}
			return podnetList("1.1.0", hostLocal(dataDir, subnets...), withState)
		},
		paths: func(t *testing.T) []string {
			return []string{nettest.BinDir(t, "podnet"), nettest.RefToolsDir(t)}
		},
	},
	{
		name: "podnet-bridge", family: nftables.TableFamilyBridge, v4: "10.210", v6: "fd00:210", hostIfaces: []string{veth.DefaultBridge},
		list: func(t *testing.T, dataDir string, extra map[string]any, subnets ...string) string {
			return bridgeList(t, "1.1.0", hostLocal(dataDir, subnets...), extra)
		},
		paths: func(t *testing.T) []string {
			return []string{nettest.BinDir(t, "podnet-bridge"), nettest.RefToolsDir(t)}
		},
	},
}

// subnets are the mode's subnets number n: IPv4, and IPv6 when dual.
func (m spoofMode) subnets(n int, dual bool) []string {
	s := []string{fmt.Sprintf("%s.%d.0/24", m.v4, n)}
	if dual {
		s = append(s, fmt.Sprintf("%s:%d::/64", m.v6, n))
	}
	return s
}

func (m spoofMode) runtime(t *testing.T, n int, dual bool, extra map[string]any) *nettest.Runtime {
	t.Helper()
	withState := map[string]any{"stateDir": t.TempDir()}
	for k, v := range extra {
		withState[k] = v
	}
	rt := nettest.NewRuntime(t, nettest.NewNode(t), m.list(t, t.TempDir(), withState, m.subnets(n, dual)...), m.paths(t)...)
	stateDirs.Store(rt, withState["stateDir"])
	return rt
}

// stateDirs are the runtimes' state dirs (where the pod filter's records are).
var stateDirs sync.Map

// guard is the pod filter of the mode, with rt's records.
func (m spoofMode) guard(rt *nettest.Runtime) podfilter.Guard {
	g := podfilter.Routed
	if m.family == nftables.TableFamilyBridge {
		g = podfilter.Bridged
	}
	dir, _ := stateDirs.Load(rt)
	return g.At(dir.(string))
}

// spoofPod is an attached pod with what the tests need of it.
type spoofPod struct {
	*nettest.Pod
	v4, v6  net.IP // v6 nil for an IPv4-only pod
	mac     net.HardwareAddr
	host    string // host veth name
	hostIdx int    // host veth ifindex in the node
	ifIndex int    // eth0's ifindex in the pod
}

func addSpoofPod(t *testing.T, rt *nettest.Runtime, id string) *spoofPod {
	t.Helper()
	podNS := nettest.NewNetNS(t)
	conf := nettest.RuntimeConf(id, podNS, "eth0")
	res, err := rt.Add(conf)
	if err != nil {
		t.Fatalf("ADD %s: %v", id, err)
	}
	p := &spoofPod{Pod: &nettest.Pod{NS: podNS, RT: conf, Result: res}, host: veth.HostVethName("", "", id, "eth0")}
	for _, ip := range res.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			p.v4 = v4
		} else {
			p.v6 = ip.Address.IP
		}
	}
	nettest.Do(t, podNS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		p.mac, p.ifIndex = l.Attrs().HardwareAddr, l.Attrs().Index
		return nil
	})
	rt.Node.Do(func() error {
		l, err := netlink.LinkByName(p.host)
		if err != nil {
			return err
		}
		p.hostIdx = l.Attrs().Index
		return nil
	})
	return p
}

// wantElements are the pod filter elements of p.
func (m spoofMode) wantElements(p *spoofPod) []nettest.PodFilterElement {
	out := []nettest.PodFilterElement{
		{Family: m.family, Set: "ports", Index: p.hostIdx},
		{Family: m.family, Set: "addrs4", Index: p.hostIdx, Value: p.v4.String()},
	}
	if p.v6 != nil {
		out = append(out, nettest.PodFilterElement{Family: m.family, Set: "addrs6", Index: p.hostIdx, Value: p.v6.String()})
	}
	if m.family == nftables.TableFamilyBridge {
		out = append(out, nettest.PodFilterElement{Family: m.family, Set: "macs", Index: p.hostIdx, Value: p.mac.String()})
	}
	// both modes: the pod's own link-local address
	out = append(out, nettest.PodFilterElement{Family: m.family, Set: "addrs6", Index: p.hostIdx, Value: podfilter.EUI64LinkLocal(p.mac).String()})
	return out
}

func filterOf(t *testing.T, node *nettest.Node) []nettest.PodFilterElement {
	t.Helper()
	elems, err := nettest.ReadPodFilter(node.NS)
	if err != nil {
		t.Fatal(err)
	}
	return elems
}

// filterSettles returns the pod filter once ok accepts it (DEL and GC give
// the elements they remove a timeout of 1 ms where the kernel can, so they
// leave the sets a moment after the verb), or after 2 s whatever it is.
func filterSettles(t *testing.T, node *nettest.Node, ok func([]nettest.PodFilterElement) bool) []nettest.PodFilterElement {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		elems := filterOf(t, node)
		if ok(elems) || time.Now().After(deadline) {
			return elems
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func elemsOfIndex(elems []nettest.PodFilterElement, index int) []nettest.PodFilterElement {
	var out []nettest.PodFilterElement
	for _, e := range elems {
		if e.Index == index {
			out = append(out, e)
		}
	}
	return out
}

func sameElements(got, want []nettest.PodFilterElement) bool {
	key := func(e []nettest.PodFilterElement) []string {
		var s []string
		for _, x := range e {
			s = append(s, x.String())
		}
		slices.Sort(s)
		return s
	}
	return slices.Equal(key(got), key(want))
}

func counter(t *testing.T, node *nettest.Node, fam nftables.TableFamily, name string) uint64 {
	t.Helper()
	n, err := nettest.PodFilterCounter(node.NS, fam, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// udpListener collects the datagrams a pod receives on port, both families.
type udpListener struct {
	mu   sync.Mutex
	got  []string // "source payload"
	conn []net.PacketConn
}

const spoofPort = 7777

func listenUDP(t *testing.T, p *spoofPod) *udpListener {
	t.Helper()
	l := &udpListener{}
	nets := map[string]string{"udp4": p.v4.String()}
	if p.v6 != nil {
		nets["udp6"] = "[" + p.v6.String() + "]"
	}
	for network, addr := range nets {
		var pc net.PacketConn
		nettest.Do(t, p.NS, func() error {
			var err error
			pc, err = net.ListenPacket(network, fmt.Sprintf("%s:%d", addr, spoofPort))
			return err
		})
		l.conn = append(l.conn, pc)
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				l.mu.Lock()
				l.got = append(l.got, from.(*net.UDPAddr).IP.String()+" "+string(buf[:n]))
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range l.conn {
			c.Close()
		}
	})
	return l
}

func (l *udpListener) received() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// waitFor waits until the listener has a datagram with payload.
func (l *udpListener) waitFor(t *testing.T, payload string) {
	t.Helper()
	nettest.Eventually(t, 5*time.Second, "datagram "+payload+" received", func() error {
		for _, g := range l.received() {
			if strings.HasSuffix(g, " "+payload) {
				return nil
			}
		}
		return fmt.Errorf("received only %v", l.received())
	})
}

// sendUDP sends one datagram from src (an address of the pod, bound) to
// dst:spoofPort.
func sendUDP(t *testing.T, podNS ns.NetNS, src, dst net.IP, payload string) {
	t.Helper()
	nettest.Do(t, podNS, func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: src}, &net.UDPAddr{IP: dst, Port: spoofPort})
		if err != nil {
			return fmt.Errorf("from %s to %s: %w", src, dst, err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(payload)); err != nil {
			return fmt.Errorf("send from %s to %s: %w", src, dst, err)
		}
		return nil
	})
}

// addPodAddrs gives the pod's eth0 more addresses (/32 and /128, no DAD):
// the addresses it will forge.
func addPodAddrs(t *testing.T, podNS ns.NetNS, ips ...net.IP) {
	t.Helper()
	nettest.Do(t, podNS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, ip := range ips {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}}
			if ip.To4() == nil {
				a = &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("add %s to the pod: %w", ip, err)
			}
		}
		return nil
	})
}

// TestPodsSendOnlyAsThemselves: on one node, a pod sends UDP to a listening
// pod from its own address (received: the path works), from another pod's
// address and from an address no pod has (not received), both families,
// and the spoofed counter counts the drops. The forged datagrams are sent
// between two true ones and the second true one is received, so the
// forged ones were not merely late.
func TestPodsSendOnlyAsThemselves(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 41, true, nil)
			listener := addSpoofPod(t, rt, "spoof-listener")
			attacker := addSpoofPod(t, rt, "spoof-attacker")
			victim := addSpoofPod(t, rt, "spoof-victim")
			rec := listenUDP(t, listener)
			remote4, remote6 := net.ParseIP("10.99.0.7").To4(), net.ParseIP("fd99::7")
			addPodAddrs(t, attacker.NS, victim.v4, victim.v6, remote4, remote6)

			before := counter(t, rt.Node, m.family, contract.PodFilterSpoofedCounter)
			forged := 0
			for _, fam := range []struct {
				name                string
				own, victim, remote net.IP
				dst                 net.IP
			}{
				{"IPv4", attacker.v4, victim.v4, remote4, listener.v4},
				{"IPv6", attacker.v6, victim.v6, remote6, listener.v6},
			} {
				sendUDP(t, attacker.NS, fam.own, fam.dst, fam.name+"-true-1")
				rec.waitFor(t, fam.name+"-true-1")
				for i := range 3 {
					sendUDP(t, attacker.NS, fam.victim, fam.dst, fmt.Sprintf("%s-as-victim-%d", fam.name, i))
					sendUDP(t, attacker.NS, fam.remote, fam.dst, fmt.Sprintf("%s-as-remote-%d", fam.name, i))
					forged += 2
				}
				sendUDP(t, attacker.NS, fam.own, fam.dst, fam.name+"-true-2")
				rec.waitFor(t, fam.name+"-true-2")
			}
			time.Sleep(200 * time.Millisecond) // anything still in flight
			for _, g := range rec.received() {
				src, payload, _ := strings.Cut(g, " ")
				if strings.Contains(payload, "-as-") {
					t.Errorf("the listener received %q from %s: a forged source got through", payload, src)
				} else if src != attacker.v4.String() && src != attacker.v6.String() {
					t.Errorf("the listener received %q from %s, not from the attacker's own address", payload, src)
				}
			}
			after := counter(t, rt.Node, m.family, contract.PodFilterSpoofedCounter)
			if after-before < uint64(forged) {
				t.Errorf("counter %s rose by %d, want at least the %d forged datagrams", contract.PodFilterSpoofedCounter, after-before, forged)
			}
			t.Logf("received %v; %s counter %d -> %d", rec.received(), contract.PodFilterSpoofedCounter, before, after)
		})
	}
}

// ipv6Snapshot is what of a netns's IPv6 state a pod must not change:
// every route of every table and every address, as text.
func ipv6Snapshot(t *testing.T, node *nettest.Node) []string {
	t.Helper()
	var out []string
	node.Do(func() error {
		names, err := nettest.LinkIndexNames()
		if err != nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, fmt.Sprintf("route %v via %v dev %s table %d type %d", r.Dst, r.Gw, names[r.LinkIndex], r.Table, r.Type))
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			out = append(out, fmt.Sprintf("addr %s dev %s", a.IPNet, names[a.LinkIndex]))
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// waitIPv6Settled waits until no IPv6 address of netns is tentative (DAD
// done: the local routes of the addresses are in, and a link-local source
// can be used).
func waitIPv6Settled(t *testing.T, netns ns.NetNS) {
	t.Helper()
	nettest.Eventually(t, 15*time.Second, "IPv6 addresses of "+netns.Path()+" settled", func() error {
		return netns.Do(func(ns.NetNS) error {
			addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.Flags&unix.IFA_F_TENTATIVE != 0 {
					return fmt.Errorf("%s is tentative", a.IPNet)
				}
			}
			return nil
		})
	})
}

// podLinkLocal is the link-local address of the pod's eth0.
func podLinkLocal(t *testing.T, p *spoofPod) net.IP {
	t.Helper()
	var ll net.IP
	nettest.Do(t, p.NS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				ll = a.IP
				return nil
			}
		}
		return fmt.Errorf("eth0 has no link-local address: %v", addrs)
	})
	return ll
}

// sendICMPv6 sends msg (an ICMPv6 message; the kernel fills in the
// checksum) count times from the pod's eth0 link-local address to dst on
// eth0, with hop limit 255 as NDP requires.
func sendICMPv6(t *testing.T, p *spoofPod, dst net.IP, msg []byte, count int) {
	t.Helper()
	sendICMPv6From(t, p, podLinkLocal(t, p), dst, msg, count)
}

// sendICMPv6From is sendICMPv6 from the pod's address src.
func sendICMPv6From(t *testing.T, p *spoofPod, src, dst net.IP, msg []byte, count int) {
	t.Helper()
	nettest.Do(t, p.NS, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
		if err != nil {
			return fmt.Errorf("raw ICMPv6 socket: %w", err)
		}
		defer unix.Close(fd)
		for _, opt := range []int{unix.IPV6_MULTICAST_HOPS, unix.IPV6_UNICAST_HOPS} {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, opt, 255); err != nil {
				return err
			}
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, p.ifIndex); err != nil {
			return err
		}
		from := &unix.SockaddrInet6{ZoneId: uint32(p.ifIndex)}
		copy(from.Addr[:], src.To16())
		if err := unix.Bind(fd, from); err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
		to := &unix.SockaddrInet6{ZoneId: uint32(p.ifIndex)}
		copy(to.Addr[:], dst.To16())
		for range count {
			if err := unix.Sendto(fd, msg, 0, to); err != nil {
				return fmt.Errorf("send ICMPv6 type %d to %s: %w", msg[0], dst, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
}

// sendFrame sends an Ethernet frame count times on the pod's eth0.
func sendFrame(t *testing.T, p *spoofPod, frame []byte, count int) {
	t.Helper()
	nettest.Do(t, p.NS, func() error {
		// protocol 0: a socket that only sends
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: p.ifIndex, Halen: 6}
		copy(to.Addr[:], frame[:6])
		for range count {
			if err := unix.Sendto(fd, frame, 0, to); err != nil {
				return fmt.Errorf("send frame: %w", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
}

// routerAdvertisement is an RA with a default router lifetime of 1800 s,
// the sender's link-layer address and an autonomous, on-link prefix
// 2001:db8:bad::/64: what a rogue router sends to take over a link.
func routerAdvertisement(mac net.HardwareAddr) []byte {
	ra := []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
	ra = append(ra, 1, 1)
	ra = append(ra, mac...)
	pio := []byte{3, 4, 64, 0xc0}
	pio = binary.BigEndian.AppendUint32(pio, 86400)
	pio = binary.BigEndian.AppendUint32(pio, 14400)
	pio = append(pio, 0, 0, 0, 0)
	pio = append(pio, net.ParseIP("2001:db8:bad::").To16()...)
	return append(ra, pio...)
}

// neighborAdvertisement is an unsolicited NA with the override flag that
// claims target for mac.
func neighborAdvertisement(target net.IP, mac net.HardwareAddr) []byte {
	na := []byte{136, 0, 0, 0, 0x20, 0, 0, 0}
	na = append(na, target.To16()...)
	na = append(na, 2, 1)
	return append(na, mac...)
}

// gratuitousARP is a broadcast ARP request from mac claiming ip.
func gratuitousARP(ip net.IP, mac net.HardwareAddr) []byte {
	f := append(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
	f = append(f, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	f = append(f, mac...)
	f = append(f, ip.To4()...)
	f = append(f, 0, 0, 0, 0, 0, 0)
	return append(f, ip.To4()...)
}

// hostIfaceSettings are the settings the plugins give every host-side
// interface (plugins/veth/sysctl.go).
var hostIfaceSettings = []string{"ipv4/conf/%s/accept_redirects", "ipv6/conf/%s/accept_ra", "ipv6/conf/%s/autoconf", "ipv6/conf/%s/accept_redirects"}

func assertHostIfaceSettings(t *testing.T, node *nettest.Node, dev string) {
	t.Helper()
	for _, s := range hostIfaceSettings {
		name := "net/" + fmt.Sprintf(s, dev)
		if v, err := nettest.ReadSysctl(node.NS, name); err != nil || v != "0" {
			t.Errorf("%s = %q (%v), want 0", name, v, err)
		}
	}
}

// TestPodRouterAdvertisementsChangeNothing: an IPv4-only pod (so IPv6
// forwarding stays off on the node, where the kernel accepts RAs by
// default) sends Router Advertisements with a default router lifetime and
// an autonomous prefix to all nodes, and Redirects; after 2 s the node has
// the same IPv6 routes and addresses, and the ra-guard counter counts them.
func TestPodRouterAdvertisementsChangeNothing(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 42, false, nil)
			p := addSpoofPod(t, rt, "ra-sender")
			for _, dev := range append([]string{p.host}, m.hostIfaces...) {
				assertHostIfaceSettings(t, rt.Node, dev)
			}
			waitIPv6Settled(t, rt.Node.NS)
			waitIPv6Settled(t, p.NS)
			before := ipv6Snapshot(t, rt.Node)
			raBefore := counter(t, rt.Node, m.family, contract.PodFilterRAGuardCounter)

			const n = 5
			sendICMPv6(t, p, net.ParseIP("ff02::1"), routerAdvertisement(p.mac), n)
			time.Sleep(2 * time.Second)

			after := ipv6Snapshot(t, rt.Node)
			if !slices.Equal(before, after) {
				t.Errorf("the pod's RAs changed the node's IPv6 state:\nbefore %v\nafter  %v", before, after)
			}
			if got := counter(t, rt.Node, m.family, contract.PodFilterRAGuardCounter) - raBefore; got < n {
				t.Errorf("counter %s rose by %d, want %d", contract.PodFilterRAGuardCounter, got, n)
			}
			if err := nettest.Ping(p.NS, nettest.NodeAddr); err != nil {
				t.Errorf("the pod must still reach its node: %v", err)
			}
		})
	}
}

// neighborOf is the MAC of the node's neighbor entry for ip on dev, ""
// when none.
func neighborOf(t *testing.T, node *nettest.Node, dev string, ip net.IP) string {
	t.Helper()
	var mac string
	node.Do(func() error {
		fam := netlink.FAMILY_V4
		if ip.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		neighs, err := netlink.NeighList(l.Attrs().Index, fam)
		if err != nil {
			return err
		}
		for _, n := range neighs {
			if n.IP.Equal(ip) && n.HardwareAddr != nil {
				mac = n.HardwareAddr.String()
			}
		}
		return nil
	})
	return mac
}

// TestPodNeighborAdvertisementsForAnotherPod: a pod floods unsolicited
// Neighbor Advertisements (override flag set), from its link-local and
// from its own global address, and gratuitous ARPs that claim another
// pod's addresses for its own MAC; the node's neighbor entries for that
// pod keep its MAC, it stays reachable, and the spoofed counter counts the
// NAs (and, on the bridge, the ARPs). Router Advertisements from its
// global address are counted by ra-guard.
func TestPodNeighborAdvertisementsForAnotherPod(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 43, true, nil)
			attacker := addSpoofPod(t, rt, "na-attacker")
			victim := addSpoofPod(t, rt, "na-victim")
			waitIPv6Settled(t, victim.NS)
			waitIPv6Settled(t, attacker.NS)
			// the node's interface towards the victim
			dev := victim.host
			if m.family == nftables.TableFamilyBridge {
				dev = veth.DefaultBridge
			}
			// the node learns the victim's MAC for both addresses
			for _, ip := range []net.IP{victim.v4, victim.v6} {
				if err := nettest.Ping(rt.Node.NS, ip.String()); err != nil {
					t.Fatal(err)
				}
				if got := neighborOf(t, rt.Node, dev, ip); got != victim.mac.String() {
					t.Fatalf("node neighbor entry of %s = %q, want the victim's %s", ip, got, victim.mac)
				}
			}
			before := counter(t, rt.Node, m.family, contract.PodFilterSpoofedCounter)

			raBefore := counter(t, rt.Node, m.family, contract.PodFilterRAGuardCounter)

			const n = 10
			// from its link-local address, and from its own global one (the
			// filter accepts a pod's traffic from that early, but not ICMPv6)
			sendICMPv6(t, attacker, net.ParseIP("ff02::1"), neighborAdvertisement(victim.v6, attacker.mac), n)
			sendICMPv6From(t, attacker, attacker.v6, net.ParseIP("ff02::1"), neighborAdvertisement(victim.v6, attacker.mac), n)
			sendFrame(t, attacker, gratuitousARP(victim.v4, attacker.mac), n)
			// Router Advertisements from its global address (the node's
			// kernel ignores those itself: the counter shows the filter's drop)
			sendICMPv6From(t, attacker, attacker.v6, net.ParseIP("ff02::1"), routerAdvertisement(attacker.mac), n)
			time.Sleep(time.Second)

			for _, ip := range []net.IP{victim.v4, victim.v6} {
				if got := neighborOf(t, rt.Node, dev, ip); got != victim.mac.String() {
					t.Errorf("node neighbor entry of the victim's %s = %q after the flood, want %s", ip, got, victim.mac)
				}
				if err := nettest.Ping(rt.Node.NS, ip.String()); err != nil {
					t.Errorf("the victim must stay reachable: %v", err)
				}
			}
			want := uint64(2 * n) // the NAs
			if m.family == nftables.TableFamilyBridge {
				want += n // and the ARPs
			}
			if got := counter(t, rt.Node, m.family, contract.PodFilterSpoofedCounter) - before; got < want {
				t.Errorf("counter %s rose by %d, want at least %d", contract.PodFilterSpoofedCounter, got, want)
			}
			if got := counter(t, rt.Node, m.family, contract.PodFilterRAGuardCounter) - raBefore; got < n {
				t.Errorf("counter %s rose by %d, want %d (the RAs from the pod's global address)", contract.PodFilterRAGuardCounter, got, n)
			}
		})
	}
}

// nftCLI runs nft in the node netns.
func nftCLI(t *testing.T, node *nettest.Node, args ...string) string {
	t.Helper()
	var out []byte
	node.Do(func() error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out)
}

func famName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyBridge {
		return "bridge"
	}
	return "inet"
}

// ruleHandle finds the handle of the chain's rule with comment.
func ruleHandle(t *testing.T, node *nettest.Node, fam nftables.TableFamily, comment string) string {
	t.Helper()
	listing := nftCLI(t, node, "-a", "list", "chain", famName(fam), contract.PodFilterTable, "prerouting")
	m := regexp.MustCompile(`comment "` + regexp.QuoteMeta(comment) + `" # handle (\d+)`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no rule with comment %q in\n%s", comment, listing)
	}
	return m[1]
}

// TestPodFilterLifecycle: ADD writes exactly the pod's elements (host veth
// index with its addresses, and its MAC on the bridge) and leaves an intact
// chain alone; CHECK finds a deleted or edited rule and a missing element;
// the next ADD only adds its elements (it does not read the chain) and
// Repair (what podnet-routed runs at every resync) writes the chain again
// as it was, keeping every element; DEL removes the pod's
// elements and no other, with prevResult and without; GC removes those of
// a host veth that is gone.
func TestPodFilterLifecycle(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 44, true, nil)
			fam := famName(m.family)
			p1 := addSpoofPod(t, rt, "life-1")
			withHandles := nftCLI(t, rt.Node, "-a", "list", "chain", fam, contract.PodFilterTable, "prerouting")
			p2 := addSpoofPod(t, rt, "life-2")
			if got, want := filterOf(t, rt.Node), append(m.wantElements(p1), m.wantElements(p2)...); !sameElements(got, want) {
				t.Fatalf("pod filter after two ADDs = %v, want %v", got, want)
			}
			// an intact chain is left alone (same rule handles): ADD then
			// only adds elements, and pays for no rule change
			if got := nftCLI(t, rt.Node, "-a", "list", "chain", fam, contract.PodFilterTable, "prerouting"); got != withHandles {
				t.Errorf("the second ADD wrote the intact chain again:\n%s\nwas:\n%s", got, withHandles)
			}
			chain := nftCLI(t, rt.Node, "list", "chain", fam, contract.PodFilterTable, "prerouting")

			// someone deletes one rule and turns another's drop into accept
			nftCLI(t, rt.Node, "delete", "rule", fam, contract.PodFilterTable, "prerouting", "handle", ruleHandle(t, rt.Node, m.family, "IPv4 from another address"))
			proto := "meta nfproto ipv6"
			if m.family == nftables.TableFamilyBridge {
				proto = "meta protocol ip6"
			}
			nftCLI(t, rt.Node, "replace", "rule", fam, contract.PodFilterTable, "prerouting", "handle", ruleHandle(t, rt.Node, m.family, "IPv6 from another address"), proto, "accept")
			if err := rt.Check(p1.RT); err == nil || !strings.Contains(err.Error(), "rules") {
				t.Errorf("CHECK with a rule deleted = %v, want an error about the chain's rules", err)
			}
			p3 := addSpoofPod(t, rt, "life-3")
			g := m.guard(rt)
			var wrote bool
			var lastWhy string
			repair := func() (err error) {
				var why string
				why, _, err = g.Repair()
				wrote, lastWhy = why != "", why
				return err
			}
			nettest.Do(t, rt.Node.NS, repair)
			if !wrote {
				t.Error("Repair did not write the changed chain")
			}
			if got := nftCLI(t, rt.Node, "list", "chain", fam, contract.PodFilterTable, "prerouting"); got != chain {
				t.Errorf("the chain after Repair:\n%s\nwant it as ADD wrote it:\n%s", got, chain)
			}
			if err := rt.Check(p1.RT); err != nil {
				t.Errorf("CHECK after the chain was written again: %v", err)
			}
			if got, want := filterOf(t, rt.Node), append(append(m.wantElements(p1), m.wantElements(p2)...), m.wantElements(p3)...); !sameElements(got, want) {
				t.Errorf("pod filter after Repair = %v, want every pod's elements %v", got, want)
			}
			nettest.Do(t, rt.Node.NS, repair)
			if wrote {
				t.Errorf("Repair wrote an intact chain: %s", lastWhy)
			}

			// an element gone: CHECK names it
			nftCLI(t, rt.Node, "delete", "element", fam, contract.PodFilterTable, "addrs4", fmt.Sprintf("{ %s . %s }", p3.host, p3.v4))
			if err := rt.Check(p3.RT); err == nil || !strings.Contains(err.Error(), p3.v4.String()) {
				t.Errorf("CHECK with the pod's addrs4 element deleted = %v, want an error naming %s", err, p3.v4)
			}

			// DEL removes the pod's elements, and only them
			if err := rt.Del(p1.RT); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			elems := filterSettles(t, rt.Node, func(e []nettest.PodFilterElement) bool { return len(elemsOfIndex(e, p1.hostIdx)) == 0 })
			if left := elemsOfIndex(elems, p1.hostIdx); len(left) > 0 {
				t.Errorf("elements of the deleted pod left: %v", left)
			}
			if got := elemsOfIndex(elems, p2.hostIdx); !sameElements(got, m.wantElements(p2)) {
				t.Errorf("elements of the other pod after DEL = %v, want %v", got, m.wantElements(p2))
			}

			// p2's host veth disappears behind the plugins' back: GC prunes
			// its elements even though p2 is still a valid attachment
			rt.Node.Do(func() error {
				l, err := netlink.LinkByName(p2.host)
				if err != nil {
					return err
				}
				return netlink.LinkDel(l)
			})
			if left := elemsOfIndex(filterOf(t, rt.Node), p2.hostIdx); len(left) == 0 {
				t.Fatalf("the elements of p2 went with its veth: the GC below would prove nothing")
			}
			valid := []types.GCAttachment{{ContainerID: p2.RT.ContainerID, IfName: "eth0"}, {ContainerID: p3.RT.ContainerID, IfName: "eth0"}}
			if err := rt.GC(valid); err != nil {
				t.Fatalf("GC: %v", err)
			}
			elems = filterSettles(t, rt.Node, func(e []nettest.PodFilterElement) bool { return len(elemsOfIndex(e, p2.hostIdx)) == 0 })
			if left := elemsOfIndex(elems, p2.hostIdx); len(left) > 0 {
				t.Errorf("GC left the elements of a host veth that is gone: %v", left)
			}
			wantP3 := slices.DeleteFunc(m.wantElements(p3), func(e nettest.PodFilterElement) bool { return e.Set == "addrs4" })
			if got := elemsOfIndex(elems, p3.hostIdx); !sameElements(got, wantP3) {
				t.Errorf("elements of the live pod after GC = %v, want %v", got, wantP3)
			}
			// without prevResult, DEL finds the elements by the host veth
			rt.ForgetCache(t)
			if err := rt.Del(p3.RT); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if elems := filterSettles(t, rt.Node, func(e []nettest.PodFilterElement) bool { return len(e) == 0 }); len(elems) > 0 {
				t.Errorf("elements left after the last DEL: %v", elems)
			}
		})
	}
}

// TestHostIfaceWithoutIPv6: a host veth (and bridge) without IPv6 has no
// IPv6 settings to write; ADD must work all the same: an MTU below 1280
// (the kernel gives the interface no IPv6 at all) and a node with
// disable_ipv6.
func TestHostIfaceWithoutIPv6(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			t.Run("mtu 1200", func(t *testing.T) {
				rt := m.runtime(t, 45, false, map[string]any{"mtu": 1200})
				p := addSpoofPod(t, rt, "noipv6-mtu")
				if _, err := nettest.ReadSysctl(rt.Node.NS, "net/ipv6/conf/"+p.host+"/accept_ra"); err == nil {
					t.Fatalf("host veth %s has IPv6 settings at MTU 1200: this case tests nothing", p.host)
				}
				if v, err := nettest.ReadSysctl(rt.Node.NS, "net/ipv4/conf/"+p.host+"/accept_redirects"); err != nil || v != "0" {
					t.Errorf("accept_redirects = %q (%v), want 0", v, err)
				}
				if err := nettest.Ping(p.NS, nettest.NodeAddr); err != nil {
					t.Fatal(err)
				}
				if err := rt.Check(p.RT); err != nil {
					t.Errorf("CHECK: %v", err)
				}
				if err := rt.Del(p.RT); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("disable_ipv6", func(t *testing.T) {
				rt := m.runtime(t, 46, false, nil)
				rt.Node.Do(func() error {
					for _, k := range []string{"all", "default"} {
						if err := nettest.WriteSysctl("net/ipv6/conf/"+k+"/disable_ipv6", "1"); err != nil {
							return err
						}
					}
					return nil
				})
				p := addSpoofPod(t, rt, "noipv6-disabled")
				for _, dev := range append([]string{p.host}, m.hostIfaces...) {
					assertHostIfaceSettings(t, rt.Node, dev)
				}
				if err := rt.Check(p.RT); err != nil {
					t.Errorf("CHECK: %v", err)
				}
				if err := rt.Del(p.RT); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
