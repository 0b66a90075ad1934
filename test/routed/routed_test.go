// Package routed runs the built bin/podnet-routed against a real
// kube-apiserver, inside throwaway node network namespaces, and checks the
// kernel state it leaves there with netlink and nftables.
//
// Every test needs root, `make` (bin/podnet-routed) and PODNET_KAPI_DIR
// (scripts/ensure-kapi.sh); without them the tests fail, they never skip.
package routed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// Route lines as fmtRoute renders them (proto 77 is podnet's).
const (
	bhA   = "blackhole 10.244.1.0/24 proto 77"
	viaB  = "10.244.2.0/24 via 172.30.0.2 dev eth0 proto 77"
	viaC  = "10.244.3.0/24 via 172.30.0.3 dev eth0 proto 77"
	syncT = 30 * time.Second // first sync after start (includes API connection)
	// A change seen by the informer should reach the kernel quickly; allow
	// for a loaded machine.
	changeT = 10 * time.Second
)

// threeNodes makes node-a (172.30.0.1, 10.244.1.0/24), node-b and node-c
// (10.244.2.0/24, 10.244.3.0/24), netns and Node objects, with RBAC
// granted to the podnet-routed user.
func threeNodes(t *testing.T) (*cluster, *node, *node, *node) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	b := c.addNode("node-b", "172.30.0.2")
	cc := c.addNode("node-c", "172.30.0.3")
	c.createNode("node-a", a.ip, "10.244.1.0/24")
	c.createNode("node-b", b.ip, "10.244.2.0/24")
	c.createNode("node-c", cc.ip, "10.244.3.0/24")
	return c, a, b, cc
}

// TestNodeLifecycleRoutes: routes follow the Node objects.
func TestNodeLifecycleRoutes(t *testing.T) {
	c, a, b, _ := threeNodes(t)
	c.addNode("node-d", "172.30.0.4")
	c.addNode("node-e", "172.30.0.5")
	c.createNode("node-d", "172.30.0.4", "") // no PodCIDR yet
	c.createNode("node-e", "172.30.0.5", "") // no PodCIDR yet

	start := time.Now()
	d := a.startDaemon()
	a.expectRoutes(syncT, d, bhA, viaB, viaC)
	t.Logf("MEASURE initial sync (process start to 3 routes in the kernel): %s", time.Since(start).Round(time.Millisecond))
	d.waitReady(changeT)
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU, Encap: "none"})

	// node-d: created without a PodCIDR; re-registered with one.
	c.deleteNode("node-d")
	start = time.Now()
	c.createNode("node-d", "172.30.0.4", "10.244.4.0/24")
	viaD := "10.244.4.0/24 via 172.30.0.4 dev eth0 proto 77"
	a.expectRoutes(changeT, d, bhA, viaB, viaC, viaD)
	t.Logf("MEASURE node re-created with a PodCIDR -> route: %s", time.Since(start).Round(time.Millisecond))

	// node-e: PodCIDR assigned later on the existing object (as the node
	// IPAM controller does: "" -> CIDR is the one change the API allows).
	start = time.Now()
	c.assignPodCIDR("node-e", "10.244.5.0/24")
	viaE := "10.244.5.0/24 via 172.30.0.5 dev eth0 proto 77"
	a.expectRoutes(changeT, d, bhA, viaB, viaC, viaD, viaE)
	t.Logf("MEASURE PodCIDR assigned -> route: %s", time.Since(start).Round(time.Millisecond))

	// node-b's InternalIP changes: the route's gateway follows.
	b.addIP("172.30.0.12")
	start = time.Now()
	c.setNodeIP("node-b", "172.30.0.12")
	viaB2 := "10.244.2.0/24 via 172.30.0.12 dev eth0 proto 77"
	a.expectRoutes(changeT, d, bhA, viaB2, viaC, viaD, viaE)
	t.Logf("MEASURE InternalIP change -> gateway replaced: %s", time.Since(start).Round(time.Millisecond))

	// node-c deleted: its route goes.
	start = time.Now()
	c.deleteNode("node-c")
	a.expectRoutes(changeT, d, bhA, viaB2, viaD, viaE)
	t.Logf("MEASURE node deleted -> route removed: %s", time.Since(start).Round(time.Millisecond))

	// Steady state: periodic resyncs change nothing (no churn) and the
	// state file stays as it was.
	noChurn(t, resync+resync/2, d)
	a.expectRoutes(0, d, bhA, viaB2, viaD, viaE)
	a.expectState(0, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU, Encap: "none"})
}

