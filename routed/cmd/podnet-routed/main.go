// Command podnet-routed is podnet's node daemon: it watches the cluster's
// Nodes and routes every remote node's PodCIDR over tunl0 (IPIP), the
// podnet.vxlan device or directly, masquerades outbound pod traffic and
// publishes the node's PodCIDR and MTU for the CNI plugins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/ipam"
	"github.com/podnet/podnet/routed/daemon"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/kube"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/engine"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/routed/reconcile"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "podnet-routed:", err)
		os.Exit(1)
	}
}

func run(argv []string) error {
	fs := flag.NewFlagSet("podnet-routed", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: in-cluster config)")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME)")
	encap := fs.String("encap", "ipip", "encapsulation between nodes: ipip, vxlan or none")
	crossSubnet := fs.Bool("cross-subnet", false, "route directly to nodes on this node's L2 subnet, encapsulate only across subnets")
	clusterCIDRs := fs.String("cluster-cidr", os.Getenv("CLUSTER_CIDR"), "comma-separated cluster pod CIDRs (required): every Node's PodCIDR must lie inside one, and traffic to them is not masqueraded")
	serviceCIDRs := fs.String("service-cidr", os.Getenv("SERVICE_CIDR"), "comma-separated service CIDRs no PodCIDR may overlap (added to the ServiceCIDR objects of the API, where they can be read)")
	apiTimeout := fs.Duration("apiserver-timeout", time.Minute, "how long the API server may be out of reach before /readyz fails (0: never)")
	masquerade := fs.Bool("masquerade", true, "masquerade pod traffic leaving the cluster CIDRs (false: none, IPv6 included)")
	masqueradeIPv6 := fs.String("masquerade-ipv6", envOr("MASQUERADE_IPV6", "auto"), "masquerade IPv6 pod traffic leaving the cluster CIDRs: auto (only from a unique local fc00::/7 PodCIDR, which the internet does not route; a global one keeps its address), true or false (env MASQUERADE_IPV6)")
	mtu := fs.Int("mtu", 0, "pod/overlay MTU (0: underlay MTU minus encapsulation overhead)")
	stateDir := fs.String("state-dir", nodestate.DefaultDir, "directory of node.json for the CNI plugins")
	resync := fs.Duration("resync-interval", 30*time.Second, "full resync period (repairs and prunes)")
	healthAddr := fs.String("health-addr", "127.0.0.1:9099", "address of /healthz and /readyz (empty: off; loopback by default: the node's other interfaces face the network)")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9098", "address of /metrics (empty: off)")
	vni := fs.Int("vxlan-vni", 4096, "VXLAN network identifier")
	port := fs.Int("vxlan-port", 4789, "VXLAN UDP port")
	cleanup := fs.Bool("cleanup", false, "remove every route, device, nft table and state file podnet-routed created, then exit")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	reconcileInterval := fs.Duration("reconcile-interval", time.Minute, "period of the leak reconcile, which frees the addresses and host-side state of pods whose DEL never came and repairs live pods' host routes (0: off)")
	reconcileGrace := fs.Duration("reconcile-grace", 2*time.Minute, "age under which the leak reconcile never frees a reservation (covers an ADD in flight); a reservation of an earlier boot is freed at once")
	criSocket := fs.String("cri-socket", reconcile.DefaultCRISocket, "the container runtime's CRI socket, asked which pods are alive (empty: ask none, judge by netns alone)")
	ipamDataDirs := fs.String("ipam-data-dir", ipam.DefaultDataDir, "comma-separated podnet-ipam data directories (ipam.dataDir) whose stores the leak reconcile covers")
	procSys := fs.String("proc-sys", "/proc/sys", "the sysctl tree where live pods' host veth settings are repaired")
	netpol := fs.Bool("network-policy", envOr("NETWORK_POLICY", "false") == "true", "enforce networking.k8s.io/v1 NetworkPolicy on this node (table inet podnet-policy; needs list/watch on pods, namespaces and networkpolicies); false removes the table (env NETWORK_POLICY; conf/k8s/podnet.yaml turns it on)")
	policyLogDrops := fs.Uint64("policy-log-drops", 0, "log the new connections NetworkPolicy drops to the kernel log, at most this many a second per pod and direction, prefixed \"podnet-policy drop <namespace>/<pod> <direction>: \" (0: off)")
	explainPolicy := fs.Bool("explain-policy", false, "print which NetworkPolicies allow or refuse the flow given as arguments, SRC DST PORT[/tcp|udp|sctp], and why, then exit")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *explainPolicy {
		f, err := parseFlow(fs.Args())
		if err != nil {
			return fmt.Errorf("--explain-policy: %w", err)
		}
		restCfg, err := kubeConfig(*kubeconfig)
		if err != nil {
			return err
		}
		core, err := kube.CoreClient(restCfg)
		if err != nil {
			return err
		}
		pods, nss, pols, err := kube.PolicyListWatches(restCfg, core)
		if err != nil {
			return err
		}
		var node *nodeCheck
		if *nodeName != "" {
			// on a node (NODE_NAME is set in podnet-routed's pod): its
			// kernel table against the API objects too
			// a Node that cannot be read stops only this comparison, not
			// the explanation
			cidrs, cerr := nodePodCIDRs(core, *nodeName)
			node = &nodeCheck{name: *nodeName, podCIDRs: cidrs, check: func(rs policy.Ruleset) (string, error) {
				if cerr != nil {
					return "", cerr
				}
				return nft.Check(rs, *policyLogDrops > 0, *policyLogDrops)
			}, local: func(st *policy.State) error {
				return engine.LocalView(st, *nodeName, strings.Split(*ipamDataDirs, ","))
			}}
		}
		return explain(os.Stdout, pods, nss, pols, f, node)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (only --explain-policy takes arguments)", fs.Args())
	}
	if *cleanup {
		err := daemon.Cleanup(*stateDir)
		if derr := policyOff(*stateDir); derr != nil {
			err = errors.Join(err, derr)
		}
		if err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
		log.Info("cleanup done")
		return nil
	}

	e, err := desired.ParseEncap(*encap)
	if err != nil {
		return fmt.Errorf("--encap: %w", err)
	}
	if *nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	cidrs, err := parseCIDRs(*clusterCIDRs)
	if err != nil {
		return fmt.Errorf("--cluster-cidr: %w", err)
	}
	if len(cidrs) == 0 {
		return errors.New("--cluster-cidr (or CLUSTER_CIDR) is required: the cluster's pod CIDRs, kubeadm's --pod-network-cidr (e.g. 10.244.0.0/16); a Node whose PodCIDR lies outside them gets no route")
	}
	for _, c := range cidrs {
		if err := desired.CheckClusterCIDR(c); err != nil {
			return fmt.Errorf("--cluster-cidr: %w", err)
		}
	}
	if err := checkEncapFamilies(e, cidrs); err != nil {
		return err
	}
	masq6, err := dataplane.ParseMasqueradeIPv6(*masqueradeIPv6)
	if err != nil {
		return fmt.Errorf("--masquerade-ipv6: %w", err)
	}
	svc, err := parseCIDRs(*serviceCIDRs)
	if err != nil {
		return fmt.Errorf("--service-cidr: %w", err)
	}
	for _, sv := range svc {
		for _, c := range cidrs {
			if sv.Bits() <= c.Bits() && sv.Contains(c.Addr()) {
				return fmt.Errorf("--service-cidr %s holds the cluster CIDR %s: every Node would be refused", sv, c)
			}
		}
	}
	if *resync <= 0 {
		return errors.New("--resync-interval must be positive")
	}
	if *reconcileInterval < 0 || *reconcileGrace < 0 {
		return errors.New("--reconcile-interval and --reconcile-grace must not be negative")
	}
	var dataDirs []string
	for _, d := range strings.Split(*ipamDataDirs, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return fmt.Errorf("--ipam-data-dir %q: want an absolute path", d)
		}
		dataDirs = append(dataDirs, filepath.Clean(d))
	}
	if *criSocket != "" {
		if _, err := reconcile.SocketPath(*criSocket); err != nil {
			return fmt.Errorf("--cri-socket: %w", err)
		}
	}
	restCfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	core, err := kube.CoreClient(restCfg)
	if err != nil {
		return err
	}
	events, err := kube.CoreClient(restCfg) // a rate limiter of its own
	if err != nil {
		return err
	}
	svcLW, err := kube.ServiceCIDRsListWatch(restCfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d := daemon.New(daemon.Config{
		NodeName: *nodeName, Encap: e, CrossSubnet: *crossSubnet, ClusterCIDRs: cidrs, ServiceCIDRs: svc,
		APIServers: kube.APIServerAddrs(ctx, restCfg), Masquerade: *masquerade, MasqueradeIPv6: masq6, MTU: *mtu, StateDir: *stateDir,
		ResyncInterval: *resync, APIServerTimeout: *apiTimeout, VXLANVNI: *vni, VXLANPort: *port,
	}, kube.NodesListWatch(core), log).WithAPI(core, events, svcLW)
	if *netpol {
		pods, nss, pols, err := kube.PolicyListWatches(restCfg, core)
		if err != nil {
			return err
		}
		reg, repairs := d.Registry()
		m := engine.NewMetrics(reg, repairs)
		pev := kube.NewPolicyEvents(events, *nodeName, log)
		go pev.Run(ctx)
		eng := engine.New(engine.Config{NodeName: *nodeName, Resync: *resync, SocketPath: policysock.Path(*stateDir), ProcSys: *procSys, Events: pev,
			IPAMDataDirs: dataDirs, NodeEvent: d.NodeEvent},
			engine.ListWatches{Pods: pods, Namespaces: nss, Policies: pols}, engine.NFTWriter{W: &nft.Writer{Log: log, LogDrops: *policyLogDrops > 0, LogRate: *policyLogDrops}, Unknown: m.SetUnknownDropped, Bridge: m.SetBridgeDropped}, m, log.With("loop", "policy"))
		d.OnLocalPodCIDRs(eng.SetLocalPodCIDRs)
		d.OnNFTChange(eng.CheckNow)
		go func() {
			if err := eng.Run(ctx); err != nil {
				log.Error("NetworkPolicy engine stopped", "err", err)
				stop()
			}
		}()
	} else if err := policyOff(*stateDir); err != nil {
		return fmt.Errorf("--network-policy=false: %w", err)
	}
	if *reconcileInterval > 0 {
		reg, repairs := d.Registry()
		loop, err := reconcile.New(reconcile.Config{DataDirs: dataDirs, Interval: *reconcileInterval, Grace: *reconcileGrace,
			CRISocket: *criSocket, ProcSys: *procSys}, reconcile.NewMetrics(reg, repairs), log.With("loop", "reconcile"))
		if err != nil {
			return fmt.Errorf("leak reconcile: %w", err)
		}
		// A runtime refused or down does not make the node unready: the
		// pods' network works, and the reconcile keeps every pod whose
		// host veth is in service; /readyz and the metrics say it.
		d.ReadyDetails(loop.Status)
		go loop.Run(ctx)
	}
	for _, addr := range uniq(*healthAddr, *metricsAddr) {
		srv := &http.Server{Addr: addr, Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "addr", addr, "err", err)
				stop()
			}
		}()
		defer srv.Close()
	}
	log.Info("starting", "node", *nodeName, "encap", e, "crossSubnet", *crossSubnet, "clusterCIDRs", cidrs, "serviceCIDRs", svc)
	return d.Run(ctx)
}

// policyOff removes what the NetworkPolicy engine leaves on the node: its
// table (the node then enforces no policy) and its socket (the plugins
// then wait for nobody).
func policyOff(stateDir string) error {
	w := &nft.Writer{}
	defer w.Close()
	err := w.Delete()
	if rerr := os.Remove(policysock.Path(stateDir)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
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

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
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

func uniq(addrs ...string) []string {
	var out []string
	for _, a := range addrs {
		if a != "" && (len(out) == 0 || out[len(out)-1] != a) {
			out = append(out, a)
		}
	}
	return out
}
