// Package cluster brings up a whole podnet cluster on one machine, out of
// network namespaces, for `make demo` (cmd/podnet-demo), the end-to-end
// suite (test/e2e), podnet-routed's control-plane suite (test/routed) and
// the data-path benchmark (test/bench/routedbench):
//
//   - an underlay: one netns holding a Linux bridge per L2 subnet; every
//     other netns hangs on it by a veth pair ("eth0" on its side);
//   - a control plane netns running a real etcd + kube-apiserver
//     (test/kapi) on the underlay, reached by the nodes over it like a
//     real cluster's API endpoint;
//   - N node netns, each with its Node object (spec.podCIDRs carved from
//     the cluster CIDR in order, as kube-controller-manager's range
//     allocator does; status InternalIP as the kubelet reports it) and a
//     podnet-routed process;
//   - pods: netns attached through libcni with the shipped
//     conf/10-podnet.conflist (only its directories changed), exactly as a
//     container runtime on the node would call the plugins;
//   - an "outside" netns on the underlay that is not part of the cluster,
//     and, for cross-subnet, a router netns joining two underlay subnets.
//
// A cluster is IPv4, dual-stack (Config.ClusterCIDR6) or IPv6-only, its
// underlay and API server included (an IPv6 Config.ClusterCIDR).
//
// With Config.Bare, Up builds the underlay and the control plane only, and
// AddMachine adds node netns without Node object or podnet-routed, for
// tests that drive those themselves (test/routed); Config.APIProxy then
// gives every node a pausable way to the API server (Node.CutAPI). The
// low-level pieces (named netns, processes, polling, forwarder) are
// test/nettest's.
//
// Every name starts with Config.Name, so several clusters can run at once.
// Down removes everything; DownDir does the same from the state file a
// cluster keeps in its work directory (for `make demo-down` after KEEP=1).
// The machine's own netns only gains and loses the named netns entries.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// Fixed addressing of the box (inside its own netns, so several clusters
// can use the same addresses).
var (
	// Subnets are the underlay L2 subnets (bridges br0, br1).
	Subnets = []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24"), netip.MustParsePrefix("172.30.1.0/24")}
	// APIServerIP is the control plane's address on subnet 0.
	APIServerIP = netip.MustParseAddr("172.30.0.250")
	// OutsideIP is the outside host's address on subnet 0.
	OutsideIP = netip.MustParseAddr("172.30.0.200")
	// RouterHost is the router's host number on every subnet (.254).
	RouterHost = 254
	// Subnets6 are the IPv6 prefixes of the underlay subnets of a
	// dual-stack cluster (Config.ClusterCIDR6): a node has host number h
	// in both families.
	Subnets6 = []netip.Prefix{netip.MustParsePrefix("fd00:172:30::/64"), netip.MustParsePrefix("fd00:172:30:1::/64")}
	// APIServerIP6 is the control plane's address on subnet 0 of an
	// IPv6-only cluster (the same host number as APIServerIP).
	APIServerIP6 = netip.MustParseAddr("fd00:172:30::fa")
	// OutsideIP6 is the outside host's IPv6 address on subnet 0, in a
	// dual-stack cluster (with OutsideIP) and an IPv6-only one.
	OutsideIP6 = netip.MustParseAddr("fd00:172:30::c8")
)

// APIServerPort is kube-apiserver's port in the control plane netns.
const APIServerPort = 6443

// UnderlayDev is the name of every netns' underlay interface.
const UnderlayDev = "eth0"

