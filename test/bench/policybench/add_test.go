//go:build bench

package policybench

// ADD with the engine on against the reference plugins (issue 34's
// must-show 1 and 2), in node 1's netns, at 0 policies and at each count:
//
//   - podnet as the DaemonSet runs it (the node's conflist: podnet with
//     podnet-ipam in-process, stateDir, so its ADD waits on the engine's
//     socket) next to ptp + host-local (containernetworking/plugins, the
//     cni stage's reference, with a host-local store of its own beside
//     node 1's), PODNET_BENCH_POLICY_ADD_PODS pods of each stack
//     sequential and as many with PODNET_BENCH_POLICY_ADD_WORKERS
//     concurrent ADDs, in turns of PODNET_BENCH_POLICY_ADD_CHUNK pods that
//     alternate between the stacks (ABBA: podnet, ref, ref, podnet, ...),
//     each turn started once node 1's engine is quiet, so that neither
//     stack pays for the other's work; every pod of a phase is DELeted
//     after it and the node checked for leaks;
//   - PODNET_BENCH_POLICY_BURST pods started at once (as many concurrent
//     ADDs) at the last count, podnet then ptp + host-local
//     (PODNET_BENCH_POLICY_BURST_REPS runs each, the order alternating).
//
// The podnet pods are what a scheduler and a kubelet make them: the Pod
// object (namespace bench, labelled app=srv tier=web as the attach step's,
// so that the policies select them) exists before the ADD, and its
// status.podIPs are reported right after the ADD
// (PODNET_BENCH_POLICY_ADD_STATUS=0: never), which the engine then
// writes; neither is timed. The reference pods have no Pod object: nothing
// on the node reads one for them. The engine's share of each podnet ADD is
// podnet_policy_wait_seconds of node 1, its bucket counts before and
// after each phase.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

const (
	podnetAddStack = "podnet+podnet-ipam (engine on)"
	refAddStack    = "ptp+host-local"
	refSubnet      = "10.203.0.0/16"
	waitMetric     = "podnet_policy_wait_seconds"
)

// addCompare is policy.json's add_compare.
type addCompare struct {
	Pods    int `json:"pods"`    // per stack, mode and level
	Workers int `json:"workers"` // the concurrent mode's ADDs in flight
	Chunk   int `json:"chunk"`   // pods per turn
	// Status: the podnet pods' status.podIPs reported after their ADD
	Status bool   `json:"status"`
	Podnet string `json:"podnet"` // what podnet's stack is
	Ref    string `json:"ref"`    // the reference's conflist
	// Levels: 0 policies, then each count
	Levels []addLevel `json:"levels"`
	// Burst: many pods at once at the last count
	Burst *addBurst `json:"burst,omitempty"`
}

// addLevel is one count of policies: libcni's AddNetworkList of each pod
// in ms (µs resolution), in the order the pods were added.
type addLevel struct {
	Policies     int       `json:"policies"`
	PodnetSeqMs  []float64 `json:"podnet_seq_ms"`
	RefSeqMs     []float64 `json:"ref_seq_ms"`
	PodnetConcMs []float64 `json:"podnet_conc_ms"`
	RefConcMs    []float64 `json:"ref_conc_ms"`
	// WaitSeq, WaitConc: podnet_policy_wait_seconds on node 1 over each
	// phase (only podnet's ADDs wait)
	WaitSeq  *histDelta `json:"wait_seq,omitempty"`
	WaitConc *histDelta `json:"wait_conc,omitempty"`
	Errors   []string   `json:"errors,omitempty"`
	// Leaks: what the node held after the DEL of a phase that it did
	// not before (should be none)
	Leaks   []string `json:"leaks,omitempty"`
	Seconds float64  `json:"seconds"`
	// RoutedSeq, RoutedConc: podnet-routed's CPU (both nodes) during each
	// stack's turns, per ADD
	RoutedSeq  *routedCPU `json:"routed_cpu_seq,omitempty"`
	RoutedConc *routedCPU `json:"routed_cpu_conc,omitempty"`
	// BlockedSeqMs, BlockedConcMs: per podnet ADD (in the order they
	// ended), how long it was held up by podnet-routed, from the plugin's
	// own step trace (PODNET_TRACE, on for podnet's turns): its guard step
	// (waiting for podnet-routed to add the port to the pod filter, or
	// adding it itself) and its policy step (the rest of the engine's
	// wait, which runs while the plugin sets up the pod)
	BlockedSeqMs  []float64 `json:"blocked_seq_ms,omitempty"`
	BlockedConcMs []float64 `json:"blocked_conc_ms,omitempty"`
	// RollingMs, BlockedRollingMs: podnet's ADDs, workers in flight,
	// beside the DEL of as many older podnet pods (8 in flight), as a
	// node replacing its pods does (addBench.rolling): latency and the
	// time podnet-routed held each up. Empty with
	// PODNET_BENCH_POLICY_ROLLING=0.
	RollingMs        []float64 `json:"rolling_ms,omitempty"`
	BlockedRollingMs []float64 `json:"blocked_rolling_ms,omitempty"`
	// StepsSeq: the sequential podnet ADDs step by step, from the same
	// trace (p50 of each step's wall time, in the trace's order, then
	// "inside the plugin": main to the result)
	StepsSeq []stepP50 `json:"steps_seq,omitempty"`
}

