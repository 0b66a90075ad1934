//go:build bench

package policybench

import (
	"context"
	"fmt"
	"math/rand/v2"
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
// (one nf_tables transaction a node, from this process: tableSwitch).
// Connections: Rounds rounds of Batches batches of Batch sequential
// fresh connections, the arm switched before every batch in the order
// without, with, with, without, ... (ABBA: a drift linear over four
// batches weighs on both arms alike), so both arms see the same moments
// of the machine; each batch's first Warm connections (the swap's
// transient) are shown apart, not pooled. Throughput: one iperf3 run of each arm a round, the
// order alternating. What it leaves out: the engines' CPU, which the
// phases measure (routed_cpu_ms, under 2 % of a CPU).
type swapArms struct {
	Policies        int `json:"policies"`
	ClusterPolicies int `json:"cluster_policies"`
	Rounds          int `json:"rounds"`
	Batches         int `json:"batches"` // a round's batches, both arms
	Batch           int `json:"batch"`   // sequential fresh connections a batch
	// Segments of SegmentMs each of one iperf3 stream a round (streamArms)
	Segments  int `json:"segments"`
	SegmentMs int `json:"segment_ms"`
	// TableLines: `nft list table inet podnet-policy` lines on node 1,
	// without and with the policies
	TableLines [2]int      `json:"table_lines"`
	SwapMs     []float64   `json:"swap_ms"` // each swap, both nodes
	Runs       []swapRound `json:"runs"`
	// Pooled: p50, p99, p99.9 of every connection but each batch's Warm
	// first (ms), without and with the policies
	PooledOpen [3]float64 `json:"pooled_open"`
	PooledPol  [3]float64 `json:"pooled_pol"`
	// Warm: the first connections of each batch left out of the pooled
	// figures (both arms): right after a swap, connections through the
	// table just woken are slower for some ten connections (ByPosition:
	// 1.15x at the first, 1.05x at the tenth with batches of 10), a
	// transient of the swap that a node's table, never swapped, does not
	// have. PooledAll: p50, p99, p99.9 with them, without and with.
	Warm      int           `json:"warm"`
	PooledAll [2][3]float64 `json:"pooled_all"`
	// ByPosition: p50 of the connections at each position of a batch
	// (0: right after the swap), without and with
	ByPosition [][2]float64 `json:"by_position"`
	// Tenths: the pooled p99 of each tenth of the rounds (ms), without
	// and with
	Tenths [][2]float64 `json:"tenths"`
	// P99CI: the 5th and 95th percentile of the pooled p99 ratio (with ÷
	// without) over 400 resamples of the rounds (with replacement)
	P99CI [2]float64 `json:"p99_ci"`
	// StreamOpen, StreamPol: Gbit/s of every round's stream segments of
	// each arm; GbpsCI: their ratio's 90 % interval over resampled rounds
	StreamOpen float64    `json:"stream_open_gbps"`
	StreamPol  float64    `json:"stream_pol_gbps"`
	GbpsCI     [2]float64 `json:"gbps_ci"`
	// Repairs: node 1's podnet_repairs_total of the policy table by the
	// restart (SIGCONT) after the swaps: nft's encoding of a table differs
	// from the engine's, which rewrites it whole
	Repairs float64 `json:"repairs"`
}

// swapRound is one round: each arm's connections (p50, p99 of the
// round's) and its part of the round's stream.
type swapRound struct {
	Open swapResult `json:"open"`
	Pol  swapResult `json:"pol"`
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

// switches dials each node's tables (tableSwitch).
func (b *bench) switches() []*tableSwitch {
	var out []*tableSwitch
	for i, n := range []*cluster.Node{b.n1, b.n2} {
		s, err := newTableSwitch(n.NS.NetNS, b.open.families(i))
		b.must(err)
		b.t.Cleanup(func() { _ = s.Close() })
		out = append(out, s)
	}
	return out
}

// activate makes each node's podnet-open tables (open) or its policy
// tables (not open) the ones on the hooks and the others dormant, one
// transaction a node.
func (b *bench) activate(sw []*tableSwitch, open bool) {
	on, off := "podnet-policy", "podnet-open"
	if open {
		on, off = off, on
	}
	for _, s := range sw {
		b.must(s.set(on, off))
	}
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
func (b *bench) swap(pols, cnps, rounds, batches, batch, warm, segs int, segDur time.Duration) *swapArms {
	t := b.t
	if b.open[0] == nil || rounds <= 0 {
		return nil
	}
	sa := &swapArms{Policies: pols, ClusterPolicies: cnps, Rounds: rounds, Batches: batches, Batch: batch, Warm: warm, Segments: segs, SegmentMs: int(segDur.Milliseconds())}
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
	sw := b.switches()
	rx, err := newRxCounter(b.srv.NS.NetNS)
	b.must(err)
	var streams [][2][2]float64
	var all [2][]float64 // without, with
	pos := [2][][]float64{make([][]float64, batch), make([][]float64, batch)}
	// the switch switches: the bench's deny-all refuses probe-cli ->
	// probe-srv in the policies' table only
	b.activate(sw, true)
	waitVerdict(t, b.probeCli.NS, b.probeAddr, true, 5*time.Second)
	b.activate(sw, false)
	waitVerdict(t, b.probeCli.NS, b.probeAddr, false, 5*time.Second)
	open, pol := make([][]float64, rounds), make([][]float64, rounds)
	for r := range rounds {
		var round swapRound
		for k := range batches {
			g := r*batches + k
			isOpen := g%4 == 0 || g%4 == 3
			start := time.Now()
			b.activate(sw, isOpen)
			sa.SwapMs = append(sa.SwapMs, float64(time.Since(start).Microseconds())/1000)
			lat := connectLatencies(t, b.cli.NS, b.srvAddr, batch)
			arm := 1
			if isOpen {
				arm = 0
			}
			all[arm] = append(all[arm], lat...)
			for i, l := range lat {
				pos[arm][i] = append(pos[arm][i], l)
			}
			lat = lat[min(warm, len(lat)):]
			if isOpen {
				open[r] = append(open[r], lat...)
			} else {
				pol[r] = append(pol[r], lat...)
			}
		}
		round.Open.P50, round.Open.P99 = roundMs([]float64{pct(open[r], 50)})[0], roundMs([]float64{pct(open[r], 99)})[0]
		round.Pol.P50, round.Pol.P99 = roundMs([]float64{pct(pol[r], 50)})[0], roundMs([]float64{pct(pol[r], 99)})[0]
		o, p := b.streamArms(sw, rx, segs, segDur)
		streams = append(streams, [2][2]float64{o, p})
		round.Open.Gbps, round.Pol.Gbps = gbit(o), gbit(p)
		t.Logf("table swap, round %d: without %.2f / %.2f ms %.2f Gbit/s, with %d + %d %.2f / %.2f ms %.2f Gbit/s",
			r+1, round.Open.P50, round.Open.P99, round.Open.Gbps, pols, cnps, round.Pol.P50, round.Pol.P99, round.Pol.Gbps)
		sa.Runs = append(sa.Runs, round)
	}
	allOpen, allPol := slices.Concat(open...), slices.Concat(pol...)
	for i, q := range []float64{50, 99, 99.9} {
		sa.PooledOpen[i], sa.PooledPol[i] = pct(allOpen, q), pct(allPol, q)
	}
	sa.Tenths = tenths(open, pol, 10)
	for i := range 2 {
		for j, q := range []float64{50, 99, 99.9} {
			sa.PooledAll[i][j] = pct(all[i], q)
		}
	}
	for i := range batch {
		sa.ByPosition = append(sa.ByPosition, [2]float64{pct(pos[0][i], 50), pct(pos[1][i], 50)})
	}
	sa.P99CI = p99Interval(open, pol, 400)
	sa.StreamOpen, sa.StreamPol, sa.GbpsCI = streamTotals(streams, 400)
	b.activate(sw, false)
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
	t.Logf("table swap: p50 by position in the batch, with vs without: %v; every connection: p99 %.3f vs %.3f ms", sa.ByPosition, sa.PooledAll[1][1], sa.PooledAll[0][1])
	t.Logf("table swap, %d rounds: fresh connection p99 pooled %.3f vs %.3f ms without (ratio 90 %% interval %.3f-%.3f); throughput %.2f vs %.2f Gbit/s (ratio 90 %% interval %.3f-%.3f)",
		rounds, sa.PooledPol[1], sa.PooledOpen[1], sa.P99CI[0], sa.P99CI[1], sa.StreamPol, sa.StreamOpen, sa.GbpsCI[0], sa.GbpsCI[1])
	return sa
}

// gbit is bytes and seconds as Gbit/s.
func gbit(x [2]float64) float64 {
	if x[1] == 0 {
		return 0
	}
	return x[0] * 8 / x[1] / 1e9
}

// streamTotals is each arm's throughput over every round's stream
// (Gbit/s, without and with) and the 5th and 95th percentile of their
// ratio (with ÷ without) over resamples of the rounds.
func streamTotals(streams [][2][2]float64, resamples int) (open, pol float64, ci [2]float64) {
	sum := func(idx func(int) int) (o, p float64) {
		var so, sp [2]float64
		for i := range streams {
			r := streams[idx(i)]
			so[0], so[1], sp[0], sp[1] = so[0]+r[0][0], so[1]+r[0][1], sp[0]+r[1][0], sp[1]+r[1][1]
		}
		return gbit(so), gbit(sp)
	}
	open, pol = sum(func(i int) int { return i })
	if len(streams) == 0 {
		return open, pol, ci
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var ratios []float64
	for range resamples {
		o, p := sum(func(int) int { return rng.IntN(len(streams)) })
		if o > 0 {
			ratios = append(ratios, p/o)
		}
	}
	return open, pol, [2]float64{pct(ratios, 5), pct(ratios, 95)}
}

// tenths is the pooled p99 of each of n consecutive parts of the
// rounds, without and with.
func tenths(open, pol [][]float64, n int) [][2]float64 {
	n = min(n, len(open))
	var out [][2]float64
	for i := range n {
		lo, hi := i*len(open)/n, (i+1)*len(open)/n
		out = append(out, [2]float64{pct(slices.Concat(open[lo:hi]...), 99), pct(slices.Concat(pol[lo:hi]...), 99)})
	}
	return out
}

// p99Interval is the 5th and 95th percentile of the pooled p99 ratio
// (with ÷ without) over resamples of the rounds drawn with replacement
// (a round's two arms kept together: they saw the same moments).
func p99Interval(open, pol [][]float64, resamples int) [2]float64 {
	if len(open) == 0 {
		return [2]float64{}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var ratios []float64
	for range resamples {
		var o, p []float64
		for range open {
			r := rng.IntN(len(open))
			o, p = append(o, open[r]...), append(p, pol[r]...)
		}
		if q := pct(o, 99); q > 0 {
			ratios = append(ratios, pct(p, 99)/q)
		}
	}
	return [2]float64{pct(ratios, 5), pct(ratios, 95)}
}
