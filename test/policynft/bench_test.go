package policynft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
				nettest.Do(b, e.node, func() error { return e.w.ApplyFull(e.withPorts(connRuleset(e, tc.n, tc.throughA))) })
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

// BenchmarkConnectArms measures what the table costs a new connection,
// in isolation from the machine's other load: arms that differ in one
// thing take turns (the order rotates every round), each round writes
// the arm's table and makes sequential connections from pod b to pod a
// (TCP connect, one echo, close; client, server and the node's
// forwarding, which runs in the sender's softirq, all in this process),
// timing each and taking the process's CPU time (getrusage) per
// connection, and the result is the median over the rounds of each arm's
// ratio to the arm "open" of the same round (pair ratios, like the
// bench's datapath stage). The CPU time is what a connection costs; the
// wall time adds the wait for a CPU, which the machine's other tenants
// decide. Every arm but no-table holds 1,000 other pods isolated by
// 1,000 other policies (connRuleset). Run it once:
//
//	go test -run XXX -bench ConnectArms -benchtime 1x ./test/policynft/
//
// PODNET_BENCH_ROUNDS (12) and PODNET_BENCH_CONNS (500) size it.
//
//	no-table        no table inet podnet-policy at all
//	open            a not isolated: its first packets pass the base chains
//	                and miss the verdict maps (the bench's "0 policies")
//	isolated        a isolated, its chain jumps to the one policy chain
//	                that allows b (two set lookups)
//	walk-10         a's chain walks 10 other policy chains first
//	walk-100        and 100
//	no-midstream    isolated, the egress chains' mid-stream TCP rules
//	                deleted (nft CLI)
func BenchmarkConnectArms(b *testing.B) {
	rounds := envInt("PODNET_BENCH_ROUNDS", 12)
	conns := envInt("PODNET_BENCH_CONNS", 500)
	e := newEnv(b, "a", "b")
	server(b, e.pods["a"].ns, 8080)
	pa, pb := e.pods["a"], e.pods["b"]
	// b closes first: its TIME_WAIT sockets would pile up over the rounds
	// and slow connect()'s port search; reused, every arm is alike
	nettest.Do(b, pb.ns, func() error { return nettest.WriteSysctl("net/ipv4/tcp_tw_reuse", "1") })
	others := connRuleset(e, 1000, false)
	withWalk := func(n int) policy.Ruleset {
		rs := others
		rs.Pods = slices.Clone(rs.Pods)
		rs.Policies = slices.Clone(rs.Policies)
		for i := range n {
			id := fmt.Sprintf("walk%d", i)
			rs.Policies = append(rs.Policies, policy.PolicyChain{ID: id, Direction: policy.Ingress, Rules: []policy.Rule{
				{Peers: []policy.Range{{From: netip.AddrFrom4([4]byte{12, byte(i >> 8), byte(i), 0}), To: netip.AddrFrom4([4]byte{12, byte(i >> 8), byte(i), 200})}},
					Ports: join(port(policy.ProtoTCP, 80, 80), port(policy.ProtoTCP, 8080, 8080))},
			}})
			rs.Pods[0].Ingress = append([]string{id}, rs.Pods[0].Ingress...)
		}
		return rs
	}
	open := others
	open.Pods = slices.DeleteFunc(slices.Clone(others.Pods), func(p policy.PodChains) bool { return p.ID == "a" })
	type arm struct {
		name  string
		rs    *policy.Ruleset
		after func()
	}
	dropMidstream := func() {
		for _, chain := range []string{"egress-fwd", "egress-in"} {
			for _, line := range strings.Split(e.nft("-a", "list", "chain", "inet", nft.TableName, chain), "\n") {
				if !strings.Contains(line, "tcp flags") {
					continue
				}
				f := strings.Fields(line)
				e.nft("delete", "rule", "inet", nft.TableName, chain, "handle", f[len(f)-1])
			}
		}
	}
	iso, w10, w100 := withWalk(0), withWalk(10), withWalk(100)
	arms := []arm{
		{"no-table", nil, nil},
		{"open", &open, nil},
		{"isolated", &iso, nil},
		{"walk-10", &w10, nil},
		{"walk-100", &w100, nil},
		{"no-midstream", &iso, dropMidstream},
	}
	dial := nettest.DialIn(pb.ns)
	dst := net.JoinHostPort(pa.v4.String(), "8080")
	connect := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := dial(ctx, "tcp", dst)
		if err != nil {
			return err
		}
		defer c.Close()
		return echo(c)
	}
	type sample struct{ p50us, cpuUs float64 }
	got := map[string][]sample{}
	var tables []*policy.Ruleset
	for _, a := range arms {
		tables = append(tables, a.rs)
	}
	e.rotateArms(rounds, tables, func(i int) {
		a := arms[i]
		if a.after != nil {
			a.after()
		}
		if err := connect(); err != nil { // warm: ARP, neighbours
			b.Fatalf("%s: %v", a.name, err)
		}
		var us []float64
		cpu0 := cpuTime()
		for range conns {
			start := time.Now()
			if err := connect(); err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			us = append(us, float64(time.Since(start).Microseconds()))
		}
		cpu := (cpuTime() - cpu0).Seconds() * 1e6 / float64(conns)
		slices.Sort(us)
		got[a.name] = append(got[a.name], sample{us[len(us)/2], cpu})
	})
	for _, a := range arms {
		var lat, cpu, latR, cpuR []float64
		for i, s := range got[a.name] {
			o := got["open"][i]
			lat, cpu = append(lat, s.p50us), append(cpu, s.cpuUs)
			latR, cpuR = append(latR, s.p50us/o.p50us), append(cpuR, s.cpuUs/o.cpuUs)
		}
		b.Logf("%-13s connect p50 %6.0f µs (÷open %.3f), CPU %5.1f µs/conn (÷open %.3f); CPU ratios %v",
			a.name, medianOf(lat), medianOf(latR), medianOf(cpu), medianOf(cpuR), fmtRatios(cpuR))
		b.ReportMetric(medianOf(cpuR), a.name+"-cpu÷open")
	}
}

// medianOf is the median of xs.
func medianOf(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuTime is this process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fmtRatios(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, " ")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
