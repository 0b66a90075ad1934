//go:build bench

// Package policybench is the NetworkPolicy stage of `make bench` (issue
// 24), built only with the build tag bench: a two-node VXLAN test/cluster
// with podnet-routed --network-policy=true on both nodes, 1,000 pods, and
// 100 then 1,000 NetworkPolicies in the API server
// (PODNET_BENCH_POLICY_COUNTS, "100,1000").
//
// What is real and what is not: the two node netns, their podnet-routed
// (engine, nft table inet podnet-policy, conntrack) and kube-apiserver +
// etcd are real; four pods are real netns attached through libcni (srv
// and probe-srv on node 1, cli and probe-cli on node 2), and all the
// traffic measured is theirs. The other 996 pods are Pod objects only,
// with status.podIPs set as a kubelet would: 200 bound to node 1 with
// addresses in its PodCIDR (the engine compiles and writes them as local
// pods: verdict map elements, pod chains), 796 bound to 20 nodes that do
// not exist (peers in the policies' address sets). The policies (see
// policies) are in 11 namespaces and select those pods with pod
// selectors, namespace selectors, matchExpressions, ipBlocks with
// excepts, named ports, port ranges and egress rules; n/100 of them
// select srv besides the one allowing cli, and n/250 select cli for
// egress besides the one allowing it to srv, so that the measured first
// packets walk several policy chains on both nodes.
//
// Measured at each count: fresh-connection latency, connection rate and
// iperf3 throughput with 0 and that many policies (the 1,000 pods there in
// both), the table's size, the chains the first packet walks,
// enforcement latency (a policy created or deleted, a client pod's label
// changed -> the first new connection of the probe flow with the new
// verdict) and the incremental writes' time, and the full write after a
// restart of node 1's podnet-routed; revocation (an established stream's
// first line that gets no echo after the allowing policy is deleted) at
// the first count. At 0 policies and at each count, CNI ADD with the
// engine on next to ptp + host-local in node 1's netns, sequential and
// concurrent, and many pods at once at the last count (add_test.go, issue
// 34). It asserts nothing; the numbers go to
// $PODNET_BENCH_OUT/policy.json for bench/report.
package policybench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
	"github.com/podnet/podnet/test/policygen"
)

type flip struct {
	Policies int     `json:"policies"` // policies in place (0 in results before the 1,000-policy runs: 100)
	Kind     string  `json:"kind"`     // policy-create, policy-delete, label-remove, label-add
	To       string  `json:"to"`       // allowed or refused
	Ms       float64 `json:"ms"`       // change requested -> first attempt of the final run with the new verdict; -1: not within the limit
	Attempts int     `json:"attempts"`
}

type phase struct {
	Policies int `json:"policies"`
	// ClusterPolicies: ClusterNetworkPolicies in place too (the admin
	// phases, result.CNP, only)
	ClusterPolicies int `json:"cluster_policies,omitempty"`
	Rep             int `json:"rep"`
	// ConnectMs: one new TCP connection cli -> srv each, connect + one
	// echoed line, sequential
	ConnectMs  []float64 `json:"connect_ms"`
	ConnPerSec float64   `json:"conn_per_s"` // 4 workers, new connection + echo each
	// CPUPerConnUs: this process's CPU time (user + system, getrusage)
	// during those 4 workers' connections, per connection: the client's
	// and the server's syscalls and the forwarding of both nodes, which
	// the kernel runs in the softirq of the sending task, mostly this one
	// (podnet-routed and the API server are other processes). Unlike the
	// rate it does not count the time spent waiting for a CPU, which
	// the machine's other tenants decide.
	CPUPerConnUs float64 `json:"cpu_per_conn_us"`
	Gbps         float64 `json:"gbps"` // iperf3 cli -> srv, one TCP stream
	Load1        float64 `json:"load1"`
	// TimeWait: cli's sockets in TIME_WAIT when the phase started
	TimeWait int `json:"time_wait"`
	// RoutedCPUMs: node 1's and node 2's podnet-routed CPU time during the
	// phase's measurements (its engine's resync read-back every 30 s
	// among them)
	RoutedCPUMs [2]float64 `json:"routed_cpu_ms"`
	Seconds     float64    `json:"seconds"` // the measurements' wall time
}

