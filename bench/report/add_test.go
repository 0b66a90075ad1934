package main

import (
	"math"
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
