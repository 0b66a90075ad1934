// Package engine runs podnet-routed's NetworkPolicy engine: shared
// informers on Pods, Namespaces and NetworkPolicies (and, while the API
// server serves them, ClusterNetworkPolicies and Nodes: cluster.go) feed
// the pure model of package policy; every change compiles this node's Ruleset and writes it
// in one nft transaction (a diff); each resync reads the table back and
// writes it whole when someone deleted or edited it; connections a change
// no longer allows are cut from conntrack. It also answers the plugins'
// ADD-time wait on the policy socket (internal/policysock).
package engine

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/sysctl"
	"github.com/podnet/podnet/routed/policy"
)

// Writer puts a Ruleset in the kernel (NFTWriter in production).
type Writer interface {
	// Apply writes want: the whole table the first time (or when a
	// partial write fails), else what changed since the last write; one
	// transaction either way.
	Apply(want policy.Ruleset) error
	// Resync reads the table back and writes it whole when it differs
	// from want; it says whether it did.
	Resync(want policy.Ruleset) (repaired bool, err error)
	// DropCounters are the packets each pod chain dropped, by pod ID and
	// direction.
	DropCounters() (map[DropKey]uint64, error)
	// Revoke deletes the conntrack entries allowed says are no longer
	// allowed and returns how many.
	Revoke(allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error)
	// Delete removes the table.
	Delete() error
}

// DropKey names one drop counter: a pod chain's (PodID), or a Deny
// rule's of a ClusterNetworkPolicy chain (PolicyID, Rule).
type DropKey struct {
	PodID     string
	PolicyID  string
	Rule      int
	Direction policy.Direction
}

// Events posts Kubernetes Events about NetworkPolicies (kube.PolicyEvents:
// one per cluster, whichever node posts first).
type Events interface {
	Policy(namespace, name string, uid types.UID, typ, reason, message string)
}

// Event reasons: a policy the engine refuses (it isolates the pods it
// selects and allows nothing) and accepts again.
const (
	EventPolicyRefused  = "PolicyRefused"
	EventPolicyAccepted = "PolicyAccepted"
)

// ListWatches are the informers' sources (one watch each).
type ListWatches struct {
	Pods, Namespaces, Policies cache.ListerWatcher
	// ClusterPolicies lists and watches ClusterNetworkPolicies
	// (policy.networking.k8s.io/v1beta1; kube.ClusterPolicyListWatch);
	// nil: the engine enforces none. ClusterPoliciesServed says whether
	// the API server serves them (their CRD is installed); nil: always.
	// NodeInformer is a Node informer someone else runs (podnet-routed's
	// daemon: one watch per resource), with the Nodes' labels and
	// addresses; the engine hears it while ClusterNetworkPolicies are
	// watched, for their nodes peers. Without it, Nodes lists and watches
	// Nodes for the same, an informer of the engine's own (nil both: a
	// nodes peer matches no node).
	ClusterPolicies       cache.ListerWatcher
	ClusterPoliciesServed func(context.Context) (bool, error)
	NodeInformer          cache.SharedIndexInformer
	Nodes                 cache.ListerWatcher
}

// Config is the engine's configuration.
type Config struct {
	NodeName string
	// Resync is the period of the read-back and repair of the table.
	Resync time.Duration
	// SocketPath is where the plugins' ADD-time wait connects ("": none).
	SocketPath string
	// SocketTimeout bounds one wait on the engine's side.
	SocketTimeout time.Duration
	// OverrideTTL is how long an address a plugin reported counts while
	// the Pod object does not show it yet.
	OverrideTTL time.Duration
	// Events, when set, gets a Warning Event for each policy refused and a
	// Normal one when it is accepted again (the log and the
	// podnet_policy_refused gauge say it in any case).
	Events Events
	// ClusterEvents is the same for ClusterNetworkPolicies refused in
	// part (podnet_policy_cluster_refused).
	ClusterEvents ClusterEvents
	// ClusterPolicyPoll is how often the engine asks discovery whether
	// ClusterNetworkPolicies are served (default 5s).
	ClusterPolicyPoll time.Duration
	// ProcSys is the node's sysctl tree ("": /proc/sys), where the engine
	// keeps bridge-nf-call-iptables/ip6tables on: podnet-bridge's pods on
	// one node talk through the bridge, and only br_netfilter shows that
	// traffic to the inet hooks of the table.
	ProcSys string
	// IPAMDataDirs are the podnet-ipam data directories whose stores say
	// which pod holds each of the node's addresses (local.go).
	IPAMDataDirs []string
	// NodeEvent, when set, posts an Event on this node's Node (bridged
	// traffic that cannot be filtered, and so is dropped).
	NodeEvent func(typ, reason, message string)
}