type restart struct {
	Policies int `json:"policies"` // 0 in results before the 1,000-policy runs: 100
	// StartToWriteS: podnet-routed started -> its first write of the
	// table (informers synced, compiled, written whole) seen in /metrics
	StartToWriteS float64 `json:"start_to_write_s"`
	// ApplyS: podnet_policy_apply_seconds of that write (sum / count
	// when a second write came before the scrape)
	ApplyS     float64 `json:"apply_s"`
	ApplyCount float64 `json:"apply_count"`
}

// scale is what one count of policies built on node 1 (with every
// policy of the count in place).
type scale struct {
	Policies     int     `json:"policies"`
	SetupPolS    float64 `json:"setup_policies_s"` // the last create of them -> enforced
	IsolatedPods float64 `json:"isolated_pods"`
	PolicyChains float64 `json:"policy_chains"`
	// `nft list table inet podnet-policy` on node 1: lines, bytes, sets
	// and maps, chains
	TableLines  int `json:"table_lines"`
	TableBytes  int `json:"table_bytes"`
	TableSets   int `json:"table_sets"`
	TableChains int `json:"table_chains"`
	// SrvWalk: the policy chains the first packet cli -> srv walks in
	// srv's ingress chain on node 1 (the allowing one included), and how
	// many that chain jumps to; CliWalk: the same in cli's egress chain
	// on node 2
	SrvWalk [2]int `json:"srv_walk"`
	CliWalk [2]int `json:"cli_walk"`
	// IncrementalApply: podnet_policy_apply_seconds on node 1 over the
	// flips (diff writes): count and mean
	IncrementalApplyCount  float64 `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64 `json:"incremental_apply_mean_ms"`
	Repairs                float64 `json:"repairs"`
	// AttachMs: CNI ADD of a new pod on node 1 (labelled so that policies
	// select it), the plugin's wait for the engine to write it included,
	// with this count of policies in place; one pod at a time
	AttachMs []float64 `json:"attach_ms"`
}

type result struct {
	Started      time.Time `json:"started"`
	Seconds      float64   `json:"seconds"`
	Commit       string    `json:"commit"`
	LoadBefore   string    `json:"load_before"`
	LoadAfter    string    `json:"load_after"`
	Real         string    `json:"real"`
	RunFS        string    `json:"run_fs"` // where the nodes' state and IPAM stores are
	Encap        string    `json:"encap"`
	PodsTotal    int       `json:"pods_total"`
	PodsReal     int       `json:"pods_real"`
	PodsLocal    int       `json:"pods_fake_local"`
	PodsRemote   int       `json:"pods_fake_remote"`
	Policies     int       `json:"policies"`
	TableLines   int       `json:"table_lines"` // `nft list table inet podnet-policy` on node 1, lines
	IsolatedPods float64   `json:"isolated_pods"`
	PolicyChains float64   `json:"policy_chains"`
	SetupPodsS   float64   `json:"setup_pods_s"`
	SetupPolS    float64   `json:"setup_policies_s"`
	Flips        []flip    `json:"flips"`
	// RevocationMs: allowing policy deleted -> send time of the stream's
	// first line never echoed; -1: the stream kept echoing
	RevocationMs []float64 `json:"revocation_ms"`
	Phases       []phase   `json:"phases"`
	Restarts     []restart `json:"restarts"`
	// IncrementalApply: podnet_policy_apply_seconds on node 1 over the
	// flips (diff writes): count and mean
	IncrementalApplyCount  float64 `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64 `json:"incremental_apply_mean_ms"`
	// Repairs: podnet_repairs_total{object="policy-table"} on node 1 before
	// its restarts (no one touched the table: should be 0)
	Repairs float64 `json:"repairs"`
	// Scales: one per count of policies (PODNET_BENCH_POLICY_COUNTS); the
	// fields above are the first count's
	Scales []scale `json:"scales"`
	// AttachZeroMs: scale.AttachMs with the engine on and no policy (the
	// 1,000 pods in place)
	AttachZeroMs []float64 `json:"attach_zero_ms"`
	// CNP: the last count of policies again with ClusterNetworkPolicies
	// beside them (PODNET_BENCH_POLICY_CNPS, 0: none)
	CNP *cnpScale `json:"cnp,omitempty"`
	// AddCompare: ADD with the engine on next to ptp + host-local at 0
	// policies and at each count, and many pods at once at the last
	// (issue 34, add_test.go)
	AddCompare *addCompare `json:"add_compare,omitempty"`
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

const (
	nsBench     = policygen.NSBench
	fakeLocal   = 200
	fakeRemote  = 796
	fakeNodes   = 20
	fakeNSCount = policygen.NSCount
	fakeApps    = policygen.Apps // app=a<i%200>: 5 pods each, all in one namespace
	srvPort     = policygen.SrvPort
	iperfPort   = policygen.IperfPort
	allowCli    = policygen.AllowCli
	cliEgWeb    = policygen.CliEgWeb
)

// the API objects' makers (test/policygen): the cluster gets the
// policies test/policynft's BenchmarkWaitPath compiles
var (
	tcpPort  = policygen.TCPPort
	udpPort  = policygen.UDPPort
	sel      = policygen.Sel
	tiers    = policygen.Tiers
	policies = policygen.Policies
)

func ptr[T any](v T) *T { return &v }

func TestPolicyBench(t *testing.T) {
	out := os.Getenv("PODNET_BENCH_OUT")
	if out == "" {
		t.Fatal("a benchmark, run by `make bench` (scripts/bench.sh): set PODNET_BENCH_OUT to a directory to run it")
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed (Debian package iperf3; scripts/bench.sh installs it)")
	}
	rounds := envInt("PODNET_BENCH_POLICY_ROUNDS", 10) // 4 flips each
	revokes := envInt("PODNET_BENCH_POLICY_REVOKES", 10)
	// sequential fresh connections per run: 2,000 make the p99 the 20th
	// slowest, not the 3rd (300 did), so that one preempted connection
	// does not decide a run's ratio
	conns := envInt("PODNET_BENCH_POLICY_CONNS", 2000)
	iperfS := envInt("PODNET_BENCH_POLICY_IPERF_SECONDS", 5)
	// 8 pairs: one iperf3 stream of 5 s moves by ±20 % from run to run on
	// this 2-core machine, policies or not
	reps := envInt("PODNET_BENCH_POLICY_REPS", 8)
	var counts []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("PODNET_BENCH_POLICY_COUNTS"), "100,1000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 20 {
			t.Fatalf("PODNET_BENCH_POLICY_COUNTS=%q: counts of at least 20, comma-separated", os.Getenv("PODNET_BENCH_POLICY_COUNTS"))
		}
		counts = append(counts, n)
	}
	res := result{Started: time.Now().UTC(), Encap: "vxlan", Commit: os.Getenv("PODNET_BENCH_COMMIT"),
		LoadBefore: loadavg(),
		Real: "2 node netns with podnet-routed --network-policy=true (engine, nft, conntrack) and a real kube-apiserver + etcd; 4 pod netns attached by the plugins " +
			"(srv, probe-srv on node 1; cli, probe-cli on node 2: all measured traffic is theirs); 996 Pod objects without netns (200 on node 1 with addresses in its PodCIDR, 796 on 20 nodes that do not exist)"}
	ctx := context.Background()
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	// the nodes' state and IPAM stores on a tmpfs, as the DaemonSet keeps
	// them (/run/podnet): on this machine's disk the store's fsyncs alone
	// cost an ADD about 3 ms
	runDir, runFS := nettest.RunDir(t, "pnpolb-")
	res.RunFS = runFS
	c, err := cluster.Up(ctx, cluster.Config{
		Name:     "pnpolb-" + hex.EncodeToString(id),
		WorkDir:  t.TempDir(),
		RunDir:   runDir,
		RepoRoot: nettest.RepoRoot(t),
		BinDir:   nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed"),
		KapiDir:  kapi.BinDir(t),
		Encap:    "vxlan",
		Nodes:    2,
		// /23: the fake pods of node 1 in its upper /24 (excluded from
		// its IPAM), the lower one for the pods the stage attaches,
		// 100 at once among them (add_test.go)
		NodeCIDRMaskSize: 23,
		NetworkPolicy:    true,
		Logf:             t.Logf,
	})
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s podnet-routed log (end):\n%s", n.Name, cluster.Tail(n.RoutedLog(), 20))
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	if err := n1.ExcludeAddrs(fakeLocalCIDR(t, n1).String()); err != nil {
		t.Fatal(err)
	}
	// ClusterNetworkPolicy's CRD from the start (the engines watch it
	// within 5 s; no ClusterNetworkPolicy exists before the admin phase,
	// so the pods' chains have no tier jumps until then)
	nCNP := 100
	if v, err := strconv.Atoi(os.Getenv("PODNET_BENCH_POLICY_CNPS")); err == nil && v >= 0 {
		nCNP = v
	}
	if nCNP > 0 {
		if err := c.InstallClusterPolicyCRD(ctx); err != nil {
			t.Fatalf("install the ClusterNetworkPolicy CRD: %v", err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.CreateNamespace(ctx, nsBench, map[string]string{"team": "bench"}))
	addPod := func(n *cluster.Node, name string, labels map[string]string) *cluster.Pod {
		p, err := n.AddPodSpec(ctx, cluster.PodSpec{Namespace: nsBench, Name: name, Labels: labels,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: srvPort, Protocol: corev1.ProtocolTCP}}})
		must(err)
		return p
	}
	srv := addPod(n1, "srv", map[string]string{"app": "srv", "tier": "web"})
	probeSrv := addPod(n1, "probe-srv", map[string]string{"app": "probe"})
	cli := addPod(n2, "cli", map[string]string{"role": "cli"})
	probeCli := addPod(n2, "probe-cli", map[string]string{"role": "probe-cli"})
	// cli makes some 10,000 connections a phase and closes first: its
	// TIME_WAIT sockets (60 s) pile up over the phases, and connect()'s
	// search for a free port slows down with them (p50 0.4 -> 4 ms by the
	// third phase, so that the phase after another was slower whatever
	// its policies). Reusing TIME_WAIT ports for new connections (TCP
	// timestamps keep them apart) keeps every phase like the first.
	must(cli.NS.Do(func() error { return nettest.WriteSysctl("net/ipv4/tcp_tw_reuse", "1") }))
	must(srv.ServeEcho(srvPort))
	must(probeSrv.ServeEcho(srvPort))
	// the iperf3 server on CPU 0 and its client on CPU 1 (iperf below),
	// in every run alike: left to the scheduler, where the two land (one
	// CPU or two) moved a run's throughput by ±20 %, policies or not
	nettest.StartProcT(t, srv.NS.NetNS, filepath.Join(t.TempDir(), "iperf3.log"), "iperf3", "-s", "-A", "0", "-B", srv.IP.String(), "-p", strconv.Itoa(iperfPort))
	srvAddr, probeAddr := netip.AddrPortFrom(srv.IP, srvPort), netip.AddrPortFrom(probeSrv.IP, srvPort)
	waitVerdict(t, cli.NS, srvAddr, true, 20*time.Second)

	// 996 Pod objects, then each count of policies in turn.
	start := time.Now()
	createFakePods(t, c, n1)
	res.SetupPodsS = time.Since(start).Seconds()
	res.PodsReal, res.PodsLocal, res.PodsRemote = 4, fakeLocal, fakeRemote
	res.PodsTotal = res.PodsReal + res.PodsLocal + res.PodsRemote
	res.Policies = counts[0]
	b := &bench{t: t, ctx: ctx, c: c, runFS: runFS, n1: n1, n2: n2, srv: srv, cli: cli, probeSrv: probeSrv, probeCli: probeCli,
		srvAddr: srvAddr, probeAddr: probeAddr, conns: conns, iperfS: iperfS, reps: reps,
		attaches: envInt("PODNET_BENCH_POLICY_ATTACHES", 20)}
	res.AttachZeroMs = b.attach("attach, no policy")
	ab, addCmp := newAddBench(b)
	if ab != nil {
		res.AddCompare = addCmp
		addCmp.Levels = append(addCmp.Levels, ab.level(0))
	}
	if os.Getenv("PODNET_BENCH_POLICY_ADD_ONLY") == "1" {
		// a developer's run: the ADD comparison at 0 policies, logged,
		// nothing written
		return
	}
	for ci, count := range counts {
		pols := policies(count)
		sc := scale{Policies: len(pols)}
		res.Phases = append(res.Phases, b.phases(pols, nil, &sc.SetupPolS)...)
		// the policies are in place from here on
		if body, err := n1.MetricsText(); err == nil {
			sc.IsolatedPods, _ = cluster.Metric(body, "podnet_policy_isolated_pods")
			sc.PolicyChains, _ = cluster.Metric(body, "podnet_policy_chains")
		}
		sc.TableLines, sc.TableBytes, sc.TableSets, sc.TableChains = tableStats(n1)
		sc.SrvWalk = walk(t, n1, srv, policy.Ingress, policy.PolicyID(nsBench, allowCli, policy.Ingress))
		sc.CliWalk = walk(t, n2, cli, policy.Egress, policy.PolicyID(nsBench, cliEgWeb, policy.Egress))
		t.Logf("%d policies: table %d lines, %d sets, %d chains; srv's first packet walks %d of %d policy chains (node 1 ingress), cli's %d of %d (node 2 egress)",
			len(pols), sc.TableLines, sc.TableSets, sc.TableChains, sc.SrvWalk[0], sc.SrvWalk[1], sc.CliWalk[0], sc.CliWalk[1])

		// Enforcement latency: flips of the probe flow probe-cli -> probe-srv.
		applyBefore := applyStats(n1)
		allowProbe := allowProbePolicy()
		setLabel := func(role string) func() error {
			return func() error { return c.SetPodLabels(ctx, probeCli, map[string]string{"role": role}) }
		}
		for range rounds {
			for _, step := range []struct {
				kind   string
				allow  bool
				change func() error
			}{
				{"policy-create", true, func() error { return c.CreatePolicy(ctx, allowProbe.DeepCopy()) }},
				{"label-remove", false, setLabel("none")},
				{"label-add", true, setLabel("probe-cli")},
				{"policy-delete", false, func() error { return c.DeletePolicy(ctx, nsBench, "allow-probe") }},
			} {
				f := measureFlip(t, probeCli.NS, probeAddr, step.allow, step.change)
				f.Kind, f.Policies = step.kind, len(pols)
				res.Flips = append(res.Flips, f)
				t.Logf("%d policies, flip %s -> %s: %.1f ms (%d attempts)", len(pols), f.Kind, f.To, f.Ms, f.Attempts)
			}
		}
		applyAfter := applyStats(n1)
		if dc := applyAfter[1] - applyBefore[1]; dc > 0 {
			sc.IncrementalApplyCount = dc
			sc.IncrementalApplyMeanMs = (applyAfter[0] - applyBefore[0]) / dc * 1000
		}
		sc.AttachMs = b.attach(fmt.Sprintf("attach, %d policies", len(pols)))
		if ab != nil {
			addCmp.Levels = append(addCmp.Levels, ab.level(len(pols)))
			if ci == len(counts)-1 {
				addCmp.Burst = ab.burstRuns(len(pols))
			}
		}

		// Revocation (the first count only).
		if ci == 0 {
			for range revokes {
				must(c.CreatePolicy(ctx, allowProbe.DeepCopy()))
				waitVerdict(t, probeCli.NS, probeAddr, true, 10*time.Second)
				ms := revocation(t, probeCli.NS, probeAddr, func() error { return c.DeletePolicy(ctx, nsBench, "allow-probe") })
				res.RevocationMs = append(res.RevocationMs, ms)
				t.Logf("revocation: %.1f ms", ms)
				waitVerdict(t, probeCli.NS, probeAddr, false, 10*time.Second)
			}
		}

		if body, err := n1.MetricsText(); err == nil {
			sc.Repairs, _ = cluster.Metric(body, "podnet_repairs_total", `object="policy-table"`)
		}

		// Full write after a restart of node 1's podnet-routed.
		for range 3 {
			must(n1.StopRouted())
			start := time.Now()
			must(n1.StartRouted())
			r := restart{Policies: len(pols)}
			err := nettest.Poll(ctx, 120*time.Second, 10*time.Millisecond, func() error {
				st := applyStats(n1)
				if st[1] < 1 {
					return fmt.Errorf("no write yet")
				}
				r.StartToWriteS, r.ApplyS, r.ApplyCount = time.Since(start).Seconds(), st[0]/st[1], st[1]
				return nil
			})
			must(err)
			must(n1.WaitReady(ctx, 60*time.Second))
			res.Restarts = append(res.Restarts, r)
			t.Logf("%d policies, restart: first write %.3f s after start, apply %.1f ms", len(pols), r.StartToWriteS, r.ApplyS*1000)
		}
		waitVerdict(t, cli.NS, srvAddr, true, 30*time.Second)
		res.Scales = append(res.Scales, sc)
		if ci == 0 {
			res.TableLines, res.IsolatedPods, res.PolicyChains, res.SetupPolS = sc.TableLines, sc.IsolatedPods, sc.PolicyChains, sc.SetupPolS
			res.IncrementalApplyCount, res.IncrementalApplyMeanMs, res.Repairs = sc.IncrementalApplyCount, sc.IncrementalApplyMeanMs, sc.Repairs
		}
	}
	// The admin tier: the last count again with ClusterNetworkPolicies
	// beside it (cnp_test.go).
	if nCNP > 0 {
		res.CNP = b.cnpScale(policies(counts[len(counts)-1]), clusterPolicies(nCNP), rounds, revokes)
	}
	res.LoadAfter = loadavg()

	res.Seconds = time.Since(res.Started).Seconds()
	data, err := json.Marshal(res) // compact: the 1,000-policy results are large
	must(err)
	must(os.WriteFile(filepath.Join(out, "policy.json"), data, 0o644))
	t.Logf("wrote %s", filepath.Join(out, "policy.json"))
}

