// The daemon's Prometheus metrics, in a registry of their own that the
// other loops of podnet-routed publish in too.

package daemon

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/routed/dataplane"
)

// Registry is the registry /metrics serves, and ObjectRepairs its
// podnet_repairs_total{object}: other loops of podnet-routed (the leak
// reconcile) publish there.
func (d *Daemon) Registry() (prometheus.Registerer, *prometheus.CounterVec) {
	return d.metrics.Registry, d.metrics.ObjectRepairs
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
