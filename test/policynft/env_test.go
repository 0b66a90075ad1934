// Package policynft tests the NetworkPolicy engine's kernel writer
// (routed/policy/nft) with real packets: a node netns with veth pods
// wired as the podnet plugin wires them (/32 and /128 routes to host
// veths, proxy ARP, the fixed IPv6 link-local gateway), an outside host
// behind the node, the writer running in the node netns.
package policynft

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// The addresses of the test node.
var (
	localCIDRs = []netip.Prefix{netip.MustParsePrefix("10.64.1.0/24"), netip.MustParsePrefix("fd64:1::/64")}
	// the node's own address (on lo), reached through the input hook
	nodeAddr4, nodeAddr6 = netip.MustParseAddr("172.30.0.1"), netip.MustParseAddr("fd30::1")
	// the outside host, behind the node's link "ext"
	extAddr4, extAddr6 = netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("fd99::2")
)

// gateway6 is the pod's IPv6 gateway: the host veth's fixed link-local
// address, as plugins/veth sets it.
const gateway6 = "fe80::ecee:eeff:feee:eeee"

// env is a node netns with pods and an outside host.
type env struct {
	t    testing.TB
	node ns.NetNS
	ext  ns.NetNS
	pods map[string]*pod
	w    *nft.Writer
}

type pod struct {
	name   string
	ns     ns.NetNS
	v4, v6 netip.Addr
}

// addr is the pod's address of the family v6 says.
func (p *pod) addr(v6 bool) netip.Addr {
	if v6 {
		return p.v6
	}
	return p.v4
}

// newEnv makes the node, the outside host and pods named by names, the
// n-th with addresses 10.64.1.(n+2) and fd64:1::(n+2).
func newEnv(t testing.TB, names ...string) *env {
	t.Helper()
	e := &env{t: t, node: nettest.NewNetNS(t), ext: nettest.NewNetNS(t), pods: map[string]*pod{}, w: &nft.Writer{}}
	t.Cleanup(e.w.Close)
	e.do(func() error {
		for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := nettest.WriteSysctl(s, "1"); err != nil {
				return err
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []string{nodeAddr4.String() + "/32", nodeAddr6.String() + "/128"} {
			if err := addAddr(lo, a); err != nil {
				return err
			}
		}
		return nil
	})
	// the outside host
	e.link("ext", "eth0", e.ext)
	e.do(func() error {
		l, err := netlink.LinkByName("ext")
		if err != nil {
			return err
		}
		if err := addAddr(l, "10.99.0.1/24"); err != nil {
			return err
		}
		if err := addAddr(l, "fd99::1/64"); err != nil {
			return err
		}
		// the node's default route: proxy ARP answers the pods for
		// 169.254.1.1 because it routes it through another link
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: extAddr4.AsSlice()})
	})
	nettest.Do(t, e.ext, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddr(l, extAddr4.String()+"/24"); err != nil {
			return err
		}
		if err := addAddr(l, extAddr6.String()+"/64"); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.99.0.1")}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("fd99::1")})
	})
	for i, name := range names {
		e.addPod(name, i+2)
	}
	return e
}

func (e *env) do(f func() error) {
	e.t.Helper()
	nettest.Do(e.t, e.node, f)
}

// link makes a veth pair: host in the node, peer (renamed peerName) in
// other, both up.
func (e *env) link(host, peerName string, other ns.NetNS) {
	e.t.Helper()
	e.do(func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: host + "p"}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("add veth %s: %w", host, err)
		}
		peer, err := netlink.LinkByName(host + "p")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(other.Fd())); err != nil {
			return err
		}
		return nettest.LinkUp(host)
	})
	nettest.Do(e.t, other, func() error {
		peer, err := netlink.LinkByName(host + "p")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(peer, peerName); err != nil {
			return err
		}
		return nettest.LinkUp(peerName)
	})
}