// TestRouteRepair: a podnet route deleted by hand comes back within 1 s
// and counts one route repair; a link flap that flushes routes silently
// is repaired by the resync, and counts none.
func TestRouteRepair(t *testing.T) {
	_, a, _, _ := threeNodes(t)
	d := a.startDaemon()
	a.expectRoutes(syncT, d, bhA, viaB, viaC)
	d.waitReady(changeT)

	var lat []time.Duration
	for i, dst := range []string{"10.244.2.0/24", "10.244.1.0/24", "10.244.3.0/24", "10.244.2.0/24", "10.244.1.0/24"} {
		want, _ := a.podnetRoutes()
		a.delRoutes(dst)
		got := pollFast(t, 3*time.Second, func() bool {
			r, err := a.podnetRoutes()
			return err == nil && slices.Equal(r, want)
		})
		if got < 0 {
			t.Fatalf("repair %d: route to %s not back after 3 s", i, dst)
		}
		t.Logf("MEASURE repair of %s: %s", dst, got.Round(100*time.Microsecond))
		if got > time.Second {
			t.Errorf("repair of %s took %s, want < 1 s", dst, got)
		}
		lat = append(lat, got)
	}
	t.Logf("MEASURE repair latency max %s over %d deletions", slices.Max(lat).Round(100*time.Microsecond), len(lat))

	// All three at once.
	for _, dst := range []string{"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"} {
		a.delRoutes(dst)
	}
	all := pollFast(t, 3*time.Second, func() bool {
		r, err := a.podnetRoutes()
		return err == nil && len(r) == 3
	})
	if all < 0 || all > time.Second {
		t.Fatalf("all podnet routes deleted: back after %s, want < 1 s", all)
	}
	a.expectRoutes(0, d, bhA, viaB, viaC)
	t.Logf("MEASURE repair of all 3 routes deleted at once: %s", all.Round(100*time.Microsecond))

	m, err := d.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m["podnet_route_repairs_total"] < 1 {
		t.Errorf("podnet_route_repairs_total = %v after repairs", m["podnet_route_repairs_total"])
	}
	t.Logf("podnet_route_repairs_total = %v", m["podnet_route_repairs_total"])
	// one repair per route deleted: 5 one by one, 3 at once
	if got := d.repairs(t, "route"); got != 8 {
		t.Errorf("podnet_repairs_total{object=\"route\"} = %v after 8 routes deleted, want 8", got)
	}

	// Link flap: the kernel flushes the routes via eth0 without a
	// RTM_DELROUTE; the periodic resync puts them back once eth0 is up.
	// Routes that went with their link are no repair.
	setLink(t, a, uplinkName, false)
	a.expectRoutes(changeT, d, bhA)
	setLink(t, a, uplinkName, true)
	start := time.Now()
	a.expectRoutes(resync+3*time.Second, d, bhA, viaB, viaC)
	t.Logf("MEASURE eth0 down/up: routes back %s after link up (resync interval %s)", time.Since(start).Round(time.Millisecond), resync)
	d.waitReady(resync + 3*time.Second)
	time.Sleep(resync + resync/2)
	if got := d.repairs(t, "route"); got != 8 {
		t.Errorf("podnet_repairs_total{object=\"route\"} = %v after a link flap, want 8 still: the routes went with the link", got)
	}
}

// pollFast polls cond every 1 ms and returns the time until it held, or
// -1 after timeout.
func pollFast(t *testing.T, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(time.Millisecond)
	}
	return -1
}