// EventBridgeUnfiltered is the reason of the Node Event that says bridged
// pod traffic is dropped because br_netfilter cannot be turned on.
const EventBridgeUnfiltered = "BridgeNetfilterOff"

// Engine is one node's NetworkPolicy engine.
type Engine struct {
	cfg    Config
	lw     ListWatches
	w      Writer
	m      *Metrics
	log    *slog.Logger
	podInf cache.SharedIndexInformer
	polInf cache.SharedIndexInformer
	kick   chan struct{}
	// revokeKick asks the revoker for a conntrack scan (capacity 1);
	// checkKick asks for the table's read-back and repair now
	revokeKick chan struct{}
	checkKick  chan struct{}
	now        func() time.Time
	applied    chan struct{} // closed and replaced after each successful write

	mu        sync.Mutex
	state     *policy.State
	overrides map[string]override // pod key -> addresses a plugin reported
	cidrs     []netip.Prefix
	gen       uint64 // bumped by every change
	doneGen   uint64 // the last generation in the kernel
	last      *policy.Ruleset
	refused   map[string]string
	// links are the node's host-side pod interfaces (local.go), vethNames
	// the names derived from Pod objects (a cache), storeHolders and
	// waitHolders who holds each address by the IPAM stores and by the
	// plugins' waits since.
	links        map[string]portLink
	vethNames    map[string]string
	storeHolders map[netip.Addr]string
	waitHolders  map[netip.Addr]string
	waitAt       map[netip.Addr]time.Time
	// clashes are the address clashes last reported (address -> text)
	clashes map[netip.Addr]string

	// bridgeOff: br_netfilter cannot be turned on, bridged pod traffic is
	// dropped (Ruleset.BridgeUnfiltered); sysctlsSet: bridgeNetfilter ran
	// once (what it sets later is a repair)
	bridgeOff  bool
	sysctlsSet bool

	// cluster is the cluster tier's informers and what they gave the
	// State (cluster.go)
	cluster clusterTier
}

// New builds an engine; Run starts it.
func New(cfg Config, lw ListWatches, w Writer, m *Metrics, log *slog.Logger) *Engine {
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.SocketTimeout <= 0 {
		cfg.SocketTimeout = 3 * time.Second
	}
	if cfg.OverrideTTL <= 0 {
		cfg.OverrideTTL = 2 * time.Minute
	}
	if cfg.ClusterPolicyPoll <= 0 {
		cfg.ClusterPolicyPoll = 5 * time.Second
	}
	return &Engine{
		cfg: cfg, lw: lw, w: w, m: m, log: log,
		kick:        make(chan struct{}, 1),
		revokeKick:  make(chan struct{}, 1),
		checkKick:   make(chan struct{}, 1),
		now:         time.Now,
		applied:     make(chan struct{}),
		state:       policy.NewState(),
		overrides:   map[string]override{},
		refused:     map[string]string{},
		links:       map[string]portLink{},
		vethNames:   map[string]string{},
		waitHolders: map[netip.Addr]string{},
		waitAt:      map[netip.Addr]time.Time{},
		clashes:     map[netip.Addr]string{},
		cluster:     clusterTier{uids: map[string]types.UID{}, nodes: map[string]bool{}, refused: map[string]string{}},
	}
}

// SetLocalPodCIDRs tells the engine this node's PodCIDRs (the daemon calls
// it whenever its own Node changes).
func (e *Engine) SetLocalPodCIDRs(cidrs []netip.Prefix) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if slices.Equal(e.cidrs, cidrs) {
		return
	}
	e.cidrs = slices.Clone(cidrs)
	e.changedLocked()
}

