package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// addCompare is policy.json's add_compare (issue 34's must-show 1 and 2):
// CNI ADD with the NetworkPolicy engine on next to ptp + host-local in the
// same node netns, and many pods at once.
type addCompare struct {
	Pods    int        `json:"pods"`
	Workers int        `json:"workers"`
	Chunk   int        `json:"chunk"`
	Status  bool       `json:"status"`
	Podnet  string     `json:"podnet"`
	Ref     string     `json:"ref"`
	Levels  []addLevel `json:"levels"`
	Burst   *struct {
		Policies int        `json:"policies"`
		Pods     int        `json:"pods"`
		Runs     []burstRun `json:"runs"`
	} `json:"burst"`
}

type addLevel struct {
	Policies     int        `json:"policies"`
	PodnetSeqMs  []float64  `json:"podnet_seq_ms"`
	RefSeqMs     []float64  `json:"ref_seq_ms"`
	PodnetConcMs []float64  `json:"podnet_conc_ms"`
	RefConcMs    []float64  `json:"ref_conc_ms"`
	WaitSeq      *histDelta `json:"wait_seq"`
	WaitConc     *histDelta `json:"wait_conc"`
	// BlockedSeqMs, BlockedConcMs: per podnet ADD, its guard and policy
	// steps (the plugin's trace): how long podnet-routed held it up
	BlockedSeqMs  []float64 `json:"blocked_seq_ms"`
	BlockedConcMs []float64 `json:"blocked_conc_ms"`
	// RollingMs, BlockedRollingMs: podnet's ADDs, as many in flight as
	// in the concurrent phase, beside the DEL of as many older podnet
	// pods (8 in flight), and how long podnet-routed held each up; absent
	// from older results
	RollingMs        []float64 `json:"rolling_ms"`
	BlockedRollingMs []float64 `json:"blocked_rolling_ms"`
	// StepsSeq: the sequential podnet ADDs' steps (p50 wall, ms), the
	// last "inside the plugin"; absent from older results
	StepsSeq []struct {
		Step  string  `json:"step"`
		P50Ms float64 `json:"p50_ms"`
	} `json:"steps_seq"`
	Errors  []string `json:"errors"`
	Leaks   []string `json:"leaks"`
	Seconds float64  `json:"seconds"`
}

type burstRun struct {
	Stack string    `json:"stack"`
	Ms    []float64 `json:"ms"`
	// the run's CPU: its plugin processes', both podnet-routed's, and the
	// machine's CPUs (0: a run from before these were recorded)
	PluginCPUMs float64    `json:"plugin_cpu_ms"`
	RoutedCPUMs float64    `json:"routed_cpu_ms"`
	CPUs        int        `json:"cpus"`
	WallMs      float64    `json:"wall_ms"`
	Wait        *histDelta `json:"wait"`
	Errors      []string   `json:"errors"`
	Leaks       []string   `json:"leaks"`
}

// histDelta is a Prometheus histogram's counts over a phase: bucket
// bounds (s, +Inf left out), observations at or below each, count, sum.
type histDelta struct {
	Le    []float64 `json:"le_s"`
	Cum   []float64 `json:"cum"`
	Count float64   `json:"count"`
	SumS  float64   `json:"sum_s"`
	Reset bool      `json:"reset"`
}

// plus pools two deltas of the same histogram (nil and reset ones count
// as nothing).
func (h *histDelta) plus(o *histDelta) *histDelta {
	if h == nil || h.Reset {
		return o
	}
	if o == nil || o.Reset || len(o.Cum) != len(h.Cum) {
		return h
	}
	s := &histDelta{Le: h.Le, Count: h.Count + o.Count, SumS: h.SumS + o.SumS}
	for i := range h.Cum {
		s.Cum = append(s.Cum, h.Cum[i]+o.Cum[i])
	}
	return s
}