// TestLinkChanges: the underlay, which carries podnet's routes in `none`
// mode, going down and up again has them back at once, not at the next
// resync; links that carry none (another runtime's veths, a bridge) coming and going make no full apply (each is a route dump and a
// recompute of every Node).
func TestLinkChanges(t *testing.T) {
	_, a, _, _ := threeNodes(t)
	d := a.startDaemon("--resync-interval=10m")
	a.expectRoutes(syncT, d, bhA, viaB, viaC)
	d.waitReady(changeT)
	applies := func() float64 {
		t.Helper()
		m, err := d.metrics()
		if err != nil {
			t.Fatal(err)
		}
		return m["podnet_apply_duration_seconds_count"]
	}
	time.Sleep(time.Second) // whatever the initial sync kicked
	before := applies()
	for i := range 5 {
		a.c.do(a.ns, func() error {
			links := []netlink.Link{
				&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("cni-%d", i)}, PeerName: fmt.Sprintf("cni-%dp", i)},
				&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("br-%d", i)}},
			}
			for _, l := range links {
				if err := netlink.LinkAdd(l); err != nil {
					return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("cni-%dp", i)}}); err != nil {
				return err
			}
			for _, l := range links {
				if err := netlink.LinkSetDown(l); err != nil {
					return err
				}
				if err := netlink.LinkDel(l); err != nil {
					return err
				}
			}
			return nil
		})
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if got := applies() - before; got != 0 {
		t.Errorf("%v full applies after 5 rounds of other links created, up, down and deleted; want 0", got)
	}
	a.expectRoutes(0, d, bhA, viaB, viaC)

	// the underlay flaps: its routes go with it and come back with it,
	// long before the resync (10 minutes); no route repair counted
	for round := range 2 {
		setLink(t, a, uplinkName, false)
		a.expectRoutes(changeT, d, bhA)
		setLink(t, a, uplinkName, true)
		start := time.Now()
		a.expectRoutes(changeT, d, bhA, viaB, viaC)
		t.Logf("MEASURE round %d: eth0 down/up: routes back %s after link up", round, time.Since(start).Round(time.Millisecond))
	}
	if got := d.repairs(t, "route"); got != 0 {
		t.Errorf("podnet_repairs_total{object=\"route\"} = %v after underlay flaps, want 0: the routes went with the link", got)
	}
}

func setLink(t *testing.T, n *node, name string, up bool) {
	t.Helper()
	n.c.do(n.ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if up {
			return netlink.LinkSetUp(l)
		}
		return netlink.LinkSetDown(l)
	})
}

// TestStaleAndForeignRoutes: podnet prunes its own leftovers and never
// touches routes of another protocol.
func TestStaleAndForeignRoutes(t *testing.T) {
	c, a, _, _ := threeNodes(t)
	// Left by a "previous run": podnet routes for nodes that are gone.
	a.addRoute("10.244.99.0/24", "172.30.0.99", uplinkName, contract.RouteProtocol)
	a.addRoute("10.244.100.0/24", "", "", contract.RouteProtocol)
	// An older podnet-routed's blackhole of node-a's own PodCIDR (metric
	// 0, which shadowed podnet0's connected route in bridge mode).
	a.addRoute("10.244.1.0/24", "", "", contract.RouteProtocol)
	// Someone else's: a static route inside the cluster CIDR for no node,
	// and a boot route holding node-c's PodCIDR.
	a.addRoute("10.244.98.0/24", "172.30.0.98", uplinkName, unix.RTPROT_STATIC)
	a.addRoute("10.244.3.0/24", "172.30.0.50", uplinkName, unix.RTPROT_BOOT)
	foreign98 := []string{"10.244.98.0/24 via 172.30.0.98 dev eth0 proto 4"}
	foreignC := []string{"10.244.3.0/24 via 172.30.0.50 dev eth0 proto 3"}

	d := a.startDaemon()
	a.expectRoutes(syncT, d, bhA, viaB) // stale ones pruned, none for node-c
	// the own blackhole is one, at the highest metric
	a.c.do(a.ns, func() error {
		_, own, _ := net.ParseCIDR("10.244.1.0/24")
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: own, Table: mainTable}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Type != unix.RTN_BLACKHOLE || rs[0].Priority != contract.BlackholeMetric {
			return fmt.Errorf("routes to node-a's own PodCIDR: %+v, want one blackhole with metric %d", rs, contract.BlackholeMetric)
		}
		return nil
	})
	// The rest of the node's setup does not depend on node-c's route.
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU, Encap: "none"})

	foreignIntact := func() error {
		if err := d.alive(); err != nil {
			return err
		}
		for dst, want := range map[string][]string{"10.244.98.0/24": foreign98, "10.244.3.0/24": foreignC} {
			got, err := a.routesTo(dst)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("routes to %s: got %q, want %q", dst, got, want)
			}
		}
		return nil
	}
	nettest.Consistently(t, 2*resync+resync/2, "foreign routes survive resyncs", foreignIntact)
	a.expectRoutes(0, d, bhA, viaB)
	// the conflict is node-c's alone: it is refused (and said why), the
	// node stays ready
	if refused := d.logLines("node refused"); !slices.ContainsFunc(refused, func(l map[string]any) bool {
		return l["node"] == "node-c" && l["reason"] == "overlaps-node-network"
	}) {
		t.Errorf("the conflict with the foreign route to node-c's PodCIDR is not reported in the log: %q", refused)
	}
	code, body := d.status("/readyz")
	m, _ := d.metrics()
	if code != 200 || m[`podnet_nodes_refused{reason="overlaps-node-network"}`] != 1 {
		t.Errorf("with a foreign route on node-c's PodCIDR: /readyz %d %q, podnet_nodes_refused %v", code, body, m[`podnet_nodes_refused{reason="overlaps-node-network"}`])
	}

	// A stale podnet route appearing while running (no netlink event
	// triggers an apply) is pruned by the periodic resync.
	start := time.Now()
	a.addRoute("10.244.97.0/24", "172.30.0.97", uplinkName, contract.RouteProtocol)
	a.expectRoutes(resync+3*time.Second, d, bhA, viaB)
	t.Logf("MEASURE stale podnet route added at run time pruned after %s (resync %s)", time.Since(start).Round(time.Millisecond), resync)

	// Once the owner removes its route, podnet routes node-c.
	a.delRoutes("10.244.3.0/24")
	start = time.Now()
	a.expectRoutes(resync+3*time.Second, d, bhA, viaB, viaC)
	t.Logf("MEASURE foreign route removed -> podnet route to node-c after %s", time.Since(start).Round(time.Millisecond))
	d.waitReady(resync + 3*time.Second)
	if err := foreignIntactOnly(a, "10.244.98.0/24", foreign98); err != nil {
		t.Fatal(err)
	}

	// A real previous run: stop the daemon (its routes stay), delete
	// node-b meanwhile, start again: node-b's route is pruned at once.
	d.stop()
	a.expectRoutes(0, nil, bhA, viaB, viaC)
	c.deleteNode("node-b")
	start = time.Now()
	d2 := a.startDaemon()
	a.expectRoutes(syncT, d2, bhA, viaC)
	t.Logf("MEASURE restart after node-b was deleted: its route pruned %s after start", time.Since(start).Round(time.Millisecond))
	d2.waitReady(changeT)
	if err := foreignIntactOnly(a, "10.244.98.0/24", foreign98); err != nil {
		t.Fatal(err)
	}
}

