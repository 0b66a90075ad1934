package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// Addresses podnet-routed serves on inside every node netns.
const (
	HealthAddr  = "127.0.0.1:9099"
	MetricsAddr = "127.0.0.1:9098"
)

// Node is a Kubernetes node: a netns on the underlay, its Node object and
// its podnet-routed.
type Node struct {
	c       *Cluster
	Name    string
	Subnet  int          // index in Subnets
	IP      netip.Addr   // InternalIP, on eth0 (IPv6 in an IPv6-only cluster)
	PodCIDR netip.Prefix // spec.podCIDRs[0] (IPv6 in an IPv6-only cluster)
	// IP6 and PodCIDR6 are the IPv6 InternalIP (on eth0 too) and
	// spec.podCIDRs[1] of a dual-stack cluster's node (Config.ClusterCIDR6).
	IP6      netip.Addr
	PodCIDR6 netip.Prefix
	NS       *NetNS
	Dir      string // this node's files
	// StateDir holds node.json (podnet-routed --state-dir, the plugins'
	// stateDir); DataDir the IPAM reservations (podnet-ipam dataDir).
	StateDir, DataDir string
	// runDir holds StateDir and DataDir when Config.RunDir puts them
	// outside Dir.
	runDir string
	// Initial is the netns as it was before podnet-routed first ran.
	Initial Snapshot
	// RoutedArgs are extra podnet-routed flags (after the cluster's own:
	// they win), for the next StartRouted.
	RoutedArgs []string
	Pods       []*Pod

	cni    *libcni.CNIConfig
	list   *libcni.NetworkConfigList
	routed *nettest.Proc
	// apiFwd and kubeconfig: the node's own way to the API server
	// (Config.APIProxy); else the cluster's kubeconfig, over the underlay.
	apiFwd     *nettest.Forwarder
	kubeconfig string
	podSeq     int
	exclude    []string // the IPAM's exclude (ExcludeAddrs)
}

// AddNode adds a node as a cluster admin would add a machine: netns on the
// underlay, Node object with the next free PodCIDR, podnet-routed started.
// It returns once that podnet-routed is ready; the other nodes learn the
// new one through their watch (see WaitConverged).
func (c *Cluster) AddNode(ctx context.Context) (*Node, error) {
	n, err := c.addNode()
	if err != nil {
		return nil, err
	}
	return n, n.WaitReady(ctx, 30*time.Second)
}

func (c *Cluster) addNode() (*Node, error) {
	c.nodeSeq++
	num := c.nodeSeq
	subnet := 0
	if c.Cfg.CrossSubnet && num%2 == 0 {
		subnet = 1
	}
	cidr, err := c.cidrs.allocate()
	if err != nil {
		return nil, err
	}
	var cidr6 netip.Prefix
	if c.cidrs6 != nil {
		if cidr6, err = c.cidrs6.allocate(); err != nil {
			return nil, err
		}
	}
	n, err := c.newMachine(fmt.Sprintf("node%d", num), subnet, num)
	if err != nil {
		return nil, err
	}
	n.PodCIDR, n.PodCIDR6 = cidr, cidr6
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.createNodeObject(ctx, n); err != nil {
		return nil, err
	}
	return n, n.StartRouted()
}

// AddMachine adds a bare machine on underlay subnet 0 with host number
// host (its address is Subnets[0] .host; Subnets6[0] ::host in an
// IPv6-only cluster): its netns, eth0, directories and
// CNI set-up, but no Node object and no podnet-routed, for tests that
// create those themselves (CreateNode, StartRouted). Its PodCIDR is not
// set.
func (c *Cluster) AddMachine(name string, host int) (*Node, error) {
	return c.newMachine(name, 0, host)
}