// Config describes a cluster.
type Config struct {
	// Name prefixes every netns; it must be unique among live clusters.
	Name string
	// WorkDir holds state dirs, IPAM data, logs and the API server's
	// files. Down removes it.
	WorkDir string
	// RunDir, when set, holds the nodes' state and IPAM directories
	// (<RunDir>/<Name>/<node>/{state,ipam}) instead of WorkDir, as the
	// DaemonSet keeps them under /run, a tmpfs: the IPAM store fsyncs each
	// reservation, which on a disk costs every ADD milliseconds that a
	// shipped node does not pay. Down and DeleteNode remove what they put
	// there; the caller makes and removes RunDir.
	RunDir string
	// RepoRoot holds conf/10-podnet.conflist and conf/podnet-routed-rbac.yaml.
	RepoRoot string
	// BinDir holds podnet, podnet-ipam and podnet-routed; KapiDir etcd and
	// kube-apiserver.
	BinDir, KapiDir string
	// Encap is podnet-routed's --encap: none, vxlan or ipip.
	Encap string
	// CrossSubnet puts even-numbered nodes on a second underlay subnet
	// behind a router netns and runs podnet-routed --cross-subnet.
	CrossSubnet bool
	// Nodes is how many nodes Up creates (default 3).
	Nodes int
	// ClusterCIDR (default 10.244.0.0/16) and NodeCIDRMaskSize (default
	// 24, 64 for IPv6) are kube-controller-manager's --cluster-cidr and
	// --node-cidr-mask-size. ClusterCIDR may be a comma-separated list:
	// podnet-routed gets it whole, PodCIDRs come from its first CIDR.
	//
	// An IPv6 (first) ClusterCIDR makes the cluster IPv6-only, underlay
	// included (IPv6Only): every netns has only an IPv6 underlay address
	// (Subnets6; the API server on APIServerIP6, the outside host on
	// OutsideIP6), kube-apiserver listens and advertises on it and
	// podnet-routed reaches it at https://[APIServerIP6]:APIServerPort,
	// each Node has one IPv6 InternalIP and one IPv6 PodCIDR, the
	// conflist's range is usePodCidrIPv6 alone, and Node.IP,
	// Node.PodCIDR and Pod.IP are IPv6 (IP6 and PodCIDR6 stay unset).
	// Not with ClusterCIDR6, IPv6First or CrossSubnet.
	ClusterCIDR      string
	NodeCIDRMaskSize int
	// ClusterCIDR6, when set, makes the cluster dual-stack, as
	// kube-controller-manager with a cluster CIDR of each family and
	// kubelet --node-ip=v4,v6 make it: every node also gets an IPv6
	// underlay address (host number h of Subnets6) reported as a second
	// InternalIP after the IPv4 one, and an IPv6 PodCIDR of
	// NodeCIDRMaskSize6 (default 64) carved from ClusterCIDR6;
	// podnet-routed's --cluster-cidr gets both, and the conflist a second
	// range, usePodCidrIPv6, so that every pod gets an address of each
	// family. Not with CrossSubnet (the router is IPv4 only).
	ClusterCIDR6      string
	NodeCIDRMaskSize6 int
	// IPv6First lists a dual-stack node's IPv6 InternalIP first
	// (kubelet --node-ip=v6,v4): podnet-routed takes the first as the
	// Node's next hop, so the underlay of direct routes and of VXLAN is
	// IPv6 then.
	IPv6First bool
	// NetworkPolicy runs every node's podnet-routed with
	// --network-policy=true (its NetworkPolicy engine, table inet
	// podnet-policy) and gives every pod its Pod object (PodObjects): the
	// engine drops a local pod address it does not know.
	NetworkPolicy bool
	// PodObjects gives every pod a Pod object, as the scheduler and
	// kubelet would (AddPodSpec), without NetworkPolicy too.
	PodObjects bool
	// Plugin is the conflist the nodes' pods are attached with: "" or
	// "podnet" (conf/10-podnet.conflist, routed /32 pods), "podnet-bridge"
	// (conf/10-podnet-bridge.conflist, pods on the podnet0 bridge).
	Plugin string
	// Resync is podnet-routed's --resync-interval (0: its default).
	Resync time.Duration
	// UnderlayMTU is the MTU of every underlay link (default 1500).
	UnderlayMTU int
	// Bare: Up starts no node; the caller adds machines (AddMachine) and
	// creates their Node objects and podnet-routed itself.
	Bare bool
	// NoRBAC: Up does not grant podnet-routed's user its RBAC (GrantRBAC
	// does, later).
	NoRBAC bool
	// APIProxy: every node reaches the API server through a forwarder of
	// its own on its loopback (APIProxyAddr), which Node.CutAPI pauses;
	// otherwise straight over the underlay.
	APIProxy bool
	// Detach lets the processes outlive this one (KEEP=1); otherwise they
	// are killed if it dies.
	Detach bool
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// IPv6Only says whether the cluster is IPv6-only: its (first) ClusterCIDR
// is IPv6.
func (cfg Config) IPv6Only() bool {
	first, _, _ := strings.Cut(cfg.ClusterCIDR, ",")
	p, err := netip.ParsePrefix(strings.TrimSpace(first))
	return err == nil && p.Addr().Is6()
}

// Cluster is a running box.
type Cluster struct {
	Cfg      Config
	Underlay *NetNS
	CP       *NetNS // etcd + kube-apiserver
	Outside  *NetNS
	Router   *NetNS // CrossSubnet only
	API      *kapi.Server
	Client   kubernetes.Interface
	Nodes    []*Node

	conflist   []byte
	cidrs      *cidrAllocator
	cidrs6     *cidrAllocator // dual-stack only
	kubeconfig string         // podnet-routed's (RBAC user), server on the underlay
	mu         sync.Mutex
	netns      map[string]*NetNS
	servers    []io.Closer
	nodeSeq    int
	cnpClient  cnpclient.Interface // CreateClusterPolicy's, made on first use
}

func (c *Cluster) logf(format string, args ...any) {
	if c.Cfg.Logf != nil {
		c.Cfg.Logf(format, args...)
	}
}

// Up builds the cluster and returns when every node's podnet-routed is
// ready and every node has its routes to every other node. On error it
// returns the partial cluster (so that the caller can show logs) after
// tearing it down.
func Up(ctx context.Context, cfg Config) (c *Cluster, err error) {
	cidrs, cidrs6, err := checkConfig(&cfg)
	if err != nil {
		return nil, err
	}
	if left, _ := NetNSNames(cfg.Name + "-"); len(left) > 0 {
		return nil, fmt.Errorf("cluster %s: netns %v already exist (a cluster of that name is up: tear it down first)", cfg.Name, left)
	}
	c = &Cluster{Cfg: cfg, cidrs: cidrs, cidrs6: cidrs6, netns: map[string]*NetNS{}}
	defer func() {
		if err != nil {
			if derr := c.Down(); derr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, derr)
			}
		}
	}()
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return c, err
	}
	if err := c.saveState(); err != nil {
		return c, err
	}
	confFile := "10-podnet.conflist"
	switch cfg.Plugin {
	case "", "podnet":
	case "podnet-bridge":
		confFile = "10-podnet-bridge.conflist"
	default:
		return c, fmt.Errorf("cluster: unknown Plugin %q (podnet or podnet-bridge)", cfg.Plugin)
	}
	if c.conflist, err = conflist(filepath.Join(cfg.RepoRoot, "conf", confFile)); err != nil {
		return c, err
	}

	start := time.Now()
	if err := c.buildUnderlay(); err != nil {
		return c, err
	}
	if err := c.startControlPlane(); err != nil {
		// The logs go with the work directory: keep their end.
		log := filepath.Join(cfg.WorkDir, "kapi", "kube-apiserver.log")
		return c, fmt.Errorf("%w\n%s (last lines):\n%s", err, filepath.Base(log), Tail(log, 15))
	}
	c.logf("kube-apiserver + etcd ready on %s (netns %s) in %s", c.APIServerAddr(), c.CP.Name, time.Since(start).Round(time.Millisecond))

	if cfg.Bare {
		return c, nil
	}
	start = time.Now()
	for range cfg.Nodes {
		if _, err := c.addNode(); err != nil {
			return c, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx, 30*time.Second); err != nil {
			return c, err
		}
	}
	if err := c.WaitConverged(ctx, 30*time.Second); err != nil {
		return c, err
	}
	c.logf("%d nodes up, podnet-routed --encap=%s ready and routes converged in %s", len(c.Nodes), cfg.Encap, time.Since(start).Round(time.Millisecond))
	return c, nil
}