func foreignIntactOnly(n *node, dst string, want []string) error {
	got, err := n.routesTo(dst)
	if err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("routes to %s: got %q, want %q", dst, got, want)
	}
	return nil
}

// TestAPIServerOutage: routes stay while the API server is down; changes
// made after it is back (and changes missed while the node was cut off)
// are applied.
//
// The outage is visible: past --apiserver-timeout /readyz says the API
// server is unreachable, and the metrics tell how long.
func TestAPIServerOutage(t *testing.T) {
	c, a, _, _ := threeNodes(t)
	d := a.startDaemon("--apiserver-timeout=3s")
	a.expectRoutes(syncT, d, bhA, viaB, viaC)
	d.waitReady(changeT)
	before, _ := a.podnetRoutes()
	stateBefore, err := a.state()
	if err != nil {
		t.Fatal(err)
	}

	c.api.StopAPIServer()
	downStart := time.Now()
	nettest.Consistently(t, 2*resync+resync/2, "routes while the API server is down", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		got, err := a.podnetRoutes()
		if err != nil {
			return err
		}
		if !slices.Equal(got, before) {
			return fmt.Errorf("routes changed: %q -> %q", before, got)
		}
		if st, err := a.state(); err != nil || st.MTU != stateBefore.MTU || !slices.Equal(st.PodCIDRs, stateBefore.PodCIDRs) {
			return fmt.Errorf("node.json changed: %+v, %v", st, err)
		}
		if code, body := d.status("/healthz"); code != http.StatusOK {
			return fmt.Errorf("/healthz %d %q", code, body)
		}
		return nil
	})
	code, body := d.status("/readyz")
	t.Logf("API server down for %s: routes unchanged; /readyz %d %q", time.Since(downStart).Round(time.Millisecond), code, body)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "API server unreachable") {
		t.Errorf("API server down for %s (--apiserver-timeout 3s): /readyz %d %q", time.Since(downStart).Round(time.Millisecond), code, body)
	}
	if m, err := d.metrics(); err != nil || m["podnet_apiserver_unreachable_seconds"] < 3 || m["podnet_last_watch_event_age_seconds"] < 3 {
		t.Errorf("API server down: podnet_apiserver_unreachable_seconds %v, podnet_last_watch_event_age_seconds %v (%v)",
			m["podnet_apiserver_unreachable_seconds"], m["podnet_last_watch_event_age_seconds"], err)
	}

	if err := c.api.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server back after %s down", time.Since(downStart).Round(time.Millisecond))
	// The cluster changes as soon as it is back: node-b goes, node-d
	// comes, node-c moves.
	start := time.Now()
	c.addNode("node-d", "172.30.0.4")
	c.deleteNode("node-b")
	c.createNode("node-d", "172.30.0.4", "10.244.4.0/24")
	c.setNodeIP("node-c", "172.30.0.13")
	viaC2 := "10.244.3.0/24 via 172.30.0.13 dev eth0 proto 77"
	viaD := "10.244.4.0/24 via 172.30.0.4 dev eth0 proto 77"
	a.expectRoutes(45*time.Second, d, bhA, viaC2, viaD)
	t.Logf("MEASURE after API server restart: converged %s after the changes", time.Since(start).Round(time.Millisecond))
	d.waitReady(changeT)
	if m, err := d.metrics(); err != nil || m["podnet_apiserver_unreachable_seconds"] != 0 {
		t.Errorf("API server back: podnet_apiserver_unreachable_seconds %v (%v)", m["podnet_apiserver_unreachable_seconds"], err)
	}

	// Cut node-a off the API server (its watch breaks); change the cluster
	// meanwhile; reconnect: the missed events are applied.
	a.cutAPI()
	c.deleteNode("node-c")
	c.addNode("node-e", "172.30.0.5")
	c.createNode("node-e", "172.30.0.5", "10.244.5.0/24")
	nettest.Consistently(t, resync+resync/2, "routes while node-a is cut off", func() error {
		got, err := a.podnetRoutes()
		if err != nil {
			return err
		}
		if want := sorted(bhA, viaC2, viaD); !slices.Equal(got, want) {
			return fmt.Errorf("routes changed while cut off: %q", got)
		}
		return nil
	})
	a.restoreAPI()
	start = time.Now()
	viaE := "10.244.5.0/24 via 172.30.0.5 dev eth0 proto 77"
	a.expectRoutes(45*time.Second, d, bhA, viaD, viaE)
	t.Logf("MEASURE node reconnected after missing events: converged in %s", time.Since(start).Round(time.Millisecond))
	d.waitReady(changeT)
}

