package policynft

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/podnet/podnet/test/nettest"
)

// BenchmarkPortsSetShapes: what the kernel's commit costs when a pod
// gains the named port http (80) of a rule that also allows port 5201 to
// every address, in a concatenated interval set (addr . proto . port, the
// rule's ports set) laid out two ways: "address-major", runs of addresses
// with the ports each allows (a new pod splits the run around it: one
// wide element deleted, four added), and "port-major", each port with the
// addresses that have it (a new pod adds one point). The kernel's pipapo
// set pays for the wide elements a change deletes and adds.
func BenchmarkPortsSetShapes(b *testing.B) {
	node := nettest.NewNetNS(b)
	nettest.Do(b, node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		small := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "small"})
		ss := &nftables.Set{Table: small, Name: "p4", Interval: true, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		pk := func(a netip.Addr, port uint16) []byte {
			k := a.AsSlice()
			return append(k, 6, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
		}
		A := netip.MustParseAddr
		el := func(from, to string, port uint16) nftables.SetElement {
			return nftables.SetElement{Key: pk(A(from), port), KeyEnd: pk(A(to), port)}
		}
		// address-major (today's): the numbered port 5201 everywhere,
		// http (80) at .250; a pod at .3 splits the first range
		init := []nftables.SetElement{el("0.0.0.0", "10.64.1.249", 5201), el("10.64.1.250", "10.64.1.250", 80), el("10.64.1.250", "10.64.1.250", 5201), el("10.64.1.251", "255.255.255.255", 5201)}
		if err := c.AddSet(ss, init); err != nil {
			return err
		}
		// port-major: 5201 everywhere once, 80 at .250; a pod at .3 adds a point
		pm := &nftables.Set{Table: small, Name: "pm4", Interval: true, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		if err := c.AddSet(pm, []nftables.SetElement{el("0.0.0.0", "255.255.255.255", 5201), el("10.64.1.250", "10.64.1.250", 80)}); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return err
		}
		big := init[0]
		split := []nftables.SetElement{el("0.0.0.0", "10.64.1.2", 5201), el("10.64.1.3", "10.64.1.3", 80), el("10.64.1.3", "10.64.1.3", 5201), el("10.64.1.4", "10.64.1.249", 5201)}
		point := []nftables.SetElement{el("10.64.1.3", "10.64.1.3", 80)}
		for _, mode := range []string{"port-major", "address-major"} {
			var d []time.Duration
			for range 200 { // each: the change, then back
				start := time.Now()
				if mode == "port-major" {
					_ = c.SetAddElements(pm, point)
				} else {
					_ = c.SetDeleteElements(ss, []nftables.SetElement{big})
					_ = c.SetAddElements(ss, split)
				}
				if err := c.Flush(); err != nil {
					return err
				}
				d = append(d, time.Since(start))
				if mode == "port-major" {
					_ = c.SetDeleteElements(pm, point)
				} else {
					_ = c.SetDeleteElements(ss, split)
					_ = c.SetAddElements(ss, []nftables.SetElement{big})
				}
				if err := c.Flush(); err != nil {
					return err
				}
			}
			slices.Sort(d)
			b.ReportMetric(float64(d[100].Microseconds())/1000, mode+"-p50-ms")
			b.ReportMetric(float64(d[180].Microseconds())/1000, mode+"-p90-ms")
		}
		return nil
	})
}