// checkConfig fills cfg's defaults, checks it and returns the PodCIDR
// allocators of its ClusterCIDR and ClusterCIDR6 (nil unless dual-stack).
func checkConfig(cfg *Config) (cidrs, cidrs6 *cidrAllocator, err error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.ClusterCIDR == "" {
		cfg.ClusterCIDR = "10.244.0.0/16"
	}
	v6only := cfg.IPv6Only()
	if cfg.NodeCIDRMaskSize == 0 {
		cfg.NodeCIDRMaskSize = 24
		if v6only {
			cfg.NodeCIDRMaskSize = 64
		}
	}
	if cfg.UnderlayMTU == 0 {
		cfg.UnderlayMTU = 1500
	}
	if cfg.Name == "" || cfg.WorkDir == "" || cfg.RepoRoot == "" || cfg.BinDir == "" || cfg.KapiDir == "" {
		return nil, nil, errors.New("cluster: Name, WorkDir, RepoRoot, BinDir and KapiDir are required")
	}
	if _, err := desired.ParseEncap(cfg.Encap); err != nil {
		return nil, nil, err
	}
	if cfg.CrossSubnet && cfg.Encap == "none" {
		return nil, nil, errors.New("cluster: cross-subnet needs an encapsulation (the router knows no pod routes)")
	}
	if v6only {
		switch {
		case cfg.ClusterCIDR6 != "":
			return nil, nil, fmt.Errorf("cluster: ClusterCIDR %s is IPv6 (an IPv6-only cluster): ClusterCIDR6 is for dual-stack, with an IPv4 ClusterCIDR", cfg.ClusterCIDR)
		case cfg.IPv6First:
			return nil, nil, errors.New("cluster: IPv6First is for dual-stack clusters; an IPv6-only cluster (IPv6 ClusterCIDR) has IPv6 InternalIPs only")
		case cfg.CrossSubnet:
			return nil, nil, errors.New("cluster: an IPv6-only cluster is not with cross-subnet (the router netns is IPv4 only)")
		case cfg.Encap == "ipip":
			return nil, nil, errors.New("cluster: an IPv6-only cluster cannot use --encap=ipip (IPIP carries IPv4 only): use vxlan or none")
		}
		first, _, _ := strings.Cut(cfg.ClusterCIDR, ",")
		cidrs, err = newCIDRAllocator6(first, cfg.NodeCIDRMaskSize)
		return cidrs, nil, err
	}
	if cidrs, err = newCIDRAllocator(cfg.ClusterCIDR, cfg.NodeCIDRMaskSize); err != nil {
		return nil, nil, err
	}
	if cfg.ClusterCIDR6 != "" {
		if cfg.NodeCIDRMaskSize6 == 0 {
			cfg.NodeCIDRMaskSize6 = 64
		}
		if cfg.CrossSubnet {
			return nil, nil, errors.New("cluster: dual-stack (ClusterCIDR6) is not with cross-subnet (the router netns is IPv4 only)")
		}
		if cidrs6, err = newCIDRAllocator6(cfg.ClusterCIDR6, cfg.NodeCIDRMaskSize6); err != nil {
			return nil, nil, err
		}
	}
	return cidrs, cidrs6, nil
}

