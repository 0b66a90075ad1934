//go:build bench

// Package routedbench holds the podnet-routed and data-path benchmarks of
// `make bench` (issue 8 §4-§5, issue 5 "Must show" 7), built only with
// the build tag bench: podnet-routed against a real kube-apiserver + etcd
// (test/kapi) at scale, in a node netns that reaches the API server
// through a forwarder (test/nettest), and the data path on a two-node
// test/cluster. They are tests only so that they can use the test
// harnesses; they assert almost nothing, write their raw numbers as JSON
// into $PODNET_BENCH_OUT for bench/report, and fail when it is unset.
package routedbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// benchOut returns the directory the results go to, or skips the test.
func benchOut(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PODNET_BENCH_OUT")
	if dir == "" {
		t.Fatal("a benchmark, run by `make bench` (scripts/bench.sh): set PODNET_BENCH_OUT to a directory to run it")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// fastClient is an admin client without client-go's client-side rate
// limit, so that creating thousands of Nodes is bounded by the API server.
func fastClient(t *testing.T, api *kapi.Server) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig(kapi.AdminUser, ""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0 // no rate limiter
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// memKiB returns VmRSS and VmHWM of pid in KiB.
func memKiB(pid int) (rss, hwm int) {
	st := procStatus(pid)
	return st["VmRSS:"], st["VmHWM:"]
}

// procStatus returns the kB fields of /proc/pid/status.
func procStatus(pid int) map[string]int {
	out := map[string]int{}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			if v, err := strconv.Atoi(f[1]); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out
}

// do runs f inside netns and fails the test on error.
func do(t *testing.T, n ns.NetNS, f func() error) { t.Helper(); nettest.Do(t, n, f) }

// httpGet fetches http://addr+path from inside netns.
func httpGet(netns ns.NetNS, addr, path string) (string, error) {
	_, body, err := nettest.GetIn(netns, "http://"+addr+path)
	return body, err
}

// metric returns the value of an unlabelled series in a /metrics body.
func metric(body, name string) (float64, bool) {
	m, err := nettest.ParseMetrics(body)
	v, ok := m[name]
	return v, err == nil && ok
}

// freePort returns a free TCP port on the loopback of netns.
func freePort(t *testing.T, netns ns.NetNS) int {
	t.Helper()
	port, err := nettest.FreePort(netns)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// ---- route watching ----

// routeEvent is one podnet route change seen in a node netns, stamped when
// the netlink message was read.
type routeEvent struct {
	At  time.Time
	Del bool
	Dst string
	Gw  string
}

// routeWatch subscribes to the route changes of a netns (the socket is
// created inside it) and stamps every podnet main-table route message as
// soon as it is read, on a goroutine of its own.
type routeWatch struct {
	Events   chan routeEvent
	Overflow chan error // the subscription failed (e.g. ENOBUFS): fall back to polling
	done     chan struct{}
}

func watchRoutes(t *testing.T, netns ns.NetNS) *routeWatch {
	t.Helper()
	w := &routeWatch{Events: make(chan routeEvent, 1<<16), Overflow: make(chan error, 1), done: make(chan struct{})}
	updates := make(chan netlink.RouteUpdate, 1<<12)
	do(t, netns, func() error {
		return netlink.RouteSubscribeWithOptions(updates, w.done, netlink.RouteSubscribeOptions{
			ReceiveBufferSize: 64 << 20, ReceiveBufferForceSize: true,
			ErrorCallback: func(err error) {
				select {
				case w.Overflow <- err:
				default:
				}
			},
		})
	})
	go func() {
		for u := range updates {
			at := time.Now()
			if u.Protocol != contract.RouteProtocol || u.Table != unix.RT_TABLE_MAIN || u.Dst == nil {
				continue
			}
			ev := routeEvent{At: at, Del: u.Type == unix.RTM_DELROUTE, Dst: u.Dst.String()}
			if u.Gw != nil {
				ev.Gw = u.Gw.String()
			}
			w.Events <- ev
		}
	}()
	t.Cleanup(func() { close(w.done) })
	return w
}

// podnetRouteCount dumps the podnet routes of the main table in netns.
func podnetRouteCount(netns ns.NetNS) (int, error) {
	n := 0
	err := netns.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		n = len(routes)
		return err
	})
	return n, err
}

// ---- VXLAN FDB watching ----

// fdbEvent is one new FDB entry on podnet.vxlan: the remote node address.
type fdbEvent struct {
	At  time.Time
	Dst string
}

// watchFDB stamps every new bridge-family neighbor (FDB entry) of netns.
func watchFDB(t *testing.T, netns ns.NetNS) chan fdbEvent {
	t.Helper()
	events := make(chan fdbEvent, 1<<16)
	updates := make(chan netlink.NeighUpdate, 1<<12)
	done := make(chan struct{})
	do(t, netns, func() error {
		return netlink.NeighSubscribeWithOptions(updates, done, netlink.NeighSubscribeOptions{
			ReceiveBufferSize: 64 << 20, ReceiveBufferForceSize: true, ErrorCallback: func(error) {},
		})
	})
	go func() {
		for u := range updates {
			at := time.Now()
			if u.Type != unix.RTM_NEWNEIGH || u.Family != unix.AF_BRIDGE || u.IP == nil {
				continue
			}
			select {
			case events <- fdbEvent{At: at, Dst: u.IP.String()}:
			default:
			}
		}
	}()
	t.Cleanup(func() { close(done) })
	return events
}

// fdbCount counts the FDB entries with a remote address on podnet.vxlan.
func fdbCount(netns ns.NetNS) (int, error) {
	n := 0
	err := netns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("podnet.vxlan")
		if err != nil {
			return err
		}
		fdb, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		for _, e := range fdb {
			if e.IP != nil {
				n++
			}
		}
		return err
	})
	return n, err
}

