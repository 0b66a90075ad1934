package daemon

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/testns"
)

// spoofedOf scrapes c once and returns podnet_pod_spoofed_dropped_total
// of mode.
func spoofedOf(t *testing.T, c prometheus.Collector, mode string) float64 {
	t.Helper()
	return counterOf(t, c, newPodFilterCollector().spoofed, mode)
}

// counterOf scrapes c once and returns the counter desc with the label
// values labels, in order.
func counterOf(t *testing.T, c prometheus.Collector, desc *prometheus.Desc, labels ...string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		if m.Desc().String() != desc.String() {
			continue
		}
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range out.GetLabel() {
			got = append(got, l.GetValue())
		}
		if slices.Equal(got, labels) {
			return out.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", desc, labels)
	return 0
}

// TestPodFilterCountersSummed: the routed mode's drops by reason are the
// sums over its netdev tables (the ports are spread over them).
func TestPodFilterCountersSummed(t *testing.T) {
	n := testns.New(t)
	err := n.Do(func(ns.NetNS) error {
		c := newPodFilterCollector()
		defer c.conn.Close()
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		vlan := contract.PodFilterDropCounter(contract.DropVLAN)
		for k, packets := range map[int]uint64{3: 4, 15: 5} {
			tab := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterL2Table(k)})
			conn.AddObj(&nftables.NamedObj{Table: tab, Name: vlan, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{Packets: packets}})
		}
		// an older podnet's one netdev table is not the filter's
		old := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterTable})
		conn.AddObj(&nftables.NamedObj{Table: old, Name: vlan, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{Packets: 100}})
		if err := conn.Flush(); err != nil {
			return err
		}
		if got := counterOf(t, c, c.dropped, "routed", contract.DropVLAN); got != 9 {
			t.Errorf("routed vlan drops %v, want 4 + 5", got)
		}
		if got := counterOf(t, c, c.dropped, "bridge", contract.DropVLAN); got != 0 {
			t.Errorf("bridge vlan drops %v, want 0", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRepairPodFilterKeepsItsSocket: the pod filter's check and repair
// run on one lasting socket (closing a netfilter socket takes the
// netns's nftables commit lock, and waits there for an RCU grace
// period): a check that finds nothing, a repair of a deleted table and
// the next check open no socket of their own.
func TestRepairPodFilterKeepsItsSocket(t *testing.T) {
	n := testns.New(t)
	dir := t.TempDir()
	d := testDaemon(dir)
	err := n.Do(func(ns.NetNS) error {
		defer d.guardConn.Close()
		defer d.podFilterConn.Close()
		l, alias, err := hostVeth("pn0000000000c", "p0000000000c")
		if err != nil {
			return err
		}
		req := policysock.Request{Namespace: "ns", Name: "web", HostVeth: "pn0000000000c", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.9")},
			Guard: &policysock.GuardPort{Mode: "routed", Index: l.Attrs().Index, Alias: alias, MAC: "02:00:00:00:00:09"}}
		if err := d.GuardPort(context.Background(), req, nil); err != nil {
			return err
		}
		d.repairPodFilter()
		first, sockets := d.podFilterConn.Netlink(), testns.NetfilterSockets(t)
		if first == nil {
			t.Fatal("no socket after a check")
		}
		repairs := func() float64 { return testutil.ToFloat64(d.metrics.ObjectRepairs.WithLabelValues(RepairPodFilter)) }
		before := repairs()
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		conn.DelTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterL2TableOf(l.Attrs().Index)})
		if err := conn.Flush(); err != nil {
			return err
		}
		d.repairPodFilter()
		d.repairPodFilter()
		if got := repairs() - before; got != 1 {
			t.Errorf("%v repairs counted, want 1", got)
		}
		mac, _ := net.ParseMAC("02:00:00:00:00:09")
		if err := podfilter.Routed.At(dir).Verify(podfilter.Port{Index: l.Attrs().Index, IPs: []net.IP{net.ParseIP("10.244.0.9")}, MAC: mac}); err != nil {
			t.Errorf("after the repair: %v", err)
		}
		if d.podFilterConn.Netlink() != first || testns.NetfilterSockets(t) != sockets {
			t.Errorf("the checks dialed sockets of their own (%d netfilter sockets, %d after the first check)", testns.NetfilterSockets(t), sockets)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
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