func sorted(s ...string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRBAC: with no binding the routed user cannot list Nodes and the
// daemon stays unready; the ClusterRole of conf/podnet-routed-rbac.yaml is
// enough to sync.
func TestRBAC(t *testing.T) {
	c := newCluster(t) // no grantRBAC
	a := c.addNode("node-a", "172.30.0.1")
	c.addNode("node-b", "172.30.0.2")
	c.createNode("node-a", "172.30.0.1", "10.244.1.0/24")
	c.createNode("node-b", "172.30.0.2", "10.244.2.0/24")
	d := a.startDaemon()

	nettest.Eventually(t, changeT, "/healthz up", func() error {
		if code, body := d.status("/healthz"); code != http.StatusOK {
			return fmt.Errorf("/healthz %d %q", code, body)
		}
		return nil
	})
	nettest.Consistently(t, 3*time.Second, "no RBAC: not ready, nothing programmed", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		if code, body := d.status("/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz %d %q, want 503", code, body)
		}
		if r, err := a.podnetRoutes(); err != nil || len(r) != 0 {
			return fmt.Errorf("podnet routes without RBAC: %q %v", r, err)
		}
		if _, err := a.state(); !errors.Is(err, nodestate.ErrNotReady) {
			return fmt.Errorf("node.json without RBAC: %v", err)
		}
		return nil
	})
	_, body := d.status("/readyz")
	t.Logf("no binding: /readyz 503 %q", body)
	if logText, _ := os.ReadFile(d.p.Log); !strings.Contains(string(logText), "forbidden") {
		t.Errorf("the daemon's log does not mention the authorization failure:\n%s", nettest.Tail(d.p.Log, 20))
	}

	start := time.Now()
	c.grantRBAC()
	a.expectRoutes(45*time.Second, d, bhA, "10.244.2.0/24 via 172.30.0.2 dev eth0 proto 77")
	d.waitReady(changeT)
	t.Logf("MEASURE RBAC granted -> synced and routes programmed in %s (informer list retry backoff)", time.Since(start).Round(time.Millisecond))
}

