package main

import (
	"fmt"
	"slices"
)

// verbTrace and stepStat are what test/bench/cnibench records from
// podnet's step trace (PODNET_TRACE, plugins/veth/trace.go).
type verbTrace struct {
	N     int         `json:"n"`
	Total stepStat    `json:"total"`
	Steps []*stepStat `json:"steps"`
}

type stepStat struct {
	Step       string  `json:"step"`
	WallP50Ms  float64 `json:"wall_p50_ms"`
	WallMeanMs float64 `json:"wall_mean_ms"`
	CPUMeanMs  float64 `json:"cpu_mean_ms"`
}

// stepRun is one run's trace: from cni.json's runs, or from
// steps-before.json (a measurement of an earlier podnet, kept for the
// before/after comparison).
type stepRun struct {
	Stack string                `json:"stack"`
	Mode  string                `json:"mode"`
	Steps map[string]*verbTrace `json:"steps"`
}

type stepsBefore struct {
	Note string    `json:"note"`
	Runs []stepRun `json:"runs"`
}

// poolSteps averages the per-run summaries of verb over the runs of stack
// in mode (each run weighs the same; p50 is the mean of the runs' p50s).
func poolSteps(runs []stepRun, stack, mode, verb string) *verbTrace {
	var out *verbTrace
	n := 0
	for _, r := range runs {
		vt := r.Steps[verb]
		if r.Stack != stack || r.Mode != mode || vt == nil {
			continue
		}
		n++
		if out == nil {
			out = &verbTrace{Total: stepStat{Step: "total"}}
		}
		out.N += vt.N
		addStat(&out.Total, vt.Total)
		for _, st := range vt.Steps {
			i := slices.IndexFunc(out.Steps, func(x *stepStat) bool { return x.Step == st.Step })
			if i < 0 {
				out.Steps = append(out.Steps, &stepStat{Step: st.Step})
				i = len(out.Steps) - 1
			}
			addStat(out.Steps[i], *st)
		}
	}
	if out == nil {
		return nil
	}
	div := func(s *stepStat) {
		s.WallP50Ms /= float64(n)
		s.WallMeanMs /= float64(n)
		s.CPUMeanMs /= float64(n)
	}
	div(&out.Total)
	for _, st := range out.Steps {
		div(st)
	}
	return out
}

func addStat(dst *stepStat, s stepStat) {
	dst.WallP50Ms += s.WallP50Ms
	dst.WallMeanMs += s.WallMeanMs
	dst.CPUMeanMs += s.CPUMeanMs
}

// stepTable writes one verb's steps: p50 and mean wall time, share of the
// mean wall time inside the plugin, mean CPU and its share.
func (r *report) stepTable(vt *verbTrace) {
	r.f("| step | wall p50 | wall mean | share of wall | CPU mean | share of CPU |\n|---|---:|---:|---:|---:|---:|\n")
	share := func(a, b float64) string {
		if b <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f %%", 100*a/b)
	}
	for _, st := range vt.Steps {
		r.f("| %s | %s | %s | %s | %s | %s |\n", st.Step, fmtMs(st.WallP50Ms), fmtMs(st.WallMeanMs),
			share(st.WallMeanMs, vt.Total.WallMeanMs), fmtMs(st.CPUMeanMs), share(st.CPUMeanMs, vt.Total.CPUMeanMs))
	}
	r.f("| **inside the plugin** (%d verbs) | %s | %s | 100 %% | %s | 100 %% |\n\n", vt.N, fmtMs(vt.Total.WallP50Ms), fmtMs(vt.Total.WallMeanMs), fmtMs(vt.Total.CPUMeanMs))
}

// stepSection: where podnet's ADD and DEL time goes, step by step, now and
// (from steps-before.json) before the veth was born in the pod netns.
func (r *report) stepSection(c *cniData, before *stepsBefore, beforeErr error) {
	var runs []stepRun
	for _, run := range c.Runs {
		if len(run.Steps) > 0 {
			runs = append(runs, stepRun{Stack: run.Stack, Mode: run.Mode, Steps: run.Steps})
		}
	}
	r.f("## 1b. Where podnet's time goes: ADD and DEL step by step\n\n")
	r.f("From podnet's own step trace (`PODNET_TRACE=<file>`: one JSON line per verb with each step's wall and CPU time; CPU is the plugin's plus the children it reaps), recorded during the runs of section 1 and averaged over the repetitions. ")
	r.f("\"Inside the plugin\" starts in `main` after the Go runtime is up: what libcni measures on top of it is the exec of the binary, the runtime's start and libcni's own work.\n\n")
	if len(runs) == 0 {
		r.f("No step trace in the results.\n\n")
		return
	}
	cells := aggregate(c.Runs)
	for _, stack := range []string{podnetStack, bridgeStack} {
		for _, mode := range []string{seqMode, concMode} {
			for _, verb := range []string{"ADD", "DEL"} {
				vt := poolSteps(runs, stack, mode, verb)
				if vt == nil {
					continue
				}
				r.f("**%s, %s, %s** (ms)", stack, mode, verb)
				if ce := cells[[2]string{stack, mode}]; ce != nil {
					p50 := ce.add.p(50)
					if verb == "DEL" {
						p50 = ce.del.p(50)
					}
					r.f(": libcni's %s p50 %s ms, of which %s ms inside the plugin (p50) and about %s ms exec, runtime start and libcni", verb, fmtMs(p50), fmtMs(vt.Total.WallP50Ms), fmtMs(max(0, p50-vt.Total.WallP50Ms)))
				}
				r.f("\n\n")
				r.stepTable(vt)
			}
		}
	}
	if beforeErr != nil {
		r.f("No \"before\" measurement (%v).\n\n", beforeErr)
		return
	}
	r.f("**Before** (%s)\n\n", before.Note)
	for _, mode := range []string{seqMode, concMode} {
		for _, verb := range []string{"ADD", "DEL"} {
			if vt := poolSteps(before.Runs, podnetStack, mode, verb); vt != nil {
				r.f("*%s, %s, %s, before* (ms)\n\n", podnetStack, mode, verb)
				r.stepTable(vt)
			}
		}
	}
}
