//go:build bench

package policybench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// bench is the cluster and the measured pods the stage's steps share.
type bench struct {
	t                            *testing.T
	ctx                          context.Context
	c                            *cluster.Cluster
	n1, n2                       *cluster.Node
	srv, cli, probeSrv, probeCli *cluster.Pod
	srvAddr, probeAddr           netip.AddrPort
	conns, iperfS, reps          int
	attaches, attached           int
	runFS                        string // the nodes' state and IPAM stores' filesystem
	// the policies in the API server
	inPlace     []*networkingv1.NetworkPolicy
	cnpsInPlace []*cnpv1.ClusterNetworkPolicy
	// open: both nodes' tables in the last run without any policy
	// (swap_test.go)
	open tables
}

func (b *bench) must(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
}

// attach is the CNI ADD of new pods on node 1, one at a time, each
// deleted after: the Pod object exists before the ADD and shows its
// address only later (kubelet's status report), so the plugin's wait is
// answered by the engine's write of the addresses it reports.
func (b *bench) attach(what string) []float64 {
	var ms []float64
	for range b.attaches {
		b.attached++
		p, err := b.n1.AddPodSpec(b.ctx, cluster.PodSpec{Namespace: nsBench, Name: fmt.Sprintf("attach-%d", b.attached),
			Labels: map[string]string{"app": "srv", "tier": "web"}, LateStatus: true,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: srvPort, Protocol: corev1.ProtocolTCP}}})
		b.must(err)
		ms = append(ms, float64(p.ADD.Microseconds())/1000)
		b.must(b.n1.DelPod(b.ctx, p))
	}
	b.t.Logf("%s: CNI ADD p50 %.1f ms p99 %.1f ms (%d pods)", what, pct(ms, 50), pct(ms, 99), len(ms))
	return ms
}

// deleteAll deletes the policies in place, ClusterNetworkPolicies too,
// and waits until the probe flow is allowed again.
func (b *bench) deleteAll() {
	t, ctx := b.t, b.ctx
	parallel(t, len(b.inPlace), 8, func(i int) error { return b.c.DeletePolicy(ctx, b.inPlace[i].Namespace, b.inPlace[i].Name) })
	parallel(t, len(b.cnpsInPlace), 8, func(i int) error { return b.c.DeleteClusterPolicy(ctx, b.cnpsInPlace[i].Name) })
	hadCNPs := len(b.cnpsInPlace) > 0
	b.inPlace, b.cnpsInPlace = nil, nil
	if hadCNPs {
		b.waitClusterPolicies(0)
	}
	waitVerdict(t, b.probeCli.NS, b.probeAddr, true, 60*time.Second)
	time.Sleep(2 * time.Second)
}

// createAll creates pols and cnps and returns the time from the first
// create to both enforced (the probe flow refused by bench's deny-all,
// cli -> srv allowed, both nodes' engines holding every
// ClusterNetworkPolicy), then waits until node 1 wrote nothing for 2 s.
func (b *bench) createAll(pols []*networkingv1.NetworkPolicy, cnps []*cnpv1.ClusterNetworkPolicy) float64 {
	t, ctx := b.t, b.ctx
	start := time.Now()
	parallel(t, len(pols), 8, func(i int) error { return b.c.CreatePolicy(ctx, pols[i]) })
	parallel(t, len(cnps), 8, func(i int) error { return b.c.CreateClusterPolicy(ctx, cnps[i].DeepCopy()) })
	b.inPlace, b.cnpsInPlace = pols, cnps
	waitVerdict(t, b.probeCli.NS, b.probeAddr, false, 60*time.Second) // bench's deny-all
	waitVerdict(t, b.cli.NS, b.srvAddr, true, 60*time.Second)         // web-allow-cli
	if len(cnps) > 0 {
		b.waitClusterPolicies(len(cnps))
	}
	took := time.Since(start).Seconds()
	_ = nettest.Poll(ctx, 60*time.Second, time.Second, func() error {
		before := applyStats(b.n1)
		time.Sleep(2 * time.Second)
		if applyStats(b.n1)[1] != before[1] {
			return fmt.Errorf("node 1 still writing")
		}
		return nil
	})
	return took
}

