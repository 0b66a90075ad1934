package routed

// The cluster harness of datapath_test.go: a real kube-apiserver, node
// netns joined by an L2 underlay (bridges in their own netns), a
// podnet-routed process per node, pods attached with the podnet plugin
// through libcni, and traffic helpers (ping, TCP echo). Everything lives in
// throwaway netns; the machine's own netns only hosts the API server on
// loopback, reached from the node netns through an in-process forwarder.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// dpClusterCIDR is the cluster pod CIDR every daemon gets.
const dpClusterCIDR = "10.244.0.0/16"

// dpUnderlayDev is the name of each node's underlay interface.
const dpUnderlayDev = "ul0"

// dpCluster is one test cluster.
type dpCluster struct {
	t          *testing.T
	api        *kapi.Server
	kubeconfig string
	bin        string
	underlay   ns.NetNS // holds the L2 bridges
	nodes      []*dpNode
	vethSeq    int
}

// dpNode is a node netns with its Node object, state dir and daemon.
type dpNode struct {
	c        *dpCluster
	Name     string
	IP       netip.Addr // underlay address
	PodCIDR  netip.Prefix
	Node     *nettest.Node
	StateDir string
	DataDir  string
	RT       *nettest.Runtime
	Log      string // podnet-routed's stderr
	proc     *exec.Cmd
	exited   chan struct{}
	podSeq   int
}

// dpPod is a pod attached to a node.
type dpPod struct {
	Name string
	Node *dpNode
	NS   ns.NetNS
	IP   netip.Addr
	MTU  int
}

// newDPCluster starts an API server and the underlay netns.
func newDPCluster(t *testing.T) *dpCluster {
	t.Helper()
	c := &dpCluster{t: t, bin: nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed")}
	start := time.Now()
	c.api = kapi.Start(t)
	t.Logf("kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	c.kubeconfig = c.api.Kubeconfig(kapi.AdminUser, "")
	c.underlay = nettest.NewNetNS(t)
	dpDo(t, c.underlay, func() error { return dpLinkUp("lo") })
	return c
}

// AddBridge creates an L2 segment (a bridge in the underlay netns).
func (c *dpCluster) AddBridge(name string) {
	c.t.Helper()
	dpDo(c.t, c.underlay, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s: %w", name, err)
		}
		return netlink.LinkSetUp(br)
	})
}

