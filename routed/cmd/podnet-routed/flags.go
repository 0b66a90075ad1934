// podnet-routed's flags and their checks: what an operator may get wrong
// stops it at start, before it touches anything.

package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam"
	"github.com/podnet/podnet/routed/daemon"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/reconcile"
)

// options are podnet-routed's flags, as given.
type options struct {
	kubeconfig, nodeName, encap, clusterCIDRs, serviceCIDRs string
	masqueradeIPv6, stateDir, healthAddr, metricsAddr       string
	logLevel, criSocket, ipamDataDirs, procSys              string
	crossSubnet, masquerade, cleanup, netpol, explainPolicy bool
	apiTimeout, resync, reconcileInterval, reconcileGrace   time.Duration
	mtu, vni, port, gcPercent, policyNice                   int
	gcPercentGiven                                          bool // --gc-percent was on the command line
	policyLogDrops                                          uint64
	args                                                    []string // what follows the flags (--explain-policy's flow)
}

// parseFlags reads argv into options.
func parseFlags(argv []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("podnet-routed", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME)")
	fs.StringVar(&o.encap, "encap", "ipip", "encapsulation between nodes: ipip, vxlan or none")
	fs.BoolVar(&o.crossSubnet, "cross-subnet", false, "route directly to nodes on this node's L2 subnet, encapsulate only across subnets")
	fs.StringVar(&o.clusterCIDRs, "cluster-cidr", os.Getenv("CLUSTER_CIDR"), "comma-separated cluster pod CIDRs (required): every Node's PodCIDR must lie inside one, and traffic to them is not masqueraded")
	fs.StringVar(&o.serviceCIDRs, "service-cidr", os.Getenv("SERVICE_CIDR"), "comma-separated service CIDRs no PodCIDR may overlap (added to the ServiceCIDR objects of the API, where they can be read)")
	fs.DurationVar(&o.apiTimeout, "apiserver-timeout", time.Minute, "how long the API server may be out of reach before /readyz fails (0: never)")
	fs.BoolVar(&o.masquerade, "masquerade", true, "masquerade pod traffic leaving the cluster CIDRs (false: none, IPv6 included)")
	fs.StringVar(&o.masqueradeIPv6, "masquerade-ipv6", envOr("MASQUERADE_IPV6", "auto"), "masquerade IPv6 pod traffic leaving the cluster CIDRs: auto (only from a unique local fc00::/7 PodCIDR, which the internet does not route; a global one keeps its address), true or false (env MASQUERADE_IPV6)")
	fs.IntVar(&o.mtu, "mtu", 0, "pod/overlay MTU (0: underlay MTU minus encapsulation overhead)")
	fs.StringVar(&o.stateDir, "state-dir", nodestate.DefaultDir, "directory of node.json for the CNI plugins")
	fs.DurationVar(&o.resync, "resync-interval", 30*time.Second, "full resync period (repairs and prunes)")
	fs.StringVar(&o.healthAddr, "health-addr", "127.0.0.1:9099", "address of /healthz and /readyz (empty: off; loopback by default: the node's other interfaces face the network)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9098", "address of /metrics (empty: off)")
	fs.IntVar(&o.vni, "vxlan-vni", 4096, "VXLAN network identifier")
	fs.IntVar(&o.port, "vxlan-port", 4789, "VXLAN UDP port")
	fs.BoolVar(&o.cleanup, "cleanup", false, "remove every route, device, nft table and state file podnet-routed created, then exit")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", time.Minute, "period of the leak reconcile, which frees the addresses and host-side state of pods whose DEL never came and repairs live pods' host routes (0: off)")
	fs.DurationVar(&o.reconcileGrace, "reconcile-grace", 2*time.Minute, "age under which the leak reconcile never frees a reservation (covers an ADD in flight); a reservation of an earlier boot is freed at once")
	fs.StringVar(&o.criSocket, "cri-socket", reconcile.DefaultCRISocket, "the container runtime's CRI socket, asked which pods are alive (empty: ask none, judge by netns alone)")
	fs.StringVar(&o.ipamDataDirs, "ipam-data-dir", ipam.DefaultDataDir, "comma-separated podnet-ipam data directories (ipam.dataDir) whose stores the leak reconcile covers")
	fs.StringVar(&o.procSys, "proc-sys", "/proc/sys", "the sysctl tree where live pods' host veth settings are repaired")
	fs.BoolVar(&o.netpol, "network-policy", envOr("NETWORK_POLICY", "false") == "true", "enforce networking.k8s.io/v1 NetworkPolicy on this node (table inet podnet-policy; needs list/watch on pods, namespaces and networkpolicies); false removes the table (env NETWORK_POLICY; conf/k8s/podnet.yaml turns it on)")
	fs.Uint64Var(&o.policyLogDrops, "policy-log-drops", 0, "log the new connections NetworkPolicy drops to the kernel log, at most this many a second per pod and direction, prefixed \"podnet-policy drop <namespace>/<pod> <direction>: \" (0: off)")
	fs.IntVar(&o.policyNice, "policy-nice", -10, "nice value (-20..19) of the NetworkPolicy engine's write loop thread and of its read-back after a write, of the thread that adds a new pod's port to the pod filter for its plugin, and of the threads serving the plugins' requests on the policy socket, and of the leak reconcile's thread while it waits for and holds an IPAM store's lock, those threads alone (0: the process's): every pod's CNI ADD waits for that loop's write and for the lock, which must not queue behind the plugins and pods a busy node starts; needs CAP_SYS_NICE to go below 0, else the loop logs a warning and keeps the process's")
	fs.BoolVar(&o.explainPolicy, "explain-policy", false, "print which NetworkPolicies allow or refuse the flow given as arguments, SRC DST PORT[/tcp|udp|sctp], and why, then exit")
	fs.IntVar(&o.gcPercent, "gc-percent", 50, "after the initial sync, how much the Go heap may grow, in percent of what the last collection left live, before the next collection (GOGC; Go's default, which the initial sync keeps, is 100; negative: never): the live heap is long-lived state (the Nodes, their routes) and Node events leave little garbage, so collections stay rare and less memory is held for the growth; the environment's GOGC is kept throughout unless this flag is given; GOMEMLIMIT, when set, adds Go's soft memory limit")
	if err := fs.Parse(argv); err != nil {
		return nil, err
	}
	if o.policyNice < -20 || o.policyNice > 19 {
		return nil, fmt.Errorf("--policy-nice %d: a nice value is -20..19", o.policyNice)
	}
	fs.Visit(func(f *flag.Flag) { o.gcPercentGiven = o.gcPercentGiven || f.Name == "gc-percent" })
	o.args = fs.Args()
	return o, nil
}