// newNetNS creates the cluster's netns <Name>-<suffix> and records it.
func (c *Cluster) newNetNS(suffix string) (*NetNS, error) {
	n, err := newNetNS(c.Cfg.Name + "-" + suffix)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.netns[n.Name] = n
	c.mu.Unlock()
	return n, c.saveState()
}

// dropNetNS removes one of the cluster's netns.
func (c *Cluster) dropNetNS(n *NetNS) error {
	c.mu.Lock()
	delete(c.netns, n.Name)
	c.mu.Unlock()
	n.Close()
	err := removeNetNS(n.Name)
	return errors.Join(err, c.saveState())
}

func (c *Cluster) buildUnderlay() error {
	var err error
	if c.Underlay, err = c.newNetNS("underlay"); err != nil {
		return err
	}
	nBridges := 1
	if c.Cfg.CrossSubnet {
		nBridges = 2
	}
	for i := range nBridges {
		if err := AddBridge(c.Underlay.NetNS, bridgeName(i), c.Cfg.UnderlayMTU); err != nil {
			return err
		}
	}
	gw := netip.Addr{}
	if c.Cfg.CrossSubnet {
		if c.Router, err = c.newNetNS("router"); err != nil {
			return err
		}
		for i := range 2 {
			if err := c.plug(c.Router, i, "router"+fmt.Sprint(i), fmt.Sprintf("eth%d", i), hostAddr(i, RouterHost), netip.Addr{}); err != nil {
				return err
			}
		}
		if err := c.Router.Do(func() error { return nettest.WriteSysctl("net/ipv4/ip_forward", "1") }); err != nil {
			return err
		}
		gw = hostAddr(0, RouterHost).Addr()
	}
	if c.Outside, err = c.newNetNS("outside"); err != nil {
		return err
	}
	// The outside host knows the underlay only: no route to any pod.
	outside := c.OutsideIPs()
	if err := c.plug(c.Outside, 0, "outside", UnderlayDev, netip.PrefixFrom(outside[0], subnetOf(outside[0], 0).Bits()), gw); err != nil {
		return err
	}
	for _, a := range outside[1:] {
		if err := addAddr(c.Outside, UnderlayDev, netip.PrefixFrom(a, subnetOf(a, 0).Bits())); err != nil {
			return err
		}
	}
	return nil
}

