//go:build bench

package policybench

import (
	"math"
	"testing"
)

func TestDying(t *testing.T) {
	for line, want := range map[string]bool{
		"link pn47b6f6bb2b9 veth broadcast|multicast":            true,
		"link pn47b6f6bb2b9 veth up|broadcast|multicast|running": false,
		"link vxlan0 vxlan broadcast|multicast":                  false,
		"route 10.244.0.5 dev pn47b6f6bb2b9":                     false,
	} {
		if got := dying(line); got != want {
			t.Errorf("dying(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestHistMinusQuantile(t *testing.T) {
	before := &hist{le: []float64{.001, .002, .003}, cum: []float64{5, 5, 5}, count: 5, sum: .01}
	after := &hist{le: []float64{.001, .002, .003}, cum: []float64{95, 104, 105}, count: 105, sum: .11}
	d := after.minus(before)
	if d.Reset || d.Count != 100 || d.Cum[0] != 90 || d.Cum[2] != 100 {
		t.Fatalf("minus: %+v", d)
	}
	if lo, hi, in := d.quantile(0.99); lo != .001 || hi != .002 || math.Abs(in-.002) > 1e-12 {
		t.Errorf("p99 (%v, %v] ~%v, want (0.001, 0.002] ~0.002", lo, hi, in)
	}
	if d := before.minus(after); !d.Reset {
		t.Errorf("counts going back: %+v, want a reset", d)
	}
	if after.minus(nil) != nil {
		t.Error("no scrape before: a delta")
	}
}
