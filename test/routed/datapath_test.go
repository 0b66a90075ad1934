package routed

// Datapath tests of podnet-routed: real nodes (netns) on a real underlay,
// a real kube-apiserver, a podnet-routed process per node, pods attached
// with the podnet plugin through libcni, and real traffic between them.
// The cluster harness is in datapath_cluster_test.go.

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/nettest"
)

// dpConvergeLimit bounds how long the daemons may take to program routes
// and to carry the first packet.
const dpConvergeLimit = 20 * time.Second

// dpVXLANRoute and dpDirectRoute are how Routes() prints a route to
// node m's PodCIDR.
func dpVXLANRoute(m *dpNode) string {
	return fmt.Sprintf("%s via %s dev %s onlink", m.PodCIDR, m.PodCIDR.Addr(), desired.VXLANDevice)
}

func dpDirectRoute(m *dpNode) string {
	return fmt.Sprintf("%s via %s dev %s", m.PodCIDR, m.IP, dpUnderlayDev)
}

// dpWaitPing pings dst from pod until a reply comes back (or limit) and
// returns the RTT of the answered ping.
func dpWaitPing(t *testing.T, from *dpPod, dst netip.Addr, limit time.Duration) string {
	t.Helper()
	var out string
	err := dpPoll(limit, func() error {
		var err error
		out, err = dpPing(from.NS, "-c1", "-W2", dst.String())
		return err
	})
	if err != nil {
		t.Fatalf("ping %s -> %s failed for %v: %v\n%s", from.Name, dst, limit, err, out)
	}
	return dpRTTOf(out)
}

// dpPingMatrix pings every pod from every other pod and logs the RTTs.
func dpPingMatrix(t *testing.T, pods []*dpPod) {
	t.Helper()
	var rtts []string
	for _, a := range pods {
		for _, b := range pods {
			if a == b {
				continue
			}
			rtt := dpWaitPing(t, a, b.IP, 10*time.Second)
			rtts = append(rtts, fmt.Sprintf("%s->%s %s", a.Node.Name, b.Node.Name, rtt))
		}
	}
	t.Logf("pod<->pod ping RTTs: %s", strings.Join(rtts, ", "))
}

// dpCheckPathMTU checks that a don't-fragment ping filling the pod MTU
// crosses nodes and that one byte more fails promptly (the pod's own
// interface refuses it) instead of hanging or being answered.
func dpCheckPathMTU(t *testing.T, from, to *dpPod, mtu int) {
	t.Helper()
	fits := strconv.Itoa(mtu - 28) // 20 IPv4 + 8 ICMP
	out, err := dpPing(from.NS, "-M", "do", "-c1", "-W2", "-s", fits, to.IP.String())
	if err != nil {
		t.Errorf("ping -M do -s %s %s -> %s (pod MTU %d) failed: %v\n%s", fits, from.Node.Name, to.Node.Name, mtu, err, out)
	} else {
		t.Logf("ping -M do -s %s %s -> %s: %s", fits, from.Node.Name, to.Node.Name, dpRTTOf(out))
	}
	over := strconv.Itoa(mtu - 27)
	start := time.Now()
	out, err = dpPing(from.NS, "-M", "do", "-c1", "-W2", "-s", over, to.IP.String())
	took := time.Since(start)
	switch {
	case err == nil:
		t.Errorf("ping -M do -s %s %s -> %s (one byte over pod MTU %d) was answered:\n%s", over, from.Node.Name, to.Node.Name, mtu, out)
	case strings.Contains(err.Error(), "hung") || took > 5*time.Second:
		t.Errorf("ping -M do -s %s did not fail promptly (%v): %v\n%s", over, took, err, out)
	default:
		why := err.Error()
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "error") || strings.Contains(line, "Frag") || strings.Contains(line, "received") {
				why = strings.TrimSpace(line)
				break
			}
		}
		t.Logf("ping -M do -s %s %s -> %s failed in %v as it must: %s", over, from.Node.Name, to.Node.Name, took.Round(time.Millisecond), why)
	}
}

