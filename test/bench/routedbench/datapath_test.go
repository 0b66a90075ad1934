//go:build bench

package routedbench

// Data path (issue 8 §5): two node netns on one L2 underlay (a bridge in
// its own netns, MTU 1500), podnet-routed in each (--encap=none, then
// --encap=vxlan), one pod per node attached by the podnet plugin with
// podnet-ipam (usePodCidr) through libcni. iperf3 (TCP, one stream) pod to
// pod across the nodes, and node to node over the same underlay, taking
// turns, -reps times per mode. Then the MTU: a don't-fragment ping that
// fills the pod MTU crosses the nodes, one byte more fails, and no netns
// on the path fragmented or reassembled anything during the transfers.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

type iperfRun struct {
	Path        string  `json:"path"` // "pod" or "node"
	Rep         int     `json:"rep"`
	Gbps        float64 `json:"gbps"` // receiver side
	Retransmits int     `json:"retransmits"`
	MSS         int     `json:"mss"`
}

type modeResult struct {
	Encap     string            `json:"encap"`
	PodMTU    int               `json:"pod_mtu"`
	Runs      []iperfRun        `json:"runs"`
	PingFits  string            `json:"ping_fits"`  // "" = passed, else the failure
	PingOver  string            `json:"ping_over"`  // how one byte over the MTU failed ("" = it was answered)
	FragDelta map[string]string `json:"frag_delta"` // netns -> counters that moved (empty map = none moved)
}

type datapathResult struct {
	Started  time.Time    `json:"started"`
	Seconds  float64      `json:"seconds"`
	Duration int          `json:"duration_s"`
	Omit     int          `json:"omit_s"`
	Iperf    string       `json:"iperf3"`
	Modes    []modeResult `json:"modes"`
}

type dpNode struct {
	name     string
	ip       string
	podCIDR  string
	node     *nettest.Node
	stateDir string
	rt       *nettest.Runtime
}