func (e *Engine) changedLocked() {
	e.gen++
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Run watches, compiles and writes until ctx ends. The table stays in the
// kernel when it returns: a restarting engine keeps enforcing.
func (e *Engine) Run(ctx context.Context) error {
	e.podInf = cache.NewSharedIndexInformer(e.lw.Pods, &corev1.Pod{}, 0, cache.Indexers{})
	if err := e.podInf.SetTransform(stripPod); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	nsInf := cache.NewSharedIndexInformer(e.lw.Namespaces, &corev1.Namespace{}, 0, cache.Indexers{})
	polInf := cache.NewSharedIndexInformer(e.lw.Policies, &networkingv1.NetworkPolicy{}, 0, cache.Indexers{})
	e.polInf = polInf
	if err := nsInf.SetTransform(stripMeta); err != nil {
		return fmt.Errorf("namespace informer: %w", err)
	}
	if err := polInf.SetTransform(stripMeta); err != nil {
		return fmt.Errorf("policy informer: %w", err)
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandlerFuncs
	}{
		{e.podInf, cache.ResourceEventHandlerFuncs{AddFunc: e.onPod, UpdateFunc: e.onPodUpdate, DeleteFunc: e.onPodDelete}},
		{nsInf, cache.ResourceEventHandlerFuncs{AddFunc: e.onNamespace, UpdateFunc: func(_, o any) { e.onNamespace(o) }, DeleteFunc: e.onNamespaceDelete}},
		{polInf, cache.ResourceEventHandlerFuncs{AddFunc: e.onPolicy, UpdateFunc: func(_, o any) { e.onPolicy(o) }, DeleteFunc: e.onPolicyDelete}},
	}
	for _, x := range handlers {
		if _, err := x.inf.AddEventHandler(x.h); err != nil {
			return fmt.Errorf("informer handler: %w", err)
		}
		go x.inf.Run(ctx.Done())
	}
	if e.cfg.SocketPath != "" {
		l, err := policysock.Listen(e.cfg.SocketPath)
		if err != nil {
			return err
		}
		go func() {
			if err := policysock.Serve(ctx, l, e.cfg.SocketTimeout, e.handleWait); err != nil {
				e.log.Error("policy socket", "err", err)
			}
		}()
	}
	synced := map[string]cache.InformerSynced{"Pods": e.podInf.HasSynced, "Namespaces": nsInf.HasSynced, "NetworkPolicies": polInf.HasSynced}
	clusterSynced, err := e.startCluster(ctx, func() bool {
		return e.podInf.HasSynced() && nsInf.HasSynced() && polInf.HasSynced()
	})
	if err != nil {
		return err
	}
	if clusterSynced != nil {
		synced["ClusterNetworkPolicies and Nodes"] = clusterSynced
	}
	if !e.waitSynced(ctx, synced) {
		return ctx.Err()
	}
	e.log.Info("NetworkPolicy engine synced")
	e.bridgeNetfilter()
	e.refreshLocal()
	return e.loop(ctx)
}

// loop writes each change as it comes. Every resync, beside it, the
// table is read back (and written whole when someone changed it), the
// drop counters are read and stale overrides pruned: a change never
// waits for that reading.
func (e *Engine) loop(ctx context.Context) error {
	t := time.NewTicker(e.cfg.Resync)
	defer t.Stop()
	var periodic sync.WaitGroup
	defer periodic.Wait()
	periodic.Go(func() { e.revoker(ctx) })
	busy := false
	periodicDone := make(chan struct{}, 1)
	for {
		if err := e.sync(); err != nil {
			e.m.Errors.Inc()
			e.log.Error("NetworkPolicy write failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-e.kick:
		case <-periodicDone:
			busy = false
		case <-e.checkKick:
			if busy {
				continue // one is reading: it sees the change, or the next does
			}
			busy = true
			periodic.Go(func() {
				e.resync()
				periodicDone <- struct{}{}
			})
		case <-t.C:
			if busy {
				continue // the last one is still reading: skip this tick
			}
			busy = true
			periodic.Go(func() {
				e.bridgeNetfilter()
				e.refreshLocal()
				e.resync()
				e.readCounters()
				e.pruneOverrides()
				periodicDone <- struct{}{}
			})
		}
	}
}

// CheckNow asks for the table's read-back (and repair) at once, beside
// the write loop: the daemon calls it when the kernel notifies a change
// of the engine's tables. It never blocks.
func (e *Engine) CheckNow() {
	select {
	case e.checkKick <- struct{}{}:
	default:
	}
}

// bridgeNetfilter keeps bridged IPv4 and IPv6 traffic going through the
// inet hooks (kubeadm's preflight wants the same settings).
//
// Where they cannot be turned on (no br_netfilter module, a read-only
// /proc/sys), bridged traffic would skip the policy table: the engine then
// fails closed, the bridge table drops IP between two pod ports
// (Ruleset.BridgeUnfiltered), the podnet_policy_bridge_unfiltered gauge is
// 1, and the node gets a Warning Event. Traffic through the node (to other
// nodes, to the node itself) is routed and still judged.
func (e *Engine) bridgeNetfilter() {
	w := sysctl.Writer{Root: e.cfg.ProcSys, Log: e.log}
	changed, failed := w.Set([]sysctl.Setting{
		{Name: "net/bridge/bridge-nf-call-iptables", Value: "1"},
		{Name: "net/bridge/bridge-nf-call-ip6tables", Value: "1"},
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(changed) > 0 && e.sysctlsSet {
		e.m.Repairs.Add(float64(len(changed))) // someone turned them off
	}
	e.sysctlsSet = true
	off := len(failed) > 0
	if off == e.bridgeOff {
		return
	}
	e.bridgeOff = off
	e.m.BridgeUnfiltered.Set(map[bool]float64{false: 0, true: 1}[off])
	e.changedLocked()
	if !off {
		e.log.Info("bridge netfilter is on again: bridged pod traffic is judged by policy again")
		return
	}
	e.log.Error("cannot turn bridge netfilter on (is br_netfilter loaded?): IP between podnet-bridge pods of this node is dropped until it is", "err", failed[0])
	if e.cfg.NodeEvent != nil {
		e.cfg.NodeEvent(corev1.EventTypeWarning, EventBridgeUnfiltered,
			"bridge netfilter (br_netfilter, net.bridge.bridge-nf-call-iptables/ip6tables) cannot be turned on: IP traffic between podnet-bridge pods of this node is dropped, since NetworkPolicy could not judge it: "+failed[0].Error())
	}
}

// refreshLocal reads the node's host-side pod interfaces and the IPAM
// stores' holders again (at start and every resync).
func (e *Engine) refreshLocal() {
	links, err := scanLinks()
	if err != nil {
		e.log.Warn("cannot list the node's links: the pods' ports stay as last known", "err", err)
	}
	holders := readHolders(e.cfg.IPAMDataDirs)
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := false
	if err == nil && !maps.Equal(links, e.links) {
		e.links, changed = links, true
	}
	if !maps.Equal(holders, e.storeHolders) {
		e.storeHolders, changed = holders, true
	}
	for a, at := range e.waitAt {
		if e.now().Sub(at) >= e.cfg.OverrideTTL {
			delete(e.waitAt, a)
			delete(e.waitHolders, a)
			changed = true
		}
	}
	if changed {
		e.changedLocked()
	}
}

// resync repairs the table from the last Ruleset written.
func (e *Engine) resync() {
	e.mu.Lock()
	last := e.last
	e.mu.Unlock()
	if last == nil {
		return
	}
	repaired, err := e.w.Resync(*last)
	if err != nil {
		e.m.Errors.Inc()
		e.log.Warn("NetworkPolicy table resync failed", "err", err)
		return
	}
	if repaired {
		e.m.Repairs.Inc()
		e.log.Warn("NetworkPolicy table was changed behind podnet-routed's back: written whole again")
	}
}

// sync compiles the current state and writes what changed.
func (e *Engine) sync() error {
	start := e.now()
	e.mu.Lock()
	gen := e.gen
	e.state.SetLocalPorts(e.localPortsLocked())
	e.state.SetHolders(e.holdersLocked())
	rs := e.state.Compile(e.cfg.NodeName, e.cidrs)
	rs.BridgeUnfiltered = e.bridgeOff
	prev := e.last
	refused := e.state.Refused()
	clashes := e.state.Clashes()
	cRefused, cPolicies := e.state.RefusedClusterPolicies(), e.state.ClusterPolicies()
	e.mu.Unlock()
	e.report(refused)
	e.reportClusterRefused(cRefused)
	e.m.ClusterPolicies.Set(float64(cPolicies))
	e.reportClashes(clashes)
	if prev != nil && prev.Equal(rs) {
		e.done(gen, prev)
		return nil
	}
	if err := e.w.Apply(rs); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	e.m.ApplySeconds.Observe(e.now().Sub(start).Seconds())
	e.m.IsolatedPods.Set(float64(len(rs.Pods)))
	e.m.Policies.Set(float64(len(rs.Policies)))
	e.done(gen, &rs)
	// a change of which addresses are known only adds or removes whole
	// pods; what a connection may do changes only with the chains
	if prev != nil && !prev.ChainsEqual(rs) {
		select {
		case e.revokeKick <- struct{}{}:
		default: // one is pending: it will judge by the newest Ruleset
		}
	}
	return nil
}

// revoker deletes the conntrack entries of the connections the Ruleset in
// the kernel no longer allows, after each change of the chains, beside
// the write loop: the conntrack table's scan (tens of milliseconds with
// many connections) never delays the next change, nor a new pod's ADD.
// Changes that come during a scan make one more scan, by the newest
// Ruleset (e.last, what the kernel holds).
func (e *Engine) revoker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.revokeKick:
		}
		e.mu.Lock()
		rs := e.last
		e.mu.Unlock()
		if rs == nil {
			continue
		}
		n, err := e.w.Revoke(policy.NewMatcher(*rs).Allows)
		if err != nil {
			e.log.Warn("cannot revoke the connections the new policy refuses", "err", err)
		}
		e.m.Revoked.Add(float64(n))
		if n > 0 {
			e.log.Info("connections revoked", "count", n)
		}
	}
}

func (e *Engine) done(gen uint64, rs *policy.Ruleset) {
	e.mu.Lock()
	e.last = rs
	if gen > e.doneGen {
		e.doneGen = gen
	}
	close(e.applied)
	e.applied = make(chan struct{})
	e.mu.Unlock()
}
