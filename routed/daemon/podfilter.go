package daemon

import (
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/podfilter"
)

// podFilterCollector publishes the drop counters of the plugins' pod
// filter (table podnet-pods, inet for the routed mode and bridge for the
// bridge mode): packets pods sent with a source that is not theirs, and
// Router Advertisements and redirects they sent. They are read at scrape
// time; a table that does not exist (no pod on the node yet) counts 0.
//
// They are read on one lasting socket. The kernel takes the nftables
// commit lock of the netns each time a netfilter netlink socket is closed
// and, when a transaction's cleanup is pending (after any commit, for an
// RCU grace period), waits for that cleanup holding it: every pod's ADD
// and the policy engine's writes wait meanwhile. With a socket per read
// (three per scrape), podnet-routed's threads spent 6 s waiting for that
// lock in a 45 s phase of 8 ADDs at a time, and the engine's writes slept
// up to 185 ms behind it.
type podFilterCollector struct {
	spoofed, raGuard, dropped *prometheus.Desc
	mu                        sync.Mutex // one scrape at a time on conn
	conn                      nftutil.Conn
}

func newPodFilterCollector() *podFilterCollector {
	return &podFilterCollector{conn: nftutil.Conn{Timeout: 2 * time.Second},
		spoofed: prometheus.NewDesc("podnet_pod_spoofed_dropped_total",
			"Packets from pods with a source address (or ARP sender, neighbor target, MAC) that is not theirs, dropped by the plugins' pod filter, by mode.", []string{"mode"}, nil),
		raGuard: prometheus.NewDesc("podnet_pod_ra_dropped_total",
			"Router Advertisements and redirects sent by pods, dropped by the plugins' pod filter, by mode.", []string{"mode"}, nil),
		dropped: prometheus.NewDesc("podnet_pod_dropped_total",
			"Packets and frames from pods dropped by the plugins' pod filter (an allow-list), by mode and reason. podnet_pod_spoofed_dropped_total is the sum of the spoofing reasons, podnet_pod_ra_dropped_total the router-advertisement one.", []string{"mode", "reason"}, nil),
	}
}

func (c *podFilterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.spoofed
	ch <- c.raGuard
	ch <- c.dropped
}

func (c *podFilterCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, err := c.conn.Open()
	if err != nil {
		return
	}
	for _, g := range []podfilter.Guard{podfilter.Routed, podfilter.Bridged} {
		var spoofed, ra uint64
		byReason := map[string]uint64{}
		for _, t := range g.Tables() {
			all, err := counters(conn, t)
			if err != nil {
				// whatever it was in the middle of must not be read as
				// the next answer: the next scrape dials again
				c.conn.Close()
				conn, err = c.conn.Open()
				if err != nil {
					return
				}
			}
			spoofed += all[contract.PodFilterSpoofedCounter]
			ra += all[contract.PodFilterRAGuardCounter]
			for _, r := range contract.PodFilterDropReasons {
				byReason[r] += all[contract.PodFilterDropCounter(r)]
			}
		}
		ch <- prometheus.MustNewConstMetric(c.spoofed, prometheus.CounterValue, float64(spoofed), g.Mode())
		ch <- prometheus.MustNewConstMetric(c.raGuard, prometheus.CounterValue, float64(ra), g.Mode())
		for _, r := range contract.PodFilterDropReasons {
			ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(byReason[r]), g.Mode(), r)
		}
	}
}

// counters reads the packets of table t's named counters; none when
// there is no table. An error is the socket's (none for a missing table).
func counters(conn *nftables.Conn, t *nftables.Table) (map[string]uint64, error) {
	out := map[string]uint64{}
	objs, err := conn.GetNamedObjects(t)
	if err != nil {
		if nftutil.IsNotFound(err) {
			return out, nil
		}
		return out, err
	}
	for _, o := range objs {
		if named, ok := o.(*nftables.NamedObj); ok {
			if ctr, ok := named.Obj.(*expr.Counter); ok {
				out[named.Name] = ctr.Packets
			}
		}
	}
	return out, nil
}
