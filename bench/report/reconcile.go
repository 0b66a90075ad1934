package main

import (
	"fmt"
	"math"
)

// reconcileSection is issue 22's cost of the leak reconcile: podnet's ADD
// and DEL with and without podnet-routed's reconcile passing during them
// (cni.json, reconcileStack), and one pass over 250 reservations, alive
// and dead (reconcile.json, test/bench/reconcilebench).
func (r *report) reconcileSection(c *cniData, d *reconcileData, dErr error) {
	r.f("## 1c. Leak reconcile cost\n\n")
	r.f("podnet-routed's leak reconcile (routed/reconcile, issue 22) judges every reservation from a snapshot read without the IPAM store's lock and takes the lock only to free the dead, in holds it ends after a budget so that the ADDs and DELs queued on the lock get in between. ")
	r.f("The goal: a reconcile of 250 reservations holds the lock for at most 10 ms at a time, so ADD p99 does not move.\n\n")

	cells := aggregate(c.Runs)
	desc := ""
	for _, s := range c.Stacks {
		if s.Name == reconcileStack {
			desc = s.Reconcile
		}
	}
	if cells[[2]string{reconcileStack, seqMode}] == nil && cells[[2]string{reconcileStack, concMode}] == nil {
		r.f("The %s stack was not run.\n\n", reconcileStack)
	} else {
		r.f("**During the plugin runs.** %s is %s, its runs taking turns with the other stacks' in section 1: %s. ", reconcileStack, podnetStack, desc)
		r.f("A pass every second is 60 times podnet-routed's default rate (one a minute); each phase's first pass frees the 250 planted reservations while the phase's ADDs or DELs queue on the store's lock. The reconcile runs in the benchmark's own process, so its CPU is not in the CPU columns of section 1 (it competes for the machine's cores all the same).\n\n")
		r.f("| mode | stack | ADD p50 | ADD p99 | DEL p50 | DEL p99 | reconcile passes | pass p50 / max (ms) | lock holds | longest hold (ms) | dead freed / planted | leaks | errors |\n")
		r.f("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|\n")
		for _, mode := range []string{seqMode, concMode} {
			for _, s := range []string{podnetStack, reconcileStack} {
				ce := cells[[2]string{s, mode}]
				if ce == nil {
					continue
				}
				passes, holds, planted, freed := 0, 0, 0, 0
				var passMs []float64
				maxHold := 0.0
				for _, run := range c.Runs {
					if run.Stack == s && run.Mode == mode {
						passes += run.ReconcilePasses
						holds += run.ReconcileHolds
						planted += run.ReconcilePlanted
						freed += run.ReconcileReclaimed
						passMs = append(passMs, run.ReconcilePassMs...)
						maxHold = math.Max(maxHold, run.ReconcileMaxLockHoldMs)
					}
				}
				rc := "— | — | — | — | —"
				if s == reconcileStack {
					rc = fmt.Sprintf("%d | %s / %s | %d | %s | %d / %d", passes, fmtMs(median(passMs)), fmtMs(maxOf(passMs)), holds, fmtMs(maxHold), freed, planted)
				}
				leaks, errs := leakSummary(c.Runs, s, mode)
				r.f("| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", mode, s, fmtMs(ce.add.p(50)), fmtMs(ce.add.p(99)), fmtMs(ce.del.p(50)), fmtMs(ce.del.p(99)), rc, leaks, errs)
			}
		}
		r.f("\nWith ÷ without the reconcile (p50: median of the per-repetition ratios, range in brackets; p99: of the pooled samples):\n\n")
		r.f("| mode | ADD p50 | ADD p99 | DEL p50 | DEL p99 |\n|---|---:|---:|---:|---:|\n")
		for _, mode := range []string{seqMode, concMode} {
			a, b := cells[[2]string{reconcileStack, mode}], cells[[2]string{podnetStack, mode}]
			if a == nil || b == nil {
				continue
			}
			addP99, delP99 := a.add.p(99)/b.add.p(99), a.del.p(99)/b.del.p(99)
			r.f("| %s | %s | %.2f× | %s | %.2f× |\n", mode, repRatio(a.add.RepP50, b.add.RepP50), addP99, repRatio(a.del.RepP50, b.del.RepP50), delP99)
			gap := fmt.Sprintf("%s vs %s ms", fmtMs(a.add.p(99)), fmtMs(b.add.p(99)))
			r.targets = append(r.targets, target{fmt.Sprintf("ADD p99 does not move with the leak reconcile passing every second (≤ 1.10× without), %s", mode),
				fmt.Sprintf("%.2f× (%s)", addP99, gap), met(addP99 <= 1.10), gapRatio(addP99, 1.10)})
		}
		r.f("\n")
	}

	if dErr != nil {
		r.f("**One pass over 250 reservations**: not run (%v).\n\n", dErr)
		return
	}
	r.f("**One pass over %d reservations** (test/bench/reconcilebench, %d repetitions): %s. ", d.Reservations, d.Reps, d.Note)
	r.f("Each repetition ADDs %d pods, each in a netns of its own, in a fresh node netns and store (on %s); three passes run while every netns is there (all judged alive, nothing freed), then the netns are removed, %.0f s is left for the kernel to tear them down, and one pass frees them all. ", d.Reservations, d.DataFS, d.SettleS)
	r.f("Grace %.0f s, lock budget %s ms. During every pass a contender takes and releases the store's lock every 0.2 ms, as queued ADDs and DELs would, and records how long each take waited.\n\n", d.GraceS, fmtMs(d.LockBudgetMs))
	r.f("| case | passes | pass p50 / max (ms) | lock holds per pass | longest hold (ms) | mean hold (ms) | contender's wait p50 / longest (ms) | freed per pass | left after |\n")
	r.f("|---|---:|---|---|---:|---:|---|---|---|\n")
	worst := 0.0
	for _, cs := range []struct {
		name   string
		passes []reconcilePass
	}{{"alive (netns there)", d.Live}, {"dead (netns gone)", d.Dead}} {
		if len(cs.passes) == 0 {
			continue
		}
		var pass, wait50, holds, freed, left []float64
		maxHold, maxWait, holdSum, nHolds := 0.0, 0.0, 0.0, 0
		for _, p := range cs.passes {
			pass = append(pass, p.PassMs)
			wait50 = append(wait50, p.ContenderP50WaitMs)
			holds = append(holds, float64(p.Holds))
			freed = append(freed, float64(p.Reclaimed))
			left = append(left, float64(p.RecordsAfter))
			maxHold, maxWait = math.Max(maxHold, p.MaxLockHoldMs), math.Max(maxWait, p.ContenderMaxWaitMs)
			holdSum += p.HoldSumMs
			nHolds += p.Holds
		}
		worst = math.Max(worst, maxHold)
		mean := "—"
		if nHolds > 0 {
			mean = fmtMs(holdSum / float64(nHolds))
		}
		r.f("| %s | %d | %s / %s | %s | %s | %s | %s / %s | %s | %s |\n", cs.name, len(cs.passes), fmtMs(median(pass)), fmtMs(maxOf(pass)),
			span(holds), fmtMs(maxHold), mean, fmtMs(median(wait50)), fmtMs(maxWait), span(freed), span(left))
	}
	r.f("\nA pass over live pods only reads: it takes no lock at all. The longest hold is the budget plus the one release in flight when it ran out, plus whatever the scheduler took from the holding thread.\n\n")
	gap := fmt.Sprintf("%.1f ms to spare", 10-worst)
	if worst > 10 {
		gap = fmt.Sprintf("%.1f ms over", worst-10)
	}
	r.targets = append(r.targets, target{fmt.Sprintf("a reconcile of %d reservations holds the store lock ≤ 10 ms at a time", d.Reservations),
		fmt.Sprintf("%s ms, the longest of %d passes", fmtMs(worst), len(d.Live)+len(d.Dead)), met(worst <= 10), gap})
}

// span renders the range of integer-valued xs ("3" or "2–5").
func span(xs []float64) string {
	lo, hi := pct(xs, 0.0001), maxOf(xs)
	if lo == hi {
		return fmt.Sprintf("%.0f", lo)
	}
	return fmt.Sprintf("%.0f–%.0f", lo, hi)
}