// quantile is the bucket (lo, hi] (s) the q-quantile (nearest rank) of
// the observations falls in, hi +Inf past the last bound, and a linear
// interpolation within the bucket; NaN without observations.
func (h *histDelta) quantile(q float64) (lo, hi, interp float64) {
	if h == nil || h.Reset || h.Count <= 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	rank := math.Max(1, math.Ceil(q*h.Count))
	prev := 0.0
	for i, c := range h.Cum {
		if c >= rank {
			if i > 0 {
				lo = h.Le[i-1]
			}
			hi = h.Le[i]
			return lo, hi, lo + (hi-lo)*(rank-prev)/(c-prev)
		}
		prev = c
	}
	last := 0.0
	if len(h.Le) > 0 {
		last = h.Le[len(h.Le)-1]
	}
	return last, math.Inf(1), math.Inf(1)
}

// msBound renders a bucket bound in s as ms, as short as it is exact.
func msBound(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(math.Round(s*1e7)/1e4, 'f', -1, 64)
}

// waitCell renders the q-quantile of h: its bucket in ms and the
// interpolation.
func waitCell(h *histDelta, q float64) string {
	lo, hi, in := h.quantile(q)
	if math.IsNaN(hi) {
		return "—"
	}
	if math.IsInf(hi, 1) {
		return fmt.Sprintf("> %s", msBound(lo))
	}
	return fmt.Sprintf("(%s, %s] ~%s", msBound(lo), msBound(hi), fmtMs(in*1000))
}

func waitMean(h *histDelta) string {
	if h == nil || h.Reset || h.Count <= 0 {
		return "—"
	}
	return fmtMs(h.SumS / h.Count * 1000)
}

func waitCount(h *histDelta) float64 {
	if h == nil || h.Reset {
		return 0
	}
	return h.Count
}

