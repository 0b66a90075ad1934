package routed

// The harness: a real kube-apiserver (test/kapi), one "underlay" netns
// holding a bridge, and one netns per Kubernetes node, each with a veth
// ("eth0", the node's InternalIP) on that bridge. bin/podnet-routed runs
// inside a node netns; it reaches the API server (on the root netns'
// loopback) through a small TCP proxy whose listener lives on the node
// netns' loopback (127.0.0.1:6443 there). Nothing touches the root netns.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

const (
	clusterCIDR    = "10.244.0.0/16"
	underlayPrefix = "10.77.0." // node InternalIPs: 10.77.0.<n>/24
	underlayMTU    = 1400       // not 1500, so that node.json's MTU says where it came from
	uplinkName     = "eth0"
	apiProxyAddr   = "127.0.0.1:6443" // inside every node netns
	resync         = 2 * time.Second
	mainTable      = unix.RT_TABLE_MAIN
)

// cluster is one API server plus the underlay the node netns hang on.
type cluster struct {
	t        *testing.T
	bin      string
	api      *kapi.Server
	client   kubernetes.Interface
	underlay ns.NetNS
	nodes    map[string]*node
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	bin := filepath.Join(nettest.BinDir(t, "podnet-routed"), "podnet-routed")
	start := time.Now()
	api := kapi.Start(t) // fails (never skips) without PODNET_KAPI_DIR
	t.Logf("kube-apiserver + etcd up in %s", time.Since(start).Round(time.Millisecond))
	// An admin client without client-go's default 5 QPS limit, so that the
	// measured latencies are the daemon's, not the test client's throttle.
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig(kapi.AdminUser, ""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin, api: api, client: client, nodes: map[string]*node{}}
	c.underlay = nettest.NewNetNS(t)
	c.do(c.underlay, func() error {
		if err := linkUp("lo"); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add br0: %w", err)
		}
		return netlink.LinkSetUp(br)
	})
	return c
}

func (c *cluster) do(n ns.NetNS, f func() error) {
	c.t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		c.t.Fatal(err)
	}
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return netlink.LinkSetUp(l)
}

// node is a Kubernetes node: its netns (with eth0 on the underlay bridge),
// a state dir, and the API proxy podnet-routed talks to.
type node struct {
	c        *cluster
	name     string
	ip       string // InternalIP on eth0
	ns       ns.NetNS
	dir      string
	stateDir string
	proxy    *apiProxy
}

// addNode creates the node's netns, wires eth0 (ip/24, MTU underlayMTU) to
// the underlay bridge and starts its API proxy. It does not create the
// Node object.
func (c *cluster) addNode(name, ip string) *node {
	c.t.Helper()
	n := &node{c: c, name: name, ip: ip, ns: nettest.NewNetNS(c.t), dir: c.t.TempDir()}
	n.stateDir = filepath.Join(n.dir, "state")
	peer := "ul-" + name
	c.do(n.ns, func() error {
		// No DAD: eth0's link-local address is final at once, so a recorded
		// "before" state does not change under the test's feet.
		for _, s := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
			if err := os.WriteFile("/proc/sys/"+s, []byte("0"), 0o644); err != nil {
				return err
			}
		}
		if err := linkUp("lo"); err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: uplinkName, MTU: underlayMTU},
			PeerName:      peer,
			PeerMTU:       underlayMTU,
			PeerNamespace: netlink.NsFd(int(c.underlay.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		l, err := netlink.LinkByName(uplinkName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, mustAddr(ip+"/24")); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	c.do(c.underlay, func() error {
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	n.proxy = startAPIProxy(c.t, n.ns, fmt.Sprintf("127.0.0.1:%d", c.api.Port))
	c.nodes[name] = n
	return n
}

func mustAddr(s string) *netlink.Addr {
	a, err := netlink.ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// addIP adds another address to the node's eth0 (for an InternalIP change).
func (n *node) addIP(ip string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		l, err := netlink.LinkByName(uplinkName)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, mustAddr(ip+"/24"))
	})
}

// ---- Kubernetes objects ----

// grantRBAC applies conf/podnet-routed-rbac.yaml: its ClusterRole as is,
// its ClusterRoleBinding with the test's token user "podnet-routed" added
// as a subject (the file binds the kube-system ServiceAccount).
func (c *cluster) grantRBAC() {
	c.t.Helper()
	data, err := os.ReadFile(filepath.Join(nettest.RepoRoot(c.t), "conf", "podnet-routed-rbac.yaml"))
	if err != nil {
		c.t.Fatal(err)
	}
	ctx := context.Background()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var roles, bindings int
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			c.t.Fatalf("parse podnet-routed-rbac.yaml: %v", err)
		}
		if obj == nil {
			continue
		}
		switch obj["kind"] {
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(obj, &cr); err != nil {
				c.t.Fatal(err)
			}
			if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, &cr, metav1.CreateOptions{}); err != nil {
				c.t.Fatal(err)
			}
			roles++
		case "ClusterRoleBinding":
			var crb rbacv1.ClusterRoleBinding
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(obj, &crb); err != nil {
				c.t.Fatal(err)
			}
			crb.Subjects = append(crb.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kapi.RoutedUser})
			if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{}); err != nil {
				c.t.Fatal(err)
			}
			bindings++
		}
	}
	if roles != 1 || bindings != 1 {
		c.t.Fatalf("podnet-routed-rbac.yaml: %d ClusterRoles, %d ClusterRoleBindings; want 1 and 1", roles, bindings)
	}
}

