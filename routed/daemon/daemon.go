// Package daemon is podnet-routed's control loop: a client-go informer on
// Nodes feeds the desired state, which is applied to the kernel on every
// change, on every deletion of a podnet route (repair), and periodically
// (resync and prune).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
)

// NodeIPAnnotation overrides a node's InternalIP.
const NodeIPAnnotation = "podnet.io/node-ip"

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
}

// Daemon reconciles the node's dataplane with the Nodes of the cluster.
type Daemon struct {
	cfg     Config
	nodesLW cache.ListerWatcher
	// serviceCIDRsLW lists and watches ServiceCIDR objects (nil: the flag
	// alone); events posts Events about refused Nodes (nil: none)
	serviceCIDRsLW cache.ListerWatcher
	events         *eventSink
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
	// pending the other reasons to apply ("repair", "link change")
	// since then: one kick may stand for several.
	dirtyMu sync.Mutex
	dirty   map[string]struct{}
	pending map[string]bool

	// service ranges read from ServiceCIDR objects
	svcMu      sync.Mutex
	svcFromAPI []netip.Prefix

	synced      atomic.Bool
	lastApplyOK atomic.Bool
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

	// the pod filter's repair (repair.go): one at a time (the resync and
	// the nftables monitor), and the refused records already logged
	podFilterMu      sync.Mutex
	podFilterRefused map[string]bool
	// onNFTChange, when set, hears (debounced) that someone else changed
	// an nftables table podnet owns (nftmonitor.go)
	onNFTChange []func()
}