// addPod makes a pod netns wired like the plugin's: /32 and /128 on
// eth0, default routes through the host veth (proxy ARP for IPv4, the
// fixed link-local gateway for IPv6), host routes to it in the node.
func (e *env) addPod(name string, n int) *pod {
	e.t.Helper()
	p := &pod{name: name, ns: nettest.NewNetNS(e.t),
		v4: netip.MustParseAddr(fmt.Sprintf("10.64.1.%d", n)),
		v6: netip.MustParseAddr(fmt.Sprintf("fd64:1::%x", n))}
	host := "pn" + name
	e.do(func() error {
		if err := nettest.WriteSysctl("net/ipv6/conf/default/accept_ra", "0"); err != nil {
			return err
		}
		return nil
	})
	e.link(host, "eth0", p.ns)
	e.do(func() error {
		l, err := netlink.LinkByName(host)
		if err != nil {
			return err
		}
		for _, s := range []string{"net/ipv4/conf/" + host + "/proxy_arp", "net/ipv4/neigh/" + host + "/proxy_delay"} {
			v := map[bool]string{true: "1", false: "0"}[strings.HasSuffix(s, "proxy_arp")]
			if err := nettest.WriteSysctl(s, v); err != nil {
				return err
			}
		}
		if err := addAddr(l, gateway6+"/64"); err != nil {
			return err
		}
		for _, a := range []netip.Addr{p.v4, p.v6} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}); err != nil {
				return fmt.Errorf("route to %s: %w", a, err)
			}
		}
		return nil
	})
	nettest.Do(e.t, p.ns, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddr(l, p.v4.String()+"/32"); err != nil {
			return err
		}
		if err := addAddr(l, p.v6.String()+"/128"); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4(169, 254, 1, 1).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IPv4(169, 254, 1, 1).To4()}); err != nil {
			return fmt.Errorf("pod default route: %w", err)
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gateway6)})
	})
	e.pods[name] = p
	return p
}

func addAddr(l netlink.Link, cidr string) error {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if a.IP.To4() == nil {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", cidr, l.Attrs().Name, err)
	}
	return nil
}

// apply writes rs with the env's writer in the node, with the ports of
// its pods filled in as the engine does (withPorts).
func (e *env) apply(rs policy.Ruleset) nft.Stats {
	e.t.Helper()
	rs = e.withPorts(rs)
	var st nft.Stats
	e.do(func() error {
		var err error
		st, err = e.w.Apply(rs)
		return err
	})
	return st
}

// rotateArms runs rounds of the arms in turn, the order rotating every
// round so that the machine's drift falls on every arm alike: arm i's
// table written whole (nil: no table at all) with the pods' host veths
// (withPorts: a host veth the table does not know passes nothing), then
// run(i) measures it.
func (e *env) rotateArms(rounds int, arms []*policy.Ruleset, run func(i int)) {
	tables := make([]*policy.Ruleset, len(arms))
	for i, rs := range arms {
		if rs != nil {
			withPorts := e.withPorts(*rs)
			tables[i] = &withPorts
		}
	}
	for r := range rounds {
		for k := range tables {
			i := (k + r) % len(tables)
			if rs := tables[i]; rs == nil {
				e.do(e.w.Delete)
			} else {
				e.do(func() error { return e.w.ApplyFull(*rs) })
			}
			run(i)
		}
	}
}

// withPorts gives rs the host veths of the env's pods it knows (Known, or a
// pod entry with one of their addresses), as the engine's compile does from
// the node's links: a pod rs does not know has no port in it.
func (e *env) withPorts(rs policy.Ruleset) policy.Ruleset {
	if rs.Ports != nil {
		return rs // the test set them
	}
	rs.Ports = []string{}
	owner := map[netip.Addr]string{}
	for _, p := range e.pods {
		owner[p.v4], owner[p.v6] = "pn"+p.name, "pn"+p.name
	}
	for _, a := range rs.Known {
		if h, ok := owner[a]; ok && !slices.Contains(rs.Ports, h) {
			rs.Ports = append(rs.Ports, h)
		}
	}
	rs.Pods = slices.Clone(rs.Pods)
	for i := range rs.Pods {
		pc := &rs.Pods[i]
		if pc.Ports != nil {
			continue
		}
		for _, a := range pc.Addrs {
			if h, ok := owner[a]; ok && !slices.Contains(pc.Ports, h) {
				pc.Ports = append(pc.Ports, h)
				if !slices.Contains(rs.Ports, h) {
					rs.Ports = append(rs.Ports, h)
				}
			}
		}
	}
	slices.Sort(rs.Ports)
	return rs
}