// createNode creates a Node with podCIDR (none when "") and, when ip is
// not "", status.addresses InternalIP (written with UpdateStatus, as the
// kubelet does).
func (c *cluster) createNode(name, ip, podCIDR string) {
	c.t.Helper()
	ctx := context.Background()
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if podCIDR != "" {
		obj.Spec.PodCIDR = podCIDR
		obj.Spec.PodCIDRs = []string{podCIDR}
	}
	created, err := c.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create node %s: %v", name, err)
	}
	if ip == "" {
		return
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("node %s status: %v", name, err)
	}
}

// setNodeIP changes the node's InternalIP.
func (c *cluster) setNodeIP(name, ip string) {
	c.t.Helper()
	c.updateNode(name, true, func(n *corev1.Node) {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	})
}

// assignPodCIDR sets spec.podCIDR(s) of a node that has none, as the node
// IPAM controller does.
func (c *cluster) assignPodCIDR(name, podCIDR string) {
	c.t.Helper()
	c.updateNode(name, false, func(n *corev1.Node) {
		n.Spec.PodCIDR = podCIDR
		n.Spec.PodCIDRs = []string{podCIDR}
	})
}

func (c *cluster) updateNode(name string, status bool, f func(*corev1.Node)) {
	c.t.Helper()
	ctx := context.Background()
	for range 5 {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		f(n)
		if status {
			_, err = c.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		} else {
			_, err = c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		}
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			c.t.Fatalf("update node %s: %v", name, err)
		}
	}
	c.t.Fatalf("update node %s: too many conflicts", name)
}

func (c *cluster) deleteNode(name string) {
	c.t.Helper()
	if err := c.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete node %s: %v", name, err)
	}
	// Nodes have no finalizers here: wait until it is really gone.
	eventually(c.t, 10*time.Second, "node "+name+" deleted", func() error {
		_, err := c.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
}

// ---- the API proxy ----

// apiProxy forwards TCP from a listener on a node netns' loopback to the
// API server on the root netns' loopback. The listening socket is created
// inside the netns (a socket stays in the netns it was made in); the
// upstream dials happen on ordinary goroutines, in the root netns.
type apiProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	paused bool
	conns  map[net.Conn]struct{}
}