// New builds a daemon that lists and watches Nodes through nodes (see
// NodesListWatch).
func New(cfg Config, nodes cache.ListerWatcher, log *slog.Logger) *Daemon {
	d := &Daemon{
		cfg:     cfg,
		nodesLW: nodes,
		log:     log,
		dp:      &dataplane.Netlink{Encap: cfg.Encap, VNI: cfg.VXLANVNI, Port: cfg.VXLANPort, MTU: cfg.MTU, Log: log},
		table:   dataplane.Table{Log: log},
		metrics: NewMetrics(),
		kick:    make(chan struct{}, 1),
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

// Registry is the registry /metrics serves, and ObjectRepairs its
// podnet_repairs_total{object}: other loops of podnet-routed (the leak
// reconcile) publish there.
func (d *Daemon) Registry() (prometheus.Registerer, *prometheus.CounterVec) {
	return d.metrics.Registry, d.metrics.ObjectRepairs
}

// OnLocalPodCIDRs calls f with this node's PodCIDRs after each valid view
// of its own Node. Set it before Run.
func (d *Daemon) OnLocalPodCIDRs(f func([]netip.Prefix)) *Daemon {
	d.onSelf = f
	return d
}

// WithAPI makes the daemon probe the API server through core when its
// watch is quiet, post Events about the Nodes it refuses through events
// (CoreClient, each with a rate limiter of its own, so that a burst of
// Events never delays a Node list or watch) and read the cluster's
// service ranges from ServiceCIDR objects through serviceCIDRs
// (ServiceCIDRsListWatch; nil: the flag alone).
func (d *Daemon) WithAPI(core, events rest.Interface, serviceCIDRs cache.ListerWatcher) *Daemon {
	d.core = core
	if events != nil {
		d.events = newEventSink(events, d.cfg.NodeName, d.log)
	}
	d.serviceCIDRsLW = serviceCIDRs
	return d
}

// CoreClient is a REST client of core/v1 and nothing else, in protobuf:
// the typed clientset and informer factory would link every API group
// into the binary (its pages are most of the daemon's resident memory),
// and JSON costs several times the CPU and garbage to decode a large
// Node list.
func CoreClient(cfg *rest.Config) (rest.Interface, error) {
	return restClient(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, true)
}

// restClient is a REST client of one API group version, its scheme alone.
func restClient(cfg *rest.Config, apiPath string, gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error, protobuf bool) (rest.Interface, error) {
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, fmt.Errorf("%s scheme: %w", gv, err)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = apiPath
	c.GroupVersion = &gv
	if protobuf {
		c.ContentType = runtime.ContentTypeProtobuf
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "podnet-routed"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return rc, nil
}

// NodesListWatch lists and watches the cluster's Nodes through core.
func NodesListWatch(core rest.Interface) cache.ListerWatcher {
	return cache.NewListWatchFromClient(core, "nodes", metav1.NamespaceAll, fields.Everything())
}

// Metrics are the daemon's Prometheus metrics, in their own registry.
type Metrics struct {
	Registry        *prometheus.Registry
	RoutesDesired   prometheus.Gauge
	RoutesProgramed prometheus.Gauge
	ApplySeconds    prometheus.Histogram
	Repairs         prometheus.Counter
	Errors          prometheus.Counter
	NodesSkipped    prometheus.Gauge
	NodesRefused    *prometheus.GaugeVec
	FamilyMissing   prometheus.Gauge
	ObjectRepairs   *prometheus.CounterVec // podnet_repairs_total{object} (repair.go)
	SysctlErrors    *prometheus.CounterVec // podnet_sysctl_errors_total{name}
	TunnelDropped   prometheus.CounterFunc // registered by New (it reads the daemon's table)

	contactAge, unreachableFor func() float64
}

// NewMetrics registers the metrics in a fresh registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry:        prometheus.NewRegistry(),
		RoutesDesired:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "podnet_routes_desired", Help: "Routes podnet-routed wants in the kernel."}),
		RoutesProgramed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "podnet_routes_programmed", Help: "Routes with podnet's protocol in the kernel after the last apply."}),
		ApplySeconds:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "podnet_apply_duration_seconds", Help: "Time to apply the desired state.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		Repairs:         prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_route_repairs_total", Help: "Applies that put back a podnet route someone else deleted or edited."}),
		Errors:          prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_apply_errors_total", Help: "Applies that failed."}),
		NodesSkipped:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "podnet_nodes_skipped", Help: "Nodes without PodCIDR or address, not routed yet."}),
		FamilyMissing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "podnet_nodes_podcidr_family_missing",
			Help: "Nodes with PodCIDRs of one family only while the cluster CIDRs hold both (their pods get no address of the other)."}),
		ObjectRepairs: newRepairsTotal(),
		SysctlErrors:  newSysctlErrorsTotal(),
	}
	m.NodesRefused = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "podnet_nodes_refused", Help: "Nodes refused by validation (no route to them), by reason."}, []string{"reason"})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "podnet_last_watch_event_age_seconds", Help: "Seconds since the last Node watch event or list from the API server."},
		func() float64 { return call(m.contactAge) })
	unreachable := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "podnet_apiserver_unreachable_seconds", Help: "Seconds the API server has been out of reach (0: reachable)."},
		func() float64 { return call(m.unreachableFor) })
	m.Registry.MustRegister(newPodFilterCollector())
	m.Registry.MustRegister(m.RoutesDesired, m.RoutesProgramed, m.ApplySeconds, m.Repairs, m.Errors, m.NodesSkipped, m.NodesRefused, m.FamilyMissing, age, unreachable, m.ObjectRepairs, m.SysctlErrors)
	return m
}

func call(f func() float64) float64 {
	if f == nil {
		return 0
	}
	return f()
}

// tunnelDropped reads the tunnel filter's drop counter for a scrape; a
// failed read answers the last value read.
func tunnelDropped(t *dataplane.Table) func() float64 {
	var last atomic.Uint64
	return func() float64 {
		if v, err := t.TunnelDropped(); err == nil {
			last.Store(v)
		}
		return float64(last.Load())
	}
}

// Handler serves /healthz, /readyz and /metrics.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := http.StatusOK, "ok"
		if p := d.notReady(); p != "" {
			code, body = http.StatusServiceUnavailable, p
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		fmt.Fprintln(w, body)
		// What the other loops want an operator to see: never a reason
		// to take the node out (its pods' network works), so shown
		// whatever the answer is.
		if d.readyDetails != nil {
			for _, line := range d.readyDetails() {
				fmt.Fprintln(w, "warning: "+line)
			}
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{}))
	return mux
}

