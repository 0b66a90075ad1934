//go:build bench

package routedbench

// podnet-routed at 100, 1,000, 5,000 and 10,000 Nodes, in `none` and
// `vxlan` modes (issues 5, 8 and 14). One API server; the Node objects are
// created in bulk (concurrently, no client rate limit), each with a /24
// PodCIDR out of 10.0.0.0/8 and an InternalIP in the node's underlay /16,
// so every `--encap=none` route (podCIDR via nodeIP dev ul0) is valid. For
// every scale and mode a fresh node netns runs a fresh podnet-routed:
//
//   - convergence: the daemon's "node informer synced" log record to the
//     moment the netns holds all N podnet routes (N-1 remote PodCIDRs and
//     the local blackhole), seen by a netlink route subscription in the
//     netns, and in vxlan mode all N-1 FDB entries (polled); plus the time
//     to sync (start -> synced) and the daemon's own "routes applied"
//     record.
//   - update latency under churn: -samples times, one remote Node's
//     InternalIP is changed (a status merge patch, as the kubelet would)
//     and the time from issuing the request to the kernel's RTM_NEWROUTE
//     with the new gateway (vxlan: the new FDB entry) in the netns is
//     recorded, while 10 other Nodes a second move too.
//   - a full apply with nothing to change (a link change makes the daemon
//     dump and recompute everything): the podnet route messages it causes
//     (want 0).
//   - memory and CPU: VmRSS (after the no-op full apply, and before it,
//     after the updates) and VmHWM, user + system seconds.
//   - the API server's requests on Nodes by verb while the daemon ran (its
//     /metrics): one LIST and one WATCH, no per-Node GET.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// scaleResult is what one scale measured.
type scaleResult struct {
	Nodes           int            `json:"nodes"`
	Mode            string         `json:"mode"`
	Routes          int            `json:"routes"` // podnet routes expected (and seen)
	CreateS         float64        `json:"create_s"`
	CreatedNodes    int            `json:"created_nodes"` // Node objects created for this scale
	StartToSyncS    float64        `json:"start_to_sync_s"`
	SyncToRoutesS   float64        `json:"sync_to_routes_s"`   // informer synced -> all routes in the kernel
	SyncToAppliedS  float64        `json:"sync_to_applied_s"`  // informer synced -> the daemon's "routes applied" record
	StartToRoutesS  float64        `json:"start_to_routes_s"`  // process start -> all routes
	Polled          bool           `json:"polled"`             // the subscription overflowed: the end time was polled
	MetricRoutes    float64        `json:"metric_programmed"`  // podnet_routes_programmed afterwards
	UpdateMs        []float64      `json:"update_ms"`          // Node status patch issued -> route changed in the kernel
	UpdateAPIMs     []float64      `json:"update_api_ms"`      // the patch request's own round trip
	UpdateDaemonMs  []float64      `json:"update_daemon_ms"`   // the bench's own Node watch saw the change -> route changed
	UpdateTimeouts  int            `json:"update_timeouts"`    // samples whose route never changed within 10 s
	RSSKiB          int            `json:"rss_kib"`            // after convergence and the updates
	RSSAnonKiB      int            `json:"rss_anon_kib"`       // of RSSKiB: anonymous memory (heap, stacks)
	RSSFileKiB      int            `json:"rss_file_kib"`       // and file pages (the binary)
	HWMKiB          int            `json:"hwm_kib"`            // peak RSS
	RSSAfterSyncKiB int            `json:"rss_after_sync_kib"` // right after convergence
	RSSChurnKiB     int            `json:"rss_churn_kib"`      // after the updates, before the no-op full apply (whose FreeOSMemory returns the heap's garbage)
	RSSChurnAnonKiB int            `json:"rss_churn_anon_kib"` // of RSSChurnKiB: anonymous memory
	FDBs            int            `json:"fdbs,omitempty"`     // vxlan: FDB entries expected (and seen)
	CPUSyncS        float64        `json:"cpu_sync_s"`         // CPU seconds until convergence
	CPUS            float64        `json:"cpu_s"`              // CPU seconds at the end
	ChurnPerS       float64        `json:"churn_per_s"`        // other Node changes per second during the samples
	Churned         int            `json:"churned"`
	NoopApplies     int            `json:"noop_applies"`     // full applies with nothing to change
	NoopRouteMsgs   int            `json:"noop_route_msgs"`  // podnet route messages they caused
	NoopFDBMsgs     int            `json:"noop_fdb_msgs"`    // and new FDB entries (vxlan)
	APIRequests     map[string]int `json:"api_requests"`     // Node requests by verb while the daemon ran (the bench's own excluded)
	APIWatchesOpen  int            `json:"api_watches_open"` // watches on nodes opened (and still open) while the daemon ran
}