// newMachine makes a node's netns on subnet with host number host.
func (c *Cluster) newMachine(name string, subnet, host int) (*Node, error) {
	addr := c.machineAddr(subnet, host)
	n := &Node{c: c, Name: name, Subnet: subnet, IP: addr.Addr()}
	n.Dir = filepath.Join(c.Cfg.WorkDir, n.Name)
	base := n.Dir
	if c.Cfg.RunDir != "" {
		n.runDir = filepath.Join(c.Cfg.RunDir, c.Cfg.Name, n.Name)
		base = n.runDir
	}
	n.StateDir = filepath.Join(base, "state")
	n.DataDir = filepath.Join(base, "ipam")
	for _, d := range []string{n.Dir, base} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	var err error
	if n.NS, err = c.newNetNS(n.Name); err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n)
	// No IPv6 DAD: addresses are final at once, so the recorded initial
	// state does not change under our feet.
	if err := n.NS.Do(func() error {
		for _, s := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
			if err := nettest.WriteSysctl(s, "0"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := c.plug(n.NS, subnet, n.Name, UnderlayDev, addr, c.routerOf(subnet)); err != nil {
		return nil, err
	}
	if c.cidrs6 != nil {
		// the IPv6 underlay address of a dual-stack node, same host number
		a6 := hostAddr6(subnet, host)
		n.IP6 = a6.Addr()
		if err := addAddr(n.NS, UnderlayDev, a6); err != nil {
			return nil, fmt.Errorf("%s: IPv6 underlay address: %w", n.Name, err)
		}
	}
	if c.Cfg.APIProxy {
		target := c.APIServerAddr().String()
		if n.apiFwd, err = nettest.NewForwarder(n.NS.NetNS, APIProxyAddr, target, c.CP.DialContext); err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		c.mu.Lock()
		c.servers = append(c.servers, n.apiFwd)
		c.mu.Unlock()
		if n.kubeconfig, err = c.API.WriteKubeconfig(kapi.RoutedUser, "https://"+APIProxyAddr); err != nil {
			return nil, err
		}
	}
	if n.Initial, err = n.StableSnapshot(); err != nil {
		return nil, err
	}
	if err := n.initCNI(); err != nil {
		return nil, err
	}
	return n, nil
}

// APIProxyAddr is where, with Config.APIProxy, every node reaches the API
// server: a forwarder on the node netns' loopback.
const APIProxyAddr = "127.0.0.1:6443"

// CutAPI cuts the node off the API server (Config.APIProxy): its open
// connections are closed and new ones refused, until RestoreAPI.
func (n *Node) CutAPI() error {
	if n.apiFwd == nil {
		return fmt.Errorf("%s: no API proxy (Config.APIProxy)", n.Name)
	}
	n.apiFwd.Pause()
	return nil
}

// RestoreAPI reconnects a node CutAPI cut off.
func (n *Node) RestoreAPI() error {
	if n.apiFwd == nil {
		return fmt.Errorf("%s: no API proxy (Config.APIProxy)", n.Name)
	}
	n.apiFwd.Resume()
	return nil
}

// DeleteNode removes a node as when its machine is decommissioned: its
// podnet-routed stops, its Node object is deleted (its PodCIDR returns to
// the pool) and its netns, with its pods, go away.
func (c *Cluster) DeleteNode(ctx context.Context, n *Node) error {
	err := n.StopRouted()
	if err := c.deleteNodeObject(ctx, n.Name); err != nil {
		return err
	}
	c.cidrs.release(n.PodCIDR)
	if c.cidrs6 != nil && n.PodCIDR6.IsValid() {
		c.cidrs6.release(n.PodCIDR6)
	}
	c.Nodes = slices.DeleteFunc(c.Nodes, func(m *Node) bool { return m == n })
	for _, p := range n.Pods {
		p.closeServers()
		err = errors.Join(err, c.dropNetNS(p.NS))
	}
	n.Pods = nil
	if n.apiFwd != nil {
		_ = n.apiFwd.Close()
	}
	err = errors.Join(err, c.dropNetNS(n.NS), os.RemoveAll(n.Dir))
	if n.runDir != "" {
		err = errors.Join(err, os.RemoveAll(n.runDir))
	}
	return err
}

// StartRouted starts podnet-routed in the node netns.
func (n *Node) StartRouted() error {
	if n.routed != nil && !n.routed.Exited() {
		return fmt.Errorf("%s: podnet-routed already running", n.Name)
	}
	cfg := n.c.Cfg
	args := []string{
		"--kubeconfig=" + n.kubeconfigPath(),
		"--node-name=" + n.Name,
		"--encap=" + cfg.Encap,
		"--cluster-cidr=" + n.c.clusterCIDRs(),
		"--state-dir=" + n.StateDir,
		// the node's own IPAM store; no container runtime on these
		// nodes: the leak reconcile judges pods by their netns
		"--ipam-data-dir=" + n.DataDir,
		"--cri-socket=",
		"--health-addr=" + HealthAddr,
		"--metrics-addr=" + MetricsAddr,
	}
	if cfg.CrossSubnet {
		args = append(args, "--cross-subnet")
	}
	if cfg.Resync > 0 {
		args = append(args, "--resync-interval="+cfg.Resync.String())
	}
	if cfg.NetworkPolicy {
		args = append(args, "--network-policy=true")
	}
	args = append(args, n.RoutedArgs...)
	p, err := nettest.StartProc(n.NS.NetNS, !cfg.Detach, n.RoutedLog(), filepath.Join(cfg.BinDir, "podnet-routed"), args...)
	if err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	n.routed = p
	return n.c.saveState()
}

// NextHop is the address other nodes route this node's pods through: its
// first InternalIP (IP6 with Config.IPv6First).
func (n *Node) NextHop() netip.Addr {
	if n.c.Cfg.IPv6First && n.IP6.IsValid() {
		return n.IP6
	}
	return n.IP
}

// podCIDRs are the node's PodCIDRs as spec.podCIDRs lists them.
func (n *Node) podCIDRs() []string {
	out := []string{n.PodCIDR.String()}
	if n.PodCIDR6.IsValid() {
		out = append(out, n.PodCIDR6.String())
	}
	return out
}

// clusterCIDRs is podnet-routed's --cluster-cidr: both families' when
// dual-stack.
func (c *Cluster) clusterCIDRs() string {
	if c.Cfg.ClusterCIDR6 == "" {
		return c.Cfg.ClusterCIDR
	}
	return c.Cfg.ClusterCIDR + "," + c.Cfg.ClusterCIDR6
}

func (n *Node) kubeconfigPath() string {
	if n.kubeconfig != "" {
		return n.kubeconfig
	}
	return n.c.kubeconfig
}

// RoutedLog is the path of podnet-routed's log (every run appends).
func (n *Node) RoutedLog() string { return filepath.Join(n.Dir, "podnet-routed.log") }

// StopRouted sends podnet-routed SIGTERM and waits for it to exit (it
// leaves the dataplane in place).
func (n *Node) StopRouted() error {
	if n.routed == nil {
		return nil
	}
	err := n.routed.Stop(10 * time.Second)
	n.routed = nil
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", n.Name, err, Tail(n.RoutedLog(), 20))
	}
	return n.c.saveState()
}

// RoutedRunning says whether podnet-routed runs on the node.
func (n *Node) RoutedRunning() bool { return n.routed != nil && !n.routed.Exited() }

// Routed is the running podnet-routed (nil when stopped): its log
// records, exit status.
func (n *Node) Routed() *nettest.Proc { return n.routed }

// WaitReady waits for node.json with the node's PodCIDR and /readyz 200.
func (n *Node) WaitReady(ctx context.Context, limit time.Duration) error {
	client := n.httpClient()
	err := poll(ctx, limit, func() error {
		if err := n.alive(); err != nil {
			return err
		}
		st, err := nodestate.Read(n.StateDir)
		if err != nil {
			return err
		}
		if want := n.podCIDRs(); !slices.Equal(st.PodCIDRs, want) {
			return fmt.Errorf("node.json podCIDRs %v, want %v", st.PodCIDRs, want)
		}
		resp, err := client.Get("http://" + HealthAddr + "/readyz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: podnet-routed not ready: %w\n%s", n.Name, err, Tail(n.RoutedLog(), 20))
	}
	return nil
}

func (n *Node) alive() error {
	if n.routed == nil {
		return fmt.Errorf("%s: podnet-routed not running", n.Name)
	}
	if n.routed.Exited() {
		return fmt.Errorf("%s: podnet-routed exited: %v", n.Name, n.routed.Err())
	}
	return nil
}

func (n *Node) httpClient() *http.Client { return nettest.HTTPClient(n.NS.NetNS, 2*time.Second) }

// Metrics scrapes podnet-routed's /metrics (series without labels).
func (n *Node) Metrics() (map[string]float64, error) {
	code, body, err := nettest.GetIn(n.NS.NetNS, "http://"+MetricsAddr+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s: /metrics %d", n.Name, code)
	}
	return nettest.ParseMetrics(body)
}

// LinkMTU is the MTU of link dev in the node netns.
func (n *Node) LinkMTU(dev string) (int, error) { return linkMTU(n.NS, dev) }

func linkMTU(netns *NetNS, dev string) (int, error) {
	mtu := 0
	err := netns.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		mtu = l.Attrs().MTU
		return nil
	})
	return mtu, err
}