// gcPercentToSet is the GOGC to set (ok false: keep the environment's GOGC,
// which the runtime applied already).
func (o *options) gcPercentToSet() (percent int, ok bool) {
	if !o.gcPercentGiven && os.Getenv("GOGC") != "" {
		return 0, false
	}
	return o.gcPercent, true
}

// daemonConfig checks the daemon's flags and makes its configuration
// (APIServers aside: they need the client configuration).
func (o *options) daemonConfig() (daemon.Config, error) {
	e, err := desired.ParseEncap(o.encap)
	if err != nil {
		return daemon.Config{}, fmt.Errorf("--encap: %w", err)
	}
	if o.nodeName == "" {
		return daemon.Config{}, errors.New("--node-name (or NODE_NAME) is required")
	}
	cidrs, err := clusterCIDRs(o.clusterCIDRs, e)
	if err != nil {
		return daemon.Config{}, err
	}
	masq6, err := dataplane.ParseMasqueradeIPv6(o.masqueradeIPv6)
	if err != nil {
		return daemon.Config{}, fmt.Errorf("--masquerade-ipv6: %w", err)
	}
	svc, err := parseCIDRs(o.serviceCIDRs)
	if err != nil {
		return daemon.Config{}, fmt.Errorf("--service-cidr: %w", err)
	}
	for _, sv := range svc {
		for _, c := range cidrs {
			if sv.Bits() <= c.Bits() && sv.Contains(c.Addr()) {
				return daemon.Config{}, fmt.Errorf("--service-cidr %s holds the cluster CIDR %s: every Node would be refused", sv, c)
			}
		}
	}
	if o.resync <= 0 {
		return daemon.Config{}, errors.New("--resync-interval must be positive")
	}
	return daemon.Config{
		NodeName: o.nodeName, Encap: e, CrossSubnet: o.crossSubnet, ClusterCIDRs: cidrs, ServiceCIDRs: svc,
		Masquerade: o.masquerade, MasqueradeIPv6: masq6, MTU: o.mtu, StateDir: o.stateDir,
		ResyncInterval: o.resync, APIServerTimeout: o.apiTimeout, VXLANVNI: o.vni, VXLANPort: o.port,
		GuardNice: o.policyNice,
	}, nil
}

// clusterCIDRs parses and checks --cluster-cidr for encapsulation e.
func clusterCIDRs(s string, e desired.Encap) ([]netip.Prefix, error) {
	cidrs, err := parseCIDRs(s)
	if err != nil {
		return nil, fmt.Errorf("--cluster-cidr: %w", err)
	}
	if len(cidrs) == 0 {
		return nil, errors.New("--cluster-cidr (or CLUSTER_CIDR) is required: the cluster's pod CIDRs, kubeadm's --pod-network-cidr (e.g. 10.244.0.0/16); a Node whose PodCIDR lies outside them gets no route")
	}
	for _, c := range cidrs {
		if err := desired.CheckClusterCIDR(c); err != nil {
			return nil, fmt.Errorf("--cluster-cidr: %w", err)
		}
	}
	if err := checkEncapFamilies(e, cidrs); err != nil {
		return nil, err
	}
	return cidrs, nil
}

// reconcileDirs checks the leak reconcile's flags and returns its IPAM
// data directories.
func (o *options) reconcileDirs() ([]string, error) {
	if o.reconcileInterval < 0 || o.reconcileGrace < 0 {
		return nil, errors.New("--reconcile-interval and --reconcile-grace must not be negative")
	}
	var dataDirs []string
	for _, d := range strings.Split(o.ipamDataDirs, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("--ipam-data-dir %q: want an absolute path", d)
		}
		dataDirs = append(dataDirs, filepath.Clean(d))
	}
	if o.criSocket != "" {
		if _, err := reconcile.SocketPath(o.criSocket); err != nil {
			return nil, fmt.Errorf("--cri-socket: %w", err)
		}
	}
	return dataDirs, nil
}

// checkEncapFamilies refuses an encapsulation that cannot carry a cluster
// CIDR's family: IPIP is IPv4 in IPv4, and an IPv6 pod range would be
// left unrouted.
func checkEncapFamilies(e desired.Encap, cidrs []netip.Prefix) error {
	if e != desired.IPIP {
		return nil
	}
	for _, c := range cidrs {
		if c.Addr().Is6() {
			return fmt.Errorf("--encap=ipip carries IPv4 only; the cluster CIDR %s is IPv6: use --encap=vxlan (both families) or --encap=none", c)
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