// APIServerAddr is where the API server listens on the underlay:
// APIServerIP, or APIServerIP6 in an IPv6-only cluster, port APIServerPort.
func (c *Cluster) APIServerAddr() netip.AddrPort {
	if c.Cfg.IPv6Only() {
		return netip.AddrPortFrom(APIServerIP6, APIServerPort)
	}
	return netip.AddrPortFrom(APIServerIP, APIServerPort)
}

// OutsideIPs are the outside host's addresses: OutsideIP, then OutsideIP6
// in a dual-stack cluster; OutsideIP6 alone in an IPv6-only one.
func (c *Cluster) OutsideIPs() []netip.Addr {
	switch {
	case c.Cfg.IPv6Only():
		return []netip.Addr{OutsideIP6}
	case c.Cfg.ClusterCIDR6 != "":
		return []netip.Addr{OutsideIP, OutsideIP6}
	}
	return []netip.Addr{OutsideIP}
}

// UnderlaySubnets are the underlay subnets in use: Subnets[0] (both with
// CrossSubnet), then Subnets6[0] when dual-stack; Subnets6[0] alone when
// IPv6-only.
func (c *Cluster) UnderlaySubnets() []netip.Prefix {
	switch {
	case c.Cfg.IPv6Only():
		return Subnets6[:1]
	case c.Cfg.CrossSubnet:
		return Subnets
	case c.Cfg.ClusterCIDR6 != "":
		return []netip.Prefix{Subnets[0], Subnets6[0]}
	}
	return Subnets[:1]
}

// subnetOf is underlay subnet s of a's family.
func subnetOf(a netip.Addr, s int) netip.Prefix {
	if a.Is6() {
		return Subnets6[s]
	}
	return Subnets[s]
}

// RouterIP is the router's address on underlay subnet s.
func RouterIP(s int) netip.Addr { return hostAddr(s, RouterHost).Addr() }

func bridgeName(subnet int) string { return fmt.Sprintf("br%d", subnet) }

// hostAddr is host number h on underlay subnet s, with the subnet's length.
func hostAddr(s, h int) netip.Prefix {
	a := Subnets[s].Addr().As4()
	a[3] = byte(h)
	return netip.PrefixFrom(netip.AddrFrom4(a), Subnets[s].Bits())
}

// hostAddr6 is host number h on underlay subnet s's IPv6 prefix
// (Subnets6), with its length.
func hostAddr6(s, h int) netip.Prefix {
	a := Subnets6[s].Addr().As16()
	a[14], a[15] = byte(h>>8), byte(h)
	return netip.PrefixFrom(netip.AddrFrom16(a), Subnets6[s].Bits())
}

// machineAddr is host number h's (first) underlay address on subnet s:
// IPv4, or IPv6 in an IPv6-only cluster.
func (c *Cluster) machineAddr(s, h int) netip.Prefix {
	if c.Cfg.IPv6Only() {
		return hostAddr6(s, h)
	}
	return hostAddr(s, h)
}

// routerOf is the router's address on subnet s, or invalid without router.
func (c *Cluster) routerOf(s int) netip.Addr {
	if c.Router == nil {
		return netip.Addr{}
	}
	return hostAddr(s, RouterHost).Addr()
}

// plug connects target to bridge subnet with a veth pair: brSide in the
// underlay netns, ifName (the underlay MTU, addr, default route via gw when
// valid) in target.
func (c *Cluster) plug(target *NetNS, subnet int, brSide, ifName string, addr netip.Prefix, gw netip.Addr) error {
	return Plug(c.Underlay.NetNS, target.NetNS, Port{Bridge: bridgeName(subnet), BrSide: brSide, IfName: ifName, Addr: addr, GW: gw, MTU: c.Cfg.UnderlayMTU})
}

