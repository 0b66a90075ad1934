package main

import (
	"fmt"
	"math"
)

// policyCNP is policy.json's cnp: the admin tier (issue 33), the last
// count of NetworkPolicies again with ClusterNetworkPolicies beside them.
type policyCNP struct {
	Policies        int     `json:"policies"`
	ClusterPolicies int     `json:"cluster_policies"`
	SetupS          float64 `json:"setup_s"`
	ClusterRefused  float64 `json:"cluster_refused"`
	IsolatedPods    float64 `json:"isolated_pods"`
	TableLines      int     `json:"table_lines"`
	TableBytes      int     `json:"table_bytes"`
	TableSets       int     `json:"table_sets"`
	TableChains     int     `json:"table_chains"`
	SrvAdmin        [2]int  `json:"srv_admin"`
	CliAdmin        [2]int  `json:"cli_admin"`
	Phases          []struct {
		policyPhase
		ClusterPolicies int `json:"cluster_policies"`
	} `json:"phases"`
	Flips []struct {
		Kind string  `json:"kind"`
		To   string  `json:"to"`
		Ms   float64 `json:"ms"`
	} `json:"flips"`
	RevocationMs           []float64 `json:"revocation_ms"`
	IncrementalApplyCount  float64   `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64   `json:"incremental_apply_mean_ms"`
	Repairs                float64   `json:"repairs"`
	AttachMs               []float64 `json:"attach_ms"`
	Swap                   *cnpSwap  `json:"swap"`
}

// cnpSwap is policy.json's cnp.swap: the same two arms by table swaps,
// finely alternated (test/bench/policybench/swap_test.go).
type cnpSwap struct {
	Rounds     int           `json:"rounds"`
	Batches    int           `json:"batches"`
	Batch      int           `json:"batch"`
	Warm       int           `json:"warm"`
	PooledAll  [2][3]float64 `json:"pooled_all"`
	ByPosition [][2]float64  `json:"by_position"`
	Segments   int           `json:"segments"`
	SegmentMs  int           `json:"segment_ms"`
	TableLines [2]int        `json:"table_lines"`
	SwapMs     []float64     `json:"swap_ms"`
	Runs       []struct {
		Open swapRun `json:"open"`
		Pol  swapRun `json:"pol"`
	} `json:"runs"`
	PooledOpen [3]float64   `json:"pooled_open"`
	PooledPol  [3]float64   `json:"pooled_pol"`
	Tenths     [][2]float64 `json:"tenths"`
	P99CI      [2]float64   `json:"p99_ci"`
	StreamOpen float64      `json:"stream_open_gbps"`
	StreamPol  float64      `json:"stream_pol_gbps"`
	GbpsCI     [2]float64   `json:"gbps_ci"`
	Repairs    float64      `json:"repairs"`
}

type swapRun struct {
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	Gbps float64 `json:"gbps"`
}

// swapBars are the fresh-connection p99 (pooled, with ÷ without) and the
// throughput (median of the rounds' with ÷ without) of s, and the
// text of both.
func swapBars(s *cnpSwap) (p99, gbps float64, p99Text, gbpsText string) {
	if len(s.Runs) == 0 || s.PooledOpen[1] == 0 {
		return math.NaN(), math.NaN(), "no rounds", "no rounds"
	}
	var seg, rg []float64
	for _, x := range s.Tenths {
		seg = append(seg, x[1]/x[0])
	}
	for _, r := range s.Runs {
		rg = append(rg, r.Pol.Gbps/r.Open.Gbps)
	}
	p99, gbps = s.PooledPol[1]/s.PooledOpen[1], s.StreamPol/s.StreamOpen
	perArm := s.Rounds * s.Batches / 2 * (s.Batch - s.Warm)
	p99Text = fmt.Sprintf("%.2f× (pooled, %d connections an arm, each batch's first %d after a swap left out: %s vs %s ms; p50 %s vs %s, p99.9 %s vs %s); 90 %% interval of the ratio over resampled rounds %.2f-%.2f×; each tenth of the rounds: %s; with every connection %.2f× (%s vs %s ms)",
		p99, perArm, s.Warm, fmtMs(s.PooledPol[1]), fmtMs(s.PooledOpen[1]), fmtMs(s.PooledPol[0]), fmtMs(s.PooledOpen[0]), fmtMs(s.PooledPol[2]), fmtMs(s.PooledOpen[2]), s.P99CI[0], s.P99CI[1], fmtRatios(seg),
		s.PooledAll[1][1]/s.PooledAll[0][1], fmtMs(s.PooledAll[1][1]), fmtMs(s.PooledAll[0][1]))
	gbpsText = fmt.Sprintf("%.1f %% (%.2f vs %.2f Gbit/s over %.0f s of stream an arm); 90 %% interval over resampled rounds %.1f-%.1f %%; rounds' ratios: median %.2f, %s", gbps*100, s.StreamPol, s.StreamOpen, float64(s.Rounds*s.Segments*s.SegmentMs)/2000, s.GbpsCI[0]*100, s.GbpsCI[1]*100, median(rg), fmtRatios(rg))
	return p99, gbps, p99Text, gbpsText
}

// cnpSection is issue 33's must-show 3: ClusterNetworkPolicies beside the
// NetworkPolicies, with its bars met or not.
func (r *report) cnpSection(d *policyData) {
	c := d.CNP
	if c == nil {
		return
	}
	r.f("### ClusterNetworkPolicy: %s beside %s NetworkPolicies\n\n", thousands(c.ClusterPolicies), thousands(c.Policies))
	r.f("Issue 33: the last count of NetworkPolicies again, the %d pods the same, with %d ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1) beside them: both tiers, priorities over 0-1000, Admin Accept, Deny and Pass and Baseline Accept and Deny rules, peers by namespaces, pods and networks (169.254.169.254/32, 10.x, 172.16/16, 192.168.x, IPv6), most selecting every pod; pass-intra-cluster (Admin, priority 900) passes every pod-to-pod flow to the namespace owners' NetworkPolicies, which decide cli → srv as before. ", d.PodsTotal, c.ClusterPolicies)
	r.f("All created → enforced and held by both engines: %.1f s (%.0f refused in part). Node 1's table: %d lines, %d sets and maps, %d chains, %d KiB. ", c.SetupS, c.ClusterRefused, c.TableLines, c.TableSets, c.TableChains, c.TableBytes/1024)
	r.f("The first packet cli → srv walks %d of the %d rules of srv's Admin chain (node 1 ingress) and %d of the %d of cli's (node 2 egress) before the Pass, then the NetworkPolicy chains as above. ", c.SrvAdmin[0], c.SrvAdmin[1], c.CliAdmin[0], c.CliAdmin[1])
	r.f("*Enforcement*: quarantine-probe, an Admin Deny (priority 500) of probe-cli → probe-srv, created and deleted while allow-probe allows the flow, measured as the NetworkPolicy flips (%d flips; incremental writes on node 1: %.0f, mean %s ms). *Revocation*: an established stream probe-cli → probe-srv cut by quarantine-probe created. *Fresh connections and throughput*: as the 0 vs n runs above, without any policy vs with both kinds.\n\n",
		len(c.Flips), c.IncrementalApplyCount, fmtMs(c.IncrementalApplyMeanMs))

	var flips []float64
	missed := 0
	for _, f := range c.Flips {
		if f.Ms < 0 {
			missed++
			continue
		}
		flips = append(flips, f.Ms)
	}
	p99 := pct(flips, 99) / 1000
	if missed > 0 || len(flips) == 0 {
		p99 = math.Inf(1)
	}
	var rev []float64
	revMiss := 0
	for _, v := range c.RevocationMs {
		if v < 0 {
			revMiss++
		} else {
			rev = append(rev, v)
		}
	}
	worst := maxOf(rev) / 1000
	if revMiss > 0 || len(rev) == 0 {
		worst = math.Inf(1)
	}
	// the pairs: each run with the policies and the run without of the
	// same repetition right before or after it
	var c99, c50, rr, gr []float64
	for i, p := range c.Phases {
		if p.Policies == 0 {
			continue
		}
		for _, j := range []int{i - 1, i + 1} {
			if j >= 0 && j < len(c.Phases) && c.Phases[j].Policies == 0 && c.Phases[j].Rep == p.Rep {
				z := c.Phases[j]
				c99 = append(c99, pct(p.ConnectMs, 99)/pct(z.ConnectMs, 99))
				c50 = append(c50, median(p.ConnectMs)/median(z.ConnectMs))
				rr = append(rr, p.ConnPerSec/z.ConnPerSec)
				gr = append(gr, p.Gbps/z.Gbps)
				break
			}
		}
	}
	m99, mg := median(c99), median(gr)
	if len(c99) == 0 {
		m99, mg = math.NaN(), math.NaN()
	}
	rows := []target{
		{"enforcement of an Admin change (quarantine-probe created or deleted → first new connection with the new verdict), p99 ≤ 0.1 s",
			fmt.Sprintf("p99 %s ms, p50 %s ms, max %s ms (%d flips, %d not seen in 10 s)", fmtMs(pct(flips, 99)), fmtMs(median(flips)), fmtMs(maxOf(flips)), len(c.Flips), missed),
			met(p99 <= 0.1), gapSecs(p99, 0.1)},
		{"revocation: an established connection stops ≤ 1 s after an Admin Deny is created (worst run)",
			fmt.Sprintf("max %s ms, p50 %s ms (%d runs, %d still echoing)", fmtMs(maxOf(rev)), fmtMs(median(rev)), len(c.RevocationMs), revMiss),
			met(worst <= 1), gapSecs(worst, 1)},
	}
	pairs99 := fmt.Sprintf("%.2f× (%s); p50 %.2f×", m99, fmtRatios(c99), median(c50))
	pairsG := fmt.Sprintf("%.0f %% (%s)", mg*100, fmtRatios(gr))
	if c.Swap != nil {
		s99, sg, t99, tg := swapBars(c.Swap)
		rows = append(rows,
			target{"fresh-connection latency p99 with both ≤ 1.05× without any policy (table swaps)", t99, met(s99 <= 1.05), gapRatio(s99, 1.05)},
			target{"pod↔pod throughput with both ≥ 95 % of without any policy (table swaps)", tg, met(sg >= 0.95), gapPct(sg, 0.95)})
	} else {
		rows = append(rows,
			target{"fresh-connection latency p99 with both ≤ 1.05× without any policy (median of the pairs)", pairs99, met(m99 <= 1.05), gapRatio(m99, 1.05)},
			target{"pod↔pod throughput with both ≥ 95 % of without any policy (median of the pairs)", pairsG, met(mg >= 0.95), gapPct(mg, 0.95)})
	}
	r.f("| bar (issue 33) | measured | status | gap |\n|---|---|---|---|\n")
	for _, t := range rows {
		r.f("| %s | %s | %s | %s |\n", t.Goal, t.Measured, t.Status, t.Gap)
		t.Goal = fmt.Sprintf("ClusterNetworkPolicy (%d beside %d NetworkPolicies): %s", c.ClusterPolicies, c.Policies, t.Goal)
		r.targets = append(r.targets, t)
	}
	if sw := c.Swap; sw != nil {
		r.f("\n*Table swaps*: the pairs below switch arms through the API server (%d objects created or deleted and enforced, some 10 s a switch), so a pair's two runs are half a minute apart and this machine's drift moves their ratio by 0.6-2×. The bars above are judged on table swaps instead: with the policies in place, both nodes' podnet-routed are stopped (SIGSTOP, so that neither repairs what follows), the tables the engines wrote with no policy (%d lines on node 1, `nft list` of the pairs' last run without) are loaded beside theirs (%d lines) as podnet-open, dormant (on no hook), and a swap makes one table dormant and wakes the other, one nf_tables transaction a node sent by the bench itself (p50 %s ms for both nodes). %d rounds; a round is %d batches of %d sequential fresh connections, the arm switched before each batch in the order without, with, with, without (so both arms see the same moments of the machine); the first %d connections of each batch are left out of the pooled figures, both arms alike: right after a swap, connections through the table just woken are slower for some ten connections (p50 by position in the batch below), a transient of the swap that a node's table, never swapped, does not have; the figures with every connection are given beside; then one iperf3 stream cli → srv whose arm is switched the same way every %d ms, %d times, after its first 300 ms (slow start, counted in neither), throughput measured by srv's received bytes over each segment: the per-packet cost of each table on the same running flow at the same moments. They leave out the engines' CPU, which the pairs measure (under 2 %% of a CPU). Repairs of node 1's table by its engine after the swaps: %.0f. The pairs' figures: fresh connection p99 %s; throughput %s.\n",
			c.Policies+c.ClusterPolicies, sw.TableLines[0], sw.TableLines[1], fmtMs(median(sw.SwapMs)), len(sw.Runs), sw.Batches, sw.Batch, sw.Warm, sw.SegmentMs, sw.Segments, sw.Repairs, pairs99, pairsG)
		if len(sw.ByPosition) > 0 {
			r.f("\n| position in the batch (0: right after the swap) | without: p50 (ms) | with both: p50 (ms) | with ÷ without |\n|---:|---:|---:|---:|\n")
			for i, x := range sw.ByPosition {
				if i < 15 || i%5 == 4 || i == len(sw.ByPosition)-1 { // the transient whole, then every fifth
					r.f("| %d | %s | %s | %.2f× |\n", i, fmtMs(x[0]), fmtMs(x[1]), x[1]/x[0])
				}
			}
		}
		r.f("\n| round | without: p50 / p99 (ms) | Gbit/s | with both: p50 / p99 (ms) | Gbit/s |\n|---:|---|---:|---|---:|\n")
		for i, x := range sw.Runs {
			r.f("| %d | %s / %s | %.2f | %s / %s | %.2f |\n", i+1, fmtMs(x.Open.P50), fmtMs(x.Open.P99), x.Open.Gbps, fmtMs(x.Pol.P50), fmtMs(x.Pol.P99), x.Pol.Gbps)
		}
	}
	r.f("\nNot bars: connection rate with both %.2f× without (%s); attach (CNI ADD on node 1 with the engine's wait) p50 %s ms, p99 %s ms (%d pods); podnet_repairs_total on node 1 %.0f.\n\n",
		median(rr), fmtRatios(rr), fmtMs(median(c.AttachMs)), fmtMs(pct(c.AttachMs, 99)), len(c.AttachMs), c.Repairs)
	r.f("| policies + cluster policies | run | load | fresh connection p50 / p99 (ms) | connections/s (4 workers) | iperf3 Gbit/s |\n|---|---:|---:|---|---:|---:|\n")
	for _, p := range c.Phases {
		r.f("| %d + %d | %d | %.1f | %s / %s | %.0f | %.2f |\n", p.Policies, p.ClusterPolicies, p.Rep, p.Load1, fmtMs(median(p.ConnectMs)), fmtMs(pct(p.ConnectMs, 99)), p.ConnPerSec, p.Gbps)
	}
	r.f("\n")
}

// thousands is n with a comma every three digits.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