// waitClusterPolicies waits until both nodes' engines hold n
// ClusterNetworkPolicies (podnet_policy_cluster_policies).
func (b *bench) waitClusterPolicies(n int) {
	b.t.Helper()
	err := nettest.Poll(b.ctx, 60*time.Second, 50*time.Millisecond, func() error {
		for _, nd := range []*cluster.Node{b.n1, b.n2} {
			body, err := nd.MetricsText()
			if err != nil {
				return fmt.Errorf("%s: metrics: %w", nd.Name, err)
			}
			if got, _ := cluster.Metric(body, "podnet_policy_cluster_policies"); int(got) != n {
				return fmt.Errorf("%s holds %.0f ClusterNetworkPolicies, want %d", nd.Name, got, n)
			}
		}
		return nil
	})
	b.must(err)
}

// phases measures 0 vs pols (and cnps) policies in pairs, the order
// alternating (0 first in odd pairs), so that a drift of the machine's
// load does not always favour the same side; the policies are in place
// when it returns. setup gets createAll's time of the last create.
func (b *bench) phases(pols []*networkingv1.NetworkPolicy, cnps []*cnpv1.ClusterNetworkPolicy, setup *float64) []phase {
	t, cli, srv := b.t, b.cli, b.srv
	if len(b.inPlace) > 0 || len(b.cnpsInPlace) > 0 {
		b.deleteAll()
	}
	// cli's TIME_WAIT sockets at their steady state before the first
	// measured run (the first run of a series otherwise had none)
	connRate(cli.NS, b.srvAddr, 3*time.Second, 4)
	var out []phase
	for rep := 1; rep <= b.reps; rep++ {
		order := []bool{false, true}
		if rep%2 == 0 {
			order = []bool{true, false}
		}
		for _, withPol := range order {
			if withPol && len(b.inPlace) == 0 {
				*setup = b.createAll(pols, cnps)
			}
			if !withPol && len(b.inPlace) > 0 {
				b.deleteAll()
			}
			if !withPol {
				b.open = b.dumpTables()
			}
			ph := phase{Policies: 0, Rep: rep, Load1: load1(), TimeWait: timeWait(t, cli.NS)}
			if withPol {
				ph.Policies, ph.ClusterPolicies = len(pols), len(cnps)
			}
			phStart, r1, r2 := time.Now(), procCPU(b.n1), procCPU(b.n2)
			// µs resolution: policy.json stays under 1 MB (no generated
			// file over 1 MB is committed)
			ph.ConnectMs = roundMs(connectLatencies(t, cli.NS, b.srvAddr, b.conns))
			cpu0 := cpuTime()
			ph.ConnPerSec = connRate(cli.NS, b.srvAddr, 3*time.Second, 4)
			if ph.ConnPerSec > 0 {
				ph.CPUPerConnUs = (cpuTime() - cpu0).Seconds() * 1e6 / (ph.ConnPerSec * 3)
			}
			ph.Gbps = iperf(t, cli.NS.NetNS, srv.IP.String(), iperfPort, b.iperfS)
			ph.Seconds = time.Since(phStart).Seconds()
			ph.RoutedCPUMs = [2]float64{(procCPU(b.n1) - r1).Seconds() * 1000, (procCPU(b.n2) - r2).Seconds() * 1000}
			t.Logf("%d policies + %d cluster policies, rep %d: connect p50 %.2f ms p99 %.2f ms, %.0f conn/s (%.0f µs CPU each), %.2f Gbit/s (load %.1f)",
				ph.Policies, ph.ClusterPolicies, rep, pct(ph.ConnectMs, 50), pct(ph.ConnectMs, 99), ph.ConnPerSec, ph.CPUPerConnUs, ph.Gbps, ph.Load1)
			out = append(out, ph)
		}
	}
	if len(b.inPlace) == 0 {
		*setup = b.createAll(pols, cnps)
	}
	return out
}

// allowProbePolicy allows probe-cli -> probe-srv on http (the flips'
// and the revocations' policy).
func allowProbePolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsBench, Name: "allow-probe"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "probe"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "probe-cli"}}}},
				Ports: []networkingv1.NetworkPolicyPort{tcpPort(intstr.FromString("http"))},
			}},
		},
	}
}

// roundMs rounds latencies in ms to the µs.
func roundMs(ms []float64) []float64 {
	for i, v := range ms {
		ms[i] = math.Round(v*1000) / 1000
	}
	return ms
}