func (c *Cluster) startControlPlane() error {
	var err error
	if c.CP, err = c.newNetNS("cp"); err != nil {
		return err
	}
	api := c.APIServerAddr().Addr()
	if err := c.plug(c.CP, 0, "cp", UnderlayDev, netip.PrefixFrom(api, subnetOf(api, 0).Bits()), c.routerOf(0)); err != nil {
		return err
	}
	bind := "0.0.0.0"
	if api.Is6() {
		bind = "::"
	}
	dir := filepath.Join(c.Cfg.WorkDir, "kapi")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	server, err := kapi.New(kapi.Options{
		Dir:              dir,
		BinDir:           c.Cfg.KapiDir,
		ExtraIPs:         []net.IP{api.AsSlice()},
		BindAddress:      bind,
		AdvertiseAddress: api.AsSlice(),
		Port:             APIServerPort,
		StartProcess:     func(cmd *exec.Cmd) error { return c.CP.StartProcess(cmd, !c.Cfg.Detach) },
		Dial:             c.CP.DialContext,
	})
	c.API = server
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	if err := c.saveState(); err != nil {
		return err
	}
	cfg, err := server.AdminConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	// podnet-routed's credentials: a token user with only the RBAC the
	// shipped manifest grants, talking to the API server over the underlay.
	if c.kubeconfig, err = server.WriteKubeconfig(kapi.RoutedUser, "https://"+c.APIServerAddr().String()); err != nil {
		return err
	}
	if c.Cfg.NoRBAC {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.GrantRBAC(ctx)
}

// clusterState is what DownDir needs to remove a cluster left up.
type clusterState struct {
	Name  string   `json:"name"`
	NetNS []string `json:"netns"`
	Procs []pidRef `json:"processes"`
}

// StateFile is the state file's name in the work directory.
const StateFile = "cluster.json"

func (c *Cluster) saveState() error {
	c.mu.Lock()
	st := clusterState{Name: c.Cfg.Name}
	for name := range c.netns {
		st.NetNS = append(st.NetNS, name)
	}
	c.mu.Unlock()
	slices.Sort(st.NetNS)
	// In the order DownDir stops them: the API server's clients, then
	// kube-apiserver, then etcd (kube-apiserver hangs on exit without it).
	for _, n := range c.Nodes {
		if p := n.routed; p != nil && !p.Exited() {
			st.Procs = append(st.Procs, newPidRef(p.Cmd.Process.Pid))
		}
	}
	if c.API != nil {
		pids := c.API.Pids()
		slices.Reverse(pids)
		for _, pid := range pids {
			st.Procs = append(st.Procs, newPidRef(pid))
		}
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.Cfg.WorkDir, "."+StateFile)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.Cfg.WorkDir, StateFile))
}

// GrantRBAC grants podnet-routed's user the shipped RBAC (see the
// function GrantRBAC); Up does unless Config.NoRBAC.
func (c *Cluster) GrantRBAC(ctx context.Context) error {
	return GrantRBAC(ctx, c.Client, c.Cfg.RepoRoot)
}

// GrantRBAC applies conf/podnet-routed-rbac.yaml: its ClusterRole as is,
// its ClusterRoleBinding with the token user podnet-routed runs as
// (kapi.RoutedUser) added as a subject (the file binds the kube-system
// ServiceAccount, which a DaemonSet would use). The file must hold exactly
// one of each.
func GrantRBAC(ctx context.Context, client kubernetes.Interface, repoRoot string) error {
	data, err := os.ReadFile(filepath.Join(repoRoot, "conf", "podnet-routed-rbac.yaml"))
	if err != nil {
		return err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var roles, bindings int
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("parse podnet-routed-rbac.yaml: %w", err)
		}
		switch obj["kind"] {
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(obj, &cr); err != nil {
				return err
			}
			if _, err := client.RbacV1().ClusterRoles().Create(ctx, &cr, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create ClusterRole %s: %w", cr.Name, err)
			}
			roles++
		case "ClusterRoleBinding":
			var crb rbacv1.ClusterRoleBinding
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(obj, &crb); err != nil {
				return err
			}
			crb.Subjects = append(crb.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kapi.RoutedUser})
			if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create ClusterRoleBinding %s: %w", crb.Name, err)
			}
			bindings++
		}
	}
	if roles != 1 || bindings != 1 {
		return fmt.Errorf("podnet-routed-rbac.yaml: %d ClusterRoles, %d ClusterRoleBindings; want 1 and 1", roles, bindings)
	}
	return nil
}

