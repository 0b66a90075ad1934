package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// policyData is test/bench/policybench's policy.json (issue 24).
type policyData struct {
	Started      string  `json:"started"`
	Seconds      float64 `json:"seconds"`
	Commit       string  `json:"commit"`
	LoadBefore   string  `json:"load_before"`
	Real         string  `json:"real"`
	Encap        string  `json:"encap"`
	PodsTotal    int     `json:"pods_total"`
	PodsReal     int     `json:"pods_real"`
	PodsLocal    int     `json:"pods_fake_local"`
	PodsRemote   int     `json:"pods_fake_remote"`
	Policies     int     `json:"policies"`
	TableLines   int     `json:"table_lines"`
	IsolatedPods float64 `json:"isolated_pods"`
	PolicyChains float64 `json:"policy_chains"`
	SetupPodsS   float64 `json:"setup_pods_s"`
	SetupPolS    float64 `json:"setup_policies_s"`
	Flips        []struct {
		Kind     string  `json:"kind"`
		To       string  `json:"to"`
		Ms       float64 `json:"ms"`
		Attempts int     `json:"attempts"`
	} `json:"flips"`
	RevocationMs []float64 `json:"revocation_ms"`
	Phases       []struct {
		Policies   int       `json:"policies"`
		Rep        int       `json:"rep"`
		ConnectMs  []float64 `json:"connect_ms"`
		ConnPerSec float64   `json:"conn_per_s"`
		Gbps       float64   `json:"gbps"`
		Load1      float64   `json:"load1"`
	} `json:"phases"`
	Restarts []struct {
		StartToWriteS float64 `json:"start_to_write_s"`
		ApplyS        float64 `json:"apply_s"`
		ApplyCount    float64 `json:"apply_count"`
	} `json:"restarts"`
	IncrementalApplyCount  float64 `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64 `json:"incremental_apply_mean_ms"`
	Repairs                float64 `json:"repairs"`
}

// policySection is issue 24's cost of NetworkPolicy: how fast a change is
// enforced and a connection revoked, and what 100 policies over 1,000
// pods cost the data path.
func (r *report) policySection(d *policyData, err error) {
	r.f("## 7. NetworkPolicy\n\n")
	if err != nil {
		r.f("No results (%v).\n\n", err)
		return
	}
	r.f("test/bench/policybench (`make bench STAGES=policy` runs it alone): a two-node %s test/cluster, podnet-routed --network-policy=true on both, %d pods and %d NetworkPolicies in the API server. ", d.Encap, d.PodsTotal, d.Policies)
	r.f("What is real: %s. ", d.Real)
	r.f("Run %s (commit %s, load %s before, %.0f s). ", d.Started, orDash(d.Commit), d.LoadBefore, d.Seconds)
	r.f("Setup: the %d Pod objects with their status took %.1f s to create, the %d policies %.1f s to create and be enforced. ", d.PodsTotal-d.PodsReal, d.SetupPodsS, d.Policies, d.SetupPolS)
	r.f("With them, node 1 had %.0f isolated pods and %.0f policy chains, and its table was %d lines of `nft list table inet podnet-policy`.\n\n", d.IsolatedPods, d.PolicyChains, d.TableLines)

	// enforcement
	r.f("**Enforcement latency**: from the change (the API call) to the first new connection of the probe flow (probe-cli on node 2 → probe-srv on node 1, TCP, a new connection every 10 ms, 300 ms to answer) of the run of 15 in a row with the new verdict. ")
	r.f("A policy change is allow-probe created or deleted; a pod change is probe-cli's label taken off and put back (node 1's engine must change the policy's peer set). The other 100 policies stay in place.\n\n")
	r.f("| change | new verdict | flips | p50 (ms) | p99 (ms) | max (ms) | not seen in 10 s |\n|---|---|---:|---:|---:|---:|---:|\n")
	var all []float64
	missed := 0
	kinds := []string{}
	for _, f := range d.Flips {
		if !slices.Contains(kinds, f.Kind+" "+f.To) {
			kinds = append(kinds, f.Kind+" "+f.To)
		}
	}
	for _, k := range kinds {
		var xs []float64
		miss := 0
		for _, f := range d.Flips {
			if f.Kind+" "+f.To != k {
				continue
			}
			if f.Ms < 0 {
				miss++
				continue
			}
			xs = append(xs, f.Ms)
		}
		all = append(all, xs...)
		missed += miss
		kind, to, _ := strings.Cut(k, " ")
		r.f("| %s | %s | %d | %s | %s | %s | %d |\n", kind, to, len(xs)+miss, fmtMs(median(xs)), fmtMs(pct(xs, 99)), fmtMs(maxOf(xs)), miss)
	}
	r.f("| **all** | | %d | %s | %s | %s | %d |\n\n", len(all)+missed, fmtMs(median(all)), fmtMs(pct(all, 99)), fmtMs(maxOf(all)), missed)
	p99 := pct(all, 99) / 1000
	if missed > 0 {
		p99 = math.Inf(1)
	}
	r.targets = append(r.targets, target{fmt.Sprintf("NetworkPolicy enforcement: a policy or pod change → first new connection with the new verdict, p99 ≤ 0.5 s (%d flips)", len(all)+missed),
		fmt.Sprintf("p99 %s ms, p50 %s ms", fmtMs(pct(all, 99)), fmtMs(median(all))), met(p99 <= 0.5), gapSecs(p99, 0.5)})
	if d.IncrementalApplyCount > 0 {
		r.f("Node 1's engine wrote %.0f diffs during the flips, %s ms each on average (podnet_policy_apply_seconds: compile and nft transaction); its read-back found the table changed %.0f times (podnet_repairs_total{object=\"policy-table\"}; nobody touched it).\n\n", d.IncrementalApplyCount, fmtMs(d.IncrementalApplyMeanMs), d.Repairs)
	}

	// revocation
	var rev []float64
	revMiss := 0
	for _, v := range d.RevocationMs {
		if v < 0 {
			revMiss++
		} else {
			rev = append(rev, v)
		}
	}
	r.f("**Revocation**: an established TCP stream probe-cli → probe-srv sends a line every 5 ms; allow-probe, the policy allowing it, is deleted; the time from the deletion to the send of the first line never echoed (the engine deletes the stream's conntrack entry, its next packet is judged anew and dropped). ")
	r.f("%d runs: p50 %s ms, max %s ms", len(d.RevocationMs), fmtMs(median(rev)), fmtMs(maxOf(rev)))
	if revMiss > 0 {
		r.f(", %d streams still echoing 5 s later", revMiss)
	}
	r.f(".\n\n")
	worst := maxOf(rev) / 1000
	if revMiss > 0 || len(rev) == 0 {
		worst = math.Inf(1)
	}
	r.targets = append(r.targets, target{"NetworkPolicy revocation: an established connection stops ≤ 1 s after the allowing policy is deleted (worst run)",
		fmt.Sprintf("%s ms (max of %d)", fmtMs(maxOf(rev)), len(d.RevocationMs)), met(worst <= 1), gapSecs(worst, 1)})

	// 0 vs 100 policies
	r.f("**0 vs %d policies** (the %d pods there in both; cli → srv allowed by allow-cli when the policies are in: srv is isolated and its first packets go through its pod chain and policy chain), alternating, one line per run:\n\n", d.Policies, d.PodsTotal)
	r.f("| policies | run | load | fresh connection p50 / p99 (ms) | connections/s (4 workers) | iperf3 Gbit/s |\n|---:|---:|---:|---|---:|---:|\n")
	conn := map[int][]float64{}
	rate := map[int][]float64{}
	gbps := map[int][]float64{}
	for _, p := range d.Phases {
		r.f("| %d | %d | %.1f | %s / %s | %.0f | %.2f |\n", p.Policies, p.Rep, p.Load1, fmtMs(median(p.ConnectMs)), fmtMs(pct(p.ConnectMs, 99)), p.ConnPerSec, p.Gbps)
		conn[p.Policies] = append(conn[p.Policies], p.ConnectMs...)
		rate[p.Policies] = append(rate[p.Policies], p.ConnPerSec)
		gbps[p.Policies] = append(gbps[p.Policies], p.Gbps)
	}
	n := d.Policies
	c99 := pct(conn[n], 99) / pct(conn[0], 99)
	rr := median(rate[n]) / median(rate[0])
	gr := median(gbps[n]) / median(gbps[0])
	r.f("\nWith ÷ without: fresh connection p99 %.2f× (pooled samples, %s vs %s ms), p50 %.2f×; connection rate %.2f×, throughput %.2f× (medians of the runs).\n\n",
		c99, fmtMs(pct(conn[n], 99)), fmtMs(pct(conn[0], 99)), median(conn[n])/median(conn[0]), rr, gr)
	r.targets = append(r.targets,
		target{fmt.Sprintf("fresh-connection latency p99 with %d policies over %d pods ≤ 1.10× without", n, d.PodsTotal), fmt.Sprintf("%.2f×", c99), met(c99 <= 1.10), gapRatio(c99, 1.10)},
		target{fmt.Sprintf("pod↔pod connection rate with %d policies ≥ 95 %% of without", n), fmt.Sprintf("%.0f %%", rr*100), met(rr >= 0.95), gapPct(rr, 0.95)},
		target{fmt.Sprintf("pod↔pod throughput with %d policies ≥ 95 %% of without", n), fmt.Sprintf("%.0f %%", gr*100), met(gr >= 0.95), gapPct(gr, 0.95)})

	// full write
	if len(d.Restarts) > 0 {
		var start, apply []float64
		for _, x := range d.Restarts {
			start = append(start, x.StartToWriteS*1000)
			apply = append(apply, x.ApplyS*1000)
		}
		r.f("**Full resync at %d policies and %d pods**: node 1's podnet-routed restarted %d times (the table stays in the kernel meanwhile). Its first write, the whole table compiled and written in one transaction, took %s ms (median; max %s; podnet_policy_apply_seconds), %s ms after the process started (median; max %s: informers listed and synced, then that write).\n\n",
			d.Policies, d.PodsTotal, len(d.Restarts), fmtMs(median(apply)), fmtMs(maxOf(apply)), fmtMs(median(start)), fmtMs(maxOf(start)))
	}
}

// gapPct describes how far a ratio is from a "≥ want" goal.
func gapPct(got, want float64) string {
	if math.IsNaN(got) {
		return "no data"
	}
	if got >= want {
		return fmt.Sprintf("%.0f points above", (got-want)*100)
	}
	return fmt.Sprintf("%.0f points below", (want-got)*100)
}