// stepP50 is one step's median wall time over a phase's traced ADDs.
type stepP50 struct {
	Step  string  `json:"step"`
	P50Ms float64 `json:"p50_ms"`
}

// routedCPU is the CPU both nodes' podnet-routed spent while one
// stack's pods were added, per ADD (ms): for podnet's, the engine's
// compiles and writes (node 1's wait, node 2's peer sets as the pods'
// addresses arrive); for the reference's, whatever its veths coming and
// going make the daemons do. Work an ADD sets off after its turn ended
// is not counted.
type routedCPU struct {
	PodnetMs float64 `json:"podnet_ms"`
	RefMs    float64 `json:"ref_ms"`
}

// routedCPUNow is both nodes' podnet-routed CPU so far.
func (a *addBench) routedCPUNow() time.Duration { return procCPU(a.b.n1) + procCPU(a.b.n2) }

// addBurst is Pods ADDs started at once on node 1, per stack and run.
type addBurst struct {
	Policies int        `json:"policies"`
	Pods     int        `json:"pods"`
	Runs     []burstRun `json:"runs"`
}

type burstRun struct {
	Stack string `json:"stack"`
	// Ms: each pod's ADD (ms), in the order they were started
	Ms []float64 `json:"ms"`
	// PluginCPUMs: the CPU of the run's plugin processes (and the
	// processes they ran), from the bench's RUSAGE_CHILDREN; RoutedCPUMs:
	// both nodes' podnet-routed over the run; CPUs: the machine's. No
	// schedule ends the last ADD before (PluginCPUMs + RoutedCPUMs) / CPUs
	// after the gate opened.
	PluginCPUMs float64 `json:"plugin_cpu_ms"`
	RoutedCPUMs float64 `json:"routed_cpu_ms"`
	CPUs        int     `json:"cpus"`
	// WallMs: the gate opened -> the last ADD answered
	WallMs float64    `json:"wall_ms"`
	Wait   *histDelta `json:"wait,omitempty"`
	Errors []string   `json:"errors,omitempty"`
	Leaks  []string   `json:"leaks,omitempty"`
}

// histDelta is what a Prometheus histogram counted over a phase: its
// bucket bounds (s, +Inf left out), the observations at or below each
// during the phase, their count and sum. Reset: the counts went back
// (the process restarted), the delta is meaningless.
type histDelta struct {
	Le    []float64 `json:"le_s"`
	Cum   []float64 `json:"cum"`
	Count float64   `json:"count"`
	SumS  float64   `json:"sum_s"`
	Reset bool      `json:"reset,omitempty"`
}

// quantile is the bucket the q-quantile (0 < q <= 1, nearest rank) falls
// in, (lo, hi] in s (hi +Inf past the last bound), and a linear
// interpolation within it; NaN without observations.
func (h *histDelta) quantile(q float64) (lo, hi, interp float64) {
	if h == nil || h.Count <= 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	rank := math.Max(1, math.Ceil(q*h.Count))
	prev := 0.0
	for i, c := range h.Cum {
		if c >= rank {
			if i > 0 {
				lo = h.Le[i-1]
			}
			hi = h.Le[i]
			return lo, hi, lo + (hi-lo)*(rank-prev)/(c-prev)
		}
		prev = c
	}
	last := 0.0
	if len(h.Le) > 0 {
		last = h.Le[len(h.Le)-1]
	}
	return last, math.Inf(1), math.Inf(1)
}

func (h *histDelta) String() string {
	if h == nil || h.Count <= 0 {
		return "no waits"
	}
	_, hi50, _ := h.quantile(0.5)
	_, hi99, in99 := h.quantile(0.99)
	return fmt.Sprintf("%0.f waits, p50 ≤ %s ms, p99 ≤ %s ms (~%.2f ms interpolated), mean %.2f ms", h.Count,
		strconv.FormatFloat(hi50*1000, 'g', -1, 64), strconv.FormatFloat(hi99*1000, 'g', -1, 64), in99*1000, h.SumS/h.Count*1000)
}

type hist struct {
	le, cum    []float64
	count, sum float64
}

