package policynft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
	"github.com/podnet/podnet/test/policygen"
)

// BenchmarkWaitPath is the engine's share of a pod's ADD without a
// cluster: the node of make bench's policy stage (the same policies,
// test/policygen, its measured pods, and the fake pods: 200 on this
// node, 796 elsewhere) in the
// incremental compile and the nft Writer in a node netns. Each op is a
// pod of the attach step (namespace bench, app=srv tier=web, named port
// http) arriving (its chains and port written, not timed), then given
// its addresses: the compile (Flush) and the write (ApplyDelta) that its
// ADD's wait is answered by, timed apart; then deleted (not timed).
func BenchmarkWaitPath(b *testing.B) {
	for _, n := range []int{0, 100, 1000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) { benchWaitPath(b, n) })
	}
}

const waitNode = "node-1"

// waitState is the node's compile with the fake pods and n policies.
func waitState(b testing.TB, n int) *policy.Incremental {
	st := policy.NewState()
	nsLabels := func(name string, l map[string]string) map[string]string {
		out := map[string]string{"kubernetes.io/metadata.name": name}
		for k, v := range l {
			out[k] = v
		}
		return out
	}
	st.SetNamespace(policy.Namespace{Name: policygen.NSBench, Labels: nsLabels(policygen.NSBench, map[string]string{"team": "bench"})})
	// the stage's measured pods: srv and probe-srv on this node, cli and
	// probe-cli on node 2
	http := []policy.NamedPort{{Name: "http", Protocol: policy.ProtoTCP, Port: policygen.SrvPort}}
	for i, p := range []policy.Pod{
		{Name: "srv", Node: waitNode, Labels: map[string]string{"app": "srv", "tier": "web"}},
		{Name: "probe-srv", Node: waitNode, Labels: map[string]string{"app": "probe"}},
		{Name: "cli", Node: "node-2", Labels: map[string]string{"role": "cli"}},
		{Name: "probe-cli", Node: "node-2", Labels: map[string]string{"role": "probe-cli"}},
	} {
		p.Namespace, p.Ports = policygen.NSBench, http
		p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 64, 1, byte(250 + i)})}
		if p.Node != waitNode {
			p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 65, 0, byte(2 + i)})}
		}
		st.SetPod(p)
	}
	for i := range policygen.NSCount {
		name := fmt.Sprintf("bns-%d", i)
		st.SetNamespace(policy.Namespace{Name: name, Labels: nsLabels(name, policygen.NamespaceLabels(i))})
	}
	var ports []policy.NamedPort
	for _, p := range policygen.FakePodPorts() {
		ports = append(ports, policy.NamedPort{Name: p.Name, Protocol: policy.ProtoTCP, Port: uint16(p.ContainerPort)})
	}
	for i := range 996 {
		p := policy.Pod{Namespace: policygen.FakeNamespace(i), Name: fmt.Sprintf("fake-%d", i), Labels: policygen.FakePodLabels(i), Ports: ports}
		if i < 200 {
			p.Node, p.IPs = waitNode, []netip.Addr{netip.AddrFrom4([4]byte{10, 64, 1, byte(50 + i)})}
		} else {
			j := i - 200
			p.Node, p.IPs = fmt.Sprintf("fake-%d", j%20), []netip.Addr{netip.AddrFrom4([4]byte{10, 250, byte(j / 250), byte(j%250 + 1)})}
		}
		st.SetPod(p)
	}
	for _, np := range policygen.Policies(max(n, 20))[:n] {
		if err := st.SetPolicy(np); err != nil {
			b.Fatal(err)
		}
	}
	inc := policy.NewIncremental(st, waitNode, localCIDRs)
	ps := map[string][]policy.LocalPort{}
	for _, key := range st.LocalPods(waitNode) {
		ns, name, _ := strings.Cut(key, "/")
		ps[key] = []policy.LocalPort{{Name: contract.HostVethName(ns, name, "", "eth0")}}
	}
	inc.SetLocalPorts(ps)
	return inc
}

func benchWaitPath(b *testing.B, n int) {
	inc := waitState(b, n)
	node := nettest.NewNetNS(b)
	w := &nft.Writer{}
	b.Cleanup(w.Close)
	inc.Flush()
	nettest.Do(b, node, func() error { return w.ApplyFull(inc.Ruleset()) })
	var compile, write, total, arrive, settle []time.Duration
	var stats nft.Stats
	i := 0
	nettest.Do(b, node, func() error {
		apply := func() error {
			_, err := w.ApplyDelta(inc.Flush())
			return err
		}
		for b.Loop() {
			i++
			p := policy.Pod{Namespace: policygen.NSBench, Name: fmt.Sprintf("attach-%d", i), Node: waitNode,
				Labels: map[string]string{"app": "srv", "tier": "web"},
				Ports:  []policy.NamedPort{{Name: "http", Protocol: policy.ProtoTCP, Port: policygen.SrvPort}}}
			b.StopTimer()
			inc.SetPod(p) // arriving: its chains and port first
			inc.SetPodPorts(p.Namespace+"/"+p.Name, []policy.LocalPort{{Name: contract.HostVethName(p.Namespace, p.Name, "", "eth0")}})
			t0 := time.Now()
			if err := apply(); err != nil {
				return err
			}
			t1 := time.Now()
			// and read back (Writer.settle), as it is long before an
			// ADD: what the engine wrote when the Pod object came
			if err := apply(); err != nil {
				return err
			}
			arrive, settle = append(arrive, t1.Sub(t0)), append(settle, time.Since(t1))
			b.StartTimer()
			start := time.Now()
			p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 64, 1, byte(2 + i%40)})}
			inc.SetPod(p)
			d := inc.Flush()
			mid := time.Now()
			st, err := w.ApplyDelta(d)
			if err != nil {
				return err
			}
			end := time.Now()
			stats = st
			compile, write, total = append(compile, mid.Sub(start)), append(write, end.Sub(mid)), append(total, end.Sub(start))
			b.StopTimer()
			inc.DeletePod(p.Namespace, p.Name)
			if err := apply(); err != nil {
				return err
			}
			b.StartTimer()
		}
		return nil
	})
	b.Logf("the last wait's write: %+v", stats)
	for _, x := range []struct {
		name string
		d    []time.Duration
	}{{"compile", compile}, {"write", write}, {"wait", total}, {"arrive", arrive}, {"settle", settle}} {
		slices.Sort(x.d)
		b.ReportMetric(float64(x.d[len(x.d)/2].Microseconds())/1000, x.name+"-p50-ms")
		b.ReportMetric(float64(x.d[(len(x.d)*99)/100].Microseconds())/1000, x.name+"-p99-ms")
	}
}