// ---- the API objects ----

// fakeLocalCIDR is the upper half of node 1's PodCIDR (a /23), where its
// fake pods have their addresses: excluded from its IPAM, which would
// otherwise hand them out again (it goes round its range).
func fakeLocalCIDR(t *testing.T, n1 *cluster.Node) netip.Prefix {
	a := n1.PodCIDR.Addr().As4()
	if n1.PodCIDR.Bits() != 23 || !n1.PodCIDR.Addr().Is4() {
		t.Fatalf("node 1 PodCIDR %s: the bench assumes an IPv4 /23", n1.PodCIDR)
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{a[0], a[1], a[2] + 1, 0}), 24)
}

// createFakePods makes the namespaces bns-0..9 and 996 Pod objects in
// them (labels app=a<i%200>, tier, version; named ports http and
// metrics), with
// status.podIPs: 200 on node 1 at .50-.249 of the upper /24 of its
// PodCIDR (fakeLocalCIDR, which its IPAM never hands out), the rest on
// nodes fake-0..19 from 10.250.0.0/16.
func createFakePods(t *testing.T, c *cluster.Cluster, n1 *cluster.Node) {
	ctx := context.Background()
	for i := range fakeNSCount {
		name := fmt.Sprintf("bns-%d", i)
		if err := c.CreateNamespace(ctx, name, policygen.NamespaceLabels(i)); err != nil {
			t.Fatal(err)
		}
		if err := cluster.EnsureServiceAccount(ctx, c.Client, name); err != nil {
			t.Fatal(err)
		}
	}
	base := fakeLocalCIDR(t, n1).Addr().As4()
	parallel(t, fakeLocal+fakeRemote, 16, func(i int) error {
		var node, ip string
		if i < fakeLocal {
			node = n1.Name
			ip = netip.AddrFrom4([4]byte{base[0], base[1], base[2], byte(50 + i)}).String()
		} else {
			j := i - fakeLocal
			node = fmt.Sprintf("fake-%d", j%fakeNodes)
			ip = fmt.Sprintf("10.250.%d.%d", j/250, j%250+1)
		}
		spec := cluster.PodSpec{
			Namespace: policygen.FakeNamespace(i), Name: fmt.Sprintf("fake-%d", i),
			Labels: policygen.FakePodLabels(i), Ports: policygen.FakePodPorts(),
		}
		if _, err := c.Client.CoreV1().Pods(spec.Namespace).Create(ctx, cluster.PodObject(spec, node), metav1.CreateOptions{}); err != nil {
			return err
		}
		return cluster.SetPodStatusIPs(ctx, c.Client, spec.Namespace, spec.Name, "192.0.2.1", []string{ip})
	})
}