// createNodeObject registers the Node of n (CreateNode; with both
// families when the cluster is dual-stack).
func (c *Cluster) createNodeObject(ctx context.Context, n *Node) error {
	if !n.IP6.IsValid() {
		return CreateNode(ctx, c.Client, n.Name, n.IP.String(), n.PodCIDR.String())
	}
	ips := []string{n.IP.String(), n.IP6.String()}
	if c.Cfg.IPv6First {
		slices.Reverse(ips)
	}
	return CreateNodeDual(ctx, c.Client, n.Name, ips, []string{n.PodCIDR.String(), n.PodCIDR6.String()})
}

// CreateNode registers a Node as a kubelet and kube-controller-manager
// would: spec.podCIDRs (none when podCIDR is ""), then, when ip is not "",
// status.addresses (InternalIP, Hostname) through the status subresource.
func CreateNode(ctx context.Context, client kubernetes.Interface, name, ip, podCIDR string) error {
	var ips, podCIDRs []string
	if ip != "" {
		ips = []string{ip}
	}
	if podCIDR != "" {
		podCIDRs = []string{podCIDR}
	}
	return CreateNodeDual(ctx, client, name, ips, podCIDRs)
}

// CreateNodeDual is CreateNode with several PodCIDRs and InternalIPs (a
// dual-stack Node: one of each family, in the order given).
func CreateNodeDual(ctx context.Context, client kubernetes.Interface, name string, ips, podCIDRs []string) error {
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if len(podCIDRs) > 0 {
		obj.Spec = corev1.NodeSpec{PodCIDR: podCIDRs[0], PodCIDRs: podCIDRs}
	}
	created, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	if len(ips) == 0 {
		return nil
	}
	for _, ip := range ips {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("Node %s status: %w", name, err)
	}
	return nil
}

// UpdateNode changes Node name with f (its status when status is true),
// retrying on conflicts.
func UpdateNode(ctx context.Context, client kubernetes.Interface, name string, status bool, f func(*corev1.Node)) error {
	for range 5 {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(n)
		if status {
			_, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		} else {
			_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		}
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("update Node %s: %w", name, err)
		}
	}
	return fmt.Errorf("update Node %s: too many conflicts", name)
}

// deleteNodeObject deletes the Node (DeleteNodeObject).
func (c *Cluster) deleteNodeObject(ctx context.Context, name string) error {
	return DeleteNodeObject(ctx, c.Client, name)
}

// DeleteNodeObject deletes Node name and waits until it is gone.
func DeleteNodeObject(ctx context.Context, client kubernetes.Interface, name string) error {
	if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete Node %s: %w", name, err)
	}
	return poll(ctx, 10*time.Second, func() error {
		_, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("Node %s still there (%v)", name, err)
	})
}

// ExpectedRoutes is the podnet routes (pod host routes aside) n must have:
// a blackhole for each of its own PodCIDRs and one route per other node's
// PodCIDR that the encapsulation can reach. podnet-routed routes a Node
// by its first InternalIP (NextHop): a direct route goes via the Node's
// InternalIP of the PodCIDR's family (a dual-stack Node's other one for
// the other family), IPIP needs an IPv4 next hop and PodCIDR, VXLAN
// carries either family (desired.ForNode).
func (c *Cluster) ExpectedRoutes(n *Node) []string {
	want := []string{"blackhole " + n.PodCIDR.String()}
	if n.PodCIDR6.IsValid() {
		want = append(want, "blackhole "+n.PodCIDR6.String())
	}
	for _, m := range c.Nodes {
		if m == n {
			continue
		}
		encap := c.Cfg.Encap
		if c.Cfg.CrossSubnet && m.Subnet == n.Subnet {
			encap = "none"
		}
		nh := m.NextHop()
		for _, p := range []netip.Prefix{m.PodCIDR, m.PodCIDR6} {
			if !p.IsValid() {
				continue
			}
			sameFamily := p.Addr().Is4() == nh.Is4()
			switch {
			case encap == "none" && sameFamily:
				want = append(want, fmt.Sprintf("%s via %s dev %s", p, nh, UnderlayDev))
			case encap == "none" && p.Addr().Is6() && m.IP6.IsValid():
				// a dual-stack Node's other family: via its InternalIP of it
				want = append(want, fmt.Sprintf("%s via %s dev %s", p, m.IP6, UnderlayDev))
			case encap == "none" && p.Addr().Is4():
				want = append(want, fmt.Sprintf("%s via %s dev %s", p, m.IP, UnderlayDev))
			case encap == "vxlan":
				want = append(want, fmt.Sprintf("%s via %s dev %s onlink", p, p.Addr(), desired.VXLANDevice))
			case encap == "ipip" && sameFamily && p.Addr().Is4():
				want = append(want, fmt.Sprintf("%s via %s dev %s onlink", p, nh, desired.TunnelDevice))
			}
		}
	}
	slices.Sort(want)
	return want
}

