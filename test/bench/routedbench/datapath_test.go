//go:build bench

package routedbench

// Data path (issue 8 §5): a two-node test/cluster per mode (--encap=none,
// then --encap=vxlan: node netns on one L2 underlay, MTU 1500,
// podnet-routed in each), one pod per node attached through libcni with
// the shipped conflist (podnet + podnet-ipam, usePodCidr). iperf3 (TCP, one stream) pod to
// pod across the nodes, and node to node over the same underlay, taking
// turns, -reps times per mode. Then the MTU: a don't-fragment ping that
// fills the pod MTU crosses the nodes, one byte more fails, and no netns
// on the path fragmented or reassembled anything during the transfers.

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

func TestDatapath(t *testing.T) {
	out := benchOut(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 not installed (Debian package iperf3; scripts/bench.sh installs it)")
	}
	dur, omit, reps := envInt("PODNET_BENCH_IPERF_SECONDS", 3), 1, envInt("PODNET_BENCH_IPERF_REPS", 3)
	ver, _ := exec.Command("iperf3", "--version").Output()
	res := datapathResult{Started: time.Now().UTC(), Duration: dur, Omit: omit, Iperf: strings.SplitN(string(ver), "\n", 2)[0]}
	for _, encap := range []string{"none", "vxlan"} {
		t.Run(encap, func(t *testing.T) {
			res.Modes = append(res.Modes, measureMode(t, encap, dur, omit, reps))
		})
	}
	res.Seconds = time.Since(res.Started).Seconds()
	writeJSON(t, filepath.Join(out, "datapath.json"), res)
}

// measureMode brings up a two-node test/cluster in mode encap (a real
// kube-apiserver, podnet-routed per node, pods attached through libcni
// with the shipped conflist) and measures its data path; the cluster goes
// when the subtest ends.
func measureMode(t *testing.T, encap string, dur, omit, reps int) modeResult {
	mr := modeResult{Encap: encap, FragDelta: map[string]string{}}
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
		Resync:   time.Hour,
		Logf:     t.Logf,
	})
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	nodes := c.Nodes

	// One pod per node.
	type pod struct {
		ns  ns.NetNS
		ip  string
		mtu int
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
		pods = append(pods, pod{ns: p.NS.NetNS, ip: p.IP.String(), mtu: mtu})
	}
	mr.PodMTU = pods[0].mtu
	poll(t, 20*time.Second, "first pod->pod ping", func() error { return ping(pods[0].ns, pods[1].ip, "-c1", "-W1") })

	netnsOnPath := map[string]ns.NetNS{"node1": nodes[0].NS.NetNS, "node2": nodes[1].NS.NetNS, "pod1": pods[0].ns, "pod2": pods[1].ns, "underlay": c.Underlay.NetNS}
	before := map[string]map[string]int{}
	for name, n := range netnsOnPath {
		before[name] = fragCounters(t, n)
	}
	srvNode := startIperfServer(t, nodes[1].NS.NetNS, nodes[1].IP.String())
	srvPod := startIperfServer(t, pods[1].ns, pods[1].ip)
	for rep := 1; rep <= reps; rep++ {
		order := []string{"node", "pod"}
		if rep%2 == 0 {
			order = []string{"pod", "node"}
		}
		for _, path := range order {
			var r iperfRun
			if path == "node" {
				r = iperf(t, nodes[0].NS.NetNS, nodes[1].IP.String(), srvNode, dur, omit)
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
	return mr
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
