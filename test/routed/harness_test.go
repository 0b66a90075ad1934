package routed

// The harness: a bare test/cluster (a real kube-apiserver + etcd in their
// own netns, an underlay bridge, RBAC not granted yet) with machines added
// one by one, each a node netns whose eth0 (the node's InternalIP) hangs
// on the underlay and whose podnet-routed reaches the API server through a
// pausable forwarder on the node's loopback (127.0.0.1:6443 there). The
// tests create the Node objects and start podnet-routed themselves. Nothing
// touches the root netns.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

const (
	underlayMTU = 1400 // not 1500, so that node.json's MTU says where it came from
	uplinkName  = tcluster.UnderlayDev
	resync      = 2 * time.Second
	mainTable   = unix.RT_TABLE_MAIN
)

// cluster is one API server plus the underlay the node netns hang on.
type cluster struct {
	t      *testing.T
	c      *tcluster.Cluster
	api    *kapi.Server
	client kubernetes.Interface
	nodes  map[string]*node
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterWith(t, nil)
}

// newClusterWith is newCluster with the test's config changed by mod (a
// cluster CIDR list, no API proxy, ...) before the cluster comes up.
func newClusterWith(t *testing.T, mod func(*tcluster.Config)) *cluster {
	t.Helper()
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	start := time.Now()
	cfg := tcluster.Config{
		Name:        "pnrt-" + hex.EncodeToString(id),
		WorkDir:     t.TempDir(),
		RepoRoot:    nettest.RepoRoot(t),
		BinDir:      nettest.BinDir(t, "podnet-routed"),
		KapiDir:     kapi.BinDir(t), // fails (never skips) without PODNET_KAPI_DIR
		Encap:       "none",         // the flag's default is ipip, which this kernel lacks
		Resync:      resync,
		UnderlayMTU: underlayMTU,
		Bare:        true,
		NoRBAC:      true,
		APIProxy:    true,
	}
	if mod != nil {
		mod(&cfg)
	}
	tc, err := tcluster.Up(context.Background(), cfg)
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Logf("kube-apiserver + etcd and the underlay up in %s", time.Since(start).Round(time.Millisecond))
	c := &cluster{t: t, c: tc, api: tc.API, client: tc.Client, nodes: map[string]*node{}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range tc.Nodes {
				t.Logf("---- %s: last lines of %s ----\n%s", n.Name, n.RoutedLog(), tcluster.Tail(n.RoutedLog(), 60))
			}
		}
		if err := tc.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return c
}

func (c *cluster) do(n ns.NetNS, f func() error) {
	c.t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		c.t.Fatal(err)
	}
}

// node is a Kubernetes node: its netns (with eth0 on the underlay bridge),
// a state dir, and the API forwarder podnet-routed talks through.
type node struct {
	c        *cluster
	m        *tcluster.Node
	name     string
	ip       string // InternalIP on eth0
	ns       ns.NetNS
	stateDir string
}

// addNode adds the machine of node name with InternalIP ip (on the
// underlay subnet). It does not create the Node object.
func (c *cluster) addNode(name, ip string) *node {
	c.t.Helper()
	a := netip.MustParseAddr(ip)
	if !tcluster.Subnets[0].Contains(a) {
		c.t.Fatalf("%s: %s is not on the underlay %s", name, ip, tcluster.Subnets[0])
	}
	m, err := c.c.AddMachine(name, int(a.As4()[3]))
	if err != nil {
		c.t.Fatal(err)
	}
	n := &node{c: c, m: m, name: name, ip: ip, ns: m.NS.NetNS, stateDir: m.StateDir}
	c.nodes[name] = n
	return n
}

// addIP adds another address to the node's eth0 (for an InternalIP change).
func (n *node) addIP(ip string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		l, err := netlink.LinkByName(uplinkName)
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(ip + "/24")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, a)
	})
}

// cutAPI cuts the node off the API server (open connections closed, new
// ones refused) until restoreAPI.
func (n *node) cutAPI() {
	n.c.t.Helper()
	if err := n.m.CutAPI(); err != nil {
		n.c.t.Fatal(err)
	}
}

func (n *node) restoreAPI() {
	n.c.t.Helper()
	if err := n.m.RestoreAPI(); err != nil {
		n.c.t.Fatal(err)
	}
}

// ---- Kubernetes objects ----

// grantRBAC applies conf/podnet-routed-rbac.yaml for podnet-routed's user.
func (c *cluster) grantRBAC() {
	c.t.Helper()
	if err := c.c.GrantRBAC(context.Background()); err != nil {
		c.t.Fatal(err)
	}
}