// addSection is issue 34's must-show 1 and 2, with its bars as targets.
func (r *report) addSection(d *policyData) {
	a := d.AddCompare
	if a == nil || (len(a.Levels) == 0 && a.Burst == nil) {
		return
	}
	r.f("### ADD with the engine on, next to ptp + host-local (issue 34)\n\n")
	r.f("In node 1's netns, in the same phases of this stage: podnet as the DaemonSet runs it (%s), and, as the reference, ptp + host-local (containernetworking/plugins, as in section 1, with a host-local store of its own beside node 1's: `%s`). ", a.Podnet, mdEscape(a.Ref))
	r.f("At 0 policies (the %d pods there) and at each count, %d pods of each stack one at a time, then %d of each with %d ADDs in flight, in turns of %d pods that alternate between the stacks (podnet, ref, ref, podnet, …); each turn starts once node 1's engine is idle (no table write and under 20 ms of podnet-routed CPU in 500 ms), so that neither stack pays for the other's work, and each pays for its own. ", d.PodsTotal, a.Pods, a.Pods, a.Workers, a.Chunk)
	r.f("A podnet pod is what a scheduler and a kubelet make it: its Pod object (labelled as the attach step's, so that the policies select it) exists before the ADD")
	if a.Status {
		r.f(", and its status.podIPs are reported right after the ADD, as a kubelet does, which the engine then writes (neither is timed; the write is in the way of the next podnet ADDs of the turn, not of the reference's)")
	}
	r.f("; the reference's pods have no Pod object (nothing on the node reads one for them). Latency is libcni's whole `AddNetworkList`. Every pod of a phase is DELeted after it, and the node checked: links, addresses, routes, permanent neighbours, the pod filter, both IPAM stores, and the engine's verdict maps, back as before the phase. ")
	r.f("*Engine's wait* is podnet_policy_wait_seconds of node 1 over the phase's podnet ADDs (request on the policy socket → answer): the bucket the percentile falls in, (lo, hi] in ms, and a linear interpolation within it; a bound of the bucket is all the histogram knows. *Answered*: waits the engine answered (a wait not answered within the plugin's 3 s leaves the pod isolated and ADD goes on). The wait goes out as soon as the veth pair exists and the plugin sets up the pod meanwhile, so an ADD is held up by podnet-routed for only part of it: *held up* is, per podnet ADD, the plugin's own guard step (waiting for podnet-routed to add the port to the pod filter, which the same request asks for) plus its policy step (reading the engine's answer at the end), from its step trace (PODNET_TRACE, on for podnet's turns).\n\n")
	r.f("| policies | mode | pods each | podnet p50 / p99 (ms) | ptp+host-local p50 / p99 (ms) | p50 ÷ | p99 ÷ | engine's wait p50 (ms) | p99 (ms) | mean (ms) | answered | held up p50 / p99 (ms) |\n|---:|---|---:|---|---|---:|---:|---|---|---:|---:|---|\n")
	var errs, leaks []string
	for _, l := range a.Levels {
		for _, m := range []struct {
			mode        string
			podnet, ref []float64
			wait        *histDelta
			blocked     []float64
		}{{"sequential", l.PodnetSeqMs, l.RefSeqMs, l.WaitSeq, l.BlockedSeqMs}, {fmt.Sprintf("%d concurrent", a.Workers), l.PodnetConcMs, l.RefConcMs, l.WaitConc, l.BlockedConcMs}} {
			if len(m.podnet) == 0 || len(m.ref) == 0 {
				continue
			}
			held := p50p99(m.blocked)
			r.f("| %d | %s | %d | %s / %s | %s / %s | %.2f× | %.2f× | %s | %s | %s | %.0f of %d | %s |\n", l.Policies, m.mode, len(m.podnet),
				fmtMs(median(m.podnet)), fmtMs(pct(m.podnet, 99)), fmtMs(median(m.ref)), fmtMs(pct(m.ref, 99)),
				median(m.podnet)/median(m.ref), pct(m.podnet, 99)/pct(m.ref, 99),
				waitCell(m.wait, 0.5), waitCell(m.wait, 0.99), waitMean(m.wait), waitCount(m.wait), len(m.podnet), held)
		}
		for _, e := range l.Errors {
			errs = append(errs, fmt.Sprintf("%d policies: %s", l.Policies, e))
		}
		for _, e := range l.Leaks {
			leaks = append(leaks, fmt.Sprintf("%d policies: %s", l.Policies, e))
		}
	}
	r.f("\n")
	if a.Pods == 0 {
		r.f("(No sequential or concurrent phases: PODNET_BENCH_POLICY_ADD_PODS=0.)\n\n")
	}
	r.addRollingTable(a)
	r.addStepsTable(a)

	// targets: p50 at every level and mode, p99 and the engine's wait at
	// the last level
	for _, l := range a.Levels {
		for _, m := range []struct {
			mode        string
			podnet, ref []float64
		}{{"sequential", l.PodnetSeqMs, l.RefSeqMs}, {fmt.Sprintf("%d concurrent", a.Workers), l.PodnetConcMs, l.RefConcMs}} {
			if len(m.podnet) == 0 || len(m.ref) == 0 {
				continue
			}
			ra := median(m.podnet) / median(m.ref)
			r.targets = append(r.targets, target{fmt.Sprintf("ADD with the engine on (issue 34) at %d policies, %s: p50 ≤ 0.5× ptp+host-local's in the same node netns", l.Policies, m.mode),
				fmt.Sprintf("%.2f× (%s vs %s ms; %d pods each)", ra, fmtMs(median(m.podnet)), fmtMs(median(m.ref)), len(m.podnet)), met(ra <= 0.5), gapRatio(ra, 0.5)})
		}
	}
	if len(a.Levels) > 1 && len(a.Levels[len(a.Levels)-1].PodnetSeqMs) > 0 && len(a.Levels[len(a.Levels)-1].RefSeqMs) > 0 {
		l := a.Levels[len(a.Levels)-1]
		for _, m := range []struct {
			mode        string
			podnet, ref []float64
		}{{"sequential", l.PodnetSeqMs, l.RefSeqMs}, {fmt.Sprintf("%d concurrent", a.Workers), l.PodnetConcMs, l.RefConcMs}} {
			ra := pct(m.podnet, 99) / pct(m.ref, 99)
			r.targets = append(r.targets, target{fmt.Sprintf("ADD with the engine on (issue 34) at %d policies, %s: p99 ≤ 1.0× ptp+host-local's", l.Policies, m.mode),
				fmt.Sprintf("%.2f× (%s vs %s ms)", ra, fmtMs(pct(m.podnet, 99)), fmtMs(pct(m.ref, 99))), met(ra <= 1), gapRatio(ra, 1)})
		}
		w := l.WaitSeq.plus(l.WaitConc)
		lo, hi, in := w.quantile(0.99)
		measured, gap := "no waits recorded", "no data"
		ok := false
		if !math.IsNaN(hi) {
			ok = hi <= 0.002+1e-12
			measured = fmt.Sprintf("p99 in the bucket (%s, %s] ms, ~%s ms interpolated within it; p50 %s ms; %.0f waits answered of %d ADDs", msBound(lo), msBound(hi), fmtMs(in*1000),
				waitCell(w, 0.5), w.Count, len(l.PodnetSeqMs)+len(l.PodnetConcMs))
			if ok {
				gap = "—"
			} else {
				gap = fmt.Sprintf("p99 over %s ms: at least %.1f× the limit", msBound(lo), lo/0.002)
			}
		}
		r.targets = append(r.targets, target{fmt.Sprintf("the engine's wait (podnet_policy_wait_seconds: request → answer, which overlaps the plugin's pod setup) at %d policies, sequential and concurrent ADDs pooled: p99 ≤ 2 ms (a bucket bound: decided by the bucket)", l.Policies),
			measured, met(ok), gap})
		if held := append(append([]float64(nil), l.BlockedSeqMs...), l.BlockedConcMs...); len(held) > 0 {
			p99 := pct(held, 99)
			r.targets = append(r.targets, target{fmt.Sprintf("the engine's share of an ADD: the time the plugin is held up by podnet-routed (its guard and policy steps) at %d policies, sequential and concurrent ADDs pooled: p99 ≤ 2 ms", l.Policies),
				fmt.Sprintf("p99 %s ms, p50 %s ms (%d ADDs traced; sequential p99 %s ms, concurrent %s ms)", fmtMs(p99), fmtMs(median(held)), len(held), fmtMs(pct(l.BlockedSeqMs, 99)), fmtMs(pct(l.BlockedConcMs, 99))),
				met(p99 <= 2), gapMs(p99, 2)})
		}
	}

	if b := a.Burst; b != nil && len(b.Runs) > 0 {
		runsOf := map[string]int{}
		for _, run := range b.Runs {
			runsOf[run.Stack]++
		}
		r.f("**%d pods started at once** on node 1 at %d policies (the Pod objects made first, the engine idle, then %d ADDs released together; each stack in its own run, %d runs of each taking turns, then every pod DELeted and the node checked as above): the fastest ADD (the first pod up) and the slowest (the last). The fastest is one pod's luck in one run, so the target takes the median of the runs' ratios.\n\n", b.Pods, b.Policies, b.Pods, slices.Max(slices.Collect(maps.Values(runsOf))))
		r.f("*CPU* is what the run's plugin processes (and what they ran) and both nodes' podnet-routed spent from the gate to the last answer; divided by the machine's CPUs it is the least time any schedule needs to finish every ADD, so *floor ÷ fastest* is the least slowest ÷ fastest this machine allows for that fastest ADD.\n\n")
		r.f("| stack | pods | fastest (ms) | p50 (ms) | slowest (ms) | slowest ÷ fastest | last answer after (ms) | engine's wait p50 / p99 (ms) | answered | CPU: plugins + podnet-routed (ms) | floor ÷ fastest |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|\n")
		ratios := map[string][]float64{}
		fast, slow, floors := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for _, run := range b.Runs {
			ra := maxOf(run.Ms) / pct(run.Ms, 0.0001)
			ratios[run.Stack] = append(ratios[run.Stack], ra)
			fast[run.Stack] = append(fast[run.Stack], pct(run.Ms, 0.0001))
			slow[run.Stack] = append(slow[run.Stack], maxOf(run.Ms))
			wait, answered := "—", "—"
			if run.Wait != nil {
				wait = waitCell(run.Wait, 0.5) + " / " + waitCell(run.Wait, 0.99)
				answered = fmt.Sprintf("%.0f of %d", waitCount(run.Wait), len(run.Ms))
			}
			cpu, floor := "—", "—"
			if run.CPUs > 0 {
				f := (run.PluginCPUMs + run.RoutedCPUMs) / float64(run.CPUs)
				cpu = fmt.Sprintf("%s + %s", fmtMs(run.PluginCPUMs), fmtMs(run.RoutedCPUMs))
				floor = fmt.Sprintf("%.2f× (%s ms on %d CPUs)", f/pct(run.Ms, 0.0001), fmtMs(f), run.CPUs)
				floors[run.Stack] = append(floors[run.Stack], f/pct(run.Ms, 0.0001))
			}
			r.f("| %s | %d | %s | %s | %s | %.2f× | %s | %s | %s | %s | %s |\n", run.Stack, len(run.Ms), fmtMs(pct(run.Ms, 0.0001)), fmtMs(median(run.Ms)), fmtMs(maxOf(run.Ms)), ra, fmtMs(run.WallMs), wait, answered, cpu, floor)
			for _, e := range run.Errors {
				errs = append(errs, fmt.Sprintf("%d at once, %s: %s", b.Pods, run.Stack, e))
			}
			for _, e := range run.Leaks {
				leaks = append(leaks, fmt.Sprintf("%d at once, %s: %s", b.Pods, run.Stack, e))
			}
		}
		r.f("\n")
		var podnet, ref string
		for s := range ratios {
			if strings.HasPrefix(s, "podnet") {
				podnet = s
			} else {
				ref = s
			}
		}
		if podnet != "" {
			ra := median(ratios[podnet])
			refText := ""
			if ref != "" {
				refText = fmt.Sprintf("; %s %.2f× (%s → %s ms)", ref, median(ratios[ref]), fmtMs(median(fast[ref])), fmtMs(median(slow[ref])))
			}
			if f := floors[podnet]; len(f) > 0 {
				refText += fmt.Sprintf("; the CPU the burst took allows no less than %.2f× for that fastest ADD on this machine", median(f))
			}
			r.targets = append(r.targets, target{fmt.Sprintf("%d pods started at once on one node at %d policies (issue 34): the slowest ADD ≤ 2× the fastest", b.Pods, b.Policies),
				fmt.Sprintf("%.2f× (%s → %s ms)%s", ra, fmtMs(median(fast[podnet])), fmtMs(median(slow[podnet])), refText), met(ra <= 2), gapRatio(ra, 2)})
		}
	}
	// a leak's lines are "left: ..." and "gone: ..."; "(...)" is a note
	n := 0
	for _, l := range leaks {
		if !strings.Contains(l, ": (") {
			n++
		}
	}
	r.f("Errors: %s. Leaks after the DELs: %s.\n\n", listOrNone(errs), listOrNone(leaks))
	r.targets = append(r.targets, target{"ADD with the engine on (issue 34): no error, and every phase's pods leave nothing after DEL (node netns, pod filter, IPAM stores, the engine's maps)",
		fmt.Sprintf("%d errors, %d things left or gone", len(errs), n), met(len(errs)+n == 0), map[bool]string{true: "—", false: "see section 7"}[len(errs)+n == 0]})
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return mdEscape(strings.Join(xs, "; "))
}

