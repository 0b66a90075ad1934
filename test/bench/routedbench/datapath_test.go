//go:build bench

package routedbench

// Data path (issue 8 §5, issue 23 "Must show" 4): a dual-stack two-node
// test/cluster per mode (node netns on one L2 underlay, MTU 1500, with an
// IPv4 and an IPv6 address each; a PodCIDR of each family; podnet-routed
// in each), one pod per node attached through libcni with the shipped
// conflist plus its usePodCidrIPv6 range (podnet + podnet-ipam: an address
// of each family). The modes: --encap=none and --encap=vxlan, each with
// the IPv4 InternalIP first (kubelet --node-ip=v4,v6: the underlay
// podnet-routed routes and encapsulates over is IPv4), then the IPv6 one
// first (an IPv6 underlay). iperf3 (TCP, one stream) pod to pod across
// the nodes, and node to node over the same underlay, in each family,
// taking turns, -reps times per mode. Then the MTU, in each family: a
// don't-fragment ping that fills the pod MTU crosses the nodes, one byte
// more fails, and no netns on the path fragmented or reassembled anything
// during the transfers.
//
// Pods are measured in both families in every mode: --encap=none routes
// the PodCIDR of the underlay's family via the Node's first InternalIP
// and the other family's via its InternalIP of that family; VXLAN
// carries either family over the underlay (50 B of headers over an IPv4
// underlay, 70 B over an IPv6 one).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

type iperfRun struct {
	Path        string  `json:"path"`   // "pod" or "node"
	Family      string  `json:"family"` // "ipv4" or "ipv6"
	Rep         int     `json:"rep"`
	Gbps        float64 `json:"gbps"` // receiver side
	Retransmits int     `json:"retransmits"`
	MSS         int     `json:"mss"`
	// Load1 is the machine's 1-minute load average just before the run
	Load1 float64 `json:"load1"`
}

type modeResult struct {
	Encap string `json:"encap"`
	// Underlay is the family of the nodes' first InternalIP, which
	// podnet-routed routes and encapsulates over ("ipv4" when absent: the
	// results from before dual-stack)
	Underlay  string            `json:"underlay"`
	PodMTU    int               `json:"pod_mtu"`
	Runs      []iperfRun        `json:"runs"`
	PingFits  string            `json:"ping_fits"`  // "" = passed, else the failure
	PingOver  string            `json:"ping_over"`  // how one byte over the MTU failed ("" = it was answered)
	FragDelta map[string]string `json:"frag_delta"` // netns -> counters that moved (empty map = none moved)
	// the IPv6 half's MTU pings
	PingFits6 string `json:"ping_fits6"`
	PingOver6 string `json:"ping_over6"`
	// Failed: the cluster did not come up (nothing measured), and why
	Failed string `json:"failed,omitempty"`
}

type datapathResult struct {
	Started  time.Time    `json:"started"`
	Seconds  float64      `json:"seconds"`
	Duration int          `json:"duration_s"`
	Omit     int          `json:"omit_s"`
	Iperf    string       `json:"iperf3"`
	Modes    []modeResult `json:"modes"`
}

func TestDatapath(t *testing.T) {
	out := benchOut(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed (Debian package iperf3; scripts/bench.sh installs it)")
	}
	dur, omit, reps := envInt("PODNET_BENCH_IPERF_SECONDS", 10), 1, envInt("PODNET_BENCH_IPERF_REPS", 5)
	ver, _ := exec.Command("iperf3", "--version").Output()
	res := datapathResult{Started: time.Now().UTC(), Duration: dur, Omit: omit, Iperf: strings.SplitN(string(ver), "\n", 2)[0]}
	for _, m := range []struct{ encap, underlay string }{{"none", "ipv4"}, {"vxlan", "ipv4"}, {"none", "ipv6"}, {"vxlan", "ipv6"}} {
		t.Run(m.encap+"-"+m.underlay+"-underlay", func(t *testing.T) {
			res.Modes = append(res.Modes, measureMode(t, m.encap, m.underlay, dur, omit, reps))
		})
	}
	res.Seconds = time.Since(res.Started).Seconds()
	writeJSON(t, filepath.Join(out, "datapath.json"), res)
}