// createNode creates a Node with podCIDR (none when "") and, when ip is
// not "", status.addresses InternalIP (written with UpdateStatus, as the
// kubelet does).
func (c *cluster) createNode(name, ip, podCIDR string) {
	c.t.Helper()
	if err := tcluster.CreateNode(context.Background(), c.client, name, ip, podCIDR); err != nil {
		c.t.Fatal(err)
	}
}

// setNodeIP changes the node's InternalIP.
func (c *cluster) setNodeIP(name, ip string) {
	c.t.Helper()
	c.updateNode(name, true, func(n *corev1.Node) {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	})
}

// assignPodCIDR sets spec.podCIDR(s) of a node that has none, as the node
// IPAM controller does.
func (c *cluster) assignPodCIDR(name, podCIDR string) {
	c.t.Helper()
	c.updateNode(name, false, func(n *corev1.Node) {
		n.Spec.PodCIDR = podCIDR
		n.Spec.PodCIDRs = []string{podCIDR}
	})
}

func (c *cluster) updateNode(name string, status bool, f func(*corev1.Node)) {
	c.t.Helper()
	if err := tcluster.UpdateNode(context.Background(), c.client, name, status, f); err != nil {
		c.t.Fatal(err)
	}
}

// deleteNode deletes the Node object and waits until it is really gone.
func (c *cluster) deleteNode(name string) {
	c.t.Helper()
	if err := tcluster.DeleteNodeObject(context.Background(), c.client, name); err != nil {
		c.t.Fatal(err)
	}
}

// ---- podnet-routed processes ----

// daemon is a running podnet-routed.
type daemon struct {
	n           *node
	p           *nettest.Proc
	healthAddr  string
	metricsAddr string
}

