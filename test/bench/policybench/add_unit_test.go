//go:build bench

package policybench

import (
	"math"
	"os"
	"slices"
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

func TestBlockedMs(t *testing.T) {
	path := t.TempDir() + "/trace.jsonl"
	if got, steps, err := blockedMs(path); err != nil || got != nil || steps != nil {
		t.Fatalf("no trace: %v, %v; want nothing", got, err)
	}
	lines := `{"verb":"ADD","steps":[{"step":"veth","wallUs":900},{"step":"guard","wallUs":150},{"step":"host","wallUs":400},{"step":"policy","wallUs":1250}],"wallUs":5000}
{"verb":"DEL","steps":[{"step":"guard","wallUs":700}],"wallUs":3000}

{"verb":"ADD","steps":[{"step":"guard","wallUs":20},{"step":"policy","wallUs":5}],"wallUs":4000}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	got, steps, err := blockedMs(path)
	if err != nil || len(got) != 2 || got[0] != 1.4 || got[1] != 0.025 {
		t.Fatalf("blockedMs = %v, %v; want [1.4 0.025] (ADDs only: guard + policy)", got, err)
	}
	// each step's median over the ADDs that have it (nearest rank), in
	// the order the trace first names them, then the plugin's whole time
	want := []stepP50{{"veth", 0.9}, {"guard", 0.02}, {"host", 0.4}, {"policy", 0.005}, {insideStep, 4}}
	if !slices.Equal(steps, want) {
		t.Errorf("steps = %v, want %v", steps, want)
	}
	if err := os.WriteFile(path, []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := blockedMs(path); err == nil {
		t.Fatal("a broken trace line: no error")
	}
}
