package policynft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// BenchmarkApplyLarge: 1,000 pods selected by a policy of 10,000 peer
// ranges; "full" writes the whole table (one transaction, read back),
// "one-pod" adds and removes one pod incrementally.
func BenchmarkApplyLarge(b *testing.B) {
	node := nettest.NewNetNS(b)
	w := &nft.Writer{}
	b.Cleanup(w.Close)
	rs := largeRuleset(1000, 10000)
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
		}
	})
	more := largeRuleset(1001, 10000)
	b.Run("one-pod", func(b *testing.B) {
		nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
		i := 0
		for b.Loop() {
			next := more
			if i%2 == 1 {
				next = rs
			}
			i++
			nettest.Do(b, node, func() error { _, err := w.Apply(next); return err })
		}
	})
	b.Run("verify", func(b *testing.B) {
		nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
		for b.Loop() {
			nettest.Do(b, node, func() error {
				d, err := w.Verify(rs)
				if err == nil && d != "" {
					err = fmt.Errorf("verify: %s", d)
				}
				return err
			})
		}
	})
}

// connRuleset is the connection benchmark's ruleset: pod a isolated for
// ingress, allowed from b on TCP 8080 by one policy; besides it n other
// policies (10 peer ranges, 2 ports each) selecting n other pods, or,
// with throughA, a's chain jumping through them all before the one that
// allows (the worst case: the first packet walks n policy chains).
func connRuleset(e *env, n int, throughA bool) policy.Ruleset {
	rs := trafficRulesetAB(e)
	for i := range n {
		id := fmt.Sprintf("other%d", i)
		var peers []policy.Range
		for j := range 10 {
			a := netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), byte(j * 16)})
			peers = append(peers, policy.Range{From: a, To: a.Next().Next()})
		}
		rs.Policies = append(rs.Policies, policy.PolicyChain{ID: id, Direction: policy.Ingress, Rules: []policy.Rule{
			{Peers: peers, Ports: join(port(policy.ProtoTCP, 80, 80), port(policy.ProtoTCP, 443, 443))},
		}})
		if throughA {
			rs.Pods[0].Ingress = append([]string{id}, rs.Pods[0].Ingress...)
			continue
		}
		pa := netip.AddrFrom4([4]byte{10, 64, 2 + byte(i>>8), byte(i)})
		rs.Known = append(rs.Known, pa)
		rs.Pods = append(rs.Pods, policy.PodChains{ID: "o" + id, Addrs: []netip.Addr{pa}, IngressIsolated: true, Ingress: []string{id}})
	}
	return rs
}

// BenchmarkConnect is the connection rate from pod b to pod a (TCP
// connect, one echo, close: every connection's first packet judged by
// the table), without the table, with the table and 0 or 1,000 other
// policies, and with a's own chain walking 1,000 policies first.
func BenchmarkConnect(b *testing.B) {
	e := newEnv(b, "a", "b")
	server(b, e.pods["a"].ns, 8080)
	pa, pb := e.pods["a"], e.pods["b"]
	for _, tc := range []struct {
		name     string
		table    bool
		n        int
		throughA bool
	}{
		{"no-table", false, 0, false},
		{"policies=0", true, 0, false},
		{"policies=1000", true, 1000, false},
		{"a-walks-1000", true, 1000, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.table {
				nettest.Do(b, e.node, func() error { return e.w.ApplyFull(connRuleset(e, tc.n, tc.throughA)) })
			} else {
				nettest.Do(b, e.node, e.w.Delete)
			}
			dial := nettest.DialIn(pb.ns)
			dst := net.JoinHostPort(pa.v4.String(), "8080")
			start := time.Now()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c, err := dial(ctx, "tcp", dst)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if err := echo(c); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conn/s")
		})
	}
}
