// Package daemon is podnet-routed's control loop: a client-go informer on
// Nodes feeds the desired state, which is applied to the kernel on every
// change, on every deletion of a podnet route (repair), and periodically
// (resync and prune).
//
// daemon.go is the loop and its apply; informer.go the Node informer,
// trigger.go the reasons to apply, netwatch.go and nftmonitor.go the
// kernel's notifications, apiserver.go the API server's reachability and
// ServiceCIDRs, refusals.go what is said of refused Nodes, repair.go the
// repairs counted, nodestate.go node.json, metrics.go and http.go what is
// served. The Kubernetes client side is package routed/kube.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/kube"
)

// Config is the daemon's configuration (from flags).
type Config struct {
	NodeName     string
	Encap        desired.Encap
	CrossSubnet  bool
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are the service ranges from the flag; the ServiceCIDR
	// objects of the API add theirs where they can be read.
	ServiceCIDRs []netip.Prefix
	// APIServers are the addresses this node reaches the API server at:
	// no PodCIDR may hold one.
	APIServers []netip.Addr
	Masquerade bool
	// MasqueradeIPv6 narrows Masquerade for IPv6 PodCIDRs
	// (--masquerade-ipv6; "" is auto).
	MasqueradeIPv6 dataplane.MasqueradeIPv6
	MTU            int
	StateDir       string
	ResyncInterval time.Duration
	// APIServerTimeout is how long the API server may be out of reach
	// before /readyz says so (0: never).
	APIServerTimeout time.Duration
	VXLANVNI         int
	VXLANPort        int
	// GuardNice is the nice value of the thread that writes a port a
	// plugin asks to have guarded (GuardPort; 0: the process's): the
	// plugin waits for it, and a writer preempted while it holds the
	// netns's nftables commit lock holds up every other one.
	GuardNice int
}

// Daemon reconciles the node's dataplane with the Nodes of the cluster.
type Daemon struct {
	cfg     Config
	nodesLW cache.ListerWatcher
	// nodeInf is the Node informer (NodeInformer), made once;
	// nodeLabels: it keeps the Nodes' labels too (WithNodeLabels)
	nodeInf     cache.SharedIndexInformer
	nodeInfErr  error
	nodeInfOnce sync.Once
	nodeLabels  bool
	// serviceCIDRsLW lists and watches ServiceCIDR objects (nil: the flag
	// alone); events posts Events about refused Nodes (nil: none)
	serviceCIDRsLW cache.ListerWatcher
	events         *kube.EventSink
	log            *slog.Logger
	dp             *dataplane.Netlink
	table          dataplane.Table
	routes         dataplane.RouteCache
	vxlanRec       dataplane.VXLANRecord // what was written to podnet.vxlan
	metrics        *Metrics
	kick           chan struct{}
	refusals       *refusals
	familyNotes    *familyNotes

	// plan is the desired state of the last full apply, kept per Node: a
	// Node event patches it and applies the difference. nil: the next
	// event computes everything (nothing applied yet, the last apply
	// failed).
	plan *desired.Plan
	// dirty holds the names of the Nodes changed since the last apply,
	// pending the strongest other reason to apply (a repair, a link
	// change) since then: one kick may stand for several.
	dirtyMu sync.Mutex
	dirty   map[string]struct{}
	pending reason

	// service ranges read from ServiceCIDR objects
	svcMu      sync.Mutex
	svcFromAPI []netip.Prefix

	synced      atomic.Bool
	lastApplyOK atomic.Bool
	// routesIncomplete: the last apply left something unwritten (own or
	// remote): a link coming up may let it be written (linkWatch)
	routesIncomplete atomic.Bool
	// freedAt is when a full apply last gave the heap's garbage back to
	// the OS (reconcile's goroutine only)
	freedAt time.Time
	// selfProblem says why this node's own Node cannot be used ("": it
	// can); readyz reports it
	selfProblem atomic.Value
	// the API server: when a watch event or list last arrived, and since
	// when it has failed (0: it has not)
	lastEvent, lastContact atomic.Int64
	unreachableSince       atomic.Int64
	core                   rest.Interface
	lastState              nodestate.State
	// lastSelf is this node as the last valid view had it: routes to the
	// other Nodes keep converging through its underlay while this
	// node's own Node is bad or gone
	lastSelf *desired.Node
	// onSelf, when set, hears this node's PodCIDRs after each valid view
	// (the NetworkPolicy engine's LocalPodCIDRs).
	onSelf  func([]netip.Prefix)
	repairs repairState
	// readyDetails, when set, adds lines to /readyz's answer.
	readyDetails func() []string
	// afterInitialSync, when set, is called once the first full apply
	// returned (podnet-routed's --gc-percent)
	afterInitialSync func()

	// the pod filter's repair (repair.go): one at a time (the resync and
	// the nftables monitor), and the refused records already logged
	podFilterMu      sync.Mutex
	podFilterRefused map[string]bool
	// podFilterConn is repairPodFilter's lasting nftables socket (under
	// podFilterMu): a socket closed after each check would hold every
	// nftables writer of the node up (see podfilter.Guard.RepairOn).
	podFilterConn nftutil.Conn
	// the ports plugins ask podnet-routed to guard (guard.go): one write
	// at a time (guardMu) on one lasting socket, of the ports queued
	// (guardQ, under guardQMu) until then
	guardMu   sync.Mutex
	guardConn nftutil.Conn
	guardQMu  sync.Mutex
	guardQ    []*guardReq
	// onNFTChange, when set, hears (debounced) that someone else changed
	// an nftables table podnet owns (nftmonitor.go)
	onNFTChange []func()
	// hostVeths, when set, hear the link notifications of host veths,
	// and that some may have been lost (netwatch.go)
	hostVeths []HostVethObserver
}

