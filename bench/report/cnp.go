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
		{"fresh-connection latency p99 with both ≤ 1.05× without any policy (median of the pairs)",
			fmt.Sprintf("%.2f× (%s); p50 %.2f×", m99, fmtRatios(c99), median(c50)), met(m99 <= 1.05), gapRatio(m99, 1.05)},
		{"pod↔pod throughput with both ≥ 95 % of without any policy (median of the pairs)",
			fmt.Sprintf("%.0f %% (%s)", mg*100, fmtRatios(gr)), met(mg >= 0.95), gapPct(mg, 0.95)},
	}
	r.f("| bar (issue 33) | measured | status | gap |\n|---|---|---|---|\n")
	for _, t := range rows {
		r.f("| %s | %s | %s | %s |\n", t.Goal, t.Measured, t.Status, t.Gap)
		t.Goal = fmt.Sprintf("ClusterNetworkPolicy (%d beside %d NetworkPolicies): %s", c.ClusterPolicies, c.Policies, t.Goal)
		r.targets = append(r.targets, t)
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