// cpuSeconds is the user + system CPU time pid has used.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// fields after the command name (which may hold spaces): state is 3rd,
	// utime the 14th and stime the 15th of the whole line
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// apiNodeRequests reads the API server's /metrics: requests on the nodes
// resource (no subresource) by verb, and the watches on it open now.
func apiNodeRequests(t *testing.T, client kubernetes.Interface) (byVerb map[string]int, watching int) {
	t.Helper()
	body, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("API server /metrics: %v", err)
	}
	byVerb = map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || (name != "apiserver_request_total" && name != "apiserver_longrunning_requests") {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, `resource="nodes"`) || !strings.Contains(labels, `subresource=""`) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		verb := ""
		if i := strings.Index(labels, `verb="`); i >= 0 {
			verb, _, _ = strings.Cut(labels[i+len(`verb="`):], `"`)
		}
		if name == "apiserver_longrunning_requests" {
			if verb == "WATCH" {
				watching += int(v)
			}
			continue
		}
		byVerb[verb] += int(v)
	}
	return byVerb, watching
}

// nodeWatch is the bench's own watch on Nodes: when a Node's new
// InternalIP reached a watcher of the API server, the moment the daemon's
// informer gets it too. It splits "Node change -> route" into the API
// server's part (write, watch fan-out) and the daemon's.
type nodeWatch struct {
	mu   sync.Mutex
	seen map[string]time.Time // name + " " + InternalIP
	stop func()
}

func watchNodes(t *testing.T, client kubernetes.Interface) *nodeWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch nodes: %v", err)
	}
	nw := &nodeWatch{seen: map[string]time.Time{}, stop: func() { w.Stop(); cancel() }}
	go func() {
		for ev := range w.ResultChan() {
			at := time.Now()
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					nw.mu.Lock()
					nw.seen[n.Name+" "+a.Address] = at
					nw.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(nw.stop)
	return nw
}

// when returns when the watch saw Node name with address ip, waiting up
// to a second for it.
func (w *nodeWatch) when(name, ip string) (time.Time, bool) {
	for i := 0; i < 100; i++ {
		w.mu.Lock()
		at, ok := w.seen[name+" "+ip]
		w.mu.Unlock()
		if ok {
			return at, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}, false
}