// server serves TCP and UDP echo on port in netns (every address, one
// socket per family: Go's dual-stack probe may have run in a netns
// without IPv6 loopback) until the test ends.
func server(t testing.TB, netns ns.NetNS, port int) {
	t.Helper()
	for _, network := range []string{"tcp4", "tcp6", "udp4", "udp6"} {
		var l io.Closer
		nettest.Do(t, netns, func() error {
			if strings.HasPrefix(network, "tcp") {
				ln, err := net.Listen(network, ":"+strconv.Itoa(port))
				if err != nil {
					return err
				}
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						go func() { _, _ = io.Copy(c, c); c.Close() }()
					}
				}()
				l = ln
				return nil
			}
			pc, err := net.ListenPacket(network, ":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			go func() {
				buf := make([]byte, 2048)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(buf[:n], from)
				}
			}()
			l = pc
			return nil
		})
		t.Cleanup(func() { l.Close() })
	}
}

// refuseWait is how long a connect or an echo may take before the flow
// counts as refused (the table drops silently). Allowed flows answer
// within milliseconds even on a loaded machine; a refused flow costs
// this much.
const refuseWait = 800 * time.Millisecond

// flow tries one TCP connect plus echo, or one UDP echo, from netns to
// dst:port; nil when it got its echo back.
func flow(from ns.NetNS, network string, dst netip.Addr, port int) error {
	ctx, cancel := context.WithTimeout(context.Background(), refuseWait)
	defer cancel()
	c, err := nettest.DialIn(from)(ctx, network, netip.AddrPortFrom(dst, uint16(port)).String())
	if err != nil {
		return err
	}
	defer c.Close()
	return echo(c)
}

// echo sends a line over c and waits for it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(refuseWait))
	msg := []byte("policy\n")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != string(msg) {
		return fmt.Errorf("echo %q", buf)
	}
	return nil
}

// ping sends one ICMP echo (ICMPv6 for an IPv6 dst) from netns.
func ping(from ns.NetNS, dst netip.Addr) error {
	var out []byte
	err := from.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("ping", "-c", "1", "-W", "1", dst.String()).CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("ping %s: %w: %s", dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// check is one expected outcome.
type check struct {
	what  string
	allow bool
	try   func() error
}

// runChecks runs checks concurrently (a refused one costs refuseWait)
// and reports each one whose outcome is not the expected one.
func runChecks(t testing.TB, checks []check) {
	t.Helper()
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.try()
			// an allowed flow may lose a packet on a loaded machine: it
			// gets a few tries (a refused one is judged by its first)
			for try := 1; c.allow && errs[i] != nil && try < 4; try++ {
				errs[i] = c.try()
			}
		}()
	}
	wg.Wait()
	for i, c := range checks {
		switch {
		case c.allow && errs[i] != nil:
			t.Errorf("%s: want allowed, got %v", c.what, errs[i])
		case !c.allow && errs[i] == nil:
			t.Errorf("%s: want refused, got through", c.what)
		}
	}
}

// nftList is `nft list table inet podnet-policy` in the node.
func (e *env) nft(args ...string) string {
	e.t.Helper()
	out, err := nettest.ExecIn(context.Background(), e.node, "nft", args...)
	if err != nil {
		e.t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// one is one address as a Range.
func one(a netip.Addr) policy.Range { return policy.Range{From: a, To: a} }

// allFamily is every address of a's family.
func allFamily(v6 bool) policy.Range {
	if v6 {
		return policy.Range{From: netip.IPv6Unspecified(), To: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	}
	return policy.Range{From: netip.IPv4Unspecified(), To: netip.MustParseAddr("255.255.255.255")}
}

// port is a numbered port of proto for every address of both families.
func port(proto uint8, from, to uint16) []policy.PortRange {
	return []policy.PortRange{
		{Addrs: allFamily(false), Proto: proto, PortFrom: from, PortTo: to},
		{Addrs: allFamily(true), Proto: proto, PortFrom: from, PortTo: to},
	}
}

func join[T any](parts ...[]T) []T {
	var out []T
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