// New builds a daemon that lists and watches Nodes through nodes (see
// kube.NodesListWatch).
func New(cfg Config, nodes cache.ListerWatcher, log *slog.Logger) *Daemon {
	d := &Daemon{
		cfg:       cfg,
		nodesLW:   nodes,
		log:       log,
		dp:        &dataplane.Netlink{Encap: cfg.Encap, VNI: cfg.VXLANVNI, Port: cfg.VXLANPort, MTU: cfg.MTU, Log: log},
		table:     dataplane.Table{Log: log},
		metrics:   NewMetrics(),
		kick:      make(chan struct{}, 1),
		guardConn: newGuardConn(), podFilterConn: newPodFilterConn(),
	}
	d.selfProblem.Store("")
	d.metrics.contactAge = d.contactAge
	d.metrics.unreachableFor = d.unreachableFor
	d.metrics.TunnelDropped = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "podnet_tunnel_dropped_total",
		Help: "Encapsulated packets dropped: not from a Node, from a pod, or carrying a forged or transit inner packet (nft counter tunnel_dropped)."},
		tunnelDropped(&d.table))
	d.metrics.Registry.MustRegister(d.metrics.TunnelDropped)
	return d
}

// OnLocalPodCIDRs calls f with this node's PodCIDRs after each valid view
// of its own Node. Set it before Run.
func (d *Daemon) OnLocalPodCIDRs(f func([]netip.Prefix)) *Daemon {
	d.onSelf = f
	return d
}

// AfterInitialSync calls f once, when the first full apply (every Node
// decoded and routed) has returned. Set it before Run.
func (d *Daemon) AfterInitialSync(f func()) *Daemon {
	d.afterInitialSync = f
	return d
}

// WithAPI makes the daemon probe the API server through core when its
// watch is quiet, post Events about the Nodes it refuses through events
// (kube.CoreClient, each with a rate limiter of its own, so that a burst of
// Events never delays a Node list or watch) and read the cluster's
// service ranges from ServiceCIDR objects through serviceCIDRs
// (kube.ServiceCIDRsListWatch; nil: the flag alone).
func (d *Daemon) WithAPI(core, events rest.Interface, serviceCIDRs cache.ListerWatcher) *Daemon {
	d.core = core
	if events != nil {
		d.events = kube.NewEventSink(events, d.cfg.NodeName, d.log)
	}
	d.serviceCIDRsLW = serviceCIDRs
	return d
}