// scrapeHist reads the histogram name from n's /metrics.
func scrapeHist(n *cluster.Node, name string) (hist, error) {
	var h hist
	body, err := n.MetricsText()
	if err != nil {
		return h, err
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+`_bucket{le="`); ok {
			q, v, ok := strings.Cut(rest, `"} `)
			if !ok || q == "+Inf" {
				continue
			}
			le, err1 := strconv.ParseFloat(q, 64)
			c, err2 := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err1 != nil || err2 != nil {
				return h, fmt.Errorf("%s: %q", n.Name, line)
			}
			h.le, h.cum = append(h.le, le), append(h.cum, c)
		} else if v, ok := strings.CutPrefix(line, name+"_sum "); ok {
			h.sum, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		} else if v, ok := strings.CutPrefix(line, name+"_count "); ok {
			h.count, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if len(h.le) == 0 {
		return h, fmt.Errorf("%s: no %s in /metrics", n.Name, name)
	}
	return h, nil
}

func (h *hist) minus(before *hist) *histDelta {
	if h == nil || before == nil {
		return nil
	}
	d := &histDelta{Le: h.le, Count: h.count - before.count, SumS: h.sum - before.sum}
	if len(before.cum) != len(h.cum) || d.Count < 0 {
		return &histDelta{Le: h.le, Reset: true}
	}
	for i := range h.cum {
		d.Cum = append(d.Cum, h.cum[i]-before.cum[i])
	}
	return d
}

// addStack is a plugin chain run in node 1's netns through libcni.
type addStack struct {
	name   string
	podnet bool
	cni    *libcni.CNIConfig
	list   *libcni.NetworkConfigList
	// hostLocal: the reference's host-local data dir
	hostLocal string
}

type addPod struct {
	s           *addStack
	name        string
	netns       *cluster.NetNS
	rt          *libcni.RuntimeConf
	ip          netip.Addr
	start, end  time.Time
	ok, deleted bool
}

func (p *addPod) ms() float64 { return float64(p.end.Sub(p.start).Microseconds()) / 1000 }

// addBench runs the comparison on the stage's cluster.
type addBench struct {
	b                                 *bench
	podnet, ref                       *addStack
	pods, workers, chunk, burst, reps int
	status                            bool
	seq                               int
	repairs0                          float64 // podFilterRepairs when the phase began
	mu                                sync.Mutex
	errs                              []string
}

// envCount is the knob name's value when it is an integer >= 0, else def.
func envCount(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

// newAddBench makes the two stacks on node 1 and warms them up (3 ADD and
// DEL each, unmeasured: the binaries in the page cache, the stores made).
// nil when PODNET_BENCH_POLICY_ADD_PODS and PODNET_BENCH_POLICY_BURST are
// both 0.
func newAddBench(b *bench) (*addBench, *addCompare) {
	a := &addBench{b: b,
		pods:    envCount("PODNET_BENCH_POLICY_ADD_PODS", 100),
		workers: envInt("PODNET_BENCH_POLICY_ADD_WORKERS", 8),
		chunk:   envInt("PODNET_BENCH_POLICY_ADD_CHUNK", 25),
		burst:   envCount("PODNET_BENCH_POLICY_BURST", 100),
		reps:    envInt("PODNET_BENCH_POLICY_BURST_REPS", 1),
		status:  os.Getenv("PODNET_BENCH_POLICY_ADD_STATUS") != "0",
	}
	if a.pods == 0 && a.burst == 0 {
		return nil, nil
	}
	t, n1 := b.t, b.n1
	conf, err := n1.NodeConflist()
	b.must(err)
	a.podnet = &addStack{name: podnetAddStack, podnet: true}
	a.podnet.list, err = libcni.ConfListFromBytes(conf)
	b.must(err)
	a.podnet.cni = libcni.NewCNIConfigWithCacheDir([]string{b.c.Cfg.BinDir}, filepath.Join(filepath.Dir(n1.DataDir), "add-podnet-cache"), nil)
	a.ref = &addStack{name: refAddStack, hostLocal: filepath.Join(filepath.Dir(n1.DataDir), "add-host-local")}
	refConf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bench-ref","plugins":[{"type":"ptp","ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		refSubnet, a.ref.hostLocal)
	a.ref.list, err = libcni.ConfListFromBytes([]byte(refConf))
	b.must(err)
	a.ref.cni = libcni.NewCNIConfigWithCacheDir([]string{nettest.RefToolsDir(t)}, filepath.Join(filepath.Dir(n1.DataDir), "add-ref-cache"), nil)
	out := &addCompare{Pods: a.pods, Workers: a.workers, Chunk: a.chunk, Status: a.status,
		Ref:    strings.ReplaceAll(refConf, filepath.Dir(n1.DataDir), "<node 1's run directory>"),
		Podnet: "conf/10-podnet.conflist with node 1's stateDir and IPAM dataDir (both on " + b.runFS + ", as the DaemonSet's /run/podnet): podnet, podnet-ipam in-process, the ADD's last step waiting on the engine's socket"}
	for _, s := range []*addStack{a.podnet, a.ref} {
		pods := a.newPods(s, 3)
		a.quiet()
		a.turn(pods, 1)
		a.delAll(pods)
	}
	if errs := a.takeErrors(); len(errs) > 0 {
		t.Fatalf("ADD comparison, warm-up: %s", strings.Join(errs, "; "))
	}
	return a, out
}

func (a *addBench) errorf(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs) < 5 {
		a.errs = append(a.errs, fmt.Sprintf(format, args...))
	} else if len(a.errs) == 5 {
		a.errs = append(a.errs, "(more errors not shown)")
	}
}