// WaitConverged waits until every node has exactly its expected routes.
func (c *Cluster) WaitConverged(ctx context.Context, limit time.Duration) error {
	for _, n := range c.Nodes {
		if err := n.WaitRoutes(ctx, c.ExpectedRoutes(n), limit); err != nil {
			return err
		}
	}
	return nil
}

// Pods lists every pod of every node, in node order.
func (c *Cluster) Pods() []*Pod {
	var out []*Pod
	for _, n := range c.Nodes {
		out = append(out, n.Pods...)
	}
	return out
}

// Down stops every process and removes every netns and the work
// directory. It keeps going past errors and returns them all.
func (c *Cluster) Down() error {
	var errs []error
	c.mu.Lock()
	servers := c.servers
	c.servers = nil
	c.mu.Unlock()
	for _, s := range servers {
		s.Close()
	}
	for _, n := range c.Nodes {
		// How podnet-routed exits is for the tests to check (StopRouted),
		// not for the teardown: it may be stopped mid-start.
		_ = n.routed.Stop(5 * time.Second)
		n.routed = nil
	}
	if c.API != nil {
		c.API.Stop()
	}
	c.mu.Lock()
	var all []*NetNS
	for _, n := range c.netns {
		all = append(all, n)
	}
	c.mu.Unlock()
	// Pods first, then nodes, the underlay last (only tidier).
	slices.SortFunc(all, func(a, b *NetNS) int { return teardownRank(a.Name) - teardownRank(b.Name) })
	for _, n := range all {
		errs = append(errs, c.dropNetNS(n))
	}
	if left, err := NetNSNames(c.Cfg.Name + "-"); err == nil && len(left) > 0 {
		for _, name := range left {
			errs = append(errs, removeNetNS(name))
		}
	}
	errs = append(errs, os.RemoveAll(c.Cfg.WorkDir))
	if c.Cfg.RunDir != "" {
		errs = append(errs, os.RemoveAll(filepath.Join(c.Cfg.RunDir, c.Cfg.Name)))
	}
	return errors.Join(errs...)
}

func teardownRank(name string) int {
	switch {
	case strings.Contains(name, "-pod-"):
		return 0
	case strings.HasSuffix(name, "-underlay"):
		return 2
	}
	return 1
}

// DownDir removes a cluster left up (Config.Detach) from the state file in
// its work directory: it kills the processes it recorded (those still
// being the same processes), removes its netns and the directory. name,
// when not "", also sweeps every netns named name-* (a cluster whose state
// file is lost). Nothing to remove is not an error.
func DownDir(workDir, name string) (removed []string, err error) {
	var st clusterState
	data, err := os.ReadFile(filepath.Join(workDir, StateFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("%s: %w", StateFile, err)
		}
	}
	if name != "" && st.Name != "" && name != st.Name {
		return nil, fmt.Errorf("%s is cluster %q, not %q", workDir, st.Name, name)
	}
	if st.Name == "" {
		st.Name = name
	}
	var errs []error
	for _, p := range st.Procs {
		if p.kill(5 * time.Second) {
			removed = append(removed, fmt.Sprintf("process %d (%s)", p.Pid, p.Comm))
		}
	}
	names := slices.Clone(st.NetNS)
	if st.Name != "" {
		if more, err := NetNSNames(st.Name + "-"); err == nil {
			names = append(names, more...)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return teardownRank(a) - teardownRank(b) })
	names = slices.Compact(names)
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(NetNSDir, name)); err != nil {
			continue
		}
		if err := removeNetNS(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "netns "+name)
	}
	if _, err := os.Stat(workDir); err == nil {
		errs = append(errs, os.RemoveAll(workDir))
		removed = append(removed, "directory "+workDir)
	}
	return removed, errors.Join(errs...)
}

// poll calls check every 50 ms until it succeeds, limit passes or ctx
// ends; it returns check's last error.
func poll(ctx context.Context, limit time.Duration, check func() error) error {
	return nettest.Poll(ctx, limit, 50*time.Millisecond, check)
}