// gapMs describes how far a time in ms is from a "≤ want ms" goal.
func gapMs(got, want float64) string {
	if math.IsNaN(got) {
		return "no data"
	}
	if got <= want {
		return fmt.Sprintf("%s ms to spare", fmtMs(want-got))
	}
	return fmt.Sprintf("%s ms over (%.1f×)", fmtMs(got-want), got/want)
}

// addStepsTable shows the sequential podnet ADDs step by step at each
// level (from the plugin's trace), and what libcni measured on top of
// the plugin's own time: its exec, the Go runtime's start and libcni.
func (r *report) addStepsTable(a *addCompare) {
	levels := a.levelsWith(func(l addLevel) bool { return len(l.StepsSeq) > 0 })
	if len(levels) == 0 {
		return
	}
	r.f("podnet's sequential ADDs above, step by step (p50 of each step's wall time, ms, from its trace; section 1b has the same steps with the engine off, where the plugin writes its pod filter elements itself). *Outside the plugin* is libcni's ADD p50 less the plugin's own: the exec, the Go runtime's start and exit, and libcni's work.\n\n")
	r.f("| step |")
	for _, l := range levels {
		r.f(" %d policies |", l.Policies)
	}
	r.f("\n|---|")
	for range levels {
		r.f("---:|")
	}
	r.f("\n")
	var steps []string
	for _, st := range levels[0].StepsSeq {
		steps = append(steps, st.Step)
	}
	for _, name := range steps {
		r.f("| %s |", name)
		for _, l := range levels {
			cell := "—"
			for _, st := range l.StepsSeq {
				if st.Step == name {
					cell = fmtMs(st.P50Ms)
				}
			}
			r.f(" %s |", cell)
		}
		r.f("\n")
	}
	r.f("| outside the plugin |")
	for _, l := range levels {
		inside := l.StepsSeq[len(l.StepsSeq)-1].P50Ms
		r.f(" %s |", fmtMs(median(l.PodnetSeqMs)-inside))
	}
	r.f("\n\n")
}

