package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time: on a shared, overloaded
// machine it says what a compile costs better than wall time does.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCompile is a full compile (index included) of one node's
// Ruleset in a cluster of 1,000 pods in 20 namespaces: on 10 nodes (about
// 100 local pods) and on 1 node (all 1,000 local, the worst case).
func BenchmarkCompile(b *testing.B) {
	for _, nodes := range []int{10, 1} {
		for _, policies := range []int{100, 1000} {
			b.Run(fmt.Sprintf("pods=1000/policies=%d/nodes=%d", policies, nodes), func(b *testing.B) {
				g := newGen(42, nodes, 20, 1000, policies)
				var rs Ruleset
				cpu0, n := cpuTime(), 0
				for b.Loop() {
					g.s.ix = nil
					rs = g.s.Compile("n0", g.cidrs["n0"])
					n++
				}
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(n), "cpu-ns/op")
				b.ReportMetric(float64(len(rs.Pods)), "pods")
				b.ReportMetric(float64(len(rs.Policies)), "chains")
				elems := 0
				for _, pc := range rs.Policies {
					for _, r := range pc.Rules {
						elems += len(r.Peers) + len(r.Ports)
					}
				}
				b.ReportMetric(float64(elems), "elements")
			})
		}
	}
}

// BenchmarkCompileHostile compiles one node with a policy of 10,000
// except-heavy ipBlocks per direction selecting every pod of a namespace
// (parsed once at SetPolicy, so the compile merges pod addresses only).
func BenchmarkCompileHostile(b *testing.B) {
	g := newGen(42, 10, 20, 1000, 100)
	r := rand.New(rand.NewPCG(7, 7))
	for _, ns := range g.nsNames[:5] {
		if err := g.s.SetPolicy(policy(ns, "big", nil, ptypes(pIngress, pEgress), ingress(nil, hostileBlocks(r)...),
			egress(nil, hostileBlocks(r)...))); err != nil {
			b.Fatal(err)
		}
	}
	cpu0, n := cpuTime(), 0
	for b.Loop() {
		g.s.ix = nil
		g.s.Compile("n0", g.cidrs["n0"])
		n++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(n), "cpu-ns/op")
}

// BenchmarkSetPolicyHostile parses the 10,000-ipBlock policy.
func BenchmarkSetPolicyHostile(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 7))
	p := policy("x", "big", nil, ingress(nil, hostileBlocks(r)...))
	s := testState()
	for b.Loop() {
		if err := s.SetPolicy(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllows: one verdict on a compiled 1,000 x 1,000 Ruleset with a
// built Matcher (what conntrack revocation costs per entry).
func BenchmarkAllows(b *testing.B) {
	g := newGen(42, 1, 20, 1000, 1000)
	m := NewMatcher(g.s.Compile("n0", g.cidrs["n0"]))
	for b.Loop() {
		src, dst := g.flowAddrs()
		proto, port := g.flowPort(src.Is4())
		m.Allows(src, dst, proto, port)
	}
}

// BenchmarkIncrementalPod is what a new local pod costs the incremental
// compile (its Flush: the Delta the writer gets), at 100 and 1,000
// policies over 1,000 pods; each op adds one pod and deletes it again.
func BenchmarkIncrementalPod(b *testing.B) {
	for _, policies := range []int{100, 1000} {
		for _, arrived := range []bool{false, true} {
			benchIncrementalPod(b, policies, arrived)
		}
	}
}

// benchIncrementalPod: a pod with its addresses at once, or (arrived) its
// Pod object compiled first and then its addresses (its ADD's wait).
func benchIncrementalPod(b *testing.B, policies int, arrived bool) {
	{
		b.Run(fmt.Sprintf("pods=1000/policies=%d/arrived=%v", policies, arrived), func(b *testing.B) {
			g := newGen(42, 10, 20, 1000, policies)
			inc := NewIncremental(g.s, "n0", g.cidrs["n0"])
			inc.Flush()
			i := 0
			cpu0, n := cpuTime(), 0
			for b.Loop() {
				i++
				p := Pod{Namespace: g.nsNames[i%len(g.nsNames)], Name: fmt.Sprintf("new-%d", i), Node: "n0",
					Labels: map[string]string{"app": genApps[i%len(genApps)], "role": genRoles[i%len(genRoles)]},
					IPs:    []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 200, byte(i)}), netip.AddrFrom16([16]byte{0xfd, 0, 13: 200, 15: byte(i)})},
					Ports:  []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 8080}}}
				if arrived {
					// its Pod object first, not timed: what the engine
					// writes before the ADD
					b.StopTimer()
					q := p
					q.IPs = nil
					inc.SetPod(q)
					inc.Flush()
					b.StartTimer()
				}
				inc.SetPod(p)
				if d := inc.Flush(); d.Empty() && len(d.Known) == 0 {
					b.Fatal("a new pod changed nothing")
				}
				inc.DeletePod(p.Namespace, p.Name)
				inc.Flush()
				n++
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(n), "cpu-ns/op")
		})
	}
}
