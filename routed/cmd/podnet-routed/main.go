// Command podnet-routed is podnet's node daemon: it watches the cluster's
// Nodes and routes every remote node's PodCIDR over tunl0 (IPIP), the
// podnet.vxlan device or directly, masquerades outbound pod traffic and
// publishes the node's PodCIDR and MTU for the CNI plugins.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/routed/daemon"
	"github.com/podnet/podnet/routed/kube"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/engine"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/routed/reconcile"
)

// goneScanNice is the nice value of the NetworkPolicy engine's conntrack
// scans for gone pods' connections only: they have seconds to come, the
// pods being started do not.
const goneScanNice = 10

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "podnet-routed:", err)
		os.Exit(1)
	}
}

func run(argv []string) error {
	o, err := parseFlags(argv)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	switch {
	case o.explainPolicy:
		return explainPolicy(o)
	case len(o.args) > 0:
		return fmt.Errorf("unexpected arguments %q (only --explain-policy takes arguments)", o.args)
	case o.cleanup:
		return cleanup(o.stateDir, log)
	}
	cfg, err := o.daemonConfig()
	if err != nil {
		return err
	}
	dataDirs, err := o.reconcileDirs()
	if err != nil {
		return err
	}
	cl, err := newClients(o.kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg.APIServers = kube.APIServerAddrs(ctx, cl.rest)
	d := daemon.New(cfg, kube.NodesListWatch(cl.core), log).WithAPI(cl.core, cl.events, cl.serviceCIDRs)
	if p, ok := o.gcPercentToSet(); ok {
		// the initial sync decodes and routes every Node in one burst of
		// garbage, at Go's default
		d.AfterInitialSync(func() { debug.SetGCPercent(p) })
	}
	if o.netpol {
		if err := startPolicy(ctx, stop, o, cl, d, dataDirs, log); err != nil {
			return err
		}
	} else if err := policyOff(o.stateDir); err != nil {
		return fmt.Errorf("--network-policy=false: %w", err)
	}
	if o.reconcileInterval > 0 {
		if err := startReconcile(ctx, o, d, dataDirs, log); err != nil {
			return err
		}
	}
	for _, srv := range serveHTTP(d.Handler(), stop, log, o.healthAddr, o.metricsAddr) {
		defer srv.Close()
	}
	log.Info("starting", "node", cfg.NodeName, "encap", cfg.Encap, "crossSubnet", cfg.CrossSubnet, "clusterCIDRs", cfg.ClusterCIDRs, "serviceCIDRs", cfg.ServiceCIDRs)
	return d.Run(ctx)
}

// explainPolicy is --explain-policy: which NetworkPolicies allow or
// refuse the flow of the arguments, and, on a node, whether its kernel
// table agrees.
func explainPolicy(o *options) error {
	f, err := parseFlow(o.args)
	if err != nil {
		return fmt.Errorf("--explain-policy: %w", err)
	}
	restCfg, err := kubeConfig(o.kubeconfig)
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
	if o.nodeName != "" {
		// on a node (NODE_NAME is set in podnet-routed's pod): its
		// kernel table against the API objects too
		// a Node that cannot be read stops only this comparison, not
		// the explanation
		cidrs, cerr := nodePodCIDRs(core, o.nodeName)
		node = &nodeCheck{name: o.nodeName, podCIDRs: cidrs, check: func(rs policy.Ruleset) (string, error) {
			if cerr != nil {
				return "", cerr
			}
			return nft.Check(rs, o.policyLogDrops > 0, o.policyLogDrops)
		}, local: func(st *policy.State) error {
			return engine.LocalView(st, o.nodeName, strings.Split(o.ipamDataDirs, ","))
		}}
	}
	cnps, served, err := kube.ClusterPolicyListWatch(restCfg)
	if err != nil {
		return err
	}
	nodes := cache.NewListWatchFromClient(core, "nodes", metav1.NamespaceAll, fields.Everything())
	return explain(os.Stdout, pods, nss, pols, f, node, &clusterLists{policies: cnps, nodes: nodes, served: served})
}

// cleanup is --cleanup: everything podnet-routed and its NetworkPolicy
// engine left on the node goes.
func cleanup(stateDir string, log *slog.Logger) error {
	err := daemon.Cleanup(stateDir)
	if derr := policyOff(stateDir); derr != nil {
		err = errors.Join(err, derr)
	}
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	log.Info("cleanup done")
	return nil
}

// clients are podnet-routed's ways to the API server.
type clients struct {
	rest *rest.Config
	// core lists and watches; events posts Events, through a rate
	// limiter of its own
	core, events rest.Interface
	serviceCIDRs cache.ListerWatcher
}

func newClients(kubeconfig string) (*clients, error) {
	restCfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	core, err := kube.CoreClient(restCfg)
	if err != nil {
		return nil, err
	}
	events, err := kube.CoreClient(restCfg) // a rate limiter of its own
	if err != nil {
		return nil, err
	}
	svcLW, err := kube.ServiceCIDRsListWatch(restCfg)
	if err != nil {
		return nil, err
	}
	return &clients{rest: restCfg, core: core, events: events, serviceCIDRs: svcLW}, nil
}

// startPolicy starts the NetworkPolicy engine beside d; its failure stops
// podnet-routed (stop).
func startPolicy(ctx context.Context, stop func(), o *options, cl *clients, d *daemon.Daemon, dataDirs []string, log *slog.Logger) error {
	pods, nss, pols, err := kube.PolicyListWatches(cl.rest, cl.core)
	if err != nil {
		return err
	}
	// ClusterNetworkPolicies: watched (with Nodes, for their nodes
	// peers) while the API server serves them, found by discovery
	cnps, cnpServed, err := kube.ClusterPolicyListWatch(cl.rest)
	if err != nil {
		return err
	}
	// the engine hears the daemon's Node informer (with the labels) for
	// ClusterNetworkPolicy's nodes peers: one watch on Nodes
	nodeInf, err := d.WithNodeLabels().NodeInformer()
	if err != nil {
		return err
	}
	reg, repairs := d.Registry()
	m := engine.NewMetrics(reg, repairs)
	pev := kube.NewPolicyEvents(cl.events, o.nodeName, log)
	go pev.Run(ctx)
	eng := engine.New(engine.Config{NodeName: o.nodeName, Resync: o.resync, SocketPath: policysock.Path(o.stateDir), ProcSys: o.procSys, Events: pev,
		ClusterEvents: pev, IPAMDataDirs: dataDirs, NodeEvent: d.NodeEvent, LoopNice: o.policyNice, GoneScanNice: goneScanNice, Watched: true,
		Guard: d.GuardPort, Unguard: d.UnguardPort},
		engine.ListWatches{Pods: pods, Namespaces: nss, Policies: pols,
			ClusterPolicies: cnps, ClusterPoliciesServed: cnpServed, NodeInformer: nodeInf},
		engine.NFTWriter{W: &nft.Writer{Log: log, LogDrops: o.policyLogDrops > 0, LogRate: o.policyLogDrops, Nice: o.policyNice}, Unknown: m.SetUnknownDropped, Bridge: m.SetBridgeDropped, CT: &nft.Conntrack{}}, m, log.With("loop", "policy"))
	d.OnLocalPodCIDRs(eng.SetLocalPodCIDRs)
	d.OnNFTChange(eng.CheckNow)
	d.OnHostVeth(eng)
	go func() {
		if err := eng.Run(ctx); err != nil {
			log.Error("NetworkPolicy engine stopped", "err", err)
			stop()
		}
	}()
	return nil
}

// startReconcile starts the leak reconcile beside d.
func startReconcile(ctx context.Context, o *options, d *daemon.Daemon, dataDirs []string, log *slog.Logger) error {
	reg, repairs := d.Registry()
	loop, err := reconcile.New(reconcile.Config{DataDirs: dataDirs, Interval: o.reconcileInterval, Grace: o.reconcileGrace,
		CRISocket: o.criSocket, ProcSys: o.procSys, HoldNice: o.policyNice}, reconcile.NewMetrics(reg, repairs), log.With("loop", "reconcile"))
	if err != nil {
		return fmt.Errorf("leak reconcile: %w", err)
	}
	// A runtime refused or down does not make the node unready: the
	// pods' network works, and the reconcile keeps every pod whose
	// host veth is in service; /readyz and the metrics say it.
	d.ReadyDetails(loop.Status)
	go loop.Run(ctx)
	return nil
}

// serveHTTP serves h on each of addrs (once each, none when empty); a
// server that fails stops podnet-routed (stop). The caller closes the
// servers returned.
func serveHTTP(h http.Handler, stop func(), log *slog.Logger, addrs ...string) []*http.Server {
	var out []*http.Server
	for _, addr := range uniq(addrs...) {
		srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "addr", addr, "err", err)
				stop()
			}
		}()
		out = append(out, srv)
	}
	return out
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

func uniq(addrs ...string) []string {
	var out []string
	for _, a := range addrs {
		if a != "" && (len(out) == 0 || out[len(out)-1] != a) {
			out = append(out, a)
		}
	}
	return out
}