// startDaemon runs podnet-routed in the node netns with the test's
// defaults (--encap=none, 2 s resync); extra flags come last and win.
func (n *node) startDaemon(extra ...string) *daemon {
	t := n.c.t
	t.Helper()
	n.m.RoutedArgs = extra
	if err := n.m.StartRouted(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: podnet-routed %s (log %s)", n.name, strings.Join(n.m.Routed().Cmd.Args[1:], " "), n.m.RoutedLog())
	return &daemon{n: n, p: n.m.Routed(), healthAddr: tcluster.HealthAddr, metricsAddr: tcluster.MetricsAddr}
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	t := d.n.c.t
	t.Helper()
	if d.p.Exited() {
		t.Fatalf("%s: podnet-routed exited early: %v", d.n.name, d.p.Err())
	}
	if err := d.n.m.StopRouted(); err != nil {
		t.Fatal(err)
	}
}

// alive is an error when the daemon has exited.
func (d *daemon) alive() error {
	if err := d.p.Alive(); err != nil {
		return fmt.Errorf("%s: %w", d.n.name, err)
	}
	return nil
}

// logLines returns the daemon's JSON log records whose msg is msg.
func (d *daemon) logLines(msg string) []map[string]any { return d.p.LogRecords(msg) }

// noChurn checks for dur that the daemons change nothing in the kernel
// (no "routes applied" record) while the cluster does not change: the
// periodic resyncs in that window must find the kernel as desired.
func noChurn(t *testing.T, dur time.Duration, ds ...*daemon) {
	t.Helper()
	since := time.Now().Add(100 * time.Millisecond) // an apply logging right now is not churn
	nettest.Consistently(t, dur, "steady state", func() error {
		for _, d := range ds {
			if err := d.alive(); err != nil {
				return err
			}
			for _, rec := range d.logLines("routes applied") {
				ts, _ := rec["time"].(string)
				at, err := time.Parse(time.RFC3339Nano, ts)
				if err != nil {
					return fmt.Errorf("log time %q: %w", ts, err)
				}
				if at.After(since) {
					return fmt.Errorf("%s changed routes with no cluster change: %v", d.n.name, rec)
				}
			}
		}
		return nil
	})
}

// get does an HTTP GET of http://addr+path from inside the node netns (the
// daemon listens on the netns' loopback).
func (n *node) get(addr, path string) (int, string, error) {
	return nettest.GetIn(n.ns, "http://"+addr+path)
}

// status returns the HTTP status of path on the health address.
func (d *daemon) status(path string) (int, string) {
	code, body, err := d.n.get(d.healthAddr, path)
	if err != nil {
		return 0, err.Error()
	}
	return code, strings.TrimSpace(body)
}

// waitReady waits for /readyz 200 and returns how long it took.
func (d *daemon) waitReady(timeout time.Duration) time.Duration {
	d.n.c.t.Helper()
	return nettest.Eventually(d.n.c.t, timeout, d.n.name+" /readyz 200", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		if code, body := d.status("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
}

// metrics scrapes /metrics on the metrics address (unlabelled series).
func (d *daemon) metrics() (map[string]float64, error) {
	code, body, err := d.n.get(d.metricsAddr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics %d", code)
	}
	return nettest.ParseMetrics(body)
}

// ---- routes ----

// listRoutes returns the node's routes (both families) matching filter,
// rendered (tcluster.FormatRoute, short) and sorted. A nil filter means
// every route of every table.
func (n *node) listRoutes(filter *netlink.Route, mask uint64) ([]string, error) {
	var out []string
	err := n.ns.Do(func(ns.NetNS) error {
		if filter == nil {
			filter, mask = &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, filter, mask)
		if err != nil {
			return err
		}
		names, err := tcluster.LinkNames()
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, tcluster.FormatRoute(r, names, false))
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// podnetRoutes lists the routes with podnet's protocol in the main table.
func (n *node) podnetRoutes() ([]string, error) {
	return n.listRoutes(&netlink.Route{Protocol: contract.RouteProtocol, Table: mainTable}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
}

// routesTo lists every main-table route to dst, whatever its protocol.
func (n *node) routesTo(dst string) ([]string, error) {
	_, ipn, err := net.ParseCIDR(dst)
	if err != nil {
		return nil, err
	}
	return n.listRoutes(&netlink.Route{Dst: ipn, Table: mainTable}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
}

// expectRoutes waits until the node's podnet routes are exactly want and
// returns how long that took.
func (n *node) expectRoutes(timeout time.Duration, d *daemon, want ...string) time.Duration {
	n.c.t.Helper()
	want = slices.Clone(want)
	sort.Strings(want)
	return nettest.Eventually(n.c.t, timeout, n.name+" podnet routes", func() error {
		if d != nil {
			if err := d.alive(); err != nil {
				return err
			}
		}
		got, err := n.podnetRoutes()
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
		}
		return nil
	})
}

// addRoute adds a route in the node netns; dev "" means blackhole.
func (n *node) addRoute(dst, gw, dev string, proto netlink.RouteProtocol) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		_, ipn, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		r := &netlink.Route{Dst: ipn, Protocol: proto, Table: mainTable}
		if dev == "" {
			r.Type = unix.RTN_BLACKHOLE
		} else {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			r.LinkIndex = l.Attrs().Index
			r.Gw = net.ParseIP(gw)
		}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s: %w", dst, err)
		}
		return nil
	})
}

// delRoutes deletes every main-table route to dst (any protocol).
func (n *node) delRoutes(dst string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		_, ipn, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipn, Table: mainTable}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(routes) == 0 {
			return fmt.Errorf("no route to %s to delete", dst)
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil {
				return fmt.Errorf("delete route %s: %w", dst, err)
			}
		}
		return nil
	})
}

// ---- node.json ----

func (n *node) state() (*nodestate.State, error) { return nodestate.Read(n.stateDir) }

func (n *node) expectState(timeout time.Duration, want nodestate.State) {
	n.c.t.Helper()
	nettest.Eventually(n.c.t, timeout, n.name+" node.json", func() error {
		got, err := n.state()
		if err != nil {
			return err
		}
		if got.NodeName != want.NodeName || got.MTU != want.MTU || got.Encap != want.Encap || !slices.Equal(got.PodCIDRs, want.PodCIDRs) {
			return fmt.Errorf("got %+v, want %+v", *got, want)
		}
		return nil
	})
}

// ---- whole-netns snapshot (for --cleanup) ----

func (n *node) snapshot() tcluster.Snapshot {
	n.c.t.Helper()
	s, err := n.m.Snapshot()
	if err != nil {
		n.c.t.Fatal(err)
	}
	return s
}

// stableSnapshot waits until the netns state settles and returns it.
func (n *node) stableSnapshot() tcluster.Snapshot {
	n.c.t.Helper()
	s, err := n.m.StableSnapshot()
	if err != nil {
		n.c.t.Fatal(err)
	}
	return s
}

// ---- traffic ----

// ping pings dst from src inside the node netns (one echo, 1 s wait).
func (n *node) ping(src, dst string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := n.m.NS.Exec(ctx, "ping", "-c", "1", "-W", "1", "-I", src, dst)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// addPodAddr puts ip/32 on the node netns' loopback: an address in the
// node's PodCIDR that answers pings (this kernel has no dummy links).
func (n *node) addPodAddr(ip string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(ip + "/32")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, a)
	})
}