// addRollingTable shows podnet's ADDs beside DELs (a node replacing its
// pods) next to the same level's concurrent phase, when the results have
// them.
func (r *report) addRollingTable(a *addCompare) {
	rows := a.levelsWith(func(l addLevel) bool { return len(l.RollingMs) > 0 })
	if len(rows) == 0 {
		return
	}
	r.f("**Beside DELs** (a node replacing its pods): after the concurrent phase, %d podnet pods are ADDed and left, then %d new ones ADDed with %d in flight while the older ones are DELeted beside them, 8 in flight (the CNI DEL, the netns, the Pod object, as in the phases' end); podnet's ADDs only. The concurrent phase's podnet ADDs of the same level are beside them for comparison.\n\n", a.Pods, a.Pods, a.Workers)
	r.f("| policies | podnet ADD beside DELs p50 / p99 (ms) | held up p50 / p99 (ms) | concurrent, no DELs, p50 / p99 (ms) | held up p50 / p99 (ms) |\n|---:|---|---|---|---|\n")
	for _, l := range rows {
		r.f("| %d | %s | %s | %s | %s |\n", l.Policies, p50p99(l.RollingMs), p50p99(l.BlockedRollingMs), p50p99(l.PodnetConcMs), p50p99(l.BlockedConcMs))
	}
	r.f("\n")
}

// levelsWith returns the levels keep says yes to, in order.
func (a *addCompare) levelsWith(keep func(addLevel) bool) []addLevel {
	var out []addLevel
	for _, l := range a.Levels {
		if keep(l) {
			out = append(out, l)
		}
	}
	return out
}

// p50p99 is "p50 / p99" of v in ms, "—" when v is empty.
func p50p99(v []float64) string {
	if len(v) == 0 {
		return "—"
	}
	return fmtMs(median(v)) + " / " + fmtMs(pct(v, 99))
}
