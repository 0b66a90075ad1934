//go:build bench

package policybench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// swapArms is the datapath with the policies and without any, finely
// alternated (issue 33's fresh-connection and throughput bars): the
// phases switch arms through the API server (1,000 objects created or
// deleted and enforced, some 10 s a switch), so their pairs are half a
// minute apart and this machine's drift moves a pair by 0.6-2x. Here
// both nodes' engines are stopped (SIGSTOP, so that neither repairs what
// follows), the tables they wrote with no policy (`nft list` of the
// phases' last run without) are loaded beside theirs as podnet-open,
// dormant (on no hook), and a swap makes one dormant and wakes the other
// (one nft transaction a node, milliseconds): Rounds rounds, each a run
// of each arm back to back, the order alternating. What it leaves out:
// the engines' CPU, which the phases measure (routed_cpu_ms, under 2 % of
// a CPU).
type swapArms struct {
	Policies        int `json:"policies"`
	ClusterPolicies int `json:"cluster_policies"`
	Rounds          int `json:"rounds"`
	Conns           int `json:"conns"`   // sequential fresh connections per run
	IperfS          int `json:"iperf_s"` // one iperf3 stream per run, nothing omitted
	// TableLines: `nft list table inet podnet-policy` lines on node 1,
	// without and with the policies
	TableLines [2]int      `json:"table_lines"`
	SwapMs     []float64   `json:"swap_ms"` // each swap, both nodes
	Runs       []swapRound `json:"runs"`
	// Pooled: p50, p99, p99.9 of every run's connections (ms), without
	// and with the policies
	PooledOpen [3]float64 `json:"pooled_open"`
	PooledPol  [3]float64 `json:"pooled_pol"`
	// Repairs: node 1's podnet_repairs_total of the policy table by the
	// restart (SIGCONT) after the swaps: nft's encoding of a table differs
	// from the engine's, which rewrites it whole
	Repairs float64 `json:"repairs"`
}

// swapRound is one round: a run of each arm, back to back.
type swapRound struct {
	OpenFirst bool       `json:"open_first"`
	Open      swapResult `json:"open"`
	Pol       swapResult `json:"pol"`
}

type swapResult struct {
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	Gbps float64 `json:"gbps"`
}

// tables is `nft list table <family> podnet-policy` of both nodes, the
// families a node has.
type tables [2]map[string]string

// dumpTables lists both nodes' policy tables (inet and, where the engine
// wrote it, bridge).
func (b *bench) dumpTables() tables {
	var out tables
	for i, n := range []*cluster.Node{b.n1, b.n2} {
		out[i] = map[string]string{}
		for _, fam := range []string{"inet", "bridge"} {
			s, err := n.NS.Exec(context.Background(), "nft", "list", "table", fam, "podnet-policy")
			if err != nil {
				if fam == "inet" {
					b.t.Fatalf("%s: nft list table inet podnet-policy: %v\n%s", n.Name, err, s)
				}
				continue
			}
			out[i][fam] = s
		}
	}
	return out
}

// nodeNFT runs script with nft -f in each node's netns (its own
// script: i is the node's index).
func (b *bench) nodeNFT(dir string, script func(i int) string) {
	for i, n := range []*cluster.Node{b.n1, b.n2} {
		f := filepath.Join(dir, n.Name+".nft")
		b.must(os.WriteFile(f, []byte(script(i)), 0o600))
		if out, err := n.NS.Exec(context.Background(), "nft", "-f", f); err != nil {
			b.t.Fatalf("%s: nft -f: %v\n%s", n.Name, err, out)
		}
	}
}

// families are the table families of tb's node i, sorted.
func (tb tables) families(i int) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range tb[i] {
			if !yield(k) {
				return
			}
		}
	})
}

// installOpen loads b.open beside each node's policy tables as
// podnet-open, dormant (its chains on no hook).
func (b *bench) installOpen(dir string) {
	b.nodeNFT(dir, func(i int) string {
		var sb strings.Builder
		for _, fam := range b.open.families(i) {
			head := "table " + fam + " podnet-policy {"
			body, ok := strings.CutPrefix(b.open[i][fam], head)
			if !ok {
				b.t.Fatalf("%s table listing starts %.40q, not %q", fam, b.open[i][fam], head)
			}
			fmt.Fprintf(&sb, "add table %s podnet-open\ndelete table %s podnet-open\ntable %s podnet-open {\n\tflags dormant\n%s\n", fam, fam, fam, body)
		}
		return sb.String()
	})
}

// activate makes each node's podnet-open tables (open) or its policy
// tables (not open) the ones on the hooks and the others dormant, one
// transaction a node.
func (b *bench) activate(open bool, dir string) {
	on, off := "podnet-policy", "podnet-open"
	if open {
		on, off = off, on
	}
	b.nodeNFT(dir, func(i int) string {
		var sb strings.Builder
		for _, fam := range b.open.families(i) {
			fmt.Fprintf(&sb, "add table %s %s { flags dormant; }\nadd table %s %s\n", fam, off, fam, on)
		}
		return sb.String()
	})
}

