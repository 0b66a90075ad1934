package main

import (
	"strings"
	"testing"
)

// The occupancy target takes the machine's drift out with the control
// node: a run where every ADD of the last 100 pods is twice as slow, and
// so is the control node's at that time, is flat; one where only the full
// node slowed down is not.
func TestOccupancyAgainstControl(t *testing.T) {
	const n, chunk = 200, 50
	run := func(lastFull, lastControl float64) occRun {
		o := occRun{Stack: podnetStack, Pods: n, Chunk: chunk, AddMs: make([]float64, n)}
		for i := range o.AddMs {
			o.AddMs[i] = 4
			if i >= n-100 {
				o.AddMs[i] = lastFull
			}
		}
		for c := 0; c < n/chunk; c++ {
			ctl := []float64{3, 3, 3}
			if c*chunk >= n-100 {
				ctl = []float64{lastControl, lastControl, lastControl}
			}
			o.ControlAddMs = append(o.ControlAddMs, ctl)
		}
		return o
	}
	for _, tc := range []struct {
		name                  string
		lastFull, lastControl float64
		want                  string
	}{
		{"the machine slowed down", 8, 6, "1.00× against the control node (raw 2.00×)"},
		{"the node's pods cost", 8, 3, "2.00× against the control node (raw 2.00×)"},
		{"flat", 4, 3, "1.00× against the control node (raw 1.00×)"},
	} {
		o := run(tc.lastFull, tc.lastControl)
		if got := o.controlOf(n-100, n); len(got) != 6 || got[0] != tc.lastControl {
			t.Errorf("%s: controlOf(last 100) = %v", tc.name, got)
		}
		raw, corr := o.flatness(100)
		tg := occupancyTarget(raw, corr, 0, n, 100)
		if !strings.HasPrefix(tg.Measured, tc.want) {
			t.Errorf("%s: measured %q, want %q", tc.name, tg.Measured, tc.want)
		}
		if wantMet := corr <= 1.10; (tg.Status == "**met**") != wantMet {
			t.Errorf("%s: status %s with %.2f×", tc.name, tg.Status, corr)
		}
	}
	// results without a control node are judged raw
	if raw, corr := (occRun{AddMs: []float64{2, 3}}).flatness(1); raw != 1.5 || corr != 0 {
		t.Errorf("flatness without a control = %v, %v", raw, corr)
	}
	if tg := occupancyTarget(1.3, 0, 2.5, n, 100); tg.Measured != "1.30×; ptp+host-local 2.50× raw" || tg.Status != "**not met**" {
		t.Errorf("without a control: %+v", tg)
	}
}