// LinkStats are the counters of link dev in the node netns.
func (n *Node) LinkStats(dev string) (netlink.LinkStatistics, error) {
	var st netlink.LinkStatistics
	err := n.NS.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if l.Attrs().Statistics == nil {
			return fmt.Errorf("%s has no statistics", dev)
		}
		st = *l.Attrs().Statistics
		return nil
	})
	return st, err
}

// State reads the node's node.json.
func (n *Node) State() (*nodestate.State, error) { return nodestate.Read(n.StateDir) }

// Cleanup runs `podnet-routed --cleanup` in the node netns (podnet-routed
// must be stopped) and returns its output.
func (n *Node) Cleanup(ctx context.Context) (string, error) {
	if n.RoutedRunning() {
		return "", fmt.Errorf("%s: stop podnet-routed before --cleanup", n.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return n.NS.Exec(ctx, filepath.Join(n.c.Cfg.BinDir, "podnet-routed"), "--cleanup", "--state-dir="+n.StateDir)
}

// ExplainPolicy runs `podnet-routed --explain-policy SRC DST PORT` in the
// node netns as an operator would in the node's podnet-routed pod (its
// kubeconfig, --node-name: the node's kernel table is checked too) and
// returns its output.
func (n *Node) ExplainPolicy(ctx context.Context, src, dst netip.Addr, port string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return n.NS.Exec(ctx, filepath.Join(n.c.Cfg.BinDir, "podnet-routed"), "--kubeconfig="+n.kubeconfigPath(), "--node-name="+n.Name,
		"--explain-policy", src.String(), dst.String(), port)
}

// Route is a podnet route (protocol contract.RouteProtocol) in the main table.
type Route struct {
	Dst       netip.Prefix
	Via       netip.Addr
	Dev       string
	OnLink    bool
	Blackhole bool
}

// IsPodRoute says whether r is a pod's host route (made by the plugin)
// rather than a node route (made by podnet-routed).
func (r Route) IsPodRoute() bool { return r.Dst.IsSingleIP() }

// String renders r as `ip route` does.
func (r Route) String() string {
	if r.Blackhole {
		return "blackhole " + r.Dst.String()
	}
	s := r.Dst.String()
	if r.Dst.IsSingleIP() {
		s = r.Dst.Addr().String()
	}
	if r.Via.IsValid() {
		s += " via " + r.Via.String()
	}
	s += " dev " + r.Dev
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// Routes lists the node's podnet routes (IPv4 and IPv6), sorted by
// destination.
func (n *Node) Routes() ([]Route, error) {
	var out []Route
	err := n.NS.Do(func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			var rt Route
			if r.Dst != nil {
				rt.Dst = ipNetPrefix(r.Dst)
			}
			if r.Type == unix.RTN_BLACKHOLE {
				rt.Blackhole = true
				out = append(out, rt)
				continue
			}
			if r.Gw != nil {
				rt.Via, _ = netip.AddrFromSlice(r.Gw)
				rt.Via = rt.Via.Unmap()
			}
			rt.Dev = fmt.Sprint(r.LinkIndex)
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				rt.Dev = l.Attrs().Name
			}
			rt.OnLink = r.Flags&int(netlink.FLAG_ONLINK) != 0
			out = append(out, rt)
		}
		return nil
	})
	slices.SortFunc(out, func(a, b Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		return a.Dst.Bits() - b.Dst.Bits()
	})
	return out, err
}