func startAPIProxy(t *testing.T, netns ns.NetNS, target string) *apiProxy {
	t.Helper()
	p := &apiProxy{target: target, conns: map[net.Conn]struct{}{}}
	if err := netns.Do(func(ns.NetNS) error {
		var err error
		p.ln, err = net.Listen("tcp", apiProxyAddr)
		return err
	}); err != nil {
		t.Fatalf("API proxy listener: %v", err)
	}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *apiProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.paused {
			p.mu.Unlock()
			down.Close()
			continue
		}
		p.conns[down] = struct{}{}
		p.mu.Unlock()
		go p.forward(down)
	}
}

func (p *apiProxy) forward(down net.Conn) {
	defer p.drop(down)
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.paused {
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer p.drop(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
}

func (p *apiProxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pause cuts the node off the API server: open connections are closed,
// new ones refused, until resume.
func (p *apiProxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *apiProxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

func (p *apiProxy) close() {
	p.ln.Close()
	p.pause()
}

// ---- podnet-routed processes ----

// proc is a process started inside a node netns.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// run starts bin with args inside netns. The fork happens on a thread
// locked into the netns (the child inherits the thread's netns) that stays
// locked, and alive, until the child has been reaped: Pdeathsig then only
// fires when the test binary itself dies, never because Go retired the
// forking thread.
func runInNS(t *testing.T, netns ns.NetNS, logPath, bin string, args ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is in the node netns and dies with the goroutine
		if err := netns.Set(); err != nil {
			started <- fmt.Errorf("enter %s: %w", netns.Path(), err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// daemon is a running podnet-routed.
type daemon struct {
	n           *node
	p           *proc
	healthAddr  string
	metricsAddr string
}

// freePort returns a free TCP port on the netns' loopback.
func freePort(t *testing.T, netns ns.NetNS) int {
	t.Helper()
	var port int
	if err := netns.Do(func(ns.NetNS) error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port = l.Addr().(*net.TCPAddr).Port
		return l.Close()
	}); err != nil {
		t.Fatal(err)
	}
	return port
}

// kubeconfig writes the podnet-routed user's kubeconfig (through the
// proxy) into the node's dir. kapi names its files by a prefix of the
// server URL's hex that is the same for every https URL, so a private copy
// is taken at once.
func (n *node) kubeconfig() string {
	src := n.c.api.Kubeconfig(kapi.RoutedUser, "https://"+apiProxyAddr)
	data, err := os.ReadFile(src)
	if err != nil {
		n.c.t.Fatal(err)
	}
	dst := filepath.Join(n.dir, "routed.kubeconfig")
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		n.c.t.Fatal(err)
	}
	return dst
}

// startDaemon runs podnet-routed in the node netns with the test's
// defaults (--encap=none, 2 s resync); extra flags come last and win.
func (n *node) startDaemon(extra ...string) *daemon {
	t := n.c.t
	t.Helper()
	d := &daemon{
		n:           n,
		healthAddr:  fmt.Sprintf("127.0.0.1:%d", freePort(t, n.ns)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t, n.ns)),
	}
	args := []string{
		"--kubeconfig=" + n.kubeconfig(),
		"--node-name=" + n.name,
		"--cluster-cidr=" + clusterCIDR,
		"--state-dir=" + n.stateDir,
		"--resync-interval=" + resync.String(),
		"--health-addr=" + d.healthAddr,
		"--metrics-addr=" + d.metricsAddr,
	}
	if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--encap") }) {
		args = append(args, "--encap=none") // the flag's default is ipip, which this kernel lacks
	}
	args = append(args, extra...)
	logPath := filepath.Join(n.dir, "podnet-routed.log")
	d.p = runInNS(t, n.ns, logPath, n.c.bin, args...)
	t.Logf("%s: podnet-routed %s (log %s)", n.name, strings.Join(args, " "), logPath)
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("---- %s: last lines of %s ----\n%s", n.name, logPath, tail(logPath, 60))
		}
	})
	return d
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	t := d.n.c.t
	t.Helper()
	if d.p.exited() {
		t.Fatalf("%s: podnet-routed exited early: %v", d.n.name, d.p.err)
	}
	if err := d.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: podnet-routed did not exit within 10 s of SIGTERM", d.n.name)
	}
	if d.p.err != nil {
		t.Fatalf("%s: podnet-routed exited with %v after SIGTERM", d.n.name, d.p.err)
	}
}