// TestHealthAndMetrics: /healthz, /readyz and /metrics.
func TestHealthAndMetrics(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	c.addNode("node-b", "172.30.0.2")
	c.addNode("node-c", "172.30.0.3")
	c.addNode("node-d", "172.30.0.4")
	c.createNode("node-b", "172.30.0.2", "10.244.2.0/24")
	c.createNode("node-c", "172.30.0.3", "10.244.3.0/24")
	c.createNode("node-d", "172.30.0.4", "") // skipped: no PodCIDR

	// node-a's own Node does not exist yet: alive, synced, not ready
	// and saying why; the other Nodes are routed all the same (no
	// blackhole: there is no PodCIDR of its own yet).
	d := a.startDaemon()
	nettest.Eventually(t, syncT, "/healthz 200 and /readyz 503 before the node exists", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		if code, body := d.status("/healthz"); code != http.StatusOK || body != "ok" {
			return fmt.Errorf("/healthz %d %q", code, body)
		}
		if code, body := d.status("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "does not exist") {
			return fmt.Errorf("/readyz %d %q, want 503 saying the node has no Node object", code, body)
		}
		return nil
	})
	a.expectRoutes(changeT, d, viaB, viaC)

	start := time.Now()
	c.createNode("node-a", "172.30.0.1", "10.244.1.0/24")
	d.waitReady(changeT)
	t.Logf("MEASURE own Node created -> /readyz 200 in %s", time.Since(start).Round(time.Millisecond))
	a.expectRoutes(changeT, d, bhA, viaB, viaC)

	expectMetrics := func(want map[string]float64) {
		t.Helper()
		nettest.Eventually(t, changeT, "metrics", func() error {
			m, err := d.metrics()
			if err != nil {
				return err
			}
			for k, v := range want {
				if m[k] != v {
					return fmt.Errorf("%s = %v, want %v", k, m[k], v)
				}
			}
			if m["podnet_apply_duration_seconds_count"] < 1 {
				return fmt.Errorf("podnet_apply_duration_seconds_count = %v", m["podnet_apply_duration_seconds_count"])
			}
			return nil
		})
	}
	// 2 remote routes + the local blackhole; node-d skipped.
	expectMetrics(map[string]float64{"podnet_routes_desired": 3, "podnet_routes_programmed": 3, "podnet_nodes_skipped": 1})

	c.deleteNode("node-c")
	a.expectRoutes(changeT, d, bhA, viaB)
	expectMetrics(map[string]float64{"podnet_routes_desired": 2, "podnet_routes_programmed": 2, "podnet_nodes_skipped": 1})
	c.assignPodCIDR("node-d", "10.244.4.0/24")
	a.expectRoutes(changeT, d, bhA, viaB, "10.244.4.0/24 via 172.30.0.4 dev eth0 proto 77")
	expectMetrics(map[string]float64{"podnet_routes_desired": 3, "podnet_routes_programmed": 3, "podnet_nodes_skipped": 0})

	// Both listeners serve the handler; unknown paths are 404.
	for _, addr := range []string{d.healthAddr, d.metricsAddr} {
		for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/nope": 404} {
			code, _, err := a.get(addr, path)
			if err != nil || code != want {
				t.Errorf("GET %s%s: %d %v, want %d", addr, path, code, err, want)
			}
		}
	}
	_, text, _ := a.get(d.metricsAddr, "/metrics")
	for _, name := range []string{"podnet_routes_desired", "podnet_routes_programmed"} {
		if !strings.Contains(text, "# TYPE "+name+" gauge") {
			t.Errorf("/metrics has no gauge %s", name)
		}
	}
}