func (a *addBench) takeErrors() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.errs
	a.errs = nil
	return e
}

// newPods makes n pods of s: their netns (named after the cluster, so that
// its teardown sweeps what a failed run leaves) and, for podnet, their
// Pod objects.
func (a *addBench) newPods(s *addStack, n int) []*addPod {
	b := a.b
	pods := make([]*addPod, n)
	for i := range pods {
		a.seq++
		name := fmt.Sprintf("add-%d", a.seq)
		if !s.podnet {
			name = fmt.Sprintf("ref-%d", a.seq)
		}
		netns, err := nettest.NewNamedNetNS(b.c.Cfg.Name + "-pod-" + name)
		b.must(err)
		id := make([]byte, 32)
		_, _ = rand.Read(id)
		cid := hex.EncodeToString(id)
		pods[i] = &addPod{s: s, name: name, netns: netns, rt: &libcni.RuntimeConf{
			ContainerID: cid, NetNS: netns.Path(), IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", nsBench}, {"K8S_POD_NAME", name}, {"K8S_POD_INFRA_CONTAINER_ID", cid}},
		}}
	}
	if s.podnet {
		parallel(b.t, n, 8, func(i int) error {
			spec := cluster.PodSpec{Namespace: nsBench, Name: pods[i].name, Labels: map[string]string{"app": "srv", "tier": "web"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: srvPort, Protocol: corev1.ProtocolTCP}}}
			_, err := b.c.Client.CoreV1().Pods(nsBench).Create(b.ctx, cluster.PodObject(spec, b.n1.Name), metav1.CreateOptions{})
			return err
		})
	}
	return pods
}

// add is one pod's CNI ADD in node 1's netns, then (podnet) the kubelet's
// status report.
func (a *addBench) add(p *addPod) {
	b := a.b
	var res *current.Result
	err := b.n1.NS.Do(func() error {
		p.start = time.Now()
		r, err := p.s.cni.AddNetworkList(b.ctx, p.s.list, p.rt)
		p.end = time.Now()
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	})
	if err != nil {
		a.errorf("%s ADD %s: %v", p.s.name, p.name, err)
		return
	}
	for _, ip := range res.IPs {
		if ad, ok := netip.AddrFromSlice(ip.Address.IP); ok && ad.Unmap().Is4() {
			p.ip = ad.Unmap()
		}
	}
	if !p.ip.IsValid() {
		a.errorf("%s ADD %s: no IPv4 address in %v", p.s.name, p.name, res.IPs)
		return
	}
	p.ok = true
	if p.s.podnet && a.status {
		if err := cluster.SetPodStatusIPs(b.ctx, b.c.Client, nsBench, p.name, b.n1.IP.String(), []string{p.ip.String()}); err != nil {
			a.errorf("%s status: %v", p.name, err)
		}
	}
}

// turn ADDs pods with workers in flight.
func (a *addBench) turn(pods []*addPod, workers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, len(pods)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(pods) {
					return
				}
				a.add(pods[i])
			}
		})
	}
	wg.Wait()
}

// delAll DELs the pods (8 at a time), as a runtime does: the CNI DEL
// (after a failed ADD too), the netns removed, then the Pod object.
func (a *addBench) delAll(pods []*addPod) {
	b := a.b
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(8, len(pods)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(pods) {
					return
				}
				p := pods[i]
				if err := b.n1.NS.Do(func() error { return p.s.cni.DelNetworkList(b.ctx, p.s.list, p.rt) }); err != nil {
					a.errorf("%s DEL %s: %v", p.s.name, p.name, err)
				}
				p.netns.Close()
				if err := nettest.RemoveNamedNetNS(p.netns.Name); err != nil {
					a.errorf("%s: %v", p.name, err)
				}
				if p.s.podnet {
					err := b.c.Client.CoreV1().Pods(nsBench).Delete(b.ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
					if err != nil {
						a.errorf("delete Pod %s: %v", p.name, err)
					}
				}
				p.deleted = true
			}
		})
	}
	wg.Wait()
}

