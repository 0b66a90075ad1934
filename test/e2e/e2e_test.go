// Package e2e is podnet's end-to-end suite: whole clusters built by
// test/cluster (a real kube-apiserver + etcd, node netns on an underlay
// bridge, podnet-routed on every node, pods attached through libcni with
// the shipped conf/10-podnet.conflist, an outside host) and real traffic
// between them, in the modes this kernel has: --encap=none, --encap=vxlan,
// and vxlan --cross-subnet with two underlay subnets joined by a router.
// IPIP needs a kernel with the ipip module: test/ipipvm runs it in a QEMU
// VM (same path: Node objects, podnet-routed per node netns, pods made by
// the plugins, cross-node pings over tunl0).
//
// The suite needs root, ping, the built binaries (`make`) and
// PODNET_KAPI_DIR / PODNET_CNI_TOOLS as `make test` sets them.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// converge bounds how long podnet-routed may take to program a change.
const converge = 20 * time.Second

// resync is podnet-routed's --resync-interval in the suite.
const resync = 2 * time.Second

// up starts a cluster for the test and tears it down when the test ends
// (with every podnet-routed log when the test failed).
func up(t *testing.T, encap string, nodes int, crossSubnet bool) *cluster.Cluster {
	t.Helper()
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	cfg := cluster.Config{
		Name:        "pne2e-" + hex.EncodeToString(id),
		WorkDir:     t.TempDir(),
		RepoRoot:    nettest.RepoRoot(t),
		BinDir:      nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed"),
		KapiDir:     kapi.BinDir(t),
		Encap:       encap,
		CrossSubnet: crossSubnet,
		Nodes:       nodes,
		Resync:      resync,
		Logf:        t.Logf,
	}
	start := time.Now()
	c, err := cluster.Up(context.Background(), cfg)
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Logf("cluster %s (--encap=%s, %d nodes, cross-subnet %v) up in %s", cfg.Name, encap, nodes, crossSubnet, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("---- %s: podnet-routed log (last lines) ----\n%s", n.Name, cluster.Tail(n.RoutedLog(), 30))
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
		if left, _ := cluster.NetNSNames(cfg.Name + "-"); len(left) > 0 {
			t.Errorf("netns left after teardown: %v", left)
		}
	})
	return c
}

// reporter is the part of testing.TB the assertions use, so that a test
// can run them against a recorder and prove that they do fail.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

// requireConnected fails t unless every pair of the matrix answered; it
// logs the matrix either way.
func requireConnected(t reporter, m *cluster.Matrix) bool {
	t.Helper()
	var b strings.Builder
	m.Render(&b, "  ")
	t.Logf("ping matrix:\n%s", b.String())
	fails := m.Failures()
	total, ok := m.Pairs()
	if len(fails) > 0 || ok != total {
		t.Errorf("%d of %d pod pairs do not answer ICMP:\n  %s", total-ok, total, strings.Join(fails, "\n  "))
		return false
	}
	return true
}