// dpCheckEcho runs a TCP echo server in dst's pod and talks to it from src.
func dpCheckEcho(t *testing.T, src, dst *dpPod) {
	t.Helper()
	srv := dpServe(t, dst.NS, dst.IP)
	if _, err := dpEcho(src.NS, srv.Addr); err != nil {
		t.Errorf("TCP %s -> %s: %v", src.Name, dst.Name, err)
		return
	}
	select {
	case peer := <-srv.Peers:
		if peer != src.IP {
			t.Errorf("TCP %s -> %s: server saw source %s, want the pod's own %s", src.Name, dst.Name, peer, src.IP)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("TCP %s -> %s: server recorded no peer", src.Name, dst.Name)
	}
}

// TestVXLANAndNone runs three nodes on one L2 underlay with
// --encap=vxlan and --encap=none: node.json, routes, pod MTU, pod<->pod
// ping and TCP across nodes, and the path MTU at the pod MTU.
func TestVXLANAndNone(t *testing.T) {
	for _, tc := range []struct {
		encap string
		mtu   int
	}{{"vxlan", 1500 - desired.VXLANOverhead}, {"none", 1500}} {
		t.Run(tc.encap, func(t *testing.T) {
			t.Parallel()
			c := newDPCluster(t)
			c.AddBridge("br0")
			var nodes []*dpNode
			for i := 1; i <= 3; i++ {
				nodes = append(nodes, c.AddNode(fmt.Sprintf("node%d", i), "br0", fmt.Sprintf("172.31.0.%d/24", i),
					netip.Addr{}, fmt.Sprintf("10.244.%d.0/24", i)))
			}
			start := time.Now()
			c.Start(tc.encap)
			stateMTU := map[*dpNode]int{}
			for _, n := range nodes {
				st := n.WaitState(time.Second)
				stateMTU[n] = st.MTU
				if st.MTU != tc.mtu || st.Encap != tc.encap {
					t.Errorf("%s node.json: mtu %d encap %q, want %d %q", n.Name, st.MTU, st.Encap, tc.mtu, tc.encap)
				}
				want := []string{"blackhole " + n.PodCIDR.String()}
				for _, m := range nodes {
					if m == n {
						continue
					}
					if tc.encap == "vxlan" {
						want = append(want, dpVXLANRoute(m))
					} else {
						want = append(want, dpDirectRoute(m))
					}
				}
				n.WaitRoutes(want, dpConvergeLimit)
			}
			t.Logf("routes converged on all nodes %v after the daemons started", time.Since(start).Round(time.Millisecond))
			if tc.encap == "vxlan" {
				for _, n := range nodes {
					if got := n.LinkMTU(desired.VXLANDevice); got != tc.mtu {
						t.Errorf("%s: %s MTU %d, want %d", n.Name, desired.VXLANDevice, got, tc.mtu)
					}
				}
			}

			var pods []*dpPod
			for _, n := range nodes {
				p := n.AddPod()
				if p.MTU != stateMTU[n] || p.MTU != tc.mtu {
					t.Errorf("pod %s: eth0 MTU %d, want node.json's %d (expected %d)", p.Name, p.MTU, stateMTU[n], tc.mtu)
				}
				pods = append(pods, p)
			}
			dpWaitPing(t, pods[0], pods[1].IP, dpConvergeLimit)
			t.Logf("first cross-node pod ping answered %v after the daemons started", time.Since(start).Round(time.Millisecond))
			dpPingMatrix(t, pods)

			dpCheckEcho(t, pods[0], pods[2])
			dpCheckEcho(t, pods[2], pods[0])
			dpCheckEcho(t, pods[1], pods[2])

			dpCheckPathMTU(t, pods[0], pods[1], tc.mtu)
			dpCheckPathMTU(t, pods[2], pods[0], tc.mtu)
		})
	}
}

// TestCrossSubnet runs four nodes, two on each of two underlay subnets
// joined by a router, with --encap=vxlan --cross-subnet: routes to the
// node on the same subnet are direct, to the others over podnet.vxlan,
// and every pod reaches every other one (only encapsulated traffic can
// cross the router: it has no route to the pods).
func TestCrossSubnet(t *testing.T) {
	t.Parallel()
	c := newDPCluster(t)
	c.AddBridge("br1")
	c.AddBridge("br2")
	router := nettest.NewNetNS(t)
	gw1, gw2 := netip.MustParseAddr("172.31.1.254"), netip.MustParseAddr("172.31.2.254")
	c.Plug(router, "br1", "eth1", gw1.String()+"/24", netip.Addr{})
	c.Plug(router, "br2", "eth2", gw2.String()+"/24", netip.Addr{})
	dpSysctl(t, router, "net/ipv4/ip_forward", "1")

	nodes := []*dpNode{
		c.AddNode("node1", "br1", "172.31.1.1/24", gw1, "10.244.1.0/24"),
		c.AddNode("node2", "br1", "172.31.1.2/24", gw1, "10.244.2.0/24"),
		c.AddNode("node3", "br2", "172.31.2.3/24", gw2, "10.244.3.0/24"),
		c.AddNode("node4", "br2", "172.31.2.4/24", gw2, "10.244.4.0/24"),
	}
	subnet := func(n *dpNode) netip.Prefix { p, _ := n.IP.Prefix(24); return p }
	start := time.Now()
	c.Start("vxlan", "--cross-subnet")
	for _, n := range nodes {
		if st := n.WaitState(time.Second); st.MTU != 1500-desired.VXLANOverhead {
			t.Errorf("%s node.json mtu %d, want %d", n.Name, st.MTU, 1500-desired.VXLANOverhead)
		}
		want := []string{"blackhole " + n.PodCIDR.String()}
		for _, m := range nodes {
			switch {
			case m == n:
			case subnet(m) == subnet(n):
				want = append(want, dpDirectRoute(m))
			default:
				want = append(want, dpVXLANRoute(m))
			}
		}
		n.WaitRoutes(want, dpConvergeLimit)
	}
	t.Logf("routes converged on all nodes %v after the daemons started", time.Since(start).Round(time.Millisecond))

	var pods []*dpPod
	for _, n := range nodes {
		p := n.AddPod()
		if p.MTU != 1500-desired.VXLANOverhead {
			t.Errorf("pod %s: eth0 MTU %d, want %d", p.Name, p.MTU, 1500-desired.VXLANOverhead)
		}
		pods = append(pods, p)
	}
	dpWaitPing(t, pods[0], pods[2].IP, dpConvergeLimit)
	t.Logf("first cross-subnet pod ping answered %v after the daemons started", time.Since(start).Round(time.Millisecond))
	dpPingMatrix(t, pods)

	// Same-subnet traffic must not use the tunnel, cross-subnet traffic must.
	vxlanTx := func() uint64 {
		var tx uint64
		dpDo(t, nodes[0].Node.NS, func() error {
			l, err := netlink.LinkByName(desired.VXLANDevice)
			if err != nil {
				return err
			}
			tx = l.Attrs().Statistics.TxPackets
			return nil
		})
		return tx
	}
	before := vxlanTx()
	for i := 0; i < 3; i++ {
		dpWaitPing(t, pods[0], pods[1].IP, 5*time.Second)
	}
	if d := vxlanTx() - before; d != 0 {
		t.Errorf("node1 -> node2 (same subnet) sent %d packets over %s, want 0 (direct)", d, desired.VXLANDevice)
	}
	before = vxlanTx()
	for i := 0; i < 3; i++ {
		dpWaitPing(t, pods[0], pods[3].IP, 5*time.Second)
	}
	if d := vxlanTx() - before; d < 3 {
		t.Errorf("node1 -> node4 (other subnet) sent %d packets over %s, want >= 3", d, desired.VXLANDevice)
	}

	dpCheckEcho(t, pods[0], pods[1]) // same subnet
	dpCheckEcho(t, pods[0], pods[3]) // across the router
	dpCheckEcho(t, pods[2], pods[1])
	dpCheckPathMTU(t, pods[1], pods[2], 1500-desired.VXLANOverhead)
}

// TestMasquerade checks the nft masquerade of podnet-routed with real TCP:
// a host outside the cluster (on the underlay, with no route to the pod
// CIDRs) sees pod connections coming from the pod's node address, while a
// pod on another node sees the client pod's own address.
func TestMasquerade(t *testing.T) {
	t.Parallel()
	c := newDPCluster(t)
	c.AddBridge("br0")
	nodes := []*dpNode{
		c.AddNode("node1", "br0", "172.31.0.1/24", netip.Addr{}, "10.244.1.0/24"),
		c.AddNode("node2", "br0", "172.31.0.2/24", netip.Addr{}, "10.244.2.0/24"),
	}
	outsideIP := netip.MustParseAddr("172.31.0.200")
	// Only the connected 172.31.0.0/24: the node addresses, not the pods.
	outside := c.AddHost("br0", outsideIP.String()+"/24", netip.Addr{})
	start := time.Now()
	c.Start("vxlan")
	for i, n := range nodes {
		n.WaitRoutes([]string{"blackhole " + n.PodCIDR.String(), dpVXLANRoute(nodes[1-i])}, dpConvergeLimit)
	}
	t.Logf("routes converged %v after the daemons started", time.Since(start).Round(time.Millisecond))
	pods := []*dpPod{nodes[0].AddPod(), nodes[1].AddPod()}
	dpWaitPing(t, pods[0], pods[1].IP, dpConvergeLimit)

	if out, err := dpPing(outside, "-c1", "-W1", pods[0].IP.String()); err == nil {
		t.Fatalf("the outside host reaches pod %s directly: the test setup is wrong\n%s", pods[0].IP, out)
	}

	srv := dpServe(t, outside, outsideIP)
	for _, p := range pods {
		for len(srv.Peers) > 0 {
			<-srv.Peers
		}
		err := dpPoll(10*time.Second, func() error { _, err := dpEcho(p.NS, srv.Addr); return err })
		if err != nil {
			t.Errorf("pod %s (%s) -> outside %s: %v (not masqueraded? the outside host has no route back to %s)", p.Name, p.IP, srv.Addr, err, dpClusterCIDR)
			continue
		}
		select {
		case peer := <-srv.Peers:
			if peer != p.Node.IP {
				t.Errorf("pod %s -> outside: source %s, want node %s's underlay address %s", p.Name, peer, p.Node.Name, p.Node.IP)
			} else {
				t.Logf("pod %s (%s) -> outside: source %s (masqueraded to %s)", p.Name, p.IP, peer, p.Node.Name)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("pod %s -> outside: server recorded no peer", p.Name)
		}
	}

	// Pod to pod across nodes keeps the pod address, both ways.
	dpCheckEcho(t, pods[0], pods[1])
	dpCheckEcho(t, pods[1], pods[0])
	if !t.Failed() {
		t.Logf("pod -> pod across nodes: sources %s and %s kept", pods[0].IP, pods[1].IP)
	}

	// Someone deletes podnet's nft table on node1: the periodic resync
	// (2 s here) writes it again and pods are masqueraded again.
	nft, err := nftables.New(nftables.WithNetNSFd(int(nodes[0].Node.NS.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer nft.CloseLasting()
	nft.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable})
	if err := nft.Flush(); err != nil {
		t.Fatalf("delete the nft table: %v", err)
	}
	back := time.Now()
	if err := dpPoll(10*time.Second, func() error {
		tables, err := nft.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			return err
		}
		for _, tb := range tables {
			if tb.Name == contract.NFTable {
				return nil
			}
		}
		return fmt.Errorf("no table inet %s", contract.NFTable)
	}); err != nil {
		t.Fatalf("the deleted nft table was not written again: %v", err)
	}
	t.Logf("deleted nft table back after %v", time.Since(back).Round(time.Millisecond))
	for len(srv.Peers) > 0 {
		<-srv.Peers
	}
	if err := dpPoll(10*time.Second, func() error { _, err := dpEcho(pods[0].NS, srv.Addr); return err }); err != nil {
		t.Fatalf("pod %s -> outside after the table came back: %v", pods[0].Name, err)
	}
	select {
	case peer := <-srv.Peers:
		if peer != nodes[0].IP {
			t.Errorf("after the table came back: source %s, want %s", peer, nodes[0].IP)
		}
	case <-time.After(2 * time.Second):
		t.Error("after the table came back: server recorded no peer")
	}
}