// TestVXLANAndCleanup: two nodes in VXLAN mode route pod traffic to each
// other; SIGTERM leaves the dataplane in place; --cleanup restores each
// node netns to its state before podnet-routed ran.
func TestVXLANAndCleanup(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	b := c.addNode("node-b", "172.30.0.2")
	c.createNode("node-a", a.ip, "10.244.1.0/24")
	c.createNode("node-b", b.ip, "10.244.2.0/24")
	// A "pod" address on each node, inside its PodCIDR.
	a.addPodAddr("10.244.1.5")
	b.addPodAddr("10.244.2.5")
	nodes := []*node{a, b}
	before := map[*node]tcluster.Snapshot{}
	fwdBefore := map[*node]string{}
	for _, n := range nodes {
		before[n] = n.stableSnapshot()
		fwdBefore[n] = sysctl(t, n, "net/ipv4/ip_forward")
	}

	daemons := map[*node]*daemon{}
	for _, n := range nodes {
		daemons[n] = n.startDaemon("--encap=vxlan")
	}
	a.expectRoutes(syncT, daemons[a], bhA, "10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink")
	b.expectRoutes(syncT, daemons[b], "blackhole 10.244.2.0/24 proto 77", "10.244.1.0/24 via 10.244.1.0 dev podnet.vxlan proto 77 onlink")
	for _, n := range nodes {
		daemons[n].waitReady(changeT)
	}
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU - 50, Encap: "vxlan"})

	// The VXLAN device, its VTEP address, neighbor and FDB entry, and the
	// masquerade table.
	s := a.snapshot()
	for _, want := range []struct {
		what string
		got  []string
		line string
	}{
		{"link", s.Links, "podnet.vxlan type vxlan mtu 1350 up mac 0e:70:ac:1e:00:01 vni 4096 port 4789"},
		{"addr", s.Addrs, "podnet.vxlan 10.244.1.0/32 scope 0"},
		{"neigh", s.Neighs, "10.244.2.0 dev podnet.vxlan lladdr 0e:70:ac:1e:00:02 permanent"},
		{"nft", s.NFT, "table inet podnet"},
		{"nft", s.NFT, "  chain postrouting hook 4 priority 100"},
	} {
		if !slices.Contains(want.got, want.line) {
			t.Errorf("%s %q missing in node-a:\n\t%s", want.what, want.line, strings.Join(want.got, "\n\t"))
		}
	}
	if fdb := vxlanFDB(t, a); !slices.Equal(fdb, []string{"0e:70:ac:1e:00:02 dst 172.30.0.2"}) {
		t.Errorf("podnet.vxlan FDB of node-a: %q", fdb)
	}

	// Pod to pod across the overlay.
	start := time.Now()
	nettest.Eventually(t, changeT, "ping 10.244.1.5 -> 10.244.2.5 over VXLAN", func() error { return a.ping("10.244.1.5", "10.244.2.5") })
	t.Logf("MEASURE first pod-to-pod ping over VXLAN answered after %s", time.Since(start).Round(time.Millisecond))

	// podnet.vxlan deleted by hand (its routes go with it, without a
	// RTM_DELROUTE for each): the resync re-creates device, routes and
	// peers.
	a.c.do(a.ns, func() error {
		l, err := netlink.LinkByName("podnet.vxlan")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	start = time.Now()
	a.expectRoutes(resync+3*time.Second, daemons[a], bhA, "10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink")
	nettest.Eventually(t, changeT, "ping over the re-created podnet.vxlan", func() error { return a.ping("10.244.1.5", "10.244.2.5") })
	t.Logf("MEASURE podnet.vxlan deleted -> device, routes and pod-to-pod traffic back after %s", time.Since(start).Round(time.Millisecond))
	if fdb := vxlanFDB(t, a); !slices.Equal(fdb, []string{"0e:70:ac:1e:00:02 dst 172.30.0.2"}) {
		t.Errorf("podnet.vxlan FDB of node-a after re-creation: %q", fdb)
	}
	noChurn(t, resync+resync/2, daemons[a], daemons[b])

	// SIGTERM: the daemons exit, the dataplane stays.
	running := map[*node]tcluster.Snapshot{}
	for _, n := range nodes {
		running[n] = n.snapshot()
		daemons[n].stop()
	}
	for _, n := range nodes {
		if d := running[n].Diff(n.snapshot()); d != "" {
			t.Errorf("%s changed after SIGTERM (routes must stay):\n%s", n.name, d)
		}
		if _, err := n.state(); err != nil {
			t.Errorf("%s: node.json after SIGTERM: %v", n.name, err)
		}
	}
	if err := a.ping("10.244.1.5", "10.244.2.5"); err != nil {
		t.Errorf("pod-to-pod after the daemons stopped: %v", err)
	}

	// --cleanup (twice: it is idempotent) restores the recorded state.
	for _, n := range nodes {
		for i := range 2 {
			if out, err := n.m.Cleanup(context.Background()); err != nil {
				t.Fatalf("%s: podnet-routed --cleanup (run %d): %v\n%s", n.name, i+1, err, out)
			}
		}
		after := n.snapshot()
		if d := before[n].Diff(after); d != "" {
			t.Errorf("%s after --cleanup differs from before podnet-routed (- before, + after):\n%s", n.name, d)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, nodestate.FileName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: node.json still there after --cleanup: %v", n.name, err)
		}
		if fwd := sysctl(t, n, "net/ipv4/ip_forward"); fwd != fwdBefore[n] {
			t.Logf("%s: net.ipv4.ip_forward %s before podnet-routed, %s after --cleanup (not restored; not part of the compared state)", n.name, fwdBefore[n], fwd)
		}
	}
}

func sysctl(t *testing.T, n *node, name string) string {
	t.Helper()
	var v string
	n.c.do(n.ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + name)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v
}

// vxlanFDB lists podnet.vxlan's FDB entries with a remote destination.
func vxlanFDB(t *testing.T, n *node) []string {
	t.Helper()
	var out []string
	if err := n.ns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("podnet.vxlan")
		if err != nil {
			return err
		}
		fdb, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, e := range fdb {
			if e.IP != nil && !e.IP.Equal(net.IPv4zero) {
				out = append(out, fmt.Sprintf("%s dst %s", e.HardwareAddr, e.IP))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestNodeEventWritesOnlyItsRoutes: with 40 Nodes programmed, one Node's
// InternalIP change is one route message in the kernel (its route
// replaced), and one Node's deletion is one (its route deleted): a Node
// event does not rewrite the other Nodes' routes, and the periodic
// resyncs (every 2 s here) that fall in the window write nothing. That it
// does not re-read them either (no dump) is pinned with a counting fake
// kernel in routed/dataplane.
func TestNodeEventWritesOnlyItsRoutes(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	c.createNode("node-a", a.ip, "10.244.1.0/24")
	want := []string{bhA}
	for i := 2; i <= 40; i++ {
		ip := fmt.Sprintf("172.30.0.%d", 100+i)
		c.createNode(fmt.Sprintf("node-%02d", i), ip, fmt.Sprintf("10.244.%d.0/24", i))
		want = append(want, fmt.Sprintf("10.244.%d.0/24 via %s dev eth0 proto 77", i, ip))
	}
	d := a.startDaemon()
	a.expectRoutes(syncT, d, want...)
	d.waitReady(changeT)

	// every main-table route message in node-a's netns from now on
	type msg struct {
		del bool
		dst string
		gw  string
	}
	msgs := make(chan msg, 1024)
	updates := make(chan netlink.RouteUpdate, 1024)
	done := make(chan struct{})
	defer close(done)
	c.do(a.ns, func() error { return netlink.RouteSubscribe(updates, done) })
	go func() {
		for u := range updates {
			if u.Table != unix.RT_TABLE_MAIN || u.Dst == nil || u.Protocol != contract.RouteProtocol {
				continue
			}
			m := msg{del: u.Type == unix.RTM_DELROUTE, dst: u.Dst.String()}
			if u.Gw != nil {
				m.gw = u.Gw.String()
			}
			msgs <- m
		}
	}()
	collect := func(what string, first msg) {
		t.Helper()
		var got []msg
		deadline := time.After(changeT)
		for len(got) == 0 || got[len(got)-1] != first {
			select {
			case m := <-msgs:
				got = append(got, m)
			case <-deadline:
				t.Fatalf("%s: route message %+v not seen in %s (saw %+v)", what, first, changeT, got)
			}
		}
		// anything else the event caused comes right after
		quiet := time.After(time.Second)
	drain:
		for {
			select {
			case m := <-msgs:
				got = append(got, m)
			case <-quiet:
				break drain
			}
		}
		if len(got) != 1 {
			t.Errorf("%s: %d route messages %+v, want only %+v", what, len(got), got, first)
		}
	}

	c.setNodeIP("node-17", "172.30.0.217")
	collect("node-17 moved", msg{dst: "10.244.17.0/24", gw: "172.30.0.217"})
	c.deleteNode("node-23")
	collect("node-23 deleted", msg{del: true, dst: "10.244.23.0/24", gw: "172.30.0.123"})

	want[16] = "10.244.17.0/24 via 172.30.0.217 dev eth0 proto 77"
	want = slices.Delete(want, 22, 23)
	a.expectRoutes(0, d, want...)
}