// parallel runs f(0..n-1) on workers goroutines and fails on the first
// error.
func parallel(t *testing.T, n, workers int, f func(int) error) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

// ---- measurements ----

// waitVerdict waits until a new connection from -> to gets verdict allowed.
func waitVerdict(t *testing.T, from *cluster.NetNS, to netip.AddrPort, allowed bool, limit time.Duration) {
	t.Helper()
	err := nettest.Poll(context.Background(), limit, 50*time.Millisecond, func() error {
		err := cluster.ProbeTCP(context.Background(), from, to, 300*time.Millisecond)
		if allowed != (err == nil) {
			return fmt.Errorf("want allowed=%v, probe: %v", allowed, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s → %s: %v", from.Name, to, err)
	}
}

type attempt struct {
	at time.Time
	ok bool
}

// measureFlip starts a new TCP connection from -> to (connect and one
// echoed line, 300 ms to answer) every 10 ms, makes the change, and
// returns the time from the change to the first attempt of the run of 15
// attempts in a row that all had the new verdict (allowed) and after
// which none had the old one (up to 10 s).
func measureFlip(t *testing.T, from *cluster.NetNS, to netip.AddrPort, allowed bool, change func() error) flip {
	t.Helper()
	const every, answer, run, limit = 10 * time.Millisecond, 300 * time.Millisecond, 15, 10 * time.Second
	f := flip{To: "refused", Ms: -1}
	if allowed {
		f.To = "allowed"
	}
	var mu sync.Mutex
	var atts []attempt
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				at := time.Now()
				err := cluster.ProbeTCP(context.Background(), from, to, answer)
				mu.Lock()
				atts = append(atts, attempt{at: at, ok: err == nil})
				mu.Unlock()
			}()
		}
	}()
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	if err := change(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	deadline := t0.Add(limit)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		// the answered attempts, in start order, up to the last started
		// more than `answer` ago (all of those have finished)
		cut := time.Now().Add(-answer - 20*time.Millisecond)
		done := slices.Clone(atts)
		mu.Unlock()
		slices.SortFunc(done, func(a, b attempt) int { return a.at.Compare(b.at) })
		done = slices.DeleteFunc(done, func(a attempt) bool { return a.at.After(cut) })
		// the last attempt with the old verdict, then a run of `run`
		last := -1
		for i, a := range done {
			if a.ok != allowed {
				last = i
			}
		}
		if len(done)-last-1 >= run {
			first := done[last+1].at
			f.Ms = max(0, first.Sub(t0).Seconds()*1000)
			f.Attempts = len(done)
			break
		}
	}
	close(stop)
	wg.Wait()
	return f
}

