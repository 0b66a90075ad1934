package daemon

import (
	"testing"
	"time"
)

// TestFreeAfter: a full apply gives the heap back to the OS after the
// initial sync and then at most once every freeGap, whatever calls for
// full applies in between (a storm of link changes from another
// runtime's containers); Node events never do.
func TestFreeAfter(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	var zero time.Time
	for _, tc := range []struct {
		why       reason
		last, now time.Time
		want      bool
	}{
		{reasonInitialSync, zero, t0, true},
		{reasonInitialSync, t0, t0.Add(time.Second), true},
		{reasonNode, zero, t0, false},
		{reasonNode, t0, t0.Add(time.Hour), false},
		{reasonNone, zero, t0, false},
		{reasonLinkChange, zero, t0, true},
		{reasonLinkChange, t0, t0.Add(time.Second), false},
		{reasonLinkChange, t0, t0.Add(freeGap - time.Millisecond), false},
		{reasonLinkChange, t0, t0.Add(freeGap), true},
		{reasonRepair, t0, t0.Add(5 * time.Second), false},
		{reasonRepair, t0, t0.Add(time.Minute), true},
		{reasonResync, t0, t0.Add(10 * time.Second), false},
		{reasonResync, t0, t0.Add(10 * time.Minute), true},
		{reasonServiceCIDRs, t0, t0.Add(time.Minute), true},
	} {
		if got := freeAfter(tc.why, tc.last, tc.now); got != tc.want {
			t.Errorf("freeAfter(%s, last %v, %v later) = %v, want %v", reasonNames[tc.why], tc.last, tc.now.Sub(tc.last), got, tc.want)
		}
	}
	// a storm: link changes every 20 ms for two minutes free 4 times
	// (at 0, 30, 60, 90 s), not 6,000
	last, frees := zero, 0
	for at := t0; at.Before(t0.Add(2 * time.Minute)); at = at.Add(20 * time.Millisecond) {
		if freeAfter(reasonLinkChange, last, at) {
			last, frees = at, frees+1
		}
	}
	if frees != 4 {
		t.Errorf("a storm of link changes freed %d times in 2 minutes, want 4", frees)
	}
}