// Plug connects target to bridge with a veth pair: the target end is
// called ifName and gets addr (CIDR) and, when gw is valid, a default route
// via gw.
func (c *dpCluster) Plug(target ns.NetNS, bridge, ifName, addr string, gw netip.Addr) {
	c.t.Helper()
	c.vethSeq++
	brSide, tmp := fmt.Sprintf("ul%d", c.vethSeq), fmt.Sprintf("ul%dp", c.vethSeq)
	dpDo(c.t, c.underlay, func() error {
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: brSide, MTU: 1500, MasterIndex: br.Attrs().Index}, PeerName: tmp}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", brSide, err)
		}
		peer, err := netlink.LinkByName(tmp)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(target.Fd())); err != nil {
			return fmt.Errorf("move %s: %w", tmp, err)
		}
		l, err := netlink.LinkByName(brSide)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	dpDo(c.t, target, func() error {
		if err := dpLinkUp("lo"); err != nil {
			return err
		}
		l, err := netlink.LinkByName(tmp)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(l, ifName); err != nil {
			return err
		}
		if err := netlink.LinkSetMTU(l, 1500); err != nil {
			return err
		}
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s: %w", addr, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if gw.IsValid() {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
}

// AddNode creates a node netns on bridge with underlay address addr (CIDR)
// and default gateway gw (optional), its Node object (PodCIDR, InternalIP)
// and the forwarder to the API server. The daemon is started by Start.
func (c *dpCluster) AddNode(name, bridge, addr string, gw netip.Addr, podCIDR string) *dpNode {
	c.t.Helper()
	t := c.t
	pfx := netip.MustParsePrefix(addr)
	n := &dpNode{c: c, Name: name, IP: pfx.Addr(), PodCIDR: netip.MustParsePrefix(podCIDR), Node: nettest.NewNode(t)}
	n.StateDir = filepath.Join(t.TempDir(), "state")
	n.DataDir = filepath.Join(t.TempDir(), "ipam")
	c.Plug(n.Node.NS, bridge, dpUnderlayDev, addr, gw)
	dpAPIForward(t, n.Node.NS, c.api.Port)

	ctx := context.Background()
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}},
	}
	client := c.api.Client()
	created, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", name, err)
	}

	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"podnet","stateDir":%q,`+
		`"ipam":{"type":"podnet-ipam","ranges":[[{"subnet":"usePodCidr"}]],"dataDir":%q}}]}`, n.StateDir, n.DataDir)
	n.RT = nettest.NewRuntime(t, n.Node, conflist, c.bin)
	c.nodes = append(c.nodes, n)
	return n
}

// AddHost creates a plain netns (not a node) on bridge with addr and an
// optional default gateway.
func (c *dpCluster) AddHost(bridge, addr string, gw netip.Addr) ns.NetNS {
	c.t.Helper()
	h := nettest.NewNetNS(c.t)
	c.Plug(h, bridge, "eth0", addr, gw)
	return h
}

// Start runs podnet-routed in every node with the given flags and returns
// when all of them have published node.json (the time is logged).
func (c *dpCluster) Start(encap string, extra ...string) time.Duration {
	c.t.Helper()
	start := time.Now()
	for _, n := range c.nodes {
		n.start(encap, extra...)
	}
	for _, n := range c.nodes {
		n.WaitState(20 * time.Second)
	}
	d := time.Since(start)
	c.t.Logf("%d podnet-routed (--encap=%s %s) published node.json in %v", len(c.nodes), encap, strings.Join(extra, " "), d.Round(time.Millisecond))
	return d
}

func (n *dpNode) start(encap string, extra ...string) {
	t := n.c.t
	t.Helper()
	n.Log = filepath.Join(t.TempDir(), "podnet-routed-"+n.Name+".log")
	logf, err := os.Create(n.Log)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--kubeconfig=" + n.c.kubeconfig, "--node-name=" + n.Name, "--encap=" + encap,
		"--cluster-cidr=" + dpClusterCIDR, "--state-dir=" + n.StateDir,
		"--health-addr=", "--metrics-addr=", "--resync-interval=2s", "--log-level=debug",
	}, extra...)
	cmd := exec.Command(filepath.Join(n.c.bin, "podnet-routed"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The child inherits the netns of the (locked) thread that forks it.
	// No Pdeathsig: it fires when that thread exits, not the test process.
	dpDo(t, n.Node.NS, func() error { return cmd.Start() })
	n.proc, n.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(n.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("podnet-routed on %s ignored SIGTERM for 10s; killing it", n.Name)
			_ = cmd.Process.Kill()
			<-n.exited
		}
		if t.Failed() {
			t.Logf("podnet-routed log of %s:\n%s", n.Name, dpTail(n.Log, 40))
		}
	})
}

// Alive fails the test when the daemon has exited.
func (n *dpNode) Alive() {
	t := n.c.t
	t.Helper()
	select {
	case <-n.exited:
		t.Fatalf("podnet-routed on %s exited: %v\n%s", n.Name, n.proc.ProcessState, dpTail(n.Log, 40))
	default:
	}
}

// WaitState waits for node.json and checks its PodCIDRs.
func (n *dpNode) WaitState(limit time.Duration) *nodestate.State {
	t := n.c.t
	t.Helper()
	var st *nodestate.State
	err := dpPoll(limit, func() error {
		n.Alive()
		var err error
		st, err = nodestate.Read(n.StateDir)
		return err
	})
	if err != nil {
		t.Fatalf("%s: node.json not written: %v\n%s", n.Name, err, dpTail(n.Log, 40))
	}
	if !slices.Equal(st.PodCIDRs, []string{n.PodCIDR.String()}) {
		t.Fatalf("%s: node.json podCIDRs %v, want [%s]", n.Name, st.PodCIDRs, n.PodCIDR)
	}
	return st
}

// Routes lists the node's podnet routes as "dst via gw dev X [onlink]" or
// "blackhole dst", sorted.
func (n *dpNode) Routes() ([]string, error) {
	var out []string
	err := n.Node.NS.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Type == unix.RTN_BLACKHOLE {
				out = append(out, "blackhole "+r.Dst.String())
				continue
			}
			dev := fmt.Sprint(r.LinkIndex)
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			s := fmt.Sprintf("%s via %s dev %s", r.Dst, r.Gw, dev)
			if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
				s += " onlink"
			}
			out = append(out, s)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// WaitRoutes waits until the node's podnet routes are exactly want.
func (n *dpNode) WaitRoutes(want []string, limit time.Duration) {
	t := n.c.t
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	var got []string
	err := dpPoll(limit, func() error {
		n.Alive()
		var err error
		if got, err = n.Routes(); err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return errors.New("routes differ")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: podnet routes after %v:\n  got  %q\n  want %q\n%s", n.Name, limit, got, want, dpTail(n.Log, 20))
	}
}

// LinkMTU returns the MTU of dev in the node netns.
func (n *dpNode) LinkMTU(dev string) int {
	t := n.c.t
	t.Helper()
	mtu := 0
	dpDo(t, n.Node.NS, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		mtu = l.Attrs().MTU
		return nil
	})
	return mtu
}

// AddPod attaches a new pod netns with the podnet plugin and returns it
// with its IPv4 address and the MTU of its eth0.
func (n *dpNode) AddPod() *dpPod {
	t := n.c.t
	t.Helper()
	n.podSeq++
	p := &dpPod{Name: fmt.Sprintf("%s-pod%d", n.Name, n.podSeq), Node: n, NS: nettest.NewNetNS(t)}
	rt := nettest.RuntimeConf(p.Name, p.NS, "eth0", [2]string{"K8S_POD_NAME", p.Name}, [2]string{"K8S_POD_NAMESPACE", "default"})
	res, err := n.RT.Add(rt)
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", p.Name, n.Name, err)
	}
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			p.IP = a.Unmap()
		}
	}
	if !p.IP.IsValid() || !n.PodCIDR.Contains(p.IP) {
		t.Fatalf("pod %s got %v, want an address in %s", p.Name, res.IPs, n.PodCIDR)
	}
	dpDo(t, p.NS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		p.MTU = l.Attrs().MTU
		return nil
	})
	return p
}

// dpAPIForward listens on 127.0.0.1:port inside netns and forwards every
// connection to the API server on the machine's loopback, so the daemon's
// kubeconfig (https://127.0.0.1:port, a name the serving certificate has)
// works unchanged from the node netns.
func dpAPIForward(t *testing.T, netns ns.NetNS, port int) {
	t.Helper()
	var l net.Listener
	dpDo(t, netns, func() error {
		var err error
		l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err
	})
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, add bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if add {
			if conns == nil {
				return false
			}
			conns[c] = true
		} else if conns != nil {
			delete(conns, c)
		}
		return true
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Not locked to a netns thread: dials from the machine's netns.
				out, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
				if err != nil {
					in.Close()
					return
				}
				if !track(in, true) || !track(out, true) {
					in.Close()
					out.Close()
					return
				}
				done := make(chan struct{}, 2)
				cp := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); done <- struct{}{} }
				go cp(out, in)
				go cp(in, out)
				<-done
				in.Close()
				out.Close()
				<-done
				track(in, false)
				track(out, false)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
}

// dpPing runs ping with args inside netns (bounded by a 15 s hang guard)
// and returns its output.
func dpPing(netns ns.NetNS, args ...string) (string, error) {
	var out []byte
	var runErr error
	err := netns.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		out, runErr = exec.CommandContext(ctx, "ping", args...).CombinedOutput()
		if ctx.Err() != nil {
			runErr = fmt.Errorf("ping hung: %w", ctx.Err())
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return string(out), runErr
}

var dpRTT = regexp.MustCompile(`time=([0-9.]+) ms`)

// dpRTTOf extracts the RTT of the first reply in ping's output.
func dpRTTOf(out string) string {
	if m := dpRTT.FindStringSubmatch(out); m != nil {
		return m[1] + " ms"
	}
	return "?"
}

// dpServer is a TCP echo server inside a netns that records the address
// of every peer.
type dpServer struct {
	Addr  string // ip:port to dial
	Peers chan netip.Addr
}

// dpServe starts the echo server on ip:0 inside netns (stopped with the
// test).
func dpServe(t *testing.T, netns ns.NetNS, ip netip.Addr) *dpServer {
	t.Helper()
	var l net.Listener
	dpDo(t, netns, func() error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
		return err
	})
	s := &dpServer{Addr: l.Addr().String(), Peers: make(chan netip.Addr, 16)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
				select {
				case s.Peers <- ap.Addr().Unmap():
				default:
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return s
}

// dpEcho dials addr from netns, sends a line and returns what came back.
func dpEcho(netns ns.NetNS, addr string) (string, error) {
	var c net.Conn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	msg := "podnet " + addr + "\n"
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return got, fmt.Errorf("read echo from %s: %w", addr, err)
	}
	if got != msg {
		return got, fmt.Errorf("echo from %s: got %q, want %q", addr, got, msg)
	}
	return got, nil
}

// dpPoll calls check every 100 ms until it succeeds or limit passes.
func dpPoll(limit time.Duration, check func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dpDo runs f in netns and fails the test on error.
func dpDo(t *testing.T, netns ns.NetNS, f func() error) {
	t.Helper()
	if err := netns.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// dpSysctl writes /proc/sys/<name> inside netns.
func dpSysctl(t *testing.T, netns ns.NetNS, name, value string) {
	t.Helper()
	dpDo(t, netns, func() error { return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644) })
}

func dpLinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// dpTail returns the last n lines of a file.
func dpTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