// revocation opens a stream from -> to, sends a line every 5 ms, makes
// the change, and returns the time from the change to the send of the
// first line never echoed (-1: every line echoed for 5 s).
func revocation(t *testing.T, from *cluster.NetNS, to netip.AddrPort, change func() error) float64 {
	t.Helper()
	conn, err := from.DialContext(context.Background(), "tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mu sync.Mutex
	sent := map[int]time.Time{}
	echoed := map[int]bool{}
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 0, 64)
		rd := make([]byte, 4096)
		for {
			n, err := conn.Read(rd)
			if err != nil {
				return
			}
			buf = append(buf, rd[:n]...)
			for {
				i := strings.IndexByte(string(buf), '\n')
				if i < 0 {
					break
				}
				seq, _ := strconv.Atoi(string(buf[:i]))
				buf = buf[i+1:]
				mu.Lock()
				echoed[seq] = true
				mu.Unlock()
			}
		}
	}()
	go func() {
		for seq := 1; ; seq++ {
			select {
			case <-done:
				return
			default:
			}
			mu.Lock()
			sent[seq] = time.Now()
			mu.Unlock()
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := fmt.Fprintf(conn, "%d\n", seq); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	if err := change(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	close(done)
	mu.Lock()
	defer mu.Unlock()
	// the first line never echoed that was sent after the change, with
	// no echo after it
	lastEcho := 0
	for s := range echoed {
		lastEcho = max(lastEcho, s)
	}
	at, ok := sent[lastEcho+1]
	if !ok {
		return -1
	}
	return max(0, at.Sub(t0).Seconds()*1000)
}

// connectLatencies makes n new connections from -> to one after the
// other (connect + one echoed line each) and returns their times (ms).
func connectLatencies(t *testing.T, from *cluster.NetNS, to netip.AddrPort, n int) []float64 {
	t.Helper()
	var out []float64
	fails := 0
	for range n {
		start := time.Now()
		if err := cluster.ProbeTCP(context.Background(), from, to, 2*time.Second); err != nil {
			if fails++; fails > 5 {
				t.Fatalf("fresh connections fail: %v", err)
			}
			continue
		}
		out = append(out, time.Since(start).Seconds()*1000)
	}
	return out
}

// connRate is the new connections (connect + one echoed line) per second
// that workers loops make from -> to for d.
func connRate(from *cluster.NetNS, to netip.AddrPort, d time.Duration, workers int) float64 {
	var mu sync.Mutex
	ok := 0
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if cluster.ProbeTCP(context.Background(), from, to, time.Second) == nil {
					mu.Lock()
					ok++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return float64(ok) / d.Seconds()
}

// iperf runs one iperf3 client (one TCP stream) from netns to ip:port
// and returns the receiver-side Gbit/s.
func iperf(t *testing.T, n ns.NetNS, ip string, port, dur int) float64 {
	t.Helper()
	return iperfOmit(t, n, ip, port, dur, 1)
}

// iperfOmit is iperf with the first omit seconds not counted.
func iperfOmit(t *testing.T, n ns.NetNS, ip string, port, dur, omit int) float64 {
	t.Helper()
	var out []byte
	for try := 0; ; try++ {
		_ = n.Do(func(ns.NetNS) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(dur+20)*time.Second)
			defer cancel()
			out, _ = exec.CommandContext(ctx, "iperf3", "-c", ip, "-A", "1", "-p", strconv.Itoa(port), "-t", strconv.Itoa(dur), "-O", strconv.Itoa(omit), "-J").Output()
			return nil
		})
		gbps, err := nettest.IperfGbps(out)
		if err == nil {
			return gbps
		}
		if try == 30 {
			t.Fatalf("iperf3 -c %s: %v\n%s", ip, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tableStats is `nft list table inet podnet-policy` on n: lines, bytes,
// sets and maps, chains.
func tableStats(n *cluster.Node) (lines, size, sets, chains int) {
	out, err := n.NS.Exec(context.Background(), "nft", "list", "table", "inet", "podnet-policy")
	if err != nil {
		return 0, 0, 0, 0
	}
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "set "), strings.HasPrefix(l, "map "):
			sets++
		case strings.HasPrefix(l, "chain "):
			chains++
		}
	}
	return strings.Count(out, "\n"), len(out), sets, chains
}

// applyStats is podnet_policy_apply_seconds' sum and count on n.
func applyStats(n *cluster.Node) [2]float64 {
	body, err := n.MetricsText()
	if err != nil {
		return [2]float64{}
	}
	s, _ := cluster.Metric(body, "podnet_policy_apply_seconds_sum")
	c, _ := cluster.Metric(body, "podnet_policy_apply_seconds_count")
	return [2]float64{s, c}
}

// timeWait is the TCP sockets in TIME_WAIT in netns (sockstat of the
// thread in it: /proc/net is the main thread's netns).
func timeWait(t *testing.T, n *cluster.NetNS) int {
	var tw int
	_ = n.Do(func() error {
		data, err := os.ReadFile("/proc/thread-self/net/sockstat")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(l, "TCP: "); ok {
				f := strings.Fields(rest)
				for i := 0; i+1 < len(f); i += 2 {
					if f[i] == "tw" {
						tw, _ = strconv.Atoi(f[i+1])
					}
				}
			}
		}
		return nil
	})
	return tw
}

// procCPU is n's podnet-routed CPU time so far (/proc/<pid>/stat).
func procCPU(n *cluster.Node) time.Duration {
	p := n.Routed()
	if p == nil || p.Cmd == nil || p.Cmd.Process == nil {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// after the command name in parentheses: field 3 on; utime and stime
	// are fields 14 and 15, in clock ticks (100 a second)
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// cpuTime is this process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// walk reads p's pod chain for direction d on node and returns how many of its policy chains a packet walks up to and
// including pol-<allowing> (all of them when it is not there), and how
// many it jumps to.
func walk(t *testing.T, n *cluster.Node, p *cluster.Pod, d policy.Direction, allowing string) [2]int {
	t.Helper()
	ctx := context.Background()
	chain := podChainOf(p, d)
	out, err := n.NS.Exec(ctx, "nft", "list", "chain", "inet", "podnet-policy", chain)
	if err != nil {
		t.Fatalf("%s: nft list chain %s: %v", n.Name, chain, err)
	}
	var jumps []string
	for _, l := range strings.Split(out, "\n") {
		if _, v, ok := strings.Cut(l, "jump pol-"); ok {
			jumps = append(jumps, strings.TrimSpace(v))
		}
	}
	i := slices.Index(jumps, allowing)
	if i < 0 {
		return [2]int{len(jumps), len(jumps)}
	}
	return [2]int{i + 1, len(jumps)}
}

// podChainOf is p's pod chain for direction d (its port leads there: a
// routed pod is judged by its host veth, not by its addresses).
func podChainOf(p *cluster.Pod, d policy.Direction) string {
	return nft.PodChain(policy.PodID(p.Namespace, p.Name), d)
}

func load1() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
