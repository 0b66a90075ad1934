package routed

// IPv6 between nodes (issue 23): pod-to-pod over IPv6 across two nodes in
// the three ways podnet-routed carries it (VXLAN over an IPv4 underlay,
// VXLAN over an IPv6-only underlay, direct routes over a dual-stack
// underlay), IPv6 egress masqueraded for a unique local PodCIDR only, and
// the Event a Node with one PodCIDR family gets in a dual-stack cluster.
// "Pods" are addresses on the node netns' loopback inside its PodCIDRs,
// as in the other tests of this suite.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// createDualNode creates Node name with podCIDRs and InternalIPs ips (in
// that order: the first is the primary).
func (c *cluster) createDualNode(name string, podCIDRs, ips []string) {
	c.t.Helper()
	ctx := context.Background()
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if len(podCIDRs) > 0 {
		obj.Spec = corev1.NodeSpec{PodCIDR: podCIDRs[0], PodCIDRs: podCIDRs}
	}
	created, err := c.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create Node %s: %v", name, err)
	}
	for _, ip := range ips {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("Node %s status: %v", name, err)
	}
}

// ifAddr adds (or with del, deletes) addr (with its prefix length) on dev
// in netns n, without DAD.
func ifAddr(t *testing.T, n ns.NetNS, dev, addr string, del bool) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if del {
			return netlink.AddrDel(l, a)
		}
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	}); err != nil {
		t.Fatalf("address %s on %s (del %v): %v", addr, dev, del, err)
	}
}

// hostPrefix is ip/32 or ip/128.
func hostPrefix(ip string) string {
	a := netip.MustParseAddr(ip)
	return netip.PrefixFrom(a, a.BitLen()).String()
}

// sourceCounters puts, in the outside host, an nft table counting the
// ICMPv6 echo requests it receives from each of srcs, and returns a
// reader of the counts by source.
func sourceCounters(t *testing.T, out *tcluster.NetNS, srcs ...string) func() map[string]int {
	t.Helper()
	ctx := context.Background()
	script := "table ip6 seen {\n chain input {\n  type filter hook input priority 0;\n"
	for _, s := range srcs {
		script += fmt.Sprintf("  ip6 saddr %s icmpv6 type echo-request counter\n", s)
	}
	script += " }\n}\n"
	if o, err := out.Exec(ctx, "sh", "-c", "nft delete table ip6 seen 2>/dev/null; printf '%s' \""+script+"\" | nft -f -"); err != nil {
		t.Fatalf("outside nft: %v\n%s", err, o)
	}
	return func() map[string]int {
		o, err := out.Exec(ctx, "nft", "list", "table", "ip6", "seen")
		if err != nil {
			t.Fatalf("outside nft list: %v\n%s", err, o)
		}
		got := map[string]int{}
		for _, line := range strings.Split(o, "\n") {
			f := strings.Fields(line)
			if i := slices.Index(f, "packets"); i > 0 && len(f) > 2 && f[0] == "ip6" && f[1] == "saddr" {
				n, _ := strconv.Atoi(f[i+1])
				got[f[2]] += n
			}
		}
		return got
	}
}

