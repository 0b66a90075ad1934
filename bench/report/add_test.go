package main

import (
	"math"
	"strings"
	"testing"
)

func TestHistQuantile(t *testing.T) {
	// 100 observations: 90 in (0, 1 ms], 9 in (1, 2 ms], 1 in (2, 3 ms]
	h := &histDelta{Le: []float64{.001, .002, .003}, Cum: []float64{90, 99, 100}, Count: 100, SumS: .1}
	for _, tc := range []struct{ q, lo, hi, in float64 }{
		{0.5, 0, .001, .001 * 50 / 90},
		{0.99, .001, .002, .002},
		{1, .002, .003, .003},
	} {
		lo, hi, in := h.quantile(tc.q)
		if lo != tc.lo || hi != tc.hi || math.Abs(in-tc.in) > 1e-12 {
			t.Errorf("quantile(%v) = (%v, %v] ~%v, want (%v, %v] ~%v", tc.q, lo, hi, in, tc.lo, tc.hi, tc.in)
		}
	}
	// past the last bound: +Inf
	over := &histDelta{Le: []float64{.001}, Cum: []float64{0}, Count: 1}
	if lo, hi, _ := over.quantile(0.99); lo != .001 || !math.IsInf(hi, 1) {
		t.Errorf("past the last bound: (%v, %v]", lo, hi)
	}
	if _, hi, _ := (&histDelta{Reset: true, Count: 5}).quantile(0.5); !math.IsNaN(hi) {
		t.Error("a reset delta has a quantile")
	}
	if _, hi, _ := (*histDelta)(nil).quantile(0.5); !math.IsNaN(hi) {
		t.Error("no delta has a quantile")
	}
	p := h.plus(h)
	if p.Count != 200 || p.Cum[1] != 198 || h.Count != 100 {
		t.Errorf("plus: %+v (h %+v)", p, h)
	}
	if h.plus(nil) != h || (*histDelta)(nil).plus(h) != h || h.plus(&histDelta{Reset: true}) != h {
		t.Error("plus of nothing is not the other")
	}
	if got := msBound(.00075); got != "0.75" {
		t.Errorf("msBound(.00075) = %q", got)
	}
	if got := msBound(.0001); got != "0.1" {
		t.Errorf("msBound(.0001) = %q", got)
	}
}

// TestHeldUpTarget: the engine's share of an ADD is judged on the time
// the plugin's trace says podnet-routed held it up, both phases of the
// last level pooled, and shown per row.
func TestHeldUpTarget(t *testing.T) {
	ms := constMs
	for _, tc := range []struct {
		name      string
		seq, conc []float64
		status    string
		measured  string
	}{
		{"met", ms(0.2, 100), ms(1.9, 100), "**met**", "p99 1.90 ms"},
		{"not met", ms(0.2, 100), append(ms(0.5, 90), ms(7, 10)...), "not met", "p99 7.00 ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &addCompare{Pods: 100, Workers: 8, Chunk: 25, Levels: []addLevel{
				{Policies: 0, PodnetSeqMs: ms(5, 100), RefSeqMs: ms(10, 100), PodnetConcMs: ms(20, 100), RefConcMs: ms(40, 100)},
				{Policies: 1000, PodnetSeqMs: ms(6, 100), RefSeqMs: ms(10, 100), PodnetConcMs: ms(30, 100), RefConcMs: ms(40, 100), BlockedSeqMs: tc.seq, BlockedConcMs: tc.conc},
			}}
			r := &report{}
			r.addSection(&policyData{AddCompare: a})
			var got *target
			for i := range r.targets {
				if strings.Contains(r.targets[i].Goal, "held up by podnet-routed") {
					got = &r.targets[i]
				}
			}
			if got == nil {
				t.Fatalf("no held-up target in %+v", r.targets)
			}
			if !strings.Contains(got.Status, tc.status) || !strings.HasPrefix(got.Measured, tc.measured) || !strings.Contains(got.Goal, "1000 policies") {
				t.Errorf("target %+v, want %s, measured %q…", *got, tc.status, tc.measured)
			}
			if !strings.Contains(r.b.String(), "| 0.20 / 0.20 |") {
				t.Errorf("the sequential row does not show the held-up time:\n%s", r.b.String())
			}
		})
	}
}