// quiet waits until node 1's engine is idle: no table write and at most 20
// ms of podnet-routed CPU in 500 ms (up to 30 s, then it goes on).
func (a *addBench) quiet() {
	n1 := a.b.n1
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		w0, c0 := applyStats(n1)[1], procCPU(n1)
		time.Sleep(500 * time.Millisecond)
		if applyStats(n1)[1] == w0 && procCPU(n1)-c0 <= 20*time.Millisecond {
			return
		}
	}
	a.b.t.Logf("ADD comparison: node 1's engine still busy after 30 s; going on")
}

// scrape reads node 1's podnet_policy_wait_seconds; nil (logged) when it
// cannot: the phases go on without the engine's share.
func (a *addBench) scrape() *hist {
	h, err := scrapeHist(a.b.n1, waitMetric)
	if err != nil {
		a.b.t.Logf("ADD comparison: %v", err)
		return nil
	}
	return &h
}

// phase is one mode at one level: a.pods pods of each stack in turns of
// a.chunk, workers in flight, then every pod DELeted and the node checked.
func (a *addBench) phase(workers int) (podnetMs, refMs []float64, wait *histDelta, routed *routedCPU, blocked []float64, steps []stepP50, errs, leaks []string) {
	base := a.baseState()
	a.repairs0 = a.podFilterRepairs()
	pp, rp := a.newPods(a.podnet, a.pods), a.newPods(a.ref, a.pods)
	h0 := a.scrape()
	cpu := map[bool]time.Duration{} // podnet's turns (true), the reference's
	trace := filepath.Join(a.b.t.TempDir(), "trace.jsonl")
	for k := 0; k*a.chunk < a.pods; k++ {
		lo, hi := k*a.chunk, min((k+1)*a.chunk, a.pods)
		turns := [][]*addPod{pp[lo:hi], rp[lo:hi]}
		if k%2 == 1 {
			turns[0], turns[1] = turns[1], turns[0]
		}
		for _, pods := range turns {
			a.quiet()
			c0 := a.routedCPUNow()
			restore := func() {}
			if pods[0].s.podnet {
				restore = setEnv("PODNET_TRACE", trace)
			}
			a.turn(pods, workers)
			restore()
			cpu[pods[0].s.podnet] += a.routedCPUNow() - c0
		}
	}
	blocked, steps, err := blockedMs(trace)
	if err != nil {
		a.errorf("podnet's step trace: %v", err)
	}
	wait = a.scrape().minus(h0)
	podnetMs, refMs = okMs(pp), okMs(rp)
	if len(pp) > 0 && len(rp) > 0 {
		routed = &routedCPU{PodnetMs: cpu[true].Seconds() * 1000 / float64(len(pp)), RefMs: cpu[false].Seconds() * 1000 / float64(len(rp))}
	}
	a.delAll(append(pp, rp...))
	errs = a.takeErrors()
	leaks = a.leaks(base, pp)
	return
}

// setEnv sets the process's variable k to v (libcni passes the runtime's
// environment on to the plugins) and returns what puts it back.
func setEnv(k, v string) func() {
	old, had := os.LookupEnv(k)
	os.Setenv(k, v)
	return func() {
		if had {
			os.Setenv(k, old)
		} else {
			os.Unsetenv(k)
		}
	}
}