// TestIPv6Datapath: two nodes, pod to pod over IPv6 in three set-ups that
// share one API server and one pair of machines (each subtest starts from
// clean nodes and leaves them clean: podnet-routed --cleanup):
//   - vxlan over the IPv4 underlay, dual-stack PodCIDRs from a global
//     IPv6 range: both families cross, and the pod's IPv6 egress keeps
//     its address (--masquerade-ipv6=auto, a global range);
//   - none over a dual-stack underlay, ULA PodCIDRs: the IPv6 PodCIDR is
//     routed via the peer's IPv6 InternalIP, and the pod's IPv6 egress
//     leaves with the node's address (auto, a ULA range);
//   - vxlan over an IPv6-only underlay (no IPv4 address left on the
//     nodes): the VXLAN device's local address and the FDB destination are
//     IPv6, its MTU is the underlay's minus 70, the MAC is the IPv6 hash.
func TestIPv6Datapath(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.11")
	b := c.addNode("node-b", "172.30.0.12")
	nodes := []*node{a, b}
	v6 := map[*node]string{a: "fd00:172:30::11", b: "fd00:172:30::12"}
	for _, n := range nodes {
		ifAddr(t, n.ns, uplinkName, v6[n]+"/64", false)
	}
	const outside6 = "fd00:172:30::200"
	ifAddr(t, c.c.Outside.NetNS, uplinkName, outside6+"/64", false)
	// "pod" number 5 of a PodCIDR
	pod := func(cidr string) string {
		a := netip.MustParsePrefix(cidr).Addr()
		for range 5 {
			a = a.Next()
		}
		return a.String()
	}

	type setup struct {
		name        string
		flags       []string
		podCIDRs    map[*node][]string
		ips         map[*node][]string
		routesA     []string
		egressV6    bool // the outside host routes the pod range back (global)
		masquerade6 bool // the outside host must see the node's address
		v6Only      bool
	}
	for _, s := range []setup{
		{
			name:     "vxlan, IPv4 underlay, global IPv6 pods",
			flags:    []string{"--encap=vxlan", "--cluster-cidr=10.244.0.0/16,2001:db8:244::/56"},
			podCIDRs: map[*node][]string{a: {"10.244.1.0/24", "2001:db8:244:1::/64"}, b: {"10.244.2.0/24", "2001:db8:244:2::/64"}},
			ips:      map[*node][]string{a: {a.ip, v6[a]}, b: {b.ip, v6[b]}},
			routesA: []string{"blackhole 10.244.1.0/24 proto 77", "blackhole 2001:db8:244:1::/64 dev lo proto 77",
				"10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink",
				"2001:db8:244:2::/64 via 2001:db8:244:2:: dev podnet.vxlan proto 77 onlink"},
			egressV6: true,
		},
		{
			name:     "none, dual-stack underlay, ULA pods",
			flags:    []string{"--encap=none", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"},
			podCIDRs: map[*node][]string{a: {"10.244.1.0/24", "fd00:10:244:1::/64"}, b: {"10.244.2.0/24", "fd00:10:244:2::/64"}},
			ips:      map[*node][]string{a: {a.ip, v6[a]}, b: {b.ip, v6[b]}},
			routesA: []string{"blackhole 10.244.1.0/24 proto 77", "blackhole fd00:10:244:1::/64 dev lo proto 77",
				"10.244.2.0/24 via 172.30.0.12 dev eth0 proto 77",
				"fd00:10:244:2::/64 via fd00:172:30::12 dev eth0 proto 77"},
			egressV6: true, masquerade6: true,
		},
		{
			name:     "vxlan, IPv6-only underlay",
			flags:    []string{"--encap=vxlan", "--cluster-cidr=fd00:10:244::/56"},
			podCIDRs: map[*node][]string{a: {"fd00:10:244:1::/64"}, b: {"fd00:10:244:2::/64"}},
			ips:      map[*node][]string{a: {v6[a]}, b: {v6[b]}},
			routesA: []string{"blackhole fd00:10:244:1::/64 dev lo proto 77",
				"fd00:10:244:2::/64 via fd00:10:244:2:: dev podnet.vxlan proto 77 onlink"},
			v6Only: true,
		},
	} {
		ok := t.Run(s.name, func(t *testing.T) {
			c.t = t // the harness reports to the subtest
			defer func() { c.t = t }()
			if s.v6Only {
				for _, n := range nodes {
					ifAddr(t, n.ns, uplinkName, n.ip+"/24", true)
				}
			}
			for _, n := range nodes {
				c.createDualNode(n.name, s.podCIDRs[n], s.ips[n])
				for _, p := range s.podCIDRs[n] {
					ifAddr(t, n.ns, "lo", hostPrefix(pod(p)), false)
				}
			}
			ds := map[*node]*daemon{}
			for _, n := range nodes {
				ds[n] = n.startDaemon(s.flags...)
			}
			a.expectRoutes(syncT, ds[a], s.routesA...)
			for _, n := range nodes {
				ds[n].waitReady(changeT)
				// the nodes route IPv6 for their pods
				if v := sysctl(t, n, "net/ipv6/conf/all/forwarding"); v != "1" {
					t.Errorf("%s: net.ipv6.conf.all.forwarding=%s with an IPv6 PodCIDR, want 1", n.name, v)
				}
			}
			// pod to pod, both ways, every family the Nodes have
			for i, p := range s.podCIDRs[a] {
				src, dst := pod(p), pod(s.podCIDRs[b][i])
				start := time.Now()
				nettest.Eventually(t, changeT, "ping "+src+" -> "+dst, func() error { return a.ping(src, dst) })
				t.Logf("MEASURE %s: first ping %s -> %s answered after %s", s.name, src, dst, time.Since(start).Round(time.Millisecond))
				nettest.Eventually(t, changeT, "ping "+dst+" -> "+src, func() error { return b.ping(dst, src) })
			}
			if s.v6Only {
				mtu := underlayMTU - 70
				a.expectState(changeT, nodestate.State{NodeName: a.name, PodCIDRs: s.podCIDRs[a], MTU: mtu, Encap: "vxlan"})
				if got, err := a.m.LinkMTU("podnet.vxlan"); err != nil || got != mtu {
					t.Errorf("podnet.vxlan MTU %d (%v), want %d (IPv6 underlay: 70 bytes of headers)", got, err, mtu)
				}
				var local net.IP
				c.do(a.ns, func() error {
					l, err := netlink.LinkByName("podnet.vxlan")
					if err == nil {
						local = l.(*netlink.Vxlan).SrcAddr
					}
					return err
				})
				if local.String() != v6[a] {
					t.Errorf("podnet.vxlan local address %s, want %s", local, v6[a])
				}
				macB := "0a:" // the IPv6 space
				if fdb := vxlanFDB(t, a); len(fdb) != 1 || !strings.HasPrefix(fdb[0], macB) || !strings.HasSuffix(fdb[0], " dst "+v6[b]) {
					t.Errorf("podnet.vxlan FDB of node-a %q, want one entry 0a:… dst %s", fdb, v6[b])
				}
			}
			if s.egressV6 {
				// a's IPv6 pod pings the outside host, which sees the
				// pod's own address (global) or a's (ULA, masqueraded)
				p6 := pod(s.podCIDRs[a][1])
				seen := sourceCounters(t, c.c.Outside, p6, v6[a])
				ctx := context.Background()
				if !s.masquerade6 {
					// a global range is routed to its node
					if o, err := c.c.Outside.Exec(ctx, "ip", "-6", "route", "replace", s.podCIDRs[a][1], "via", v6[a]); err != nil {
						t.Fatalf("outside route: %v\n%s", err, o)
					}
					defer c.c.Outside.Exec(ctx, "ip", "-6", "route", "del", s.podCIDRs[a][1])
				}
				nettest.Eventually(t, changeT, "ping "+p6+" -> outside "+outside6, func() error { return a.ping(p6, outside6) })
				got := seen()
				wantFrom, notFrom := p6, v6[a]
				if s.masquerade6 {
					wantFrom, notFrom = v6[a], p6
				}
				if got[wantFrom] == 0 || got[notFrom] != 0 {
					t.Errorf("the outside host saw echo requests by source %v: want them from %s only (masquerade %v)", got, wantFrom, s.masquerade6)
				} else {
					t.Logf("the outside host saw %s's IPv6 pod traffic from %s", a.name, wantFrom)
				}
			}
			// back to clean nodes for the next set-up
			for _, n := range nodes {
				ds[n].stop()
				if out, err := n.m.Cleanup(context.Background()); err != nil {
					t.Fatalf("%s --cleanup: %v\n%s", n.name, err, out)
				}
				c.deleteNode(n.name)
				for _, p := range s.podCIDRs[n] {
					ifAddr(t, n.ns, "lo", hostPrefix(pod(p)), true)
				}
			}
		})
		if !ok {
			return
		}
	}
}

// TestPodCIDRFamilyMissingEvent: in a dual-stack cluster, a Node whose
// spec.podCIDRs hold one family gets one PodCIDRFamilyMissing Warning
// Event from each podnet-routed (not again at every resync), the gauge
// podnet_nodes_podcidr_family_missing counts it, and it is not refused:
// its IPv4 PodCIDR is routed. A dual-stack Node gets no such Event.
func TestPodCIDRFamilyMissingEvent(t *testing.T) {
	c := newClusterWith(t, func(cfg *tcluster.Config) { cfg.ClusterCIDR = "10.244.0.0/16,fd00:10:244::/56" })
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.21")
	c.createDualNode("node-a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, []string{a.ip, "fd00:172:30::21"})
	c.createDualNode("node-dual", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, []string{"172.30.0.23", "fd00:172:30::23"})
	c.createDualNode("node-v4only", []string{"10.244.2.0/24"}, []string{"172.30.0.22", "fd00:172:30::22"})
	ifAddr(t, a.ns, uplinkName, "fd00:172:30::21/64", false)
	d := a.startDaemon("--encap=none")
	a.expectRoutes(syncT, d, "blackhole 10.244.1.0/24 proto 77", "blackhole fd00:10:244:1::/64 dev lo proto 77",
		"10.244.2.0/24 via 172.30.0.22 dev eth0 proto 77",
		"10.244.3.0/24 via 172.30.0.23 dev eth0 proto 77", "fd00:10:244:3::/64 via fd00:172:30::23 dev eth0 proto 77")
	want := "podnet-routed on node-a: Node node-v4only has no IPv6 PodCIDR but the cluster CIDRs are 10.244.0.0/16, fd00:10:244::/56: its pods get no IPv6 address; is kube-controller-manager running with both --cluster-cidr families?"
	check := func() []string {
		var left []string
		evs, err := c.nodeEvents("PodCIDRFamilyMissing")
		if err != nil {
			return []string{err.Error()}
		}
		if p := checkEvent(evs["node-v4only"], "node-v4only", "node-a", "PodCIDRFamilyMissing", corev1.EventTypeWarning); p != "" {
			left = append(left, p)
		} else if m := evs["node-v4only"][0].Message; m != want {
			left = append(left, fmt.Sprintf("Event message %q, want %q", m, want))
		}
		for _, other := range []string{"node-a", "node-dual"} {
			if len(evs[other]) > 0 {
				left = append(left, fmt.Sprintf("%s has both families but got %d PodCIDRFamilyMissing Events", other, len(evs[other])))
			}
		}
		m, err := d.metrics()
		if err != nil {
			return append(left, err.Error())
		}
		if v, ok := m["podnet_nodes_podcidr_family_missing"]; !ok || v != 1 {
			left = append(left, fmt.Sprintf("podnet_nodes_podcidr_family_missing %v (present %v), want 1", v, ok))
		}
		if recs := d.refusalLogs("node lacks a PodCIDR family", "node-v4only"); len(recs) != 1 {
			left = append(left, fmt.Sprintf("%d log lines for node-v4only, want 1", len(recs)))
		}
		g, err := d.refusedGauge()
		if err != nil {
			return append(left, err.Error())
		}
		for r, v := range g {
			if v != 0 {
				left = append(left, fmt.Sprintf("podnet_nodes_refused{reason=%q} %v: nobody is refused", r, v))
			}
		}
		return left
	}
	settle(t, changeT, "PodCIDRFamilyMissing for node-v4only only", check)
	// three resyncs later: still one Event, one log line
	time.Sleep(3 * resync)
	settle(t, time.Second, "no Event again at resync", check)
	// the Node goes (spec.podCIDRs cannot change once set): gauge back to 0
	c.deleteNode("node-v4only")
	a.expectRoutes(changeT, d, "blackhole 10.244.1.0/24 proto 77", "blackhole fd00:10:244:1::/64 dev lo proto 77",
		"10.244.3.0/24 via 172.30.0.23 dev eth0 proto 77", "fd00:10:244:3::/64 via fd00:172:30::23 dev eth0 proto 77")
	nettest.Eventually(t, changeT, "gauge back to 0", func() error {
		m, err := d.metrics()
		if err != nil {
			return err
		}
		if v := m["podnet_nodes_podcidr_family_missing"]; v != 0 {
			return fmt.Errorf("podnet_nodes_podcidr_family_missing %v, want 0", v)
		}
		return nil
	})
}
