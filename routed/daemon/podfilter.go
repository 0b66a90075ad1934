package daemon

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/internal/contract"
)

// podFilterCollector publishes the drop counters of the plugins' pod
// filter (table podnet-pods, inet for the routed mode and bridge for the
// bridge mode): packets pods sent with a source that is not theirs, and
// Router Advertisements and redirects they sent. They are read at scrape
// time; a table that does not exist (no pod on the node yet) counts 0.
type podFilterCollector struct {
	spoofed, raGuard *prometheus.Desc
}

func newPodFilterCollector() *podFilterCollector {
	return &podFilterCollector{
		spoofed: prometheus.NewDesc("podnet_pod_spoofed_dropped_total",
			"Packets from pods with a source address (or ARP sender, neighbor target, MAC) that is not theirs, dropped by the plugins' pod filter, by mode.", []string{"mode"}, nil),
		raGuard: prometheus.NewDesc("podnet_pod_ra_dropped_total",
			"Router Advertisements and redirects sent by pods, dropped by the plugins' pod filter, by mode.", []string{"mode"}, nil),
	}
}

func (c *podFilterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.spoofed
	ch <- c.raGuard
}

func (c *podFilterCollector) Collect(ch chan<- prometheus.Metric) {
	conn, err := nftables.New()
	if err != nil {
		return
	}
	defer conn.CloseLasting()
	for _, m := range []struct {
		mode string
		fam  nftables.TableFamily
	}{{"routed", nftables.TableFamilyINet}, {"bridge", nftables.TableFamilyBridge}} {
		t := &nftables.Table{Family: m.fam, Name: contract.PodFilterTable}
		ch <- prometheus.MustNewConstMetric(c.spoofed, prometheus.CounterValue, float64(counter(conn, t, contract.PodFilterSpoofedCounter)), m.mode)
		ch <- prometheus.MustNewConstMetric(c.raGuard, prometheus.CounterValue, float64(counter(conn, t, contract.PodFilterRAGuardCounter)), m.mode)
	}
}

// counter reads named counter name of table t; 0 when there is none.
func counter(conn *nftables.Conn, t *nftables.Table, name string) uint64 {
	obj, err := conn.GetObject(&nftables.NamedObj{Table: t, Name: name, Type: nftables.ObjTypeCounter})
	if err != nil || obj == nil {
		return 0
	}
	if named, ok := obj.(*nftables.NamedObj); ok {
		if ctr, ok := named.Obj.(*expr.Counter); ok {
			return ctr.Packets
		}
	}
	return 0
}
