package engine

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/routed/policy"
)

// Metrics are the engine's Prometheus metrics.
type Metrics struct {
	ApplySeconds prometheus.Histogram
	// WaitSeconds: how long the engine took to answer a plugin's ADD-time
	// wait (from the request to the answer: the pod's policy in the
	// kernel), the engine's share of a CNI ADD.
	WaitSeconds prometheus.Histogram
	// Mismatches: resync cross-checks that found the incremental compile
	// different from the whole one (a bug; the whole one is written).
	Mismatches prometheus.Counter
	Errors     prometheus.Counter
	Repairs    prometheus.Counter
	Revoked    prometheus.Counter
	// RevokeScans: the conntrack scans, by kind ("all": every connection
	// judged; "gone": gone pods' only).
	RevokeScans  *prometheus.CounterVec
	IsolatedPods prometheus.Gauge
	Policies     prometheus.Gauge
	Refused      prometheus.Gauge
	// AddressClashes: addresses two or more Pod objects claim;
	// BridgeUnfiltered: 1 while bridged pod traffic is dropped because
	// br_netfilter cannot be turned on.
	AddressClashes   prometheus.Gauge
	BridgeUnfiltered prometheus.Gauge
	// ClusterPolicies: the ClusterNetworkPolicies the engine holds;
	// ClusterRefused: those refused in part; ClusterWatching: 1 while the
	// API server serves ClusterNetworkPolicies and the engine watches them.
	ClusterPolicies prometheus.Gauge
	ClusterRefused  prometheus.Gauge
	ClusterWatching prometheus.Gauge
	drops           *dropCounter
	// clusterDrops: podnet_policy_cluster_drops_total{tier,policy,rule}
	clusterDrops *dropCounter
	unknown      atomic.Uint64
	link         atomic.Uint64
	unfiltered   atomic.Uint64
}

// SetBridgeDropped takes the bridge table's link_dropped and
// unfiltered_dropped counters.
func (m *Metrics) SetBridgeDropped(link, unfiltered uint64) {
	m.link.Store(link)
	m.unfiltered.Store(unfiltered)
}

// SetUnknownDropped takes the table's unknown_dropped counter.
func (m *Metrics) SetUnknownDropped(n uint64) { m.unknown.Store(n) }

// NewMetrics registers the engine's metrics in reg; repairs is the
// daemon's podnet_repairs_total{object} (nil: a counter of its own).
func NewMetrics(reg prometheus.Registerer, repairs *prometheus.CounterVec) *Metrics {
	m := &Metrics{
		ApplySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "podnet_policy_apply_seconds",
			Help:    "Time from a change of Pods, Namespaces or NetworkPolicies to its nft transaction being in the kernel (compile and write).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		WaitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "podnet_policy_wait_seconds",
			Help:    "Time the engine took to answer a plugin's ADD-time wait: from the request to the pod's policy in the kernel (the engine's share of a CNI ADD).",
			Buckets: []float64{.0001, .00025, .0005, .00075, .001, .0015, .002, .003, .005, .0075, .01, .025, .05, .1, .25, .5, 1, 3},
		}),
		Mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_policy_incremental_mismatch_total",
			Help: "Resync cross-checks that found the incremental compile different from a whole compile (a bug: it is logged and the whole compile is written).",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_policy_errors_total", Help: "NetworkPolicy table writes that failed (each is retried in full).",
		}),
		Revoked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_policy_revoked_total", Help: "Conntrack entries deleted because a policy change no longer allows their connection.",
		}),
		RevokeScans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podnet_policy_revoke_scans_total", Help: "Conntrack scans after policy changes, by kind: all (every connection judged) or gone (only the connections of pods that are gone).",
		}, []string{"kind"}),
		IsolatedPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_isolated_pods", Help: "Local pods isolated in at least one direction.",
		}),
		Policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_chains", Help: "Policy chains (policy and direction) selecting at least one local pod.",
		}),
		Refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_refused", Help: "NetworkPolicies refused as invalid: each isolates the pods it selects and allows nothing.",
		}),
		AddressClashes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_address_clashes", Help: "Addresses that two or more Pod objects claim (a terminating pod whose address was reused, a stale status): each goes to one pod, logged.",
		}),
		BridgeUnfiltered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_bridge_unfiltered", Help: "1 while bridge netfilter cannot be turned on: IP between podnet-bridge pods of this node is dropped rather than left unjudged.",
		}),
		ClusterPolicies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_cluster_policies", Help: "ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1) the engine holds, refused in part or not.",
		}),
		ClusterRefused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_cluster_refused", Help: "ClusterNetworkPolicies refused in part: what could not be read fails closed (an Accept rule matches less, a Deny or Pass rule denies everything), logged and one Warning Event per cluster.",
		}),
		ClusterWatching: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podnet_policy_cluster_watching", Help: "1 while the API server serves ClusterNetworkPolicies (their CRD is installed) and the engine watches them, 0 while it does not.",
		}),
		drops: newDropCounter(),
		clusterDrops: &dropCounter{
			vec: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "podnet_policy_cluster_drops_total",
				Help: "New connections dropped on this node by a ClusterNetworkPolicy's Deny rule (tier Admin or Baseline; rule: its index in spec.ingress or spec.egress, and its name).",
			}, []string{"tier", "policy", "rule"}),
			last: map[dropSeen]uint64{},
		},
	}
	if repairs != nil {
		m.Repairs = repairs.WithLabelValues("policy-table")
	} else {
		m.Repairs = prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_policy_repairs_total", Help: "NetworkPolicy table rewrites after it was changed behind podnet-routed's back."})
		reg.MustRegister(m.Repairs)
	}
	unknown := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "podnet_policy_unknown_dropped_total",
		Help: "Packets from or to a local pod address the engine did not know yet (a pod between its ADD and its policy), dropped; as read at the last resync.",
	}, func() float64 { return float64(m.unknown.Load()) })
	link := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "podnet_policy_link_dropped_total",
		Help: "Link-local, multicast and broadcast packets of isolated podnet-bridge pods, dropped on the bridge (no policy names such addresses); as read at the last resync. podnet pods' are in podnet_policy_drops_total.",
	}, func() float64 { return float64(m.link.Load()) })
	unfiltered := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "podnet_policy_unfiltered_dropped_total",
		Help: "Packets between podnet-bridge pods of the node dropped because bridge netfilter cannot be turned on; as read at the last resync.",
	}, func() float64 { return float64(m.unfiltered.Load()) })
	reg.MustRegister(link, unfiltered)
	reg.MustRegister(unknown, m.ApplySeconds, m.WaitSeconds, m.Mismatches, m.Errors, m.Revoked, m.RevokeScans, m.IsolatedPods, m.Policies, m.Refused, m.AddressClashes, m.BridgeUnfiltered, m.drops.vec,
		m.clusterDrops.vec, m.ClusterPolicies, m.ClusterRefused, m.ClusterWatching)
	return m
}