type routedResult struct {
	Started time.Time     `json:"started"`
	Seconds float64       `json:"seconds"`
	Samples int           `json:"samples"`
	Scales  []scaleResult `json:"scales"`
	Flags   string        `json:"flags"`
}

const (
	benchClusterCIDR = "10.0.0.0/8"
	selfIP           = "172.20.0.10"
	underlayBits     = 16
)

// nodeName, podCIDR and nodeIP describe Node i; Node 0 is the measured
// node itself.
func nodeName(i int) string { return fmt.Sprintf("bench-node-%05d", i) }

func podCIDR(i int) string { return fmt.Sprintf("10.%d.%d.0/24", i>>8, i&255) }

func nodeIP(i int) string {
	return netip.AddrFrom4([4]byte{172, 20, byte((10 + i) >> 8), byte(10 + i)}).String()
}

// movedIP is the i-th fresh address an update moves a Node to (upper half
// of the /16, never used by nodeIP); movedSeq numbers them across scales,
// so that no update is a no-op.
var movedSeq atomic.Int64

func movedIP(i int) string {
	return netip.AddrFrom4([4]byte{172, 20, byte(128 + i>>8), byte(i)}).String()
}

// createNodes creates Nodes [from, to) with `workers` concurrent creates.
func createNodes(t *testing.T, client kubernetes.Interface, from, to, workers int) time.Duration {
	t.Helper()
	start := time.Now()
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= to {
					return
				}
				n := &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)},
					Spec:       corev1.NodeSpec{PodCIDR: podCIDR(i), PodCIDRs: []string{podCIDR(i)}},
					// Status is kept on create (the kubelet registers its
					// Node with its addresses the same way).
					Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
						{Type: corev1.NodeInternalIP, Address: nodeIP(i)}, {Type: corev1.NodeHostName, Address: nodeName(i)}}},
				}
				var err error
				for try := 0; try < 5; try++ {
					if _, err = client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("create %s: %w", n.Name, err)
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	// The status must have been kept, or the daemon would skip every node.
	got, err := client.CoreV1().Nodes().Get(context.Background(), nodeName(to-1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Addresses) == 0 || got.Status.Addresses[0].Address != nodeIP(to-1) {
		t.Fatalf("node %s: status addresses not kept on create: %+v", got.Name, got.Status.Addresses)
	}
	return time.Since(start)
}

func TestRoutedScale(t *testing.T) {
	out := benchOut(t)
	var scales []int
	for _, f := range strings.Split(envOr("PODNET_BENCH_ROUTED_SCALES", "100,1000,5000,10000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			t.Fatalf("PODNET_BENCH_ROUTED_SCALES: bad scale %q", f)
		}
		scales = append(scales, n)
	}
	samples := envInt("PODNET_BENCH_ROUTED_SAMPLES", 100)
	churn := envInt("PODNET_BENCH_ROUTED_CHURN", 10)
	modes := strings.Split(envOr("PODNET_BENCH_ROUTED_MODES", "none,vxlan"), ",")
	bin := filepath.Join(nettest.BinDir(t, "podnet-routed"), "podnet-routed")
	res := routedResult{Started: time.Now().UTC(), Samples: samples}

	start := time.Now()
	api := kapi.Start(t)
	t.Logf("kube-apiserver + etcd up in %v", time.Since(start).Round(time.Millisecond))
	client := fastClient(t, api)
	kubeconfig := api.Kubeconfig(kapi.AdminUser, "")

	created := 0
	for _, n := range scales {
		if n <= created {
			t.Fatalf("scales must increase: %v", scales)
		}
		createS := createNodes(t, client, created, n, 32).Seconds()
		t.Logf("%d Nodes: created %d in %.1fs", n, n-created, createS)
		for _, mode := range modes {
			sr := scaleResult{Nodes: n, Mode: mode, Routes: n, CreatedNodes: n - created, CreateS: createS, ChurnPerS: float64(churn)}
			if mode == "vxlan" {
				sr.FDBs = n - 1
			}
			t.Run(fmt.Sprintf("%d-%s", n, mode), func(t *testing.T) {
				measureScale(t, api, bin, kubeconfig, client, &sr, samples)
			})
			res.Scales = append(res.Scales, sr)
			writeJSON(t, filepath.Join(out, "routed.json"), res) // partial results survive a later failure
		}
		created = n
	}
	res.Flags = "--encap=<mode> --cluster-cidr=" + benchClusterCIDR + " --resync-interval=1h --log-level=info"
	res.Seconds = time.Since(res.Started).Seconds()
	writeJSON(t, filepath.Join(out, "routed.json"), res)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// measureScale runs a fresh podnet-routed in a fresh node netns against
// the sr.Nodes Nodes of the API server.
func measureScale(t *testing.T, api *kapi.Server, bin, kubeconfig string, client kubernetes.Interface, sr *scaleResult, samples int) {
	// The node: ul0 = selfIP/16 on a veth whose peer is a port of an
	// underlay bridge, so ul0 has carrier and the /16 is on-link.
	node := nettest.NewNode(t).NS
	underlay := nettest.NewNetNS(t)
	if err := cluster.AddBridge(underlay, "br0", 1500); err != nil {
		t.Fatal(err)
	}
	self := netip.MustParsePrefix(fmt.Sprintf("%s/%d", selfIP, underlayBits))
	if err := cluster.Plug(underlay, node, cluster.Port{Bridge: "br0", BrSide: "ul1", IfName: "ul0", Addr: self}); err != nil {
		t.Fatal(err)
	}
	apiAddr := fmt.Sprintf("127.0.0.1:%d", api.Port)
	nettest.Forward(t, node, apiAddr, apiAddr, nil)
	w := watchRoutes(t, node)
	var fdbs chan fdbEvent
	if sr.Mode == "vxlan" {
		fdbs = watchFDB(t, node)
	}
	reqBefore, watchingBefore := apiNodeRequests(t, client)
	stateDir := filepath.Join(t.TempDir(), "state")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t, node))
	logPath := filepath.Join(t.TempDir(), "podnet-routed.log")

	started := time.Now()
	d := nettest.StartProcT(t, node, logPath, bin,
		"--kubeconfig="+kubeconfig, "--node-name="+nodeName(0), "--encap="+sr.Mode,
		"--cluster-cidr="+benchClusterCIDR, "--state-dir="+stateDir, "--resync-interval=1h",
		"--ipam-data-dir="+filepath.Join(stateDir, "ipam"), "--cri-socket=",
		"--health-addr="+addr, "--metrics-addr="+addr, "--log-level=info")

	// Convergence: distinct podnet destinations present in the kernel.
	present := map[string]bool{}
	var allAt time.Time
	deadline := time.After(5 * time.Minute)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for allAt.IsZero() {
		select {
		case ev := <-w.Events:
			if ev.Del {
				delete(present, ev.Dst)
			} else {
				present[ev.Dst] = true
			}
			if len(present) == sr.Routes {
				allAt = ev.At
			}
		case err := <-w.Overflow:
			if !sr.Polled {
				t.Logf("route subscription failed (%v): polling the route count instead", err)
			}
			sr.Polled = true
		case <-poll.C:
			if err := d.Alive(); err != nil {
				t.Fatal(err)
			}
			if sr.Polled {
				if c, err := podnetRouteCount(node); err == nil && c == sr.Routes {
					allAt = time.Now()
				}
			}
		case <-deadline:
			c, _ := podnetRouteCount(node)
			t.Fatalf("%d routes after 5 min, want %d\n%s", c, sr.Routes, nettest.Tail(logPath, 20))
		}
	}
	if c, err := podnetRouteCount(node); err != nil || c != sr.Routes {
		t.Fatalf("route dump: %d podnet routes (err %v), want %d", c, err, sr.Routes)
	}
	// vxlan: the FDB entries are written after the routes
	for sr.FDBs > 0 {
		c, err := fdbCount(node)
		if err == nil && c == sr.FDBs {
			allAt = time.Now()
			break
		}
		if time.Since(allAt) > 5*time.Minute {
			t.Fatalf("%d FDB entries (err %v), want %d\n%s", c, err, sr.FDBs, nettest.Tail(logPath, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	sr.CPUSyncS = cpuSeconds(d.Cmd.Process.Pid)
	syncAt, ok := d.LogTime("node informer synced")
	if !ok {
		t.Fatalf("no \"node informer synced\" record\n%s", nettest.Tail(logPath, 20))
	}
	sr.StartToSyncS = syncAt.Sub(started).Seconds()
	sr.SyncToRoutesS = allAt.Sub(syncAt).Seconds()
	sr.StartToRoutesS = allAt.Sub(started).Seconds()
	// "routes applied" is logged once the initial apply returns.
	for i := 0; i < 100; i++ {
		if at, ok := d.LogTime("routes applied"); ok {
			sr.SyncToAppliedS = at.Sub(syncAt).Seconds()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sr.RSSAfterSyncKiB, _ = memKiB(d.Cmd.Process.Pid)
	t.Logf("%d Nodes %s: start->synced %.3fs, synced->%d routes in the kernel %.3fs (daemon's \"routes applied\" %.3fs), RSS %d KiB, CPU %.2fs",
		sr.Nodes, sr.Mode, sr.StartToSyncS, sr.Routes, sr.SyncToRoutesS, sr.SyncToAppliedS, sr.RSSAfterSyncKiB, sr.CPUSyncS)

	// Update latency, while other Nodes (even numbers; the samples take
	// odd ones) change ChurnPerS times a second.
	stopChurn := make(chan struct{})
	churnDone := make(chan int)
	go func() {
		crng := rand.New(rand.NewPCG(uint64(sr.Nodes), 11))
		n := 0
		tick := time.NewTicker(time.Duration(float64(time.Second) / max(sr.ChurnPerS, 0.001)))
		defer tick.Stop()
		for {
			select {
			case <-stopChurn:
				churnDone <- n
				return
			case <-tick.C:
			}
			if sr.ChurnPerS <= 0 || sr.Nodes < 4 {
				continue
			}
			j := 2 + 2*crng.IntN((sr.Nodes-2)/2)
			if j >= sr.Nodes {
				continue
			}
			if err := patchNodeIP(client, j, movedIP(int(movedSeq.Add(1)))); err == nil {
				n++
			}
		}
	}()
	nw := watchNodes(t, client)
	rng := rand.New(rand.NewPCG(uint64(sr.Nodes), 7))
	for k := 0; k < samples; k++ {
		j := 1 + 2*rng.IntN(sr.Nodes/2)
		if j >= sr.Nodes {
			j = 1
		}
		ip := movedIP(int(movedSeq.Add(1)))
		want := podCIDR(j)
		// Stale events (other Nodes' churn) must not be taken for this
		// sample.
	drain:
		for {
			select {
			case <-w.Events:
			case <-fdbs:
			default:
				break drain
			}
		}
		t0 := time.Now()
		if err := patchNodeIP(client, j, ip); err != nil {
			t.Fatal(err)
		}
		sr.UpdateAPIMs = append(sr.UpdateAPIMs, float64(time.Since(t0))/1e6)
		timeout := time.After(10 * time.Second)
	wait:
		for {
			select {
			case ev := <-w.Events:
				if sr.Mode != "vxlan" && !ev.Del && ev.Dst == want && ev.Gw == ip {
					sr.UpdateMs = append(sr.UpdateMs, float64(ev.At.Sub(t0))/1e6)
					if at, ok := nw.when(nodeName(j), ip); ok {
						sr.UpdateDaemonMs = append(sr.UpdateDaemonMs, float64(ev.At.Sub(at))/1e6)
					}
					break wait
				}
			case ev := <-fdbs:
				// vxlan: the route (via the remote VTEP) stays; the new
				// address is the FDB entry
				if ev.Dst == ip {
					sr.UpdateMs = append(sr.UpdateMs, float64(ev.At.Sub(t0))/1e6)
					if at, ok := nw.when(nodeName(j), ip); ok {
						sr.UpdateDaemonMs = append(sr.UpdateDaemonMs, float64(ev.At.Sub(at))/1e6)
					}
					break wait
				}
			case <-timeout:
				sr.UpdateTimeouts++
				t.Logf("sample %d: route to %s via %s not seen within 10 s", k, want, ip)
				break wait
			}
		}
		time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
	}
	close(stopChurn)
	sr.Churned = <-churnDone
	// the heap as Node events grow it (as far as GOGC lets it), before a
	// full apply gives the garbage back
	sr.RSSChurnKiB, _ = memKiB(d.Cmd.Process.Pid)
	sr.RSSChurnAnonKiB = procStatus(d.Cmd.Process.Pid)["RssAnon:"]
	nw.stop()

	// A full apply with nothing to change: a link (not a pod's) coming up
	// makes the daemon dump the table and recompute everything; it must
	// write no route.
	applies := func() int {
		body, err := httpGet(node, addr, "/metrics")
		if err != nil {
			t.Fatalf("podnet-routed /metrics: %v", err)
		}
		v, _ := metric(body, "podnet_apply_duration_seconds_count")
		return int(v)
	}
	time.Sleep(500 * time.Millisecond) // the last churn applied
drainAll:
	for {
		select {
		case <-w.Events:
		case <-fdbs:
		default:
			break drainAll
		}
	}
	before := applies()
	do(t, node, func() error {
		// this kernel has no dummy links; a link coming up is what makes
		// the daemon apply everything (its creation alone does not)
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "bench-kick"}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	for i := 0; i < 100 && applies() == before; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	sr.NoopApplies = applies() - before
	for len(w.Events) > 0 {
		<-w.Events
		sr.NoopRouteMsgs++
	}
	for fdbs != nil && len(fdbs) > 0 {
		<-fdbs
		sr.NoopFDBMsgs++
	}

	sr.RSSKiB, sr.HWMKiB = memKiB(d.Cmd.Process.Pid)
	st := procStatus(d.Cmd.Process.Pid)
	sr.RSSAnonKiB, sr.RSSFileKiB = st["RssAnon:"], st["RssFile:"]
	sr.CPUS = cpuSeconds(d.Cmd.Process.Pid)
	keep := os.Getenv("PODNET_BENCH_KEEP_LOGS") // a directory
	keepFile := func(what string, b []byte) {
		if keep != "" {
			_ = os.WriteFile(filepath.Join(keep, fmt.Sprintf("podnet-routed-%d-%s.%s", sr.Nodes, sr.Mode, what)), b, 0o644)
		}
	}
	if keep != "" { // where the resident memory is, mapping by mapping
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", d.Cmd.Process.Pid)); err == nil {
			keepFile("smaps", b)
		}
	}
	if body, err := httpGet(node, addr, "/metrics"); err == nil {
		sr.MetricRoutes, _ = metric(body, "podnet_routes_programmed")
		keepFile("metrics", []byte(body))
	}
	reqAfter, watching := apiNodeRequests(t, client)
	sr.APIRequests = map[string]int{}
	for verb, n := range reqAfter {
		if d := n - reqBefore[verb]; d > 0 {
			sr.APIRequests[verb] = d
		}
	}
	// the bench's own Node watch (one LIST for its resourceVersion, one
	// WATCH, closed) is not the daemon's
	for _, verb := range []string{"LIST", "WATCH"} {
		if sr.APIRequests[verb]--; sr.APIRequests[verb] <= 0 {
			delete(sr.APIRequests, verb)
		}
	}
	sr.APIWatchesOpen = watching - watchingBefore
	if err := d.Alive(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Nodes %s: %d updates under %d other changes, median %.1f ms, %d timeouts; RSS %d KiB (peak %d KiB), CPU %.2fs; podnet_routes_programmed %v; no-op full apply: %d applies, %d route messages; API requests on nodes %v, %d watches open",
		sr.Nodes, sr.Mode, len(sr.UpdateMs), sr.Churned, median(sr.UpdateMs), sr.UpdateTimeouts, sr.RSSKiB, sr.HWMKiB, sr.CPUS, sr.MetricRoutes, sr.NoopApplies, sr.NoopRouteMsgs, sr.APIRequests, sr.APIWatchesOpen)
	_ = d.Stop(10 * time.Second)
	if b, err := os.ReadFile(logPath); err == nil {
		keepFile("log", b)
	}
}

// patchNodeIP moves Node i to ip with a status merge patch, as the kubelet
// would.
func patchNodeIP(client kubernetes.Interface, i int, ip string) error {
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"addresses": []map[string]string{
		{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": nodeName(i)}}}})
	if _, err := client.CoreV1().Nodes().Patch(context.Background(), nodeName(i), types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch %s: %w", nodeName(i), err)
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
