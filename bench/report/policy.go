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
		Policies int     `json:"policies"`
		Kind     string  `json:"kind"`
		To       string  `json:"to"`
		Ms       float64 `json:"ms"`
		Attempts int     `json:"attempts"`
	} `json:"flips"`
	RevocationMs []float64     `json:"revocation_ms"`
	Phases       []policyPhase `json:"phases"`
	Restarts     []struct {
		Policies      int     `json:"policies"`
		StartToWriteS float64 `json:"start_to_write_s"`
		ApplyS        float64 `json:"apply_s"`
		ApplyCount    float64 `json:"apply_count"`
	} `json:"restarts"`
	IncrementalApplyCount  float64       `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64       `json:"incremental_apply_mean_ms"`
	Repairs                float64       `json:"repairs"`
	LoadAfter              string        `json:"load_after"`
	Scales                 []policyScale `json:"scales"`
	AttachZeroMs           []float64     `json:"attach_zero_ms"`
	CNP                    *policyCNP    `json:"cnp"`
	AddCompare             *addCompare   `json:"add_compare"`
}

// policyPhase is one run of the 0 vs n policies comparison.
type policyPhase struct {
	Policies   int        `json:"policies"`
	Rep        int        `json:"rep"`
	ConnectMs  []float64  `json:"connect_ms"`
	ConnPerSec float64    `json:"conn_per_s"`
	CPUPerConn float64    `json:"cpu_per_conn_us"`
	Gbps       float64    `json:"gbps"`
	Load1      float64    `json:"load1"`
	TimeWait   int        `json:"time_wait"`
	RoutedCPU  [2]float64 `json:"routed_cpu_ms"`
	Seconds    float64    `json:"seconds"`
}

// policyScale is what one count of policies built on node 1.
type policyScale struct {
	Policies               int       `json:"policies"`
	SetupPolS              float64   `json:"setup_policies_s"`
	IsolatedPods           float64   `json:"isolated_pods"`
	PolicyChains           float64   `json:"policy_chains"`
	TableLines             int       `json:"table_lines"`
	TableBytes             int       `json:"table_bytes"`
	TableSets              int       `json:"table_sets"`
	TableChains            int       `json:"table_chains"`
	SrvWalk                [2]int    `json:"srv_walk"`
	CliWalk                [2]int    `json:"cli_walk"`
	IncrementalApplyCount  float64   `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64   `json:"incremental_apply_mean_ms"`
	Repairs                float64   `json:"repairs"`
	AttachMs               []float64 `json:"attach_ms"`
}