// NodeRoutes is Routes without the pods' host routes, rendered and sorted.
func (n *Node) NodeRoutes() ([]string, error) {
	routes, err := n.Routes()
	var out []string
	for _, r := range routes {
		if !r.IsPodRoute() {
			out = append(out, r.String())
		}
	}
	slices.Sort(out)
	return out, err
}

// WaitRoutes waits until the node's podnet node routes are exactly want.
func (n *Node) WaitRoutes(ctx context.Context, want []string, limit time.Duration) error {
	want = slices.Sorted(slices.Values(want))
	var got []string
	err := poll(ctx, limit, func() error {
		var err error
		if got, err = n.NodeRoutes(); err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return errors.New("routes differ")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: podnet routes after %s: %v\n  got  %q\n  want %q", n.Name, limit, err, got, want)
	}
	return nil
}

// Links lists the names of the node's links, lo aside.
func (n *Node) Links() ([]string, error) {
	var out []string
	err := n.NS.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	return out, err
}

// Reservations lists the IPAM store's reservation and owner files (the
// addresses held, and by whom).
func (n *Node) Reservations() ([]string, error) {
	var out []string
	for _, sub := range []string{"ips", "owners"} {
		dir := filepath.Join(n.DataDir, "podnet", sub)
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out = append(out, filepath.Join(sub, e.Name()))
		}
	}
	return out, nil
}

// Ping pings dst from the node netns.
func (n *Node) Ping(ctx context.Context, dst netip.Addr) (time.Duration, error) {
	return Ping(ctx, n.NS, dst)
}

func ipNetPrefix(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string { return nettest.Tail(path, n) }
