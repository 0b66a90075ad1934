package daemon

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/testns"
)

// spoofedOf scrapes c once and returns podnet_pod_spoofed_dropped_total
// of mode.
func spoofedOf(t *testing.T, c prometheus.Collector, mode string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		if m.Desc().String() != newPodFilterCollector().spoofed.String() {
			continue
		}
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		if out.GetLabel()[0].GetValue() == mode {
			return out.GetCounter().GetValue()
		}
	}
	t.Fatalf("no podnet_pod_spoofed_dropped_total{mode=%q}", mode)
	return 0
}

// TestPodFilterCollectorKeepsItsSocket: the pod filter's counters are read
// at each scrape on the socket of the first one (closing a netfilter
// socket takes the netns's nftables commit lock, which every pod's ADD
// waits for), and read right: 0 before the table exists and after it
// went, its counter's packets while it is there.
func TestPodFilterCollectorKeepsItsSocket(t *testing.T) {
	n := testns.New(t)
	err := n.Do(func(ns.NetNS) error {
		c := newPodFilterCollector()
		if got := spoofedOf(t, c, "routed"); got != 0 {
			t.Errorf("no table: spoofed %v, want 0", got)
		}
		first := c.conn.Netlink()
		if first == nil {
			t.Fatal("no socket after a scrape")
		}
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		tab := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: contract.PodFilterTable})
		conn.AddObj(&nftables.NamedObj{Table: tab, Name: contract.PodFilterSpoofedCounter, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{Packets: 7}})
		if err := conn.Flush(); err != nil {
			return err
		}
		for range 3 {
			if got := spoofedOf(t, c, "routed"); got != 7 {
				t.Errorf("spoofed %v, want the counter's 7", got)
			}
		}
		conn.DelTable(tab)
		if err := conn.Flush(); err != nil {
			return err
		}
		if got := spoofedOf(t, c, "routed"); got != 0 {
			t.Errorf("table gone: spoofed %v, want 0", got)
		}
		if c.conn.Netlink() != first {
			t.Error("a later scrape dialed a socket of its own")
		}
		c.conn.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