// blockedMs reads the plugin's step trace at path: per ADD, the wall time
// of its guard and policy steps (ms), which is how long podnet-routed held
// it up; and each step's median (see addLevel.StepsSeq). No file is no
// ADD traced.
func blockedMs(path string) ([]float64, []stepP50, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var out []float64
	var order []string
	byStep := map[string][]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var v struct {
			Verb  string `json:"verb"`
			Steps []struct {
				Step   string  `json:"step"`
				WallUs float64 `json:"wallUs"`
			} `json:"steps"`
			WallUs float64 `json:"wallUs"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		if v.Verb != "ADD" {
			continue
		}
		us := 0.0
		for _, s := range v.Steps {
			if s.Step == "guard" || s.Step == "policy" {
				us += s.WallUs
			}
			if _, ok := byStep[s.Step]; !ok {
				order = append(order, s.Step)
			}
			byStep[s.Step] = append(byStep[s.Step], s.WallUs/1000)
		}
		byStep[insideStep] = append(byStep[insideStep], v.WallUs/1000)
		out = append(out, us/1000)
	}
	var steps []stepP50
	for _, st := range append(order, insideStep) {
		if v := byStep[st]; len(v) > 0 {
			steps = append(steps, stepP50{Step: st, P50Ms: roundMs([]float64{pct(v, 50)})[0]})
		}
	}
	return roundMs(out), steps, nil
}

// insideStep names the plugin's whole time (main to the result) among
// the steps.
const insideStep = "inside the plugin"

func okMs(pods []*addPod) []float64 {
	var out []float64
	for _, p := range pods {
		if p.ok {
			out = append(out, p.ms())
		}
	}
	return roundMs(out)
}

// level runs the sequential and the concurrent phase with the policies in
// place now.
func (a *addBench) level(policies int) addLevel {
	t := a.b.t
	l := addLevel{Policies: policies}
	if a.pods == 0 {
		return l
	}
	start := time.Now()
	var errs, leaks []string
	l.PodnetSeqMs, l.RefSeqMs, l.WaitSeq, l.RoutedSeq, l.BlockedSeqMs, l.StepsSeq, errs, leaks = a.phase(1)
	l.Errors, l.Leaks = append(l.Errors, errs...), append(l.Leaks, leaks...)
	l.PodnetConcMs, l.RefConcMs, l.WaitConc, l.RoutedConc, l.BlockedConcMs, _, errs, leaks = a.phase(a.workers)
	l.Errors, l.Leaks = append(l.Errors, errs...), append(l.Leaks, leaks...)
	l.Seconds = time.Since(start).Seconds()
	for _, m := range []struct {
		mode        string
		podnet, ref []float64
		wait        *histDelta
		routed      *routedCPU
		blocked     []float64
	}{{"sequential", l.PodnetSeqMs, l.RefSeqMs, l.WaitSeq, l.RoutedSeq, l.BlockedSeqMs}, {fmt.Sprintf("%d concurrent", a.workers), l.PodnetConcMs, l.RefConcMs, l.WaitConc, l.RoutedConc, l.BlockedConcMs}} {
		routed := ""
		if m.routed != nil {
			routed = fmt.Sprintf("; podnet-routed CPU per ADD during the turns (both nodes): podnet's %.2f ms, the reference's %.2f ms", m.routed.PodnetMs, m.routed.RefMs)
		}
		if len(m.blocked) > 0 {
			routed += fmt.Sprintf("; ADD held up by podnet-routed (guard + policy steps, %d traced): p50 %.2f ms p99 %.2f ms", len(m.blocked), pct(m.blocked, 50), pct(m.blocked, 99))
		}
		t.Logf("ADD at %d policies, %s: podnet p50 %.1f ms p99 %.1f ms, ptp+host-local p50 %.1f ms p99 %.1f ms (p50 %.2f×, p99 %.2f×); engine: %s%s",
			policies, m.mode, pct(m.podnet, 50), pct(m.podnet, 99), pct(m.ref, 50), pct(m.ref, 99),
			pct(m.podnet, 50)/pct(m.ref, 50), pct(m.podnet, 99)/pct(m.ref, 99), m.wait, routed)
	}
	if os.Getenv("PODNET_BENCH_POLICY_ROLLING") != "0" {
		l.RollingMs, l.BlockedRollingMs, errs = a.rolling()
		l.Errors = append(l.Errors, errs...)
		if len(l.RollingMs) > 0 {
			t.Logf("ADD at %d policies, %d concurrent beside as many DELs (a rolling update): podnet p50 %.1f ms p99 %.1f ms; held up by podnet-routed (%d traced): p50 %.2f ms p99 %.2f ms",
				policies, a.workers, pct(l.RollingMs, 50), pct(l.RollingMs, 99), len(l.BlockedRollingMs), pct(l.BlockedRollingMs, 50), pct(l.BlockedRollingMs, 99))
		}
	}
	if len(l.StepsSeq) > 0 {
		var sb strings.Builder
		for _, st := range l.StepsSeq {
			fmt.Fprintf(&sb, " %s %.2f", st.Step, st.P50Ms)
		}
		t.Logf("ADD at %d policies, sequential, podnet's steps (p50 ms):%s", policies, sb.String())
	}
	if len(l.Errors)+len(l.Leaks) > 0 {
		t.Logf("ADD at %d policies: errors %q, leaks %q", policies, l.Errors, l.Leaks)
	}
	return l
}

// rolling ADDs a.pods podnet pods, a.workers in flight, while as many
// older podnet pods, added before it, are DELeted beside them (delAll: 8
// in flight, the netns and the Pod object after each DEL), as on a node
// replacing its pods. Every DEL's plugin ends, and a socket it opened
// closes; the engine removes each gone pod from its table meanwhile
// (see test/policynft BenchmarkAddBesideDeletes). It returns the ADDs'
// latency and the time podnet-routed held each up (guard and policy
// steps), then DELs the new pods too.
func (a *addBench) rolling() (addMs, blocked []float64, errs []string) {
	old := a.newPods(a.podnet, a.pods)
	a.quiet()
	a.turn(old, a.workers)
	fresh := a.newPods(a.podnet, a.pods)
	a.quiet()
	trace := filepath.Join(a.b.t.TempDir(), "rolling.jsonl")
	restore := setEnv("PODNET_TRACE", trace)
	var wg sync.WaitGroup
	wg.Go(func() { a.delAll(old) })
	a.turn(fresh, a.workers)
	wg.Wait()
	restore()
	blocked, _, err := blockedMs(trace)
	if err != nil {
		a.errorf("podnet's step trace: %v", err)
	}
	addMs = okMs(fresh)
	a.delAll(fresh)
	return addMs, blocked, a.takeErrors()
}

// burstRuns starts a.burst pods at once, podnet's and the reference's in
// turn (a.reps runs each, the order alternating).
func (a *addBench) burstRuns(policies int) *addBurst {
	if a.burst == 0 {
		return nil
	}
	out := &addBurst{Policies: policies, Pods: a.burst}
	for rep := range a.reps {
		stacks := []*addStack{a.podnet, a.ref}
		if rep%2 == 1 {
			stacks[0], stacks[1] = stacks[1], stacks[0]
		}
		for _, s := range stacks {
			r := a.burstRun(s)
			floor := (r.PluginCPUMs + r.RoutedCPUMs) / float64(r.CPUs)
			a.b.t.Logf("%d ADDs at once, %d policies, %s: fastest %.1f ms, p50 %.1f ms, slowest %.1f ms (%.2f×), all in %.0f ms; engine: %s; CPU: plugins %.0f ms, podnet-routed %.0f ms, on %d CPUs at least %.0f ms (%.2f× the fastest)",
				a.burst, policies, s.name, pct(r.Ms, 0), pct(r.Ms, 50), pct(r.Ms, 100), pct(r.Ms, 100)/pct(r.Ms, 0), r.WallMs, r.Wait,
				r.PluginCPUMs, r.RoutedCPUMs, r.CPUs, floor, floor/pct(r.Ms, 0))
			if len(r.Errors)+len(r.Leaks) > 0 {
				a.b.t.Logf("errors %q, leaks %q", r.Errors, r.Leaks)
			}
			out.Runs = append(out.Runs, r)
		}
	}
	return out
}

func (a *addBench) burstRun(s *addStack) burstRun {
	r := burstRun{Stack: s.name}
	base := a.baseState()
	a.repairs0 = a.podFilterRepairs()
	pods := a.newPods(s, a.burst)
	a.quiet()
	h0 := a.scrape()
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() {
			<-gate
			a.add(p)
		})
	}
	c0, r0 := childrenCPU(), a.routedCPUNow()
	t0 := time.Now()
	close(gate)
	wg.Wait()
	r.PluginCPUMs = math.Round((childrenCPU()-c0).Seconds()*1e6) / 1000
	r.RoutedCPUMs = math.Round((a.routedCPUNow()-r0).Seconds()*1e6) / 1000
	r.CPUs = runtime.NumCPU()
	last := t0
	for _, p := range pods {
		if p.end.After(last) {
			last = p.end
		}
	}
	r.WallMs = math.Round(last.Sub(t0).Seconds()*1e6) / 1000
	if s.podnet {
		r.Wait = a.scrape().minus(h0)
	}
	r.Ms = okMs(pods)
	var podnetPods []*addPod
	if s.podnet {
		podnetPods = pods
	}
	a.delAll(pods)
	r.Errors = a.takeErrors()
	r.Leaks = a.leaks(base, podnetPods)
	return r
}

// childrenCPU is the CPU (user + system) of the bench's child processes
// that ended and were waited for, theirs included.
func childrenCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nodeState is what of node 1 a phase's pods could leave behind: links,
// addresses, routes (every table), permanent neighbours, the plugins' pod
// filter, podnet-ipam's reservations, host-local's.
func (a *addBench) nodeState() []string {
	// a dump that ran while the kernel changed what it lists (a detached
	// veth dying with its netns) is read again
	for range 20 {
		out, err := a.nodeStateOnce()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			a.b.must(err)
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.b.t.Fatal("node 1's netlink dumps were interrupted 20 times in a row")
	return nil
}

func (a *addBench) nodeStateOnce() ([]string, error) {
	n1 := a.b.n1
	var out []string
	err := n1.NS.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			out = append(out, fmt.Sprintf("link %s %s %v", l.Attrs().Name, l.Type(), l.Attrs().Flags))
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, ad := range addrs {
			out = append(out, fmt.Sprintf("addr %s dev %s", ad.IPNet, names[ad.LinkIndex]))
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, "route "+nettest.FormatRoute(r, names, true))
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			neighs, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, nb := range neighs {
				if nb.State&netlink.NUD_PERMANENT != 0 {
					out = append(out, fmt.Sprintf("neighbour %s dev %s", nb.IP, names[nb.LinkIndex]))
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	pf, err := nettest.PodFilterElements(n1.NS.NetNS)
	if err != nil {
		return nil, err
	}
	for _, e := range pf {
		out = append(out, "pod filter "+e)
	}
	res, err := n1.Reservations()
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		out = append(out, "podnet-ipam "+r)
	}
	err = filepath.WalkDir(a.ref.hostLocal, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		base := d.Name()
		if d.IsDir() || base == "lock" || strings.HasPrefix(base, "last_reserved_ip") {
			return nil
		}
		rel, _ := filepath.Rel(a.ref.hostLocal, path)
		out = append(out, "host-local "+rel)
		return nil
	})
	slices.Sort(out)
	return out, err
}

// dying is a link line of nodeState for a veth that is down: the host end
// of a pod DELeted (podnet's DEL detaches it) whose netns the kernel has
// not torn down yet.
func dying(line string) bool {
	f := strings.Fields(line)
	return len(f) >= 4 && f[0] == "link" && f[2] == "veth" && !slices.Contains(strings.Split(f[3], "|"), "up")
}

// baseState is nodeState once node 1 is settled: no veth of an earlier
// step's pods still being torn down, two reads 200 ms apart the same (up
// to 20 s).
func (a *addBench) baseState() []string {
	prev := a.nodeState()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		cur := a.nodeState()
		if slices.Equal(prev, cur) && !slices.ContainsFunc(cur, dying) {
			return cur
		}
		prev = cur
	}
	return prev
}

// leaks waits (up to 20 s: the kernel tears a removed netns' veths down
// after the fact, the engine writes the Pod objects' deletion) until node
// 1 is as base again and its engine's verdict maps hold none of the
// podnet pods' addresses; what still differs then is returned.
func (a *addBench) leaks(base []string, podnet []*addPod) []string {
	var diff []string
	ips := map[string]bool{}
	for _, p := range podnet {
		if p.ip.IsValid() {
			ips[p.ip.String()] = true
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		now := a.nodeState()
		diff = nil
		for _, l := range base {
			if !slices.Contains(now, l) && !dying(l) {
				diff = append(diff, "gone: "+l)
			}
		}
		for _, l := range now {
			if !slices.Contains(base, l) {
				diff = append(diff, "left: "+l)
			}
		}
		for _, m := range []string{"ingress4", "egress4", "judged4", "known4"} {
			for _, ad := range mapAddrs(a.b.n1, m) {
				if ips[ad] {
					diff = append(diff, fmt.Sprintf("left: %s in the engine's %s", ad, m))
				}
			}
		}
		if len(diff) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Pod filter elements left: how often podnet-routed's repair wrote
	// the filter whole meanwhile, and whether its leak reconcile (every
	// minute) prunes them.
	var left []string
	for _, l := range diff {
		if rest, ok := strings.CutPrefix(l, "left: "); ok && strings.HasPrefix(rest, "pod filter ") {
			left = append(left, rest)
		}
	}
	if len(left) > 0 {
		note := fmt.Sprintf("podnet-routed repaired the pod filter %.0f times since the phase began", a.podFilterRepairs()-a.repairs0)
		start := time.Now()
		for time.Since(start) < 75*time.Second && slices.ContainsFunc(a.nodeState(), func(l string) bool { return slices.Contains(left, l) }) {
			time.Sleep(time.Second)
		}
		if slices.ContainsFunc(a.nodeState(), func(l string) bool { return slices.Contains(left, l) }) {
			note += "; still there 75 s later"
		} else {
			note += fmt.Sprintf("; gone about %.0f s after the DELs (podnet-routed's leak reconcile prunes elements of gone veths)", time.Since(start).Seconds()+20)
		}
		diff = append(diff, "("+note+")")
	}
	if len(diff) > 10 {
		diff = append(diff[:10], fmt.Sprintf("(and %d more)", len(diff)-10))
	}
	return diff
}

// podFilterRepairs is node 1's podnet_repairs_total{object="pod-filter"}.
func (a *addBench) podFilterRepairs() float64 {
	body, err := a.b.n1.MetricsText()
	if err != nil {
		return 0
	}
	v, _ := cluster.Metric(body, "podnet_repairs_total", `object="pod-filter"`)
	return v
}

// mapAddrs are the addresses in the set or verdict map m of n's policy
// table.
func mapAddrs(n *cluster.Node, m string) []string {
	kind := "set"
	if strings.HasPrefix(m, "ingress") || strings.HasPrefix(m, "egress") {
		kind = "map"
	}
	out, err := n.NS.Exec(context.Background(), "nft", "list", kind, "inet", "podnet-policy", m)
	if err != nil {
		return nil
	}
	var addrs []string
	for _, f := range strings.Split(strings.NewReplacer("{", ",", "}", ",", "\n", ",", "=", ",").Replace(out), ",") {
		if k, _, _ := strings.Cut(strings.TrimSpace(f), " : "); k != "" {
			if _, err := netip.ParseAddr(k); err == nil {
				addrs = append(addrs, k)
			}
		}
	}
	return addrs
}