func TestDatapath(t *testing.T) {
	out := benchOut(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed (Debian package iperf3; scripts/bench.sh installs it)")
	}
	dur, omit, reps := envInt("PODNET_BENCH_IPERF_SECONDS", 3), 1, envInt("PODNET_BENCH_IPERF_REPS", 3)
	bin := nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed")
	ver, _ := exec.Command("iperf3", "--version").Output()
	res := datapathResult{Started: time.Now().UTC(), Duration: dur, Omit: omit, Iperf: strings.SplitN(string(ver), "\n", 2)[0]}

	api := kapi.Start(t)
	client := api.Client()
	kubeconfig := api.Kubeconfig(kapi.AdminUser, "")
	underlay := newUnderlay(t)
	var nodes []*dpNode
	for i := 1; i <= 2; i++ {
		n := &dpNode{name: fmt.Sprintf("dp-node%d", i), ip: fmt.Sprintf("172.31.0.%d", i), podCIDR: fmt.Sprintf("10.244.%d.0/24", i), node: nettest.NewNode(t)}
		n.stateDir = filepath.Join(t.TempDir(), "state")
		plug(t, underlay, "br0", n.node.NS, "ul0", n.ip+"/24", i)
		apiForward(t, n.node.NS, api.Port)
		obj := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec:       corev1.NodeSpec{PodCIDR: n.podCIDR, PodCIDRs: []string{n.podCIDR}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}}},
		}
		if _, err := client.CoreV1().Nodes().Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"podnet","stateDir":%q,`+
			`"ipam":{"type":"podnet-ipam","ranges":[[{"subnet":"usePodCidr"}]],"dataDir":%q}}]}`, n.stateDir, filepath.Join(t.TempDir(), "ipam"))
		n.rt = nettest.NewRuntime(t, n.node, conflist, bin)
		nodes = append(nodes, n)
	}

	for _, encap := range []string{"none", "vxlan"} {
		t.Run(encap, func(t *testing.T) {
			res.Modes = append(res.Modes, measureMode(t, encap, bin, kubeconfig, underlay, nodes, dur, omit, reps))
		})
	}
	res.Seconds = time.Since(res.Started).Seconds()
	writeJSON(t, filepath.Join(out, "datapath.json"), res)
}

func measureMode(t *testing.T, encap, bin, kubeconfig string, underlay ns.NetNS, nodes []*dpNode, dur, omit, reps int) modeResult {
	mr := modeResult{Encap: encap, FragDelta: map[string]string{}}
	var daemons []*proc
	for _, n := range nodes {
		daemons = append(daemons, startInNS(t, n.node.NS, filepath.Join(t.TempDir(), "routed.log"), filepath.Join(bin, "podnet-routed"),
			"--kubeconfig="+kubeconfig, "--node-name="+n.name, "--encap="+encap, "--cluster-cidr=10.244.0.0/16",
			"--state-dir="+n.stateDir, "--health-addr=", "--metrics-addr=", "--resync-interval=1h"))
	}
	// Wait for node.json of this mode on both nodes and the route to the
	// other node's PodCIDR.
	for i, n := range nodes {
		poll(t, 20*time.Second, n.name+" node.json and routes", func() error {
			if err := daemons[i].alive(); err != nil {
				t.Fatal(err)
			}
			st, err := nodestate.Read(n.stateDir)
			if err != nil {
				return err
			}
			if st.Encap != encap {
				return fmt.Errorf("node.json encap %q", st.Encap)
			}
			if c, err := podnetRouteCount(n.node.NS); err != nil || c < 2 {
				return fmt.Errorf("%d podnet routes (%v)", c, err)
			}
			return nil
		})
	}
	// One pod per node.
	type pod struct {
		ns  ns.NetNS
		ip  string
		mtu int
	}
	var pods []pod
	var podRTs []*libcni.RuntimeConf
	for i, n := range nodes {
		p := pod{ns: nettest.NewNetNS(t)}
		rt := nettest.RuntimeConf(fmt.Sprintf("dp-%s-%d", encap, i), p.ns, "eth0")
		r, err := n.rt.Add(rt)
		if err != nil {
			t.Fatalf("ADD on %s: %v", n.name, err)
		}
		podRTs = append(podRTs, rt)
		for _, ip := range r.IPs {
			if ip.Address.IP.To4() != nil {
				p.ip = ip.Address.IP.String()
			}
		}
		do(t, p.ns, func() error {
			l, err := netlink.LinkByName("eth0")
			if err == nil {
				p.mtu = l.Attrs().MTU
			}
			return err
		})
		pods = append(pods, p)
	}
	mr.PodMTU = pods[0].mtu
	poll(t, 20*time.Second, "first pod->pod ping", func() error { return ping(pods[0].ns, pods[1].ip, "-c1", "-W1") })

	netnsOnPath := map[string]ns.NetNS{"node1": nodes[0].node.NS, "node2": nodes[1].node.NS, "pod1": pods[0].ns, "pod2": pods[1].ns, "underlay": underlay}
	before := map[string]map[string]int{}
	for name, n := range netnsOnPath {
		before[name] = fragCounters(t, n)
	}
	srvNode := startIperfServer(t, nodes[1].node.NS, nodes[1].ip)
	srvPod := startIperfServer(t, pods[1].ns, pods[1].ip)
	for rep := 1; rep <= reps; rep++ {
		order := []string{"node", "pod"}
		if rep%2 == 0 {
			order = []string{"pod", "node"}
		}
		for _, path := range order {
			var r iperfRun
			if path == "node" {
				r = iperf(t, nodes[0].node.NS, nodes[1].ip, srvNode, dur, omit)
			} else {
				r = iperf(t, pods[0].ns, pods[1].ip, srvPod, dur, omit)
			}
			r.Path, r.Rep = path, rep
			t.Logf("%s rep %d %s<->%s: %.2f Gbit/s, %d retransmits, MSS %d", encap, rep, path, path, r.Gbps, r.Retransmits, r.MSS)
			mr.Runs = append(mr.Runs, r)
		}
	}
	// MTU: exactly the pod MTU with DF crosses; one byte more does not.
	if err := ping(pods[0].ns, pods[1].ip, "-M", "do", "-c1", "-W2", "-s", strconv.Itoa(mr.PodMTU-28)); err != nil {
		mr.PingFits = err.Error()
	}
	if err := ping(pods[0].ns, pods[1].ip, "-M", "do", "-c1", "-W2", "-s", strconv.Itoa(mr.PodMTU-27)); err != nil {
		mr.PingOver = firstLine(err.Error(), "message too long", "Frag", "error", "100% packet loss")
	}
	for name, n := range netnsOnPath {
		after := fragCounters(t, n)
		var moved []string
		for k, v := range after {
			if d := v - before[name][k]; d != 0 {
				moved = append(moved, fmt.Sprintf("%s+%d", k, d))
			}
		}
		if len(moved) > 0 {
			mr.FragDelta[name] = strings.Join(moved, " ")
		}
	}
	// The pods go, the daemons stop, and --cleanup leaves the nodes as
	// they were for the next mode.
	for i, n := range nodes {
		if err := n.rt.Del(podRTs[i]); err != nil {
			t.Errorf("DEL on %s: %v", n.name, err)
		}
	}
	for _, d := range daemons {
		d.stop()
	}
	for _, n := range nodes {
		cleanupNode(t, bin, n)
	}
	return mr
}

// cleanupNode runs podnet-routed --cleanup in a node.
func cleanupNode(t *testing.T, bin string, n *dpNode) {
	p := startInNS(t, n.node.NS, filepath.Join(t.TempDir(), "cleanup.log"), filepath.Join(bin, "podnet-routed"), "--cleanup", "--state-dir="+n.stateDir)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: podnet-routed --cleanup hangs", n.name)
	}
	if p.err != nil {
		t.Fatalf("%s: --cleanup: %v\n%s", n.name, p.err, tail(p.log, 10))
	}
}

func poll(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ping(n ns.NetNS, dst string, args ...string) error {
	var out []byte
	var runErr error
	_ = n.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, runErr = exec.CommandContext(ctx, "ping", append(args, dst)...).CombinedOutput()
		return nil
	})
	if runErr != nil {
		return fmt.Errorf("ping %s %s: %v: %s", strings.Join(args, " "), dst, runErr, strings.TrimSpace(string(out)))
	}
	return nil
}

func firstLine(s string, keys ...string) string {
	for _, line := range strings.Split(s, "\n") {
		for _, k := range keys {
			if strings.Contains(line, k) {
				return strings.TrimSpace(line)
			}
		}
	}
	return s
}

// fragCounters reads the IPv4 fragmentation and reassembly counters of a
// netns (/proc/thread-self/net/snmp: the netns of the locked thread).
func fragCounters(t *testing.T, n ns.NetNS) map[string]int {
	t.Helper()
	out := map[string]int{}
	do(t, n, func() error {
		data, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var head []string
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Ip:" {
				continue
			}
			if head == nil {
				head = f
				continue
			}
			for i := 1; i < len(f) && i < len(head); i++ {
				if strings.HasPrefix(head[i], "Frag") || strings.HasPrefix(head[i], "Reasm") {
					out[head[i]], _ = strconv.Atoi(f[i])
				}
			}
		}
		return nil
	})
	return out
}

// startIperfServer runs `iperf3 -s` bound to ip inside netns until the
// test ends and returns its port.
func startIperfServer(t *testing.T, n ns.NetNS, ip string) int {
	t.Helper()
	port := 5201
	startInNS(t, n, filepath.Join(t.TempDir(), "iperf3-server.log"), mustLook(t, "iperf3"), "-s", "-B", ip, "-p", strconv.Itoa(port))
	return port
}

func mustLook(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// iperf runs one iperf3 client from netns to ip:port (retrying while the
// server is not listening yet) and returns the receiver-side throughput.
func iperf(t *testing.T, n ns.NetNS, ip string, port, dur, omit int) iperfRun {
	t.Helper()
	var j struct {
		Start struct {
			MSS int `json:"tcp_mss_default"`
		} `json:"start"`
		End struct {
			Sent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			Received struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	var out []byte
	for try := 0; ; try++ {
		_ = n.Do(func(ns.NetNS) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(dur+omit+20)*time.Second)
			defer cancel()
			// iperf3 -J reports its errors in the JSON (exit status 1).
			out, _ = exec.CommandContext(ctx, "iperf3", "-c", ip, "-p", strconv.Itoa(port), "-t", strconv.Itoa(dur), "-O", strconv.Itoa(omit), "-J").Output()
			return nil
		})
		j.Error = ""
		err := json.Unmarshal(out, &j)
		if err == nil && j.Error == "" {
			break
		}
		// The server may not listen yet (it was just started) or still be
		// busy with the previous client.
		if try == 30 {
			t.Fatalf("iperf3 -c %s (%v): %s\n%s", ip, err, j.Error, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return iperfRun{Gbps: j.End.Received.BPS / 1e9, Retransmits: j.End.Sent.Retransmits, MSS: j.Start.MSS}
}