// notReady says why /readyz fails ("": it does not).
func (d *Daemon) notReady() string {
	if !d.synced.Load() {
		return "node informer not synced"
	}
	if p := d.selfProblem.Load().(string); p != "" {
		return p
	}
	if t := d.cfg.APIServerTimeout; t > 0 && d.unreachableFor() > t.Seconds() {
		return fmt.Sprintf("API server unreachable for %.0fs (more than --apiserver-timeout %s)", d.unreachableFor(), t)
	}
	if !d.lastApplyOK.Load() {
		return "the last apply of this node's own devices, blackhole or node.json failed, or none was done yet (see the log)"
	}
	return ""
}

// ReadyDetails makes /readyz add f's lines (prefixed "warning: ") to its
// answer, 200 or 503, without changing it: the leak reconcile's Status.
// Set it before Handler serves.
func (d *Daemon) ReadyDetails(f func() []string) *Daemon {
	d.readyDetails = f
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
		go d.events.run(ctx)
	}
	if d.core != nil && d.cfg.APIServerTimeout > 0 {
		go d.probeAPI(ctx, d.core)
	}
	if err := d.watchServiceCIDRs(ctx); err != nil {
		return err
	}
	informer := cache.NewSharedIndexInformer(d.nodesLW, &corev1.Node{}, 0, cache.Indexers{})
	lister := listersv1.NewNodeLister(informer.GetIndexer())
	// the API server's reachability: every list and watch event is
	// contact, every failed list or watch starts (or continues) an outage
	if err := informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		d.unreachable(err)
	}); err != nil {
		return fmt.Errorf("node watch error handler: %w", err)
	}
	// keep only what FromNode reads: the informer's store then holds a few
	// hundred bytes per Node instead of the whole object (managedFields,
	// images, conditions, labels)
	if err := informer.SetTransform(func(obj any) (any, error) {
		d.watchEvent()
		return SlimNode(obj)
	}); err != nil {
		return fmt.Errorf("node informer transform: %w", err)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: d.nodeChanged,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && FromNode(o).Equal(FromNode(c)) {
				return // nothing routing reads changed (a status heartbeat)
			}
			d.nodeChanged(cur)
		},
		DeleteFunc: d.nodeChanged,
	}); err != nil {
		return fmt.Errorf("node event handler: %w", err)
	}
	go informer.Run(ctx.Done())
	d.log.Info("waiting for the node informer to sync")
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return ctx.Err()
	}
	d.synced.Store(true)
	d.log.Info("node informer synced")
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
	d.reconcile(lister, "initial sync")
	for {
		select {
		case <-ctx.Done():
			d.log.Info("stopping; routes stay in place")
			return nil
		case <-d.kick:
			if why := d.takePending(); why != "" {
				d.reconcile(lister, why)
			}
		case <-resync.C:
			d.reconcile(lister, "periodic resync")
		}
	}
}

// nodeChanged records that a Node was added, changed or deleted, and kicks
// a reconcile.
func (d *Daemon) nodeChanged(obj any) {
	name := ""
	switch o := obj.(type) {
	case *corev1.Node:
		name = o.Name
	case cache.DeletedFinalStateUnknown:
		name = o.Key // Nodes are cluster-scoped: the key is the name
	}
	d.dirtyMu.Lock()
	if d.dirty == nil {
		d.dirty = map[string]struct{}{}
	}
	d.dirty[name] = struct{}{}
	d.dirtyMu.Unlock()
	d.trigger("node")
}

func (d *Daemon) takeDirty() map[string]struct{} {
	d.dirtyMu.Lock()
	defer d.dirtyMu.Unlock()
	names := d.dirty
	d.dirty = nil
	return names
}

// trigger records a reason to apply and wakes the loop.
func (d *Daemon) trigger(why string) {
	d.dirtyMu.Lock()
	if d.pending == nil {
		d.pending = map[string]bool{}
	}
	d.pending[why] = true
	d.dirtyMu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default: // the loop is woken already; it will take this reason too
	}
}

