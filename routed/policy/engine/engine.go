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
	"github.com/podnet/podnet/routed/policy"
)

// Writer puts a Ruleset in the kernel (NFTWriter in production).
type Writer interface {
	// Apply writes want: the whole table the first time (or when a
	// partial write fails), else what changed since the last write; one
	// transaction either way.
	Apply(want policy.Ruleset) error
	// ApplyDelta writes a change of the last Ruleset written (or
	// applied): only what d touches, in one transaction.
	ApplyDelta(d policy.Delta) error
	// Resync reads the table back and writes it whole when it differs
	// from want; it says whether it did.
	Resync(want policy.Ruleset) (repaired bool, err error)
	// DropCounters are the packets each pod chain dropped, by pod ID and
	// direction.
	DropCounters() (map[DropKey]uint64, error)
	// Revoke deletes the conntrack entries allowed says are no longer
	// allowed and returns how many.
	Revoke(allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error)
	// RevokeOf is Revoke for the connections of addrs only (as source,
	// or as destination after DNAT): no other entry is judged.
	RevokeOf(addrs []netip.Addr, allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error)
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
	// addresses (each a *corev1.Node, or what keeps them otherwise:
	// NodeFields, as desired.Record does); the engine hears it while ClusterNetworkPolicies are
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
	// Guard, when set, adds the ports of the waits that ask for it to the
	// pod filter (podnet-routed's Daemon.GuardPort).
	Guard policysock.GuardHandler
	// Unguard, when set, takes the ports DELs name out of the pod filter
	// (podnet-routed's Daemon.UnguardPort).
	Unguard policysock.UnguardHandler
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
	// RevokeGap is the least time between the starts of two conntrack
	// scans (default 200ms): changes that keep coming (pods deleted one
	// after another) make one scan per gap, not one after another, which
	// on a small node took a core from the pods starting beside them. A
	// change after a quiet gap is scanned for at once.
	RevokeGap time.Duration
	// RevokeGoneGap: the same for deleted pods' connections only (default
	// 10s): a pod that holds such an address again makes the scan urgent.
	RevokeGoneGap time.Duration
	// LoopNice is the nice value of the write loop's thread during each
	// write (0: the process's): every ADD waits for its writes, which
	// compete with the plugins and pods being started (8 ADDs at once on
	// 2 CPUs, 100 policies: a wait's mean 19 ms, 3 ms one ADD at a time).
	// The thread is locked to the loop for the write only.
	LoopNice int
	// GoneScanNice is the nice value of a conntrack scan for gone pods'
	// connections only (0: the process's): it has RevokeGoneGap to come.
	GoneScanNice int
	// Watched: the caller calls CheckNow whenever anyone else commits a
	// change to the tables, new elements included, and when it may have
	// missed one (podnet-routed's nftables monitor). The resync then
	// reads the tables back every readBackEvery-th time only.
	Watched bool
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
	// waiters are the ADD-time waits not answered yet: done answers
	// each whose generation is in the kernel, on the write loop's thread
	waiters map[*waiter]bool
	// podAdded is closed and replaced when the Pod informer adds a pod
	// (a plugin's wait for a pod the informer has not seen yet)
	podAdded chan struct{}

	mu    sync.Mutex
	state *policy.State
	// inc compiles the state change by change (every change of state
	// goes through it); written: something was written since the start
	// or the last failure (else the next write is whole); podIDs the pod
	// entries in the kernel; globals the Ruleset's own fields written
	// last; policiesChanged: refused policies to report again
	inc         *policy.Incremental
	written     bool
	everWritten bool
	podIDs      map[string]policy.PodChains
	// scanLinks and lookupLink read the node's host-side pod
	// interfaces (local.go; tests give their own)
	scanLinks  func() (map[string]portLink, error)
	lookupLink func(string) (portLink, bool)
	// heard: the host veths the link notifications told of (heard.go)
	heard heardLinks
	pols  map[string]policy.PolicyChain
	// a pending scan: urgent for a live connection (RevokeGap); all
	// connections judged, else those of revokeGone (gone pods') only
	revokeUrgent, revokeAll bool
	revokeGone              map[netip.Addr]bool
	globals                 policy.Delta
	policiesChanged         bool
	// check: the next write is followed by the cross-check of the
	// incremental compile with a whole one; mismatch: that found them
	// different, the next write is a Reset and the whole Ruleset
	check, mismatch bool
	// portsAll: the links changed, every local pod's ports are read
	// again; portsOf: the pods whose ports to read again
	portsAll  bool
	portsOf   map[string]bool
	overrides map[string]override // pod key -> addresses a plugin reported
	cidrs     []netip.Prefix
	gen       uint64 // bumped by every change
	doneGen   uint64 // the last generation in the kernel
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
	if cfg.RevokeGap <= 0 {
		cfg.RevokeGap = 200 * time.Millisecond
	}
	if cfg.RevokeGoneGap <= 0 {
		cfg.RevokeGoneGap = 10 * time.Second
	}
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
	st := policy.NewState()
	return &Engine{
		cfg: cfg, lw: lw, w: w, m: m, log: log,
		inc:         policy.NewIncremental(st, cfg.NodeName, nil),
		podIDs:      map[string]policy.PodChains{},
		scanLinks:   scanLinks,
		lookupLink:  lookupLink,
		pols:        map[string]policy.PolicyChain{},
		portsOf:     map[string]bool{},
		kick:        make(chan struct{}, 1),
		revokeKick:  make(chan struct{}, 1),
		revokeGone:  map[netip.Addr]bool{},
		checkKick:   make(chan struct{}, 1),
		now:         time.Now,
		applied:     make(chan struct{}),
		waiters:     map[*waiter]bool{},
		podAdded:    make(chan struct{}),
		state:       st,
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
	e.inc.SetLocalPodCIDRs(cidrs)
	e.changedLocked()
}

func (e *Engine) changedLocked() {
	e.gen++
	e.kickLocked()
}

// kickLocked wakes the write loop without a change (a cross-check).
func (e *Engine) kickLocked() {
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
			hs := policysock.Handlers{Guard: e.cfg.Guard, Unguard: e.cfg.Unguard, Wait: e.handleWait}
			if err := policysock.ServeHandlers(ctx, l, e.cfg.SocketTimeout, e.cfg.LoopNice, hs); err != nil {
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

// refreshLocal reads the node's host-side pod interfaces and the IPAM
// stores' holders again (at start and every resync).
func (e *Engine) refreshLocal() {
	links, err := e.scanLinks()
	if err != nil {
		e.log.Warn("cannot list the node's links: the pods' ports stay as last known", "err", err)
	}
	holders := readHolders(e.cfg.IPAMDataDirs)
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := false
	if err == nil && !maps.Equal(links, e.links) {
		e.links, e.portsAll, changed = links, true, true
	}
	holdersChanged := !maps.Equal(holders, e.storeHolders)
	if holdersChanged {
		e.storeHolders = holders
	}
	for a, at := range e.waitAt {
		if e.now().Sub(at) >= e.cfg.OverrideTTL {
			delete(e.waitAt, a)
			delete(e.waitHolders, a)
			holdersChanged = true
		}
	}
	if holdersChanged && e.inc.SetHolders(e.holdersLocked()) {
		changed = true
	}
	if changed {
		e.changedLocked()
	}
}

// sync writes what changed since the last write: the incremental
// compile's Delta in one small transaction; the whole Ruleset the first
// time, after a failed write and after a cross-check found the
// incremental compile wrong.
func (e *Engine) sync() error {
	start := e.now()
	e.mu.Lock()
	gen := e.gen
	e.localPortsLocked()
	mismatch := e.mismatch
	if mismatch {
		e.inc.Reset()
		e.mismatch = false
	}
	d := e.inc.Flush()
	d.BridgeUnfiltered = e.bridgeOff
	whole := !e.written || mismatch
	var rs policy.Ruleset
	if whole {
		rs = e.inc.Ruleset()
		rs.BridgeUnfiltered = e.bridgeOff
	}
	var refused, cRefused map[string]error
	if e.policiesChanged {
		refused, cRefused = e.state.Refused(), e.state.RefusedClusterPolicies()
		e.policiesChanged = false
	}
	cPolicies := e.state.ClusterPolicies()
	clashes := e.inc.Clashes()
	pods, chains := e.inc.Counts()
	revoke, urgent, goneAddrs := e.narrowsLocked(d)
	noop := !whole && d.Empty() && sameGlobals(e.globals, d)
	e.mu.Unlock()
	if refused != nil {
		e.report(refused)
		e.reportClusterRefused(cRefused)
	}
	e.m.ClusterPolicies.Set(float64(cPolicies))
	e.reportClashes(clashes)
	if noop {
		e.done(gen)
		e.startCheck()
		return nil
	}
	var err error
	if whole {
		err = e.w.Apply(rs)
	} else {
		err = e.w.ApplyDelta(d)
	}
	e.mu.Lock()
	if err != nil {
		e.written = false // the next write is whole
		e.mu.Unlock()
		return fmt.Errorf("write table: %w", err)
	}
	firstWrite := e.wroteLocked(d, rs, whole)
	e.mu.Unlock()
	e.m.ApplySeconds.Observe(e.now().Sub(start).Seconds())
	e.m.IsolatedPods.Set(float64(pods))
	e.m.Policies.Set(float64(chains))
	e.done(gen)
	// (the first write after the start judges nothing: the connections
	// are the previous engine's table's)
	e.askScan(revoke && !whole || whole && !firstWrite, urgent || whole, goneAddrs, d.Known)
	e.startCheck()
	return nil
}

// wroteLocked records that d (or rs, whole) is in the kernel; it says
// whether that was the first write since the start. Callers hold e.mu.
func (e *Engine) wroteLocked(d policy.Delta, rs policy.Ruleset, whole bool) (first bool) {
	first = !e.everWritten
	e.written, e.everWritten = true, true
	for _, id := range d.GonePods {
		delete(e.podIDs, id)
	}
	for _, p := range d.Pods {
		e.podIDs[p.ID] = p
	}
	for _, id := range d.GonePolicies {
		delete(e.pols, id)
	}
	for _, p := range d.Policies {
		e.pols[p.ID] = p
	}
	if whole {
		clear(e.podIDs)
		for _, p := range rs.Pods {
			e.podIDs[p.ID] = p
		}
		clear(e.pols)
		for _, p := range rs.Policies {
			e.pols[p.ID] = p
		}
	}
	e.globals = d
	return first
}

func (e *Engine) done(gen uint64) {
	e.mu.Lock()
	if gen > e.doneGen {
		e.doneGen = gen
	}
	close(e.applied)
	e.applied = make(chan struct{})
	var ready []*waiter
	for w := range e.waiters {
		if w.want <= e.doneGen {
			ready = append(ready, w)
			delete(e.waiters, w)
		}
	}
	e.mu.Unlock()
	for _, w := range ready {
		w.answer()
	}
}