// dropOpen deletes each node's podnet-open tables.
func (b *bench) dropOpen(dir string) {
	b.nodeNFT(dir, func(i int) string {
		var sb strings.Builder
		for _, fam := range b.open.families(i) {
			fmt.Fprintf(&sb, "delete table %s podnet-open\n", fam)
		}
		return sb.String()
	})
}

// signalRouted sends sig to both nodes' podnet-routed.
func (b *bench) signalRouted(sig syscall.Signal) {
	for _, n := range []*cluster.Node{b.n1, b.n2} {
		p := n.Routed()
		if p == nil || p.Cmd == nil || p.Cmd.Process == nil {
			b.t.Fatalf("%s: podnet-routed not running", n.Name)
		}
		b.must(p.Cmd.Process.Signal(sig))
	}
}

// settle waits until node 1's engine wrote nothing for 2 s.
func (b *bench) settle() {
	_ = nettest.Poll(b.ctx, 60*time.Second, time.Second, func() error {
		before := applyStats(b.n1)
		time.Sleep(2 * time.Second)
		if applyStats(b.n1)[1] != before[1] {
			return fmt.Errorf("node 1 still writing")
		}
		return nil
	})
}

// swap runs the arms with the policies in place and b.open (the tables
// of the phases' last run without any) as the other; the policies' tables
// alone are on the hooks and both engines running when it returns.
func (b *bench) swap(pols, cnps, rounds, conns, iperfS int) *swapArms {
	t := b.t
	if b.open[0] == nil || rounds <= 0 {
		return nil
	}
	sa := &swapArms{Policies: pols, ClusterPolicies: cnps, Rounds: rounds, Conns: conns, IperfS: iperfS}
	withPol := b.dumpTables()
	sa.TableLines = [2]int{strings.Count(b.open[0]["inet"], "\n"), strings.Count(withPol[0]["inet"], "\n")}
	for i := range 2 {
		if !slices.Equal(withPol.families(i), b.open.families(i)) {
			t.Fatalf("node %d's policy tables are %v, without policies %v", i+1, withPol.families(i), b.open.families(i))
		}
	}
	var repairs0 float64
	if body, err := b.n1.MetricsText(); err == nil {
		repairs0, _ = cluster.Metric(body, "podnet_repairs_total", `object="policy-table"`)
	}
	dir := t.TempDir()
	b.signalRouted(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			b.signalRouted(syscall.SIGCONT)
		}
	}()
	b.installOpen(dir)
	var allOpen, allPol []float64
	for r := range rounds {
		round := swapRound{OpenFirst: r%2 == 0}
		order := []bool{true, false}
		if !round.OpenFirst {
			order = []bool{false, true}
		}
		for _, open := range order {
			res, pool := &round.Pol, &allPol
			if open {
				res, pool = &round.Open, &allOpen
			}
			start := time.Now()
			b.activate(open, dir)
			sa.SwapMs = append(sa.SwapMs, float64(time.Since(start).Microseconds())/1000)
			lat := connectLatencies(t, b.cli.NS, b.srvAddr, conns)
			*pool = append(*pool, lat...)
			res.P50, res.P99 = roundMs([]float64{pct(lat, 50)})[0], roundMs([]float64{pct(lat, 99)})[0]
			res.Gbps = iperfOmit(t, b.cli.NS.NetNS, b.srv.IP.String(), iperfPort, iperfS, 0)
		}
		t.Logf("table swap, round %d: without %.2f / %.2f ms %.2f Gbit/s, with %d + %d %.2f / %.2f ms %.2f Gbit/s",
			r+1, round.Open.P50, round.Open.P99, round.Open.Gbps, pols, cnps, round.Pol.P50, round.Pol.P99, round.Pol.Gbps)
		sa.Runs = append(sa.Runs, round)
	}
	for i, q := range []float64{50, 99, 99.9} {
		sa.PooledOpen[i], sa.PooledPol[i] = pct(allOpen, q), pct(allPol, q)
	}
	b.activate(false, dir)
	b.dropOpen(dir)
	b.signalRouted(syscall.SIGCONT)
	stopped = false
	b.settle()
	waitVerdict(t, b.probeCli.NS, b.probeAddr, false, 60*time.Second) // bench's deny-all
	waitVerdict(t, b.cli.NS, b.srvAddr, true, 60*time.Second)
	if body, err := b.n1.MetricsText(); err == nil {
		r1, _ := cluster.Metric(body, "podnet_repairs_total", `object="policy-table"`)
		sa.Repairs = r1 - repairs0
	}
	t.Logf("table swap, %d rounds: fresh connection p99 pooled %.3f vs %.3f ms without; throughput median %.2f vs %.2f Gbit/s",
		rounds, sa.PooledPol[1], sa.PooledOpen[1], medianGbps(sa.Runs, false), medianGbps(sa.Runs, true))
	return sa
}

func medianGbps(runs []swapRound, open bool) float64 {
	var g []float64
	for _, r := range runs {
		if open {
			g = append(g, r.Open.Gbps)
		} else {
			g = append(g, r.Pol.Gbps)
		}
	}
	return pct(g, 50)
}