// takePending returns the strongest reason recorded since the last call:
// a link change (dump the table and apply everything), a repair (apply
// everything from the cache), Node changes (apply those Nodes), or ""
// when a full apply since has covered them all.
func (d *Daemon) takePending() string {
	d.dirtyMu.Lock()
	defer d.dirtyMu.Unlock()
	p := d.pending
	d.pending = nil
	for _, why := range []string{"link change", "repair", "service cidrs", "node"} {
		if p[why] {
			return why
		}
	}
	return ""
}

// watchRoutes keeps the routes cache current with the kernel's route
// notifications and kicks a reconcile whenever a route podnet-routed wants
// disappears (someone deleted it, or its device went away). A lost
// notification (a new subscription, an overflow) drops the cache: the
// next apply reads the table.
func (d *Daemon) watchRoutes(ctx context.Context, first chan struct{}) {
	watch(ctx, d.log, "route", first, d.routes.Invalidate, func(ch chan netlink.RouteUpdate, done chan struct{}, onErr func(error)) error {
		// a full apply writes thousands of routes in a burst: room for
		// their notifications (kernel memory, not the daemon's)
		return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
			ErrorCallback: onErr, ReceiveBufferSize: 16 << 20, ReceiveBufferForceSize: true})
	}, func(u netlink.RouteUpdate) {
		if d.routes.Observe(u) {
			d.trigger("repair")
		}
	})
}

// watchLinks kicks a reconcile when a link change may have taken routes
// with it (linkMatters).
func (d *Daemon) watchLinks(ctx context.Context, first chan struct{}) {
	watch(ctx, d.log, "link", first, func() {}, func(ch chan netlink.LinkUpdate, done chan struct{}, onErr func(error)) error {
		return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr})
	}, func(u netlink.LinkUpdate) {
		if linkMatters(u) {
			if u.Header.Type == unix.RTM_DELLINK || u.IfInfomsg.Flags&unix.IFF_UP == 0 {
				// the kernel drops the link's routes with it: putting
				// them back is no route repair
				d.routes.ForgetDevice(u.Link.Attrs().Name)
				if u.Link.Attrs().Name == desired.VXLANDevice {
					d.vxlanRec.Forget()
				}
			}
			d.trigger("link change")
		}
	})
}

// linkMatters tells whether a link notification calls for a full apply:
// a link deleted (the tunnel device), or one that went down or up (the
// kernel flushes the routes of a link that goes down, without a route
// notification; when the underlay comes back its routes must be put
// back). Pods' host veths are the plugin's; a link being created, or
// changing something else (MTU, address, statistics), has no routes to
// lose; podnet's own tunnel device coming up is the daemon's own doing
// (the apply that follows its going down brings it up).
func linkMatters(u netlink.LinkUpdate) bool {
	if u.Link == nil || contract.IsHostVeth(u.Link.Attrs().Name) {
		return false
	}
	if u.Header.Type == unix.RTM_DELLINK {
		return true
	}
	const created = ^uint32(0)
	change := u.IfInfomsg.Change
	if change == created || change&(unix.IFF_UP|unix.IFF_LOWER_UP|unix.IFF_RUNNING) == 0 {
		return false
	}
	name := u.Link.Attrs().Name
	own := name == desired.VXLANDevice || name == desired.TunnelDevice
	return !own || u.IfInfomsg.Flags&unix.IFF_UP == 0
}