// requireTCP fails t for every connection that failed or saw the wrong
// source address.
func requireTCP(t reporter, what string, rs []cluster.TCPResult) {
	t.Helper()
	var bad []string
	for _, r := range rs {
		if !r.OK() {
			bad = append(bad, r.String())
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: %d of %d connections wrong:\n  %s", what, len(bad), len(rs), strings.Join(bad, "\n  "))
		return
	}
	t.Logf("%s: %d connections, e.g. %s", what, len(rs), rs[0])
}

func addPods(t *testing.T, c *cluster.Cluster, n *cluster.Node, count int) []*cluster.Pod {
	t.Helper()
	var out []*cluster.Pod
	for range count {
		p, err := n.AddPod(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Check(context.Background(), p); err != nil {
			t.Errorf("CNI CHECK %s: %v", p.Name, err)
		}
		out = append(out, p)
	}
	return out
}

// TestCluster runs the whole life of a three-node cluster in each mode
// this kernel has: traffic of every kind, a node joining and leaving,
// podnet-routed restarted under traffic, every pod deleted, --cleanup.
func TestCluster(t *testing.T) {
	for _, encap := range []string{"none", "vxlan"} {
		t.Run(encap, func(t *testing.T) {
			t.Parallel()
			testLifecycle(t, encap)
		})
	}
}

func testLifecycle(t *testing.T, encap string) {
	ctx := context.Background()
	c := up(t, encap, 3, false)
	for _, n := range c.Nodes {
		addPods(t, c, n, 2)
	}
	steps := []struct {
		name string
		f    func(t *testing.T)
	}{
		{"node-objects", func(t *testing.T) { checkNodeObjects(t, c) }},
		{"pod-pod-icmp", func(t *testing.T) {
			requireConnected(t, cluster.PingMatrix(ctx, c.Pods()))
		}},
		{"pod-pod-tcp-keeps-source", func(t *testing.T) {
			requireTCP(t, "pod → pod TCP (same node and across nodes)", cluster.TCPMatrix(ctx, c.Pods()))
		}},
		{"mtu-and-path-mtu", func(t *testing.T) { testMTU(t, c) }},
		{"node-pod", func(t *testing.T) {
			var bad []string
			rs := c.NodePodPings(ctx)
			for _, r := range rs {
				if !r.RTT.OK {
					bad = append(bad, fmt.Sprintf("%s → %s (%s): %v", r.From, r.To, r.Dst, r.RTT.Err))
				}
			}
			if len(bad) > 0 {
				t.Errorf("node ↔ pod pings failed:\n  %s", strings.Join(bad, "\n  "))
			}
			t.Logf("%d node ↔ pod pings answered", len(rs)-len(bad))
		}},
		{"pod-outside-masquerade", func(t *testing.T) {
			// The outside host has no route to the pods: without the
			// masquerade nothing would come back.
			if _, err := cluster.Ping(ctx, c.Outside, c.Pods()[0].IP); err == nil {
				t.Fatalf("the outside host reaches pod %s directly: the test set-up is wrong", c.Pods()[0].IP)
			}
			rs, err := c.OutsideTCP(ctx, c.Pods())
			if err != nil {
				t.Fatal(err)
			}
			requireTCP(t, "pod → outside TCP, masqueraded to the node address", rs)
		}},
		{"node-added", func(t *testing.T) { testNodeAdded(t, c) }},
		{"node-deleted", func(t *testing.T) { testNodeDeleted(t, c) }},
		{"routed-restart-no-loss", func(t *testing.T) { testRestartNoLoss(t, c) }},
		{"pods-deleted-leave-nothing", func(t *testing.T) { testPodsDeleted(t, c) }},
		{"cleanup-restores-nodes", func(t *testing.T) { testCleanup(t, c) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.f) {
			t.Fatalf("step %s failed: later steps would only fail with it", s.name)
		}
	}
}

// testNodeAdded: a node joining later gets routes to every node, every
// node gets a route to it, and its pods reach and are reached by all.
func testNodeAdded(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	start := time.Now()
	n, err := c.AddNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx, converge); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (PodCIDR %s) joined; routes everywhere in %s", n.Name, n.PodCIDR, time.Since(start).Round(time.Millisecond))
	for _, m := range c.Nodes {
		if m == n {
			continue
		}
		routes, _ := m.NodeRoutes()
		if !slices.ContainsFunc(routes, func(r string) bool { return strings.HasPrefix(r, n.PodCIDR.String()+" ") }) {
			t.Errorf("%s has no route to %s's PodCIDR %s: %q", m.Name, n.Name, n.PodCIDR, routes)
		}
	}
	addPods(t, c, n, 1)
	requireConnected(t, cluster.PingMatrix(ctx, c.Pods()))
}

// testNodeDeleted: the last node leaves (its podnet-routed stops, its Node
// object is deleted); every other node drops its route.
func testNodeDeleted(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	gone := c.Nodes[len(c.Nodes)-1]
	cidr := gone.PodCIDR
	start := time.Now()
	if err := c.DeleteNode(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx, converge); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s deleted; its route to %s gone from every node in %s", gone.Name, cidr, time.Since(start).Round(time.Millisecond))
	for _, m := range c.Nodes {
		routes, _ := m.Routes()
		for _, r := range routes {
			if cidr.Overlaps(r.Dst) {
				t.Errorf("%s still routes %s: %s", m.Name, cidr, r)
			}
		}
	}
	requireConnected(t, cluster.PingMatrix(ctx, c.Pods()))
}

// testRestartNoLoss restarts podnet-routed on one node while a pod there
// pings a pod on another node every 50 ms: the routes stay while it is
// down and it takes over without touching them, so nothing is lost.
func testRestartNoLoss(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	src, dst := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]
	n := src.Node
	before, err := n.NodeRoutes()
	if err != nil {
		t.Fatal(err)
	}
	const count, interval = 100, 50 * time.Millisecond
	run := cluster.StartPing(ctx, src.NS, dst.IP, interval, count)
	time.Sleep(time.Second)
	start := time.Now()
	if err := n.StopRouted(); err != nil {
		t.Fatal(err)
	}
	down, _ := n.NodeRoutes()
	if !slices.Equal(down, before) {
		t.Errorf("%s: routes changed when podnet-routed stopped:\n  before %q\n  after  %q", n.Name, before, down)
	}
	if err := n.StartRouted(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(ctx, converge); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: podnet-routed stopped and ready again in %s", n.Name, time.Since(start).Round(time.Millisecond))
	summary, err := run.Wait()
	if run.Sent != count || run.Received != count {
		t.Errorf("ping %s → %s across the restart: %d sent, %d received (want %d/%d, no loss): %s (%v)", src.Name, dst.Name, run.Sent, run.Received, count, count, summary, err)
	} else {
		t.Logf("ping -i %s %s → %s across the restart: %s", interval, src.Name, dst.Name, summary)
	}
	after, _ := n.NodeRoutes()
	if !slices.Equal(after, before) {
		t.Errorf("%s: routes differ after the restart:\n  before %q\n  after  %q", n.Name, before, after)
	}
	if err := c.WaitConverged(ctx, converge); err != nil {
		t.Error(err)
	}
}

// testPodsDeleted deletes every pod with CNI DEL, as a runtime does: no
// host veth, pod route, IPAM reservation or pod netns may remain.
func testPodsDeleted(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	for _, n := range c.Nodes {
		for _, p := range slices.Clone(n.Pods) {
			if err := n.DelPod(ctx, p); err != nil {
				t.Error(err)
			}
		}
	}
	for _, n := range c.Nodes {
		// DEL detaches the veth pairs and the kernel removes them with the
		// pod netns, in the background: give it a moment
		var links []string
		deadline := time.Now().Add(10 * time.Second)
		for {
			var err error
			if links, err = n.Links(); err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(links, contract.IsHostVeth) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, l := range links {
			if contract.IsHostVeth(l) {
				t.Errorf("%s: veth %s left 10 s after its pod netns was removed", n.Name, l)
			}
		}
		routes, err := n.Routes()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			if r.IsPodRoute() {
				t.Errorf("%s: pod route %s left", n.Name, r)
			}
		}
		res, err := n.Reservations()
		if err != nil {
			t.Fatal(err)
		}
		if len(res) > 0 {
			t.Errorf("%s: IPAM reservations left in %s: %v", n.Name, n.DataDir, res)
		}
		t.Logf("%s after the last DEL: links %v, podnet routes %d (node routes only)", n.Name, links, len(routes))
	}
	if left, _ := cluster.NetNSNames(c.Cfg.Name + "-pod-"); len(left) > 0 {
		t.Errorf("pod netns left: %v", left)
	}
}

// testCleanup stops podnet-routed and runs --cleanup on every node, then
// removes the plugins' pod filter as the uninstall guide says
// (conf/README.md): each node netns must be exactly as before podnet-routed
// first ran (links, addresses, routes of every table, permanent neighbours
// and FDB, nft).
func testCleanup(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	for _, n := range c.Nodes {
		if err := n.StopRouted(); err != nil {
			t.Fatal(err)
		}
		if out, err := n.Cleanup(ctx); err != nil {
			t.Fatalf("%s: %v\n%s", n.Name, err, out)
		}
		if err := n.NS.Do(podfilter.Delete); err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		now, err := n.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if d := n.Initial.Diff(now); d != "" {
			t.Errorf("%s after --cleanup differs from before podnet-routed ran (- before, + after):\n%s", n.Name, d)
		}
		if _, err := os.Stat(n.StateDir + "/node.json"); err == nil {
			t.Errorf("%s: node.json left after --cleanup", n.Name)
		}
	}
}

// TestCrossSubnet: four nodes, two on each of two underlay subnets joined
// by a router netns that knows no pod route, podnet-routed --encap=vxlan
// --cross-subnet: direct routes on the same subnet, VXLAN across the
// router (only encapsulated traffic can cross it), and every pod reaches
// every other one with its own address. Same-subnet traffic must not use
// the tunnel, cross-subnet traffic must; the path MTU across the router is
// the pod MTU.
func TestCrossSubnet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := up(t, "vxlan", 4, true)
	subnets := map[int]int{}
	for _, n := range c.Nodes {
		subnets[n.Subnet]++
		addPods(t, c, n, 1)
	}
	if subnets[0] != 2 || subnets[1] != 2 {
		t.Fatalf("nodes per subnet %v, want 2 and 2", subnets)
	}
	for _, n := range c.Nodes {
		routes, _ := n.NodeRoutes()
		t.Logf("%s (subnet %s): %q", n.Name, cluster.Subnets[n.Subnet], routes)
	}
	checkMTUs(t, c)
	requireConnected(t, cluster.PingMatrix(ctx, c.Pods()))
	requireTCP(t, "pod → pod TCP across the router", cluster.TCPMatrix(ctx, c.Pods()))
	rs, err := c.OutsideTCP(ctx, c.Pods())
	if err != nil {
		t.Fatal(err)
	}
	requireTCP(t, "pod → outside TCP, masqueraded to the node address", rs)

	// node1 and node3 share subnet 0; node2 is on subnet 1.
	n1 := c.Nodes[0]
	same, other := c.Nodes[2], c.Nodes[1]
	if same.Subnet != n1.Subnet || other.Subnet == n1.Subnet {
		t.Fatalf("subnets: %s %d, %s %d, %s %d", n1.Name, n1.Subnet, same.Name, same.Subnet, other.Name, other.Subnet)
	}
	vxlanTx := func() uint64 {
		st, err := n1.LinkStats(desired.VXLANDevice)
		if err != nil {
			t.Fatal(err)
		}
		return st.TxPackets
	}
	pings := func(to *cluster.Node) {
		for range 3 {
			if _, err := cluster.Ping(ctx, n1.Pods[0].NS, to.Pods[0].IP); err != nil {
				t.Fatalf("%s → %s: %v", n1.Pods[0].Name, to.Pods[0].Name, err)
			}
		}
	}
	before := vxlanTx()
	pings(same)
	if d := vxlanTx() - before; d != 0 {
		t.Errorf("%s -> %s (same subnet) sent %d packets over %s, want 0 (direct)", n1.Name, same.Name, d, desired.VXLANDevice)
	}
	before = vxlanTx()
	pings(other)
	if d := vxlanTx() - before; d < 3 {
		t.Errorf("%s -> %s (other subnet) sent %d packets over %s, want >= 3", n1.Name, other.Name, d, desired.VXLANDevice)
	}
	checkPathMTU(t, other.Pods[0], same.Pods[0], podMTU("vxlan"))
}

// TestBrokenRouteIsCaught proves the connectivity check is not vacuous:
// with a route broken by hand it must report ✗ (and the assertion the
// suite uses must fail), and ✓ again once the route is back.
func TestBrokenRouteIsCaught(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := up(t, "none", 2, false)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	p1, p2 := addPods(t, c, n1, 1)[0], addPods(t, c, n2, 1)[0]
	pods := []*cluster.Pod{p1, p2}
	requireConnected(t, cluster.PingMatrix(ctx, pods))

	expectBroken := func(t *testing.T, why string) {
		t.Helper()
		m := cluster.PingMatrix(ctx, pods)
		if _, ok := m.Pairs(); ok != 0 {
			t.Errorf("%s: %d pairs still answer, want none", why, ok)
		}
		var rec recorder
		if requireConnected(&rec, m) || len(rec.errors) == 0 {
			t.Errorf("%s: the suite's connectivity assertion passed", why)
		} else {
			t.Logf("%s: the suite's assertion fails as it must: %s", why, rec.errors[0])
		}
		var b strings.Builder
		m.Render(&b, "  ")
		t.Logf("matrix with the broken route:\n%s", b.String())
	}

	t.Run("route-deleted-routed-stopped", func(t *testing.T) {
		// podnet-routed stopped, so that it cannot repair the route.
		if err := n1.StopRouted(); err != nil {
			t.Fatal(err)
		}
		out, err := n1.NS.Exec(ctx, "ip", "route", "del", n2.PodCIDR.String())
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		expectBroken(t, "route to "+n2.PodCIDR.String()+" deleted on "+n1.Name)
		// podnet-routed puts it back when it starts.
		if err := n1.StartRouted(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConverged(ctx, converge); err != nil {
			t.Fatal(err)
		}
		requireConnected(t, cluster.PingMatrix(ctx, pods))
	})

	t.Run("blackhole-with-routed-running", func(t *testing.T) {
		// A more specific blackhole for the remote pod wins over
		// podnet's /24; podnet-routed leaves foreign routes alone.
		host := p2.IP.String() + "/32"
		if out, err := n1.NS.Exec(ctx, "ip", "route", "add", "blackhole", host, "proto", "static"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		time.Sleep(resync + 500*time.Millisecond) // a full resync passes
		expectBroken(t, "blackhole "+host+" on "+n1.Name)
		if out, err := n1.NS.Exec(ctx, "ip", "route", "del", "blackhole", host); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		requireConnected(t, cluster.PingMatrix(ctx, pods))
	})
}

// recorder is a reporter that records instead of failing.
type recorder struct{ errors []string }

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Errorf(f string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(f, args...))
}

// checkNodeObjects checks the Node objects: PodCIDRs carved in order from
// the cluster CIDR (as kube-controller-manager does) and InternalIPs on the
// underlay, and node.json on every node saying the same.
func checkNodeObjects(t *testing.T, c *cluster.Cluster) {
	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range nodes.Items {
		ip := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		got[n.Name] = fmt.Sprintf("%v %s", n.Spec.PodCIDRs, ip)
	}
	want := map[string]string{
		"node1": "[10.244.0.0/24] 172.30.0.1",
		"node2": "[10.244.1.0/24] 172.30.0.2",
		"node3": "[10.244.2.0/24] 172.30.0.3",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Node objects: got %v, want %v", got, want)
	}
	for _, n := range c.Nodes {
		st, err := n.State()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(st.PodCIDRs, []string{n.PodCIDR.String()}) || st.Encap != c.Cfg.Encap {
			t.Errorf("%s node.json %+v, want podCIDRs [%s] encap %s", n.Name, *st, n.PodCIDR, c.Cfg.Encap)
		}
	}
}