// Run watches Nodes and reconciles until ctx ends. Routes stay in place
// when it returns.
func (d *Daemon) Run(ctx context.Context) error {
	if d.cfg.Encap == desired.IPIP {
		if err := dataplane.CheckIPIP(); err != nil {
			return err
		}
	}
	d.refusals = newRefusals(d.cfg.NodeName, d.log, d.events, func(r desired.Reason, n int) {
		d.metrics.NodesRefused.WithLabelValues(string(r)).Set(float64(n))
	})
	d.familyNotes = newFamilyNotes(d.refusals, func(n int) { d.metrics.FamilyMissing.Set(float64(n)) })
	if d.events != nil {
		go d.events.Run(ctx)
	}
	if d.core != nil && d.cfg.APIServerTimeout > 0 {
		go d.probeAPI(ctx, d.core)
	}
	if err := d.watchServiceCIDRs(ctx); err != nil {
		return err
	}
	nodes, err := d.syncNodes(ctx)
	if err != nil {
		return err
	}
	// subscribed before the first apply: its own notifications must find
	// the subscription there, or the cache would be dropped right after
	routesWatched, linksWatched := make(chan struct{}), make(chan struct{})
	go d.watchRoutes(ctx, routesWatched)
	go d.watchLinks(ctx, linksWatched)
	<-routesWatched
	<-linksWatched
	go d.watchNFT(ctx)

	resync := time.NewTicker(d.cfg.ResyncInterval)
	defer resync.Stop()
	// The first apply, like every resync, reads the table and every Node
	// again: it covers whatever was recorded before it began (the
	// ServiceCIDR informer's first list always is), which would
	// otherwise make a second full apply right after it.
	d.takePending()
	d.reconcile(nodes, reasonInitialSync)
	if d.afterInitialSync != nil {
		d.afterInitialSync()
	}
	for {
		select {
		case <-ctx.Done():
			d.log.Info("stopping; routes stay in place")
			return nil
		case <-d.kick:
			if why := d.takePending(); why != reasonNone {
				d.reconcile(nodes, why)
			}
		case <-resync.C:
			d.takePending()
			d.reconcile(nodes, reasonResync)
		}
	}
}

// reconcile computes the desired state from the Nodes and applies it.
// A failure that concerns one remote Node (its route cannot be written)
// is logged and counted, and retried by the next full apply, but leaves
// the node ready: only this node's own part (its devices, blackhole and
// node.json) decides readiness.
func (d *Daemon) reconcile(nodes nodeStore, why reason) {
	start := time.Now()
	var own, remote error
	if why == reasonNode {
		own, remote = d.applyNodes(nodes)
	} else {
		own, remote = d.apply(nodes, why)
	}
	d.metrics.ApplySeconds.Observe(time.Since(start).Seconds())
	if own != nil || remote != nil {
		d.metrics.Errors.Inc()
	}
	d.routesIncomplete.Store(own != nil || remote != nil)
	if remote != nil {
		d.log.Error("some routes could not be applied; retried on the next resync", "trigger", why, "err", remote)
	}
	if own != nil {
		d.lastApplyOK.Store(false)
		d.log.Error("apply failed", "trigger", why, "err", own)
		return
	}
	d.lastApplyOK.Store(true)
	if now := time.Now(); freeAfter(why, d.freedAt, now) {
		debug.FreeOSMemory()
		d.freedAt = now
	}
}

// freeGap is the least time between two full applies that give the
// heap's garbage back to the OS.
const freeGap = 30 * time.Second