// TestBurstFloor: a burst run with its CPU recorded shows the least
// slowest ÷ fastest its CPU allows, in the table and in the target.
func TestBurstFloor(t *testing.T) {
	ms := make([]float64, 100)
	for i := range ms {
		ms[i] = 100 + float64(i)*10 // 100 .. 1090 ms
	}
	a := &addCompare{}
	a.Burst = &struct {
		Policies int        `json:"policies"`
		Pods     int        `json:"pods"`
		Runs     []burstRun `json:"runs"`
	}{Policies: 1000, Pods: 100, Runs: []burstRun{
		{Stack: "podnet+podnet-ipam (engine on)", Ms: ms, WallMs: 1090, PluginCPUMs: 700, RoutedCPUMs: 100, CPUs: 2},
		{Stack: "ptp+host-local", Ms: ms, WallMs: 1090},
	}}
	r := &report{}
	r.addSection(&policyData{AddCompare: a})
	if !strings.Contains(r.b.String(), "| 700 + 100 | 4.00× (400 ms on 2 CPUs) |") {
		t.Errorf("the podnet row lacks its CPU and floor:\n%s", r.b.String())
	}
	var got string
	for _, tg := range r.targets {
		if strings.Contains(tg.Goal, "at once") {
			got = tg.Measured
		}
	}
	if !strings.Contains(got, "10.90× (100 → 1090 ms)") || !strings.Contains(got, "no less than 4.00×") {
		t.Errorf("burst target measured %q", got)
	}
}

// TestAddSteps: the sequential podnet ADDs' steps at each level, and what
// libcni measured on top of the plugin's own time (its p50 less the
// plugin's).
func TestAddSteps(t *testing.T) {
	steps := func(veth, inside float64) []struct {
		Step  string  `json:"step"`
		P50Ms float64 `json:"p50_ms"`
	} {
		return []struct {
			Step  string  `json:"step"`
			P50Ms float64 `json:"p50_ms"`
		}{{"veth", veth}, {"guard", 0.1}, {"inside the plugin", inside}}
	}
	ms := func(v float64) []float64 { return []float64{v, v, v} }
	a := &addCompare{Pods: 3, Workers: 8, Chunk: 25, Levels: []addLevel{
		{Policies: 0, PodnetSeqMs: ms(6), RefSeqMs: ms(9), StepsSeq: steps(0.5, 2.5)},
		{Policies: 1000, PodnetSeqMs: ms(7), RefSeqMs: ms(9), StepsSeq: steps(0.6, 3)},
	}}
	r := &report{}
	r.addSection(&policyData{AddCompare: a})
	out := r.b.String()
	for _, want := range []string{"| step | 0 policies | 1000 policies |", "| veth | 0.50 | 0.60 |", "| inside the plugin | 2.50 | 3.00 |", "| outside the plugin | 3.50 | 4.00 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// older results have no steps: no table
	r = &report{}
	a.Levels[0].StepsSeq, a.Levels[1].StepsSeq = nil, nil
	r.addSection(&policyData{AddCompare: a})
	if strings.Contains(r.b.String(), "outside the plugin") {
		t.Error("a steps table without steps")
	}
}

// TestRollingTable: the levels with ADDs beside DELs get a row each, next
// to the same level's concurrent phase; results without them get no
// table.
func TestRollingTable(t *testing.T) {
	ms := constMs
	a := &addCompare{Pods: 100, Workers: 8, Chunk: 25, Levels: []addLevel{
		{Policies: 0, PodnetSeqMs: ms(5, 100), RefSeqMs: ms(10, 100), PodnetConcMs: ms(20, 100), RefConcMs: ms(40, 100),
			RollingMs: ms(37, 100), BlockedRollingMs: ms(0.5, 100), BlockedConcMs: ms(0.25, 100)},
		{Policies: 1000, PodnetSeqMs: ms(6, 100), RefSeqMs: ms(10, 100), PodnetConcMs: ms(30, 100), RefConcMs: ms(40, 100)},
	}}
	r := &report{}
	r.addSection(&policyData{AddCompare: a})
	out := r.b.String()
	if !strings.Contains(out, "**Beside DELs**") || !strings.Contains(out, "| 0 | 37.0 / 37.0 | 0.50 / 0.50 | 20.0 / 20.0 | 0.25 / 0.25 |") {
		t.Errorf("no rolling row for 0 policies:\n%s", out)
	}
	if strings.Contains(out, "| 1000 | ") && strings.Contains(out[strings.Index(out, "**Beside DELs**"):], "| 1000 |") {
		t.Errorf("a rolling row for a level without rolling ADDs:\n%s", out)
	}
	a.Levels[0].RollingMs = nil
	r = &report{}
	r.addSection(&policyData{AddCompare: a})
	if strings.Contains(r.b.String(), "Beside DELs") {
		t.Error("a rolling table without rolling ADDs")
	}
}

// constMs is n samples of v ms.
func constMs(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}