func (d *daemon) kill() {
	if d.p.exited() {
		return
	}
	_ = d.p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.p.done:
	case <-time.After(5 * time.Second):
		_ = d.p.cmd.Process.Kill()
		<-d.p.done
	}
}

// alive fails the test if the daemon has exited.
func (d *daemon) alive() error {
	if d.p.exited() {
		return fmt.Errorf("%s: podnet-routed exited: %v\n%s", d.n.name, d.p.err, tail(d.p.logPath, 30))
	}
	return nil
}

// logLines returns the daemon's JSON log records whose msg is msg.
func (d *daemon) logLines(msg string) []map[string]any {
	f, err := os.Open(d.p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// noChurn checks for dur that the daemons change nothing in the kernel
// (no "routes applied" record) while the cluster does not change: the
// periodic resyncs in that window must find the kernel as desired.
func noChurn(t *testing.T, dur time.Duration, ds ...*daemon) {
	t.Helper()
	since := time.Now().Add(100 * time.Millisecond) // an apply logging right now is not churn
	consistently(t, dur, "steady state", func() error {
		for _, d := range ds {
			if err := d.alive(); err != nil {
				return err
			}
			for _, rec := range d.logLines("routes applied") {
				ts, _ := rec["time"].(string)
				at, err := time.Parse(time.RFC3339Nano, ts)
				if err != nil {
					return fmt.Errorf("log time %q: %w", ts, err)
				}
				if at.After(since) {
					return fmt.Errorf("%s changed routes with no cluster change: %v", d.n.name, rec)
				}
			}
		}
		return nil
	})
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// get does an HTTP GET of http://addr+path from inside the node netns (the
// daemon listens on the netns' loopback).
func (n *node) get(addr, path string) (int, string, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			var c net.Conn
			err := n.ns.Do(func(ns.NetNS) error {
				var err error
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, a)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// status returns the HTTP status of path on the health address.
func (d *daemon) status(path string) (int, string) {
	code, body, err := d.n.get(d.healthAddr, path)
	if err != nil {
		return 0, err.Error()
	}
	return code, strings.TrimSpace(body)
}

// waitReady waits for /readyz 200 and returns how long it took.
func (d *daemon) waitReady(timeout time.Duration) time.Duration {
	d.n.c.t.Helper()
	return eventually(d.n.c.t, timeout, d.n.name+" /readyz 200", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		if code, body := d.status("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
}

// metrics scrapes /metrics on the metrics address into name -> value
// (series without labels only, which is what podnet-routed exports, plus
// histogram _count/_sum).
func (d *daemon) metrics() (map[string]float64, error) {
	code, body, err := d.n.get(d.metricsAddr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics %d", code)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || strings.Contains(f[0], "{") {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[f[0]] = v
	}
	return out, nil
}

// ---- routes ----

// fmtRoute renders a route like `ip route`, with the fields the tests
// compare.
func fmtRoute(r netlink.Route, names map[int]string, full bool) string {
	var b strings.Builder
	switch r.Type {
	case unix.RTN_UNICAST:
	case unix.RTN_BLACKHOLE:
		b.WriteString("blackhole ")
	case unix.RTN_LOCAL:
		b.WriteString("local ")
	case unix.RTN_BROADCAST:
		b.WriteString("broadcast ")
	case unix.RTN_MULTICAST:
		b.WriteString("multicast ")
	default:
		fmt.Fprintf(&b, "type%d ", r.Type)
	}
	if r.Dst == nil {
		b.WriteString("default")
	} else {
		b.WriteString(r.Dst.String())
	}
	if r.Gw != nil {
		b.WriteString(" via " + r.Gw.String())
	}
	if r.LinkIndex > 0 {
		name, ok := names[r.LinkIndex]
		if !ok {
			name = fmt.Sprintf("if%d", r.LinkIndex)
		}
		b.WriteString(" dev " + name)
	}
	fmt.Fprintf(&b, " proto %d", r.Protocol)
	if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
		b.WriteString(" onlink")
	}
	if full {
		fmt.Fprintf(&b, " scope %d table %d metric %d", r.Scope, r.Table, r.Priority)
		if r.Src != nil {
			b.WriteString(" src " + r.Src.String())
		}
	} else if r.Table != mainTable {
		fmt.Fprintf(&b, " table %d", r.Table)
	}
	return b.String()
}

func linkNames() (map[int]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names, nil
}

// listRoutes returns the node's routes (both families) matching filter,
// rendered and sorted. A nil filter means every route of every table.
func (n *node) listRoutes(filter *netlink.Route, mask uint64, full bool) ([]string, error) {
	var out []string
	err := n.ns.Do(func(ns.NetNS) error {
		if filter == nil {
			filter, mask = &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, filter, mask)
		if err != nil {
			return err
		}
		names, err := linkNames()
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, fmtRoute(r, names, full))
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// podnetRoutes lists the routes with podnet's protocol in the main table.
func (n *node) podnetRoutes() ([]string, error) {
	return n.listRoutes(&netlink.Route{Protocol: contract.RouteProtocol, Table: mainTable}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE, false)
}

// routesTo lists every main-table route to dst, whatever its protocol.
func (n *node) routesTo(dst string) ([]string, error) {
	_, ipn, err := net.ParseCIDR(dst)
	if err != nil {
		return nil, err
	}
	return n.listRoutes(&netlink.Route{Dst: ipn, Table: mainTable}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE, false)
}

// expectRoutes waits until the node's podnet routes are exactly want and
// returns how long that took.
func (n *node) expectRoutes(timeout time.Duration, d *daemon, want ...string) time.Duration {
	n.c.t.Helper()
	want = slices.Clone(want)
	sort.Strings(want)
	return eventually(n.c.t, timeout, n.name+" podnet routes", func() error {
		if d != nil {
			if err := d.alive(); err != nil {
				return err
			}
		}
		got, err := n.podnetRoutes()
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
		}
		return nil
	})
}

// addRoute adds a route in the node netns; dev "" means blackhole.
func (n *node) addRoute(dst, gw, dev string, proto netlink.RouteProtocol) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		_, ipn, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		r := &netlink.Route{Dst: ipn, Protocol: proto, Table: mainTable}
		if dev == "" {
			r.Type = unix.RTN_BLACKHOLE
		} else {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			r.LinkIndex = l.Attrs().Index
			r.Gw = net.ParseIP(gw)
		}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s: %w", dst, err)
		}
		return nil
	})
}

// delRoutes deletes every main-table route to dst (any protocol).
func (n *node) delRoutes(dst string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		_, ipn, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipn, Table: mainTable}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(routes) == 0 {
			return fmt.Errorf("no route to %s to delete", dst)
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil {
				return fmt.Errorf("delete route %s: %w", dst, err)
			}
		}
		return nil
	})
}

// ---- node.json ----

func (n *node) state() (*nodestate.State, error) { return nodestate.Read(n.stateDir) }

func (n *node) expectState(timeout time.Duration, want nodestate.State) {
	n.c.t.Helper()
	eventually(n.c.t, timeout, n.name+" node.json", func() error {
		got, err := n.state()
		if err != nil {
			return err
		}
		if got.NodeName != want.NodeName || got.MTU != want.MTU || got.Encap != want.Encap || !slices.Equal(got.PodCIDRs, want.PodCIDRs) {
			return fmt.Errorf("got %+v, want %+v", *got, want)
		}
		return nil
	})
}

// ---- whole-netns snapshot (for --cleanup) ----

// snapshot is what `ip -d link`, `ip addr`, `ip route show table all`,
// `ip neigh show nud permanent` and `nft list tables` would show.
type snapshot struct {
	Links, Addrs, Routes, Neighs, NFT []string
}

func (s snapshot) diff(o snapshot) string {
	var b strings.Builder
	section := func(name string, x, y []string) {
		for _, l := range x {
			if !slices.Contains(y, l) {
				fmt.Fprintf(&b, "%s -%s\n", name, l)
			}
		}
		for _, l := range y {
			if !slices.Contains(x, l) {
				fmt.Fprintf(&b, "%s +%s\n", name, l)
			}
		}
	}
	section("link", s.Links, o.Links)
	section("addr", s.Addrs, o.Addrs)
	section("route", s.Routes, o.Routes)
	section("neigh", s.Neighs, o.Neighs)
	section("nft", s.NFT, o.NFT)
	return b.String()
}

func (n *node) snapshot() snapshot {
	t := n.c.t
	t.Helper()
	var s snapshot
	n.c.do(n.ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			up := "down"
			if a.Flags&net.FlagUp != 0 {
				up = "up"
			}
			line := fmt.Sprintf("%s type %s mtu %d %s mac %s", a.Name, l.Type(), a.MTU, up, a.HardwareAddr)
			if a.MasterIndex > 0 {
				line += " master " + names[a.MasterIndex]
			}
			if v, ok := l.(*netlink.Vxlan); ok {
				line += fmt.Sprintf(" vni %d port %d", v.VxlanId, v.Port)
			}
			s.Links = append(s.Links, line)
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			s.Addrs = append(s.Addrs, fmt.Sprintf("%s %s scope %d", names[a.LinkIndex], a.IPNet, a.Scope))
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			s.Routes = append(s.Routes, fmtRoute(r, names, true))
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			neighs, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, nb := range neighs {
				if nb.State&netlink.NUD_PERMANENT != 0 {
					s.Neighs = append(s.Neighs, fmt.Sprintf("%s dev %s lladdr %s permanent", nb.IP, names[nb.LinkIndex], nb.HardwareAddr))
				}
			}
		}
		return nil
	})
	nft, err := nftables.New(nftables.WithNetNSFd(int(n.ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer nft.CloseLasting()
	tables, err := nft.ListTables()
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	for _, tb := range tables {
		s.NFT = append(s.NFT, fmt.Sprintf("table %s %s", familyName(tb.Family), tb.Name))
	}
	chains, err := nft.ListChains()
	if err != nil {
		t.Fatalf("nft list chains: %v", err)
	}
	for _, ch := range chains {
		s.NFT = append(s.NFT, fmt.Sprintf("chain %s %s %s", familyName(ch.Table.Family), ch.Table.Name, ch.Name))
	}
	for _, l := range [][]string{s.Links, s.Addrs, s.Routes, s.Neighs, s.NFT} {
		sort.Strings(l)
	}
	return s
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family%d", f)
}

// stableSnapshot waits until two snapshots 300 ms apart agree (links
// settle: carrier, IPv6 link-local addresses and their routes) and returns
// it.
func (n *node) stableSnapshot() snapshot {
	n.c.t.Helper()
	prev := n.snapshot()
	var cur snapshot
	eventually(n.c.t, 10*time.Second, n.name+" netns state settles", func() error {
		time.Sleep(300 * time.Millisecond)
		cur = n.snapshot()
		if d := prev.diff(cur); d != "" {
			prev = cur
			return errors.New(d)
		}
		return nil
	})
	return cur
}

// ---- polling ----

// eventually polls f every 10 ms until it returns nil and returns the time
// it took, or fails the test after timeout with f's last error.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// consistently polls f every 100 ms for d and fails the test as soon as it
// returns an error.
func consistently(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pingFrom pings dst from src inside the node netns (one echo, 1 s wait).
func (n *node) ping(src, dst string) error {
	var out []byte
	err := n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("ping", "-c", "1", "-W", "1", "-I", src, dst).CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("ping -I %s %s in %s: %w\n%s", src, dst, n.name, err, out)
	}
	return nil
}

// addPodAddr puts ip/32 on the node netns' loopback: an address in the
// node's PodCIDR that answers pings (this kernel has no dummy links).
func (n *node) addPodAddr(ip string) {
	n.c.t.Helper()
	n.c.do(n.ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, mustAddr(ip+"/32"))
	})
}