// freeAfter tells whether the full apply just done (why; the last one
// that freed was at last) gives the heap's garbage back to the OS. A full
// apply (the initial sync above all: the whole Node list decoded) leaves
// garbage of the cluster's size behind, and Node events allocate next to
// nothing: given back at once, it is not kept resident. But that is a
// whole collection, forced (tens of milliseconds of CPU with the
// NetworkPolicy engine's state of 1,000 policies), and link changes come
// seconds apart on a node whose other interfaces come and go (another
// runtime's containers, a second CNI's pods: each up and each delete is a
// full apply): after the initial sync, at most once every freeGap.
func freeAfter(why reason, last, now time.Time) bool {
	switch {
	case why == reasonNode || why == reasonNone:
		return false
	case why == reasonInitialSync || last.IsZero():
		return true
	}
	return now.Sub(last) >= freeGap
}

// applyNodes applies the Nodes changed since the last apply: each one
// patches the plan, and only the routes (and VXLAN entries) that change
// are written, from the routes cache. Whatever the plan cannot patch one
// Node at a time (this node, a Node in a conflict, no plan yet) falls
// back to the full apply.
func (d *Daemon) applyNodes(nodes nodeStore) (own, remote error) {
	names := d.takeDirty()
	if d.plan == nil {
		return d.apply(nodes, reasonNode)
	}
	var delta desired.Delta
	notes, noted := map[string]string{}, make([]string, 0, len(names))
	for name := range names {
		var n *desired.Node
		r, err := nodes.get(name)
		noted = append(noted, name)
		switch {
		case err != nil:
			return nil, fmt.Errorf("get node %s from the informer: %w", name, err)
		case r != nil:
			dn := r.Node
			n = &dn
			if why := desired.MissingFamily(d.cfg.ClusterCIDRs, dn); why != "" {
				notes[name] = why
			}
		} // nil: deleted
		dd, ok := d.plan.Update(name, n)
		if !ok {
			return d.apply(nodes, reasonNode)
		}
		delta.Merge(dd)
	}
	d.refusals.sync(d.plan.Refused(), d.plan.TakeRefusalChanges(), nodes.exists)
	d.familyNotes.sync(notes, noted)
	d.metrics.RoutesDesired.Set(float64(d.plan.Routes()))
	d.metrics.NodesSkipped.Set(float64(d.plan.Skipped()))
	if delta.Empty() {
		return nil, nil
	}
	w := dataplane.Writer{Table: &d.table, Routes: &d.routes, VXLAN: &d.vxlanRec, Encap: d.cfg.Encap}
	res := w.Write(dataplane.Delta(delta))
	if res.RoutesWritten {
		d.metrics.RoutesProgramed.Set(float64(res.Programmed))
		d.countRouteRepairs()
	}
	d.log.Debug("routes applied", "trigger", "node", "nodes", len(names), "changed", res.Changed, "routes", d.plan.Routes())
	err := res.Err()
	if err != nil {
		d.plan = nil // the next event applies everything again
	}
	return nil, err
}