// policySection is issue 24's cost of NetworkPolicy: how fast a change is
// enforced and a connection revoked, and what 100 and 1,000 policies over
// 1,000 pods cost the data path and the writer.
func (r *report) policySection(d *policyData, err error) {
	r.f("## 7. NetworkPolicy\n\n")
	if err != nil {
		r.f("No results (%v).\n\n", err)
		return
	}
	// results written before the counts were a knob: one count, d.Policies
	if len(d.Scales) == 0 {
		d.Scales = append(d.Scales, policyScale{Policies: d.Policies, SetupPolS: d.SetupPolS, IsolatedPods: d.IsolatedPods, PolicyChains: d.PolicyChains, TableLines: d.TableLines,
			IncrementalApplyCount: d.IncrementalApplyCount, IncrementalApplyMeanMs: d.IncrementalApplyMeanMs, Repairs: d.Repairs})
	}
	for i := range d.Flips {
		if d.Flips[i].Policies == 0 {
			d.Flips[i].Policies = d.Policies
		}
	}
	for i := range d.Restarts {
		if d.Restarts[i].Policies == 0 {
			d.Restarts[i].Policies = d.Policies
		}
	}
	var counts []string
	for _, sc := range d.Scales {
		counts = append(counts, fmt.Sprint(sc.Policies))
	}
	r.f("test/bench/policybench (`make bench STAGES=policy` runs it alone): a two-node %s test/cluster, podnet-routed --network-policy=true on both, %d pods, and %s NetworkPolicies in turn in the API server (pod and namespace selectors, matchExpressions, ipBlocks with excepts in both families, named ports, port ranges, egress rules; some select the measured server srv and client cli besides the ones that allow them, so that their first packets walk several policy chains). ", d.Encap, d.PodsTotal, strings.Join(counts, " then "))
	r.f("What is real: %s. ", d.Real)
	r.f("Run %s (commit %s, load %s before", d.Started, orDash(d.Commit), d.LoadBefore)
	if d.LoadAfter != "" {
		r.f(", %s after", d.LoadAfter)
	}
	r.f(", %.0f s). The machine is shared with other work (Kubernetes clusters running conformance): the load column below is the 1-minute load average of its 2 CPUs at each run. The %d Pod objects with their status took %.1f s to create.\n\n", d.Seconds, d.PodsTotal-d.PodsReal, d.SetupPodsS)

	r.f("| policies | created → enforced (s) | isolated pods on node 1 | policy chains | table: lines / sets and maps / chains / KiB | srv's first packet walks (node 1 ingress) | cli's (node 2 egress) | incremental writes during the flips: n, mean (ms) | full write after a restart: median / max (ms) | restart → table written: median (ms) |\n|---:|---:|---:|---:|---|---|---|---|---|---:|\n")
	for _, sc := range d.Scales {
		var start, apply []float64
		for _, x := range d.Restarts {
			if x.Policies == sc.Policies {
				start = append(start, x.StartToWriteS*1000)
				apply = append(apply, x.ApplyS*1000)
			}
		}
		walk := func(w [2]int) string {
			if w[1] == 0 {
				return "—"
			}
			return fmt.Sprintf("%d of its %d policy chains", w[0], w[1])
		}
		r.f("| %d | %.1f | %.0f | %.0f | %d / %d / %d / %d | %s | %s | %.0f, %s | %s / %s | %s |\n", sc.Policies, sc.SetupPolS, sc.IsolatedPods, sc.PolicyChains,
			sc.TableLines, sc.TableSets, sc.TableChains, sc.TableBytes/1024, walk(sc.SrvWalk), walk(sc.CliWalk),
			sc.IncrementalApplyCount, fmtMs(sc.IncrementalApplyMeanMs), fmtMs(median(apply)), fmtMs(maxOf(apply)), fmtMs(median(start)))
	}
	r.f("\n*Walks*: the first packet of a connection cli → srv passes cli's egress chain on node 2 and srv's ingress chain on node 1; each jumps to its policy chains in the order of the policies' names and stops at the one that allows (two set lookups per rule). *Full write after a restart*: node 1's podnet-routed stopped and started 3 times at each count (the table stays in the kernel meanwhile); its first write compiles and writes the whole table in one transaction (podnet_policy_apply_seconds); *restart → table written* adds the start, the informers' list and sync. The read-back found the table changed %s times (podnet_repairs_total{object=\"policy-table\"}; nobody touched it).\n\n", func() string {
		var xs []string
		for _, sc := range d.Scales {
			xs = append(xs, fmt.Sprintf("%.0f", sc.Repairs))
		}
		return strings.Join(xs, ", ")
	}())
	last := d.Scales[len(d.Scales)-1]
	if len(d.Scales) > 1 || last.Policies >= 1000 {
		var apply []float64
		for _, x := range d.Restarts {
			if x.Policies == last.Policies {
				apply = append(apply, x.ApplyS)
			}
		}
		r.targets = append(r.targets, target{fmt.Sprintf("a full resync (the whole table written after a restart) at %d policies and %d pods", last.Policies, d.PodsTotal),
			fmt.Sprintf("%s ms (median of %d; max %s)", fmtMs(median(apply)*1000), len(apply), fmtMs(maxOf(apply)*1000)), met(len(apply) > 0), "—"})
	}

	// enforcement
	r.f("**Enforcement latency**: from the change (the API call) to the first new connection of the probe flow (probe-cli on node 2 → probe-srv on node 1, TCP, a new connection every 10 ms, 300 ms to answer) of the run of 15 in a row with the new verdict. ")
	r.f("A policy change is allow-probe created or deleted; a pod change is probe-cli's label taken off and put back (node 1's engine must change the policy's peer set). The other policies stay in place.\n\n")
	r.f("| policies | change | new verdict | flips | p50 (ms) | p99 (ms) | max (ms) | not seen in 10 s |\n|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, sc := range d.Scales {
		var all []float64
		missed := 0
		kinds := []string{}
		for _, f := range d.Flips {
			if f.Policies == sc.Policies && !slices.Contains(kinds, f.Kind+" "+f.To) {
				kinds = append(kinds, f.Kind+" "+f.To)
			}
		}
		if len(kinds) == 0 {
			continue
		}
		for _, k := range kinds {
			var xs []float64
			miss := 0
			for _, f := range d.Flips {
				if f.Policies != sc.Policies || f.Kind+" "+f.To != k {
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
			r.f("| %d | %s | %s | %d | %s | %s | %s | %d |\n", sc.Policies, kind, to, len(xs)+miss, fmtMs(median(xs)), fmtMs(pct(xs, 99)), fmtMs(maxOf(xs)), miss)
		}
		r.f("| %d | **all** | | %d | %s | %s | %s | %d |\n", sc.Policies, len(all)+missed, fmtMs(median(all)), fmtMs(pct(all, 99)), fmtMs(maxOf(all)), missed)
		p99 := pct(all, 99) / 1000
		if missed > 0 {
			p99 = math.Inf(1)
		}
		r.targets = append(r.targets, target{fmt.Sprintf("NetworkPolicy enforcement at %d policies: a policy or pod change → first new connection with the new verdict, p99 ≤ 0.5 s (%d flips)", sc.Policies, len(all)+missed),
			fmt.Sprintf("p99 %s ms, p50 %s ms", fmtMs(pct(all, 99)), fmtMs(median(all))), met(p99 <= 0.5), gapSecs(p99, 0.5)})
	}
	r.f("\n")

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
	r.f("**Revocation** (at %d policies): an established TCP stream probe-cli → probe-srv sends a line every 5 ms; allow-probe, the policy allowing it, is deleted; the time from the deletion to the send of the first line never echoed (the engine deletes the stream's conntrack entry, its next packet is judged anew and dropped). ", d.Scales[0].Policies)
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

	// attach with the engine on
	if len(d.AttachZeroMs) > 0 {
		r.f("**Attach with the engine on**: the CNI ADD of a new pod on node 1 (podnet through libcni, one pod at a time, each deleted after; labelled so that the policies select it), whose last step waits on the engine's socket until the pod's addresses and chains are in the kernel (the Pod object shows its address only later, as kubelet reports it). Section 1 has ADD without the engine (no socket to wait on).\n\n")
		r.f("| policies | pods | ADD p50 (ms) | ADD p99 (ms) |\n|---:|---:|---:|---:|\n")
		r.f("| 0 | %d | %s | %s |\n", len(d.AttachZeroMs), fmtMs(median(d.AttachZeroMs)), fmtMs(pct(d.AttachZeroMs, 99)))
		for _, sc := range d.Scales {
			if len(sc.AttachMs) > 0 {
				r.f("| %d | %d | %s | %s |\n", sc.Policies, len(sc.AttachMs), fmtMs(median(sc.AttachMs)), fmtMs(pct(sc.AttachMs, 99)))
			}
		}
		r.f("\n")
		if r.attachAB != "" {
			r.f("%s\n\n", r.attachAB)
		}
	}
	r.addSection(d)

	// 0 vs n policies
	conns := 0
	if len(d.Phases) > 0 {
		conns = len(d.Phases[0].ConnectMs)
	}
	r.f("**0 vs %s policies** (the %d pods there in both; with the policies srv is isolated for ingress and cli for egress, and cli → srv is allowed by web-allow-cli and cli-egress-web after the walks above). Each run measures %d sequential fresh connections (connect and one echoed line), 3 s of 4 workers making them, and 5 s of one iperf3 TCP stream cli → srv; the run without policies and the one with them are back to back, in alternating order, so their ratio cancels most of the machine's drift (before the first pair, 3 s of connections bring cli's TIME_WAIT sockets to their steady state); one line per run:\n\n", strings.Join(counts, " and "), d.PodsTotal, conns)
	r.f("| policies | run | load | cli's TIME_WAIT sockets at the start | fresh connection p50 / p99 (ms) | connections/s (4 workers) | CPU per connection (µs) | iperf3 Gbit/s | podnet-routed CPU, node 1 / node 2 (%% of a CPU) |\n|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
	type key struct{ n, rep int }
	byKey := map[key]int{}
	for i, p := range d.Phases {
		routed := "—"
		if p.Seconds > 0 {
			routed = fmt.Sprintf("%.1f / %.1f", p.RoutedCPU[0]/p.Seconds/10, p.RoutedCPU[1]/p.Seconds/10)
		}
		r.f("| %d | %d | %.1f | %d | %s / %s | %.0f | %s | %.2f | %s |\n", p.Policies, p.Rep, p.Load1, p.TimeWait, fmtMs(median(p.ConnectMs)), fmtMs(pct(p.ConnectMs, 99)), p.ConnPerSec, cpuCell(p.CPUPerConn), p.Gbps, routed)
		byKey[key{p.Policies, p.Rep}] = i
	}
	r.f("\n")
	// the run without policies right before each run with them
	for _, sc := range d.Scales {
		n := sc.Policies
		var c99, c50, rr, gr, cr []float64
		var conn0, connN []float64
		for i, p := range d.Phases {
			if p.Policies != n {
				continue
			}
			// its pair: the run without policies of the same repetition
			// right before or after it
			var z *policyPhase
			for _, j := range []int{i - 1, i + 1} {
				if j >= 0 && j < len(d.Phases) && d.Phases[j].Policies == 0 && d.Phases[j].Rep == p.Rep {
					z = &d.Phases[j]
					break
				}
			}
			if z == nil {
				continue
			}
			c99 = append(c99, pct(p.ConnectMs, 99)/pct(z.ConnectMs, 99))
			c50 = append(c50, median(p.ConnectMs)/median(z.ConnectMs))
			rr = append(rr, p.ConnPerSec/z.ConnPerSec)
			gr = append(gr, p.Gbps/z.Gbps)
			if p.CPUPerConn > 0 && z.CPUPerConn > 0 {
				cr = append(cr, z.CPUPerConn/p.CPUPerConn)
			}
			conn0, connN = append(conn0, z.ConnectMs...), append(connN, p.ConnectMs...)
		}
		if len(rr) == 0 {
			continue
		}
		r.f("With %d ÷ without, median of the %d pairs (each pair's ratios in brackets): fresh connection p99 %.2f× (%s), p50 %.2f× (%s); connection rate %.2f× (%s); throughput %.2f× (%s). Pooled samples: p99 %s vs %s ms.\n\n",
			n, len(rr), median(c99), fmtRatios(c99), median(c50), fmtRatios(c50), median(rr), fmtRatios(rr), median(gr), fmtRatios(gr), fmtMs(pct(connN, 99)), fmtMs(pct(conn0, 99)))
		if len(cr) > 0 {
			r.f("CPU per connection, without ÷ with (the connection rate CPU time allows, as a fraction of the one without policies): %.2f× (%s).\n\n", median(cr), fmtRatios(cr))
		}
		m99, mr, mg := median(c99), median(rr), median(gr)
		r.targets = append(r.targets,
			target{fmt.Sprintf("fresh-connection latency p99 with %d policies over %d pods ≤ 1.10× without (median of %d pairs)", n, d.PodsTotal, len(c99)), fmt.Sprintf("%.2f×", m99), met(m99 <= 1.10), gapRatio(m99, 1.10)},
			target{fmt.Sprintf("pod↔pod connection rate with %d policies ≥ 95 %% of without (median of %d pairs)", n, len(rr)), fmt.Sprintf("%.0f %%", mr*100), met(mr >= 0.95), gapPct(mr, 0.95)},
			target{fmt.Sprintf("pod↔pod throughput with %d policies ≥ 95 %% of without (median of %d pairs)", n, len(gr)), fmt.Sprintf("%.0f %%", mg*100), met(mg >= 0.95), gapPct(mg, 0.95)})
	}
	r.f("%s\n\n", policyNoise)
	r.cnpSection(d)
}

// policyNoise is what issue 24's investigation of the connection rate
// found (test/policynft BenchmarkConnectArms and the stage's own runs).
const policyNoise = `Why these ratios move so much, and what the policies really cost a connection (issue 24): only a connection's first packet meets the policies (every later packet of both directions is accepted by the first rule of each base chain, ` + "`ct state established,related accept`" + `, which the table has with and without policies), so throughput cannot depend on them, and the connection rate only through the SYN's walk. ` +
	`The 0.77× rate at 100 policies of an earlier run was the order of the pair: cli closes first, its TIME_WAIT sockets (60 s) piled up to some 16,000 over the phases, and connect()'s search for a free port slowed with them (connect p50 0.44 → 4 ms by the third phase, with the machine's load at 1.6 as well as at 13), so the second run of each pair, the one with policies, was the slower one; the stage now lets cli reuse TIME_WAIT ports (` + "`tcp_tw_reuse=1`" + ` in its netns), after which most runs make 2,500-3,400 connections/s with or without policies, and the pairs come out on either side of 1. ` +
	`Measured in isolation (BenchmarkConnectArms: one node netns, two veth pods, 1,000 other pods and policies in the table, 12 rounds of 500 connections per arm, the arms' order rotating, CPU time per connection from getrusage; client, server and forwarding all in that process), per connection about 350 µs of CPU: the pod isolated and its first packet through its pod chain and one policy chain 1.10× the pod not isolated (single rounds 0.84-1.32), walking 10 policy chains 0.97×, walking 100 1.12×, the mid-stream TCP rules deleted 1.05×, no table at all (no conntrack either) 0.93×. The spread of single rounds (±20-30 %) is the machine; the policies' share is below it: from the 100-chain walk, about 0.2 µs per policy chain walked, so the 12 + 5 chains the first packet walks here at 1,000 policies cost some 4 µs, about 1 % of a connection. ` +
	`What can cost the rate at 1,000 policies is podnet-routed's own CPU (the column above): its resync reads the table back every 30 s, one netlink dump per set, and took up to a fifth of a CPU during a 10 s run when it fell inside one (its table has no IPv6 rules or sets for this IPv4-only set of pods any more: 2,446 sets at 1,000 policies instead of 4,896).`

func cpuCell(us float64) string {
	if us <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", us)
}

func fmtRatios(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, ", ")
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