// measureMode brings up a dual-stack two-node test/cluster in mode encap
// over an underlay of family underlay (a real kube-apiserver,
// podnet-routed per node, pods attached through libcni with the shipped
// conflist) and measures its data path; the cluster goes when the subtest
// ends.
func measureMode(t *testing.T, encap, underlay string, dur, omit, reps int) modeResult {
	mr := modeResult{Encap: encap, Underlay: underlay, FragDelta: map[string]string{}}
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	c, err := cluster.Up(context.Background(), cluster.Config{
		Name:     "pnbench-" + hex.EncodeToString(id),
		WorkDir:  t.TempDir(),
		RepoRoot: nettest.RepoRoot(t),
		BinDir:   nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed"),
		KapiDir:  kapi.BinDir(t),
		Encap:    encap,
		Nodes:    2,
		// dual-stack: IPv4 first, as a cluster upgraded to dual-stack
		ClusterCIDR6: "fd00:10:244::/56",
		IPv6First:    underlay == "ipv6",
		Resync:       time.Hour,
		Logf:         t.Logf,
	})
	if err != nil {
		// recorded for the report, and the stage fails
		// its first line, and the first error podnet-routed logged
		mr.Failed, _, _ = strings.Cut(err.Error(), "\n")
		for _, key := range []string{`"msg":"apply failed"`, `"level":"ERROR"`} {
			if logged := firstLine(err.Error(), key); logged != err.Error() {
				mr.Failed += " — podnet-routed: " + logged
				break
			}
		}
		t.Errorf("cluster up: %v", err)
		return mr
	}
	t.Cleanup(func() {
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	nodes := c.Nodes

	// One pod per node.
	type pod struct {
		ns      ns.NetNS
		ip, ip6 string
		mtu     int
	}
	var pods []pod
	for _, n := range nodes {
		p, err := n.AddPod(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		mtu, err := p.MTU()
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod{ns: p.NS.NetNS, ip: p.IP.String(), ip6: p.IP6.String(), mtu: mtu})
	}
	mr.PodMTU = pods[0].mtu
	poll(t, 20*time.Second, "first node->node IPv6 ping", func() error { return ping(nodes[0].NS.NetNS, nodes[1].IP6.String(), "-c1", "-W1") })
	podIPs := map[string][2]string{"ipv4": {pods[0].ip, pods[1].ip}, "ipv6": {pods[0].ip6, pods[1].ip6}}
	// every mode routes both families: VXLAN carries either, and
	// podnet-routed routes the other family's PodCIDR of a dual-stack
	// Node via its InternalIP of that family
	for _, fam := range []string{"ipv4", "ipv6"} {
		poll(t, 20*time.Second, "first pod->pod "+fam+" ping", func() error { return ping(pods[0].ns, podIPs[fam][1], "-c1", "-W1") })
	}

	netnsOnPath := map[string]ns.NetNS{"node1": nodes[0].NS.NetNS, "node2": nodes[1].NS.NetNS, "pod1": pods[0].ns, "pod2": pods[1].ns, "underlay": c.Underlay.NetNS}
	before := map[string]map[string]int{}
	for name, n := range netnsOnPath {
		before[name] = fragCounters(t, n)
	}
	// One server per address, each on a port of its own.
	type target struct {
		client ns.NetNS
		dst    string
		port   int
	}
	targets := map[[2]string]target{
		{"node", "ipv4"}: {nodes[0].NS.NetNS, nodes[1].IP.String(), startIperfServer(t, nodes[1].NS.NetNS, nodes[1].IP.String(), 5201)},
		{"node", "ipv6"}: {nodes[0].NS.NetNS, nodes[1].IP6.String(), startIperfServer(t, nodes[1].NS.NetNS, nodes[1].IP6.String(), 5202)},
	}
	for fam, port := range map[string]int{"ipv4": 5201, "ipv6": 5202} {
		targets[[2]string{"pod", fam}] = target{pods[0].ns, podIPs[fam][1], startIperfServer(t, pods[1].ns, podIPs[fam][1], port)}
	}
	for rep := 1; rep <= reps; rep++ {
		// node and pod take turns in each family, the first rotating
		order := [][2]string{{"node", "ipv4"}, {"pod", "ipv4"}, {"node", "ipv6"}, {"pod", "ipv6"}}
		if rep%2 == 0 {
			order = [][2]string{{"pod", "ipv6"}, {"node", "ipv6"}, {"pod", "ipv4"}, {"node", "ipv4"}}
		}
		for _, k := range order {
			tg, ok := targets[k]
			if !ok {
				continue
			}
			load := load1()
			r := iperf(t, tg.client, tg.dst, tg.port, dur, omit)
			r.Path, r.Family, r.Rep, r.Load1 = k[0], k[1], rep, load
			t.Logf("%s over %s rep %d %s %s<->%s: %.2f Gbit/s, %d retransmits, MSS %d", encap, underlay, rep, k[1], k[0], k[0], r.Gbps, r.Retransmits, r.MSS)
			mr.Runs = append(mr.Runs, r)
		}
	}
	// MTU: exactly the pod MTU with DF crosses; one byte more does not
	// (IPv4: 20 B IP + 8 B ICMP; IPv6: 40 + 8).
	mr.PingFits, mr.PingOver = mtuPings(pods[0].ns, pods[1].ip, mr.PodMTU-28)
	mr.PingFits6, mr.PingOver6 = mtuPings(pods[0].ns, pods[1].ip6, mr.PodMTU-48)
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
	return mr
}

// load1 is the 1-minute load average (0 when unreadable).
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

// mtuPings sends a don't-fragment ping of payload bytes, which must be
// answered (fits: "" or the failure), then one of a byte more, which must
// not (over: how it failed, "" when it was answered).
func mtuPings(n ns.NetNS, dst string, payload int) (fits, over string) {
	if err := ping(n, dst, "-M", "do", "-c1", "-W2", "-s", strconv.Itoa(payload)); err != nil {
		fits = err.Error()
	}
	if err := ping(n, dst, "-M", "do", "-c1", "-W2", "-s", strconv.Itoa(payload+1)); err != nil {
		over = firstLine(err.Error(), "message too long", "Frag", "error", "100% packet loss")
	}
	return fits, over
}

func poll(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	if err := nettest.Poll(context.Background(), limit, 100*time.Millisecond, f); err != nil {
		t.Fatalf("%s: not after %v: %v", what, limit, err)
	}
}

func ping(n ns.NetNS, dst string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := nettest.ExecIn(ctx, n, "ping", append(args, dst)...); err != nil {
		return fmt.Errorf("ping %s %s: %v: %s", strings.Join(args, " "), dst, err, strings.TrimSpace(out))
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

// fragCounters reads the IPv4 and IPv6 fragmentation and reassembly
// counters of a netns (/proc/thread-self/net/snmp and snmp6: the netns of
// the locked thread).
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
		data6, err := os.ReadFile("/proc/thread-self/net/snmp6")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data6), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && (strings.HasPrefix(f[0], "Ip6Frag") || strings.HasPrefix(f[0], "Ip6Reasm")) {
				out[f[0]], _ = strconv.Atoi(f[1])
			}
		}
		return nil
	})
	return out
}

// startIperfServer runs `iperf3 -s` bound to ip:port inside netns until
// the test ends and returns port.
func startIperfServer(t *testing.T, n ns.NetNS, ip string, port int) int {
	t.Helper()
	nettest.StartProcT(t, n, filepath.Join(t.TempDir(), "iperf3-server.log"), mustLook(t, "iperf3"), "-s", "-B", ip, "-p", strconv.Itoa(port))
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