// apply judges every Node again and makes the whole dataplane match:
// routes (pruning the ones no valid Node wants), the tunnel device,
// VXLAN entries, the nft table and node.json. Its own part fails (own)
// only for what this node itself needs; a route that cannot be written
// is reported in remote. (What it writes back is a repair or not by what
// was last written, whatever the trigger: countRouteRepairs,
// VXLANRecord.) While this node's own Node cannot be used, the nft table
// keeps its last PodCIDRs (its pods are still there) and the peers keep
// following the other Nodes.
func (d *Daemon) apply(store nodeStore, why reason) (own, remote error) {
	d.plan = nil
	// every Node is read below: what changed until now is covered
	d.takeDirty()
	recs := store.list()
	nodes, notes := make([]desired.Node, 0, len(recs)), map[string]string{}
	for _, r := range recs {
		n := r.Node
		nodes = append(nodes, n)
		if why := desired.MissingFamily(d.cfg.ClusterCIDRs, n); why != "" {
			notes[n.Name] = why
		}
	}
	d.familyNotes.sync(notes, nil)
	// A Node event and a repair trust the routes cache (no dump: their
	// cost must not grow with the cluster); the initial sync, the
	// periodic resync and link changes read the table again.
	local, err := dataplane.LocalNetwork(&d.routes, why != reasonNode && why != reasonRepair)
	if err != nil {
		return err, nil
	}
	cfg := desired.Config{Self: d.cfg.NodeName, Encap: d.cfg.Encap, CrossSubnet: d.cfg.CrossSubnet,
		ClusterCIDRs: d.cfg.ClusterCIDRs, ServiceCIDRs: d.serviceCIDRs(), APIServers: d.cfg.APIServers}
	// the underlay: this node's address's link, or the last one known
	// while this node's Node is bad or gone
	underlay, err := d.dp.NodeUnderlay(&cfg, nodes, d.lastSelf)
	errs := []error{err}
	plan, st := desired.NewPlan(cfg, local, nodes, dataplane.OnLink)
	d.plan = plan
	d.plan.TakeRefusalChanges()
	d.refusals.sync(st.Refused, nil, store.exists)
	d.metrics.NodesSkipped.Set(float64(len(st.Skipped)))
	for _, s := range st.Skipped {
		d.log.Debug("node skipped", "node", s.Node, "reason", s.Reason)
	}
	d.setSelfProblem(st.SelfProblem)
	deviceReset := false
	if st.Self != nil {
		self := *st.Self
		d.lastSelf = &self
		if d.onSelf != nil {
			d.onSelf(slices.Clone(self.PodCIDRs))
		}
		if underlay != nil {
			deviceReset, err = d.setup(self, st.VTEPs, underlay)
			errs = append(errs, err)
		}
	}
	d.metrics.RoutesDesired.Set(float64(len(st.Routes)))
	spec := dataplane.TableSpec{Masquerade: d.cfg.Masquerade, MasqueradeIPv6: d.cfg.MasqueradeIPv6, ClusterCIDRs: d.cfg.ClusterCIDRs,
		Encap: d.cfg.Encap, VXLANPort: d.cfg.VXLANPort}
	if d.lastSelf != nil {
		spec.LocalPodCIDRs = d.lastSelf.PodCIDRs
	}
	spec.Peers, spec.RemotePodCIDRs = plan.Peers()
	w := dataplane.Writer{Table: &d.table, Routes: &d.routes, VXLAN: &d.vxlanRec, Encap: d.cfg.Encap}
	res := w.Write(dataplane.Full{Spec: spec, Verify: why == reasonResync, Routes: st.Routes, DeviceReset: deviceReset,
		Neighbors: st.Neighbors, FDBs: st.FDBs, SkipVXLAN: underlay == nil})
	if res.TableRepaired {
		d.countRepair(RepairNFTTable, 1, "nft table inet "+contract.NFTable)
	}
	d.metrics.RoutesProgramed.Set(float64(res.Programmed))
	d.countRouteRepairs()
	d.countRepair(RepairVXLANNeighbor, res.VXLAN.RepairedNeighbors, "VXLAN neighbor entries")
	d.countRepair(RepairVXLANFDB, res.VXLAN.RepairedFDBs, "VXLAN FDB entries")
	if why == reasonResync || why == reasonInitialSync {
		d.repairPodFilter()
	}
	errs = append(errs, res.Filter(), d.writeState(st.Self, st.SelfProblem, underlay))
	if res.Changed > 0 {
		d.log.Info("routes applied", "trigger", why, "changed", res.Changed, "routes", len(st.Routes), "skipped", len(st.Skipped), "refused", len(st.Refused))
	}
	if res.Remote() != nil {
		d.plan = nil // the next Node event applies everything again
	}
	return errors.Join(errs...), res.Remote()
}

// Cleanup removes everything podnet-routed created: podnet routes, the
// VXLAN device, the nft table and the node state file.
func Cleanup(stateDir string) error {
	var errs []error
	errs = append(errs, dataplane.Cleanup(), dataplane.DeleteTable())
	if err := nodestate.Remove(stateDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