// watch keeps a netlink subscription open until ctx ends, resubscribing
// after errors, and hands every update to handle. lost is called whenever
// updates may have been missed: on every (re)subscription and error.
// first is closed after the first attempt to subscribe.
func watch[U any](ctx context.Context, log *slog.Logger, what string, first chan struct{}, lost func(),
	subscribe func(chan U, chan struct{}, func(error)) error, handle func(U)) {
	defer func() {
		select {
		case <-first:
		default:
			close(first)
		}
	}()
	for ctx.Err() == nil {
		updates := make(chan U, 256)
		done := make(chan struct{})
		lost()
		err := subscribe(updates, done, func(err error) {
			lost()
			log.Warn(what+" subscription error", "err", err)
		})
		select {
		case <-first:
		default:
			close(first)
		}
		if err != nil {
			log.Error("cannot subscribe to "+what+" changes; relying on periodic resync", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			continue
		}
	loop:
		for {
			select {
			case <-ctx.Done():
				close(done)
				return
			case u, ok := <-updates:
				if !ok {
					break loop
				}
				handle(u)
			}
		}
		close(done)
	}
}

// reconcile computes the desired state from the lister and applies it.
// A failure that concerns one remote Node (its route cannot be written)
// is logged and counted, and retried by the next full apply, but leaves
// the node ready: only this node's own part (its devices, blackhole and
// node.json) decides readiness.
func (d *Daemon) reconcile(lister listersv1.NodeLister, why string) {
	start := time.Now()
	var own, remote error
	if why == "node" {
		own, remote = d.applyNodes(lister)
	} else {
		own, remote = d.apply(lister, why)
	}
	d.metrics.ApplySeconds.Observe(time.Since(start).Seconds())
	if own != nil || remote != nil {
		d.metrics.Errors.Inc()
	}
	if remote != nil {
		d.log.Error("some routes could not be applied; retried on the next resync", "trigger", why, "err", remote)
	}
	if own != nil {
		d.lastApplyOK.Store(false)
		d.log.Error("apply failed", "trigger", why, "err", own)
		return
	}
	d.lastApplyOK.Store(true)
	if why != "node" {
		// A full apply (the initial sync above all: the whole Node list
		// decoded) leaves garbage of the cluster's size behind, and the
		// next one is minutes away: Node events allocate next to
		// nothing. Give it back to the node now rather than keep it
		// resident.
		debug.FreeOSMemory()
	}
}

// applyNodes applies the Nodes changed since the last apply: each one
// patches the plan, and only the routes (and VXLAN entries) that change
// are written, from the routes cache. Whatever the plan cannot patch one
// Node at a time (this node, a Node in a conflict, no plan yet) falls
// back to the full apply.
func (d *Daemon) applyNodes(lister listersv1.NodeLister) (own, remote error) {
	names := d.takeDirty()
	if d.plan == nil {
		return d.apply(lister, "node")
	}
	var delta desired.Delta
	notes, noted := map[string]string{}, make([]string, 0, len(names))
	for name := range names {
		var n *desired.Node
		obj, err := lister.Get(name)
		noted = append(noted, name)
		switch {
		case err == nil:
			dn := FromNode(obj)
			n = &dn
			if why := desired.MissingFamily(d.cfg.ClusterCIDRs, dn); why != "" {
				notes[name] = why
			}
		case apierrors.IsNotFound(err): // deleted
		default:
			return nil, fmt.Errorf("get node %s from the informer: %w", name, err)
		}
		dd, ok := d.plan.Update(name, n)
		if !ok {
			return d.apply(lister, "node")
		}
		delta.Merge(dd)
	}
	d.refusals.sync(d.plan.Refused(), d.plan.TakeRefusalChanges(), nodeExists(lister))
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
func (d *Daemon) apply(lister listersv1.NodeLister, why string) (own, remote error) {
	d.plan = nil
	// every Node is read below: what changed until now is covered
	d.takeDirty()
	objs, err := lister.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err), nil
	}
	nodes, notes := make([]desired.Node, 0, len(objs)), map[string]string{}
	for _, o := range objs {
		n := FromNode(o)
		nodes = append(nodes, n)
		if why := desired.MissingFamily(d.cfg.ClusterCIDRs, n); why != "" {
			notes[n.Name] = why
		}
	}
	d.familyNotes.sync(notes, nil)
	// A Node event and a repair trust the routes cache (no dump: their
	// cost must not grow with the cluster); the initial sync, the
	// periodic resync and link changes read the table again.
	local, err := dataplane.LocalNetwork(&d.routes, why != "node" && why != "repair")
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
	d.refusals.sync(st.Refused, nil, nodeExists(lister))
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
	res := w.Write(dataplane.Full{Spec: spec, Verify: why == "periodic resync", Routes: st.Routes, DeviceReset: deviceReset,
		Neighbors: st.Neighbors, FDBs: st.FDBs, SkipVXLAN: underlay == nil})
	if res.TableRepaired {
		d.countRepair(RepairNFTTable, 1, "nft table inet "+contract.NFTable)
	}
	d.metrics.RoutesProgramed.Set(float64(res.Programmed))
	d.countRouteRepairs()
	d.countRepair(RepairVXLANNeighbor, res.VXLAN.RepairedNeighbors, "VXLAN neighbor entries")
	d.countRepair(RepairVXLANFDB, res.VXLAN.RepairedFDBs, "VXLAN FDB entries")
	if why == "periodic resync" || why == "initial sync" {
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

func (d *Daemon) setSelfProblem(p string) {
	if old := d.selfProblem.Swap(p); old != p {
		if p != "" {
			d.log.Error("this node's own Node cannot be used: no blackhole, node.json says why; routes to the other Nodes keep converging", "problem", p)
		} else if old != nil && old != "" {
			d.log.Info("this node's own Node is usable again")
		}
	}
}

// writeState publishes this node's PodCIDRs and MTU in node.json for the
// plugins, or, while this node's own Node cannot be used, why not (the
// plugins then refuse ADD with that text). It compares with the file on
// disk, so a node.json someone deleted or edited is written again.
func (d *Daemon) writeState(self *desired.Node, problem string, underlay netlink.Link) error {
	st := nodestate.State{NodeName: d.cfg.NodeName, Encap: string(d.cfg.Encap)}
	cur, err := nodestate.ReadFile(d.cfg.StateDir)
	switch {
	case self != nil:
		for _, p := range self.PodCIDRs {
			st.PodCIDRs = append(st.PodCIDRs, p.String())
		}
	case d.lastSelf != nil:
		// the PodCIDRs the pods here have their addresses from stay
		// beside the error: ADD is refused, DEL still releases
		st.Error = problem
		for _, p := range d.lastSelf.PodCIDRs {
			st.PodCIDRs = append(st.PodCIDRs, p.String())
		}
	default:
		st.Error = problem
		if err == nil { // restarted meanwhile: the file knows them
			st.PodCIDRs = cur.PodCIDRs
		}
	}
	if underlay != nil {
		st.MTU = d.dp.OverlayMTU(underlay)
	} else {
		st.MTU = d.lastState.MTU
	}
	if err == nil && cur.Equal(&st) {
		d.lastState = st
		return nil
	}
	if err := nodestate.Write(d.cfg.StateDir, &st); err != nil {
		return err
	}
	if d.lastState.Equal(&st) { // what it wrote before, deleted or edited since
		d.countStateRepair(err)
	}
	d.lastState = st
	d.log.Info("node state written", "path", nodestate.Path(d.cfg.StateDir), "podCIDRs", st.PodCIDRs, "mtu", st.MTU, "error", st.Error)
	return nil
}

// FromNode extracts what routing needs from a Node (desired.ParseNode
// judges the fields).
func FromNode(n *corev1.Node) desired.Node {
	addrs := make([]desired.Address, 0, len(n.Status.Addresses))
	for _, a := range n.Status.Addresses {
		addrs = append(addrs, desired.Address{Internal: a.Type == corev1.NodeInternalIP, Address: a.Address})
	}
	var annotation *string
	if a, ok := n.Annotations[NodeIPAnnotation]; ok {
		annotation = &a
	}
	return desired.ParseNode(n.Name, string(n.UID), n.CreationTimestamp.Time, n.Spec.PodCIDR, n.Spec.PodCIDRs, addrs, annotation)
}

// SlimNode is the node informer's transform: a Node reduced to what
// FromNode reads (name, age, PodCIDRs, addresses, the node-ip
// annotation) plus the identity the informer keeps. Anything else (a
// tombstone) passes.
func SlimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	if a, ok := n.Annotations[NodeIPAnnotation]; ok {
		slim.Annotations = map[string]string{NodeIPAnnotation: a}
	}
	return slim, nil
}

// nodeExists tells whether the informer holds Node name.
func nodeExists(lister listersv1.NodeLister) func(string) bool {
	return func(name string) bool {
		_, err := lister.Get(name)
		return err == nil
	}
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
