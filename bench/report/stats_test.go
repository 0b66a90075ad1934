package main

import (
	"math"
	"testing"
)

func TestPct(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {10, 1}, {0.0001, 1}} {
		if got := pct(xs, tc.p); got != tc.want {
			t.Errorf("pct(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if !math.IsNaN(pct(nil, 50)) {
		t.Error("pct of no samples is not NaN")
	}
	if xs[0] != 5 {
		t.Error("pct sorted its input")
	}
}

func TestRepRatio(t *testing.T) {
	r := repRatio([]float64{2, 6, 3}, []float64{1, 2, 3})
	if r.Med != 2 || r.Lo != 1 || r.Hi != 3 {
		t.Errorf("got %+v, want median 2, range 1-3", r)
	}
}

func TestRollingMedian(t *testing.T) {
	got := rollingMedian([]float64{1, 2, 30, 4, 5}, 3)
	want := []float64{1, 2, 4, 5, 4} // windows {1,2} {1,2,30} {2,30,4} {30,4,5} {4,5}, lower median
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestMidMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{0.9}, 0.9}} {
		if got := midMedian(c.in); got != c.want {
			t.Errorf("midMedian(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(midMedian(nil)) {
		t.Error("midMedian(nil) is not NaN")
	}
}