// dropCounter turns the pod chains' cumulative nft counters into
// podnet_policy_drops_total{namespace,policy}.
type dropCounter struct {
	vec  *prometheus.CounterVec
	mu   sync.Mutex
	last map[dropSeen]uint64
}

type dropSeen struct {
	pod, namespace, name string
	dir                  policy.Direction
}

func newDropCounter() *dropCounter {
	return &dropCounter{
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podnet_policy_drops_total",
			Help: "New connections dropped on this node because the pod they were from (egress) or to (ingress) is isolated and no policy allows them; a pod's drops count for each policy isolating it in that direction.",
		}, []string{"namespace", "policy"}),
		last: map[dropSeen]uint64{},
	}
}

// forgetAllBut drops what it remembers of the pod chains not in seen (pods
// gone, or no longer isolated by that policy), so that its memory follows
// the node's pods rather than every pod it ever saw.
func (d *dropCounter) forgetAllBut(seen map[dropSeen]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.last {
		if !seen[k] {
			delete(d.last, k)
		}
	}
}

// observe takes a pod chain's counter n: what it grew by since the last
// reading (all of it when the chain was written anew) is added.
func (d *dropCounter) observe(podID string, dir policy.Direction, namespace, name string, n uint64) {
	d.observeLabels(dropSeen{pod: podID, namespace: namespace, name: name, dir: dir}, n, namespace, name)
}

// observeLabels is observe for the counter k, labelled labels.
func (d *dropCounter) observeLabels(k dropSeen, n uint64, labels ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	prev, seen := d.last[k]
	d.last[k] = n
	delta := n
	if seen && n >= prev {
		delta = n - prev
	}
	if delta > 0 {
		d.vec.WithLabelValues(labels...).Add(float64(delta))
	}
}

// readCounters turns the pod chains' drop counters into
// podnet_policy_drops_total{namespace,policy}: a pod's drops count for
// each policy that isolates it in that direction.
func (e *Engine) readCounters() {
	counts, err := e.w.DropCounters()
	if err != nil {
		e.log.Debug("cannot read the NetworkPolicy drop counters", "err", err)
		return
	}
	e.mu.Lock()
	last, ok := e.writtenLocked()
	e.mu.Unlock()
	if !ok {
		return
	}
	pols := map[string]policy.PolicyChain{}
	for _, p := range last.Policies {
		pols[p.ID] = p
	}
	seen := map[dropSeen]bool{}
	for _, pod := range last.Pods {
		for _, d := range []struct {
			dir policy.Direction
			ids []string
		}{{policy.Ingress, pod.Ingress}, {policy.Egress, pod.Egress}} {
			n := counts[DropKey{PodID: pod.ID, Direction: d.dir}]
			for _, id := range d.ids {
				if p, ok := pols[id]; ok {
					e.m.drops.observe(pod.ID, d.dir, p.Namespace, p.Name, n)
					seen[dropSeen{pod: pod.ID, namespace: p.Namespace, name: p.Name, dir: d.dir}] = true
				}
			}
		}
	}
	e.m.drops.forgetAllBut(seen)
	e.readClusterCounters(&last, counts)
}

// readClusterCounters turns the ClusterNetworkPolicy Deny rules' counters
// into podnet_policy_cluster_drops_total{tier,policy,rule}.
func (e *Engine) readClusterCounters(last *policy.Ruleset, counts map[DropKey]uint64) {
	seen := map[dropSeen]bool{}
	for _, p := range last.Policies {
		if p.Tier == policy.TierNetworkPolicy {
			continue
		}
		for i, r := range p.Rules {
			if r.Action != policy.ActionDeny {
				continue
			}
			rule := fmt.Sprintf("%s %d", p.Direction, i)
			if r.Name != "" {
				rule += " " + r.Name
			}
			n := counts[DropKey{PolicyID: p.ID, Rule: i, Direction: p.Direction}]
			k := dropSeen{pod: p.ID, namespace: string(p.Tier), name: p.Name + "/" + rule, dir: p.Direction}
			e.m.clusterDrops.observeLabels(k, n, string(p.Tier), p.Name, rule)
			seen[k] = true
		}
	}
	e.m.clusterDrops.forgetAllBut(seen)
}
