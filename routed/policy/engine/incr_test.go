package engine

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podnet/podnet/routed/policy"
)

// TestCrossCheckRepairsIncremental: a State changed behind the
// incremental compile's back (what a bug of it would look like) is found
// by the resync's cross-check with a whole compile: counted, and the
// whole compile's Ruleset is written.
func TestCrossCheckRepairsIncremental(t *testing.T) {
	r := newRig(t)
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pols.Add(denyIngress())
	r.until("db-0 isolated", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	if got := testutil.ToFloat64(r.m.Mismatches); got != 0 {
		t.Fatalf("%v mismatches before anything went wrong", got)
	}
	r.e.mu.Lock()
	r.e.state.DeletePolicy("shop", "deny-ingress") // the incremental compile does not hear it
	r.e.mu.Unlock()
	r.until("the whole compile written: nothing isolated", func(rs policy.Ruleset) bool { return len(rs.Pods) == 0 })
	eventually(t, "one mismatch counted", func() error {
		if got := testutil.ToFloat64(r.m.Mismatches); got != 1 {
			return fmt.Errorf("%v mismatches", got)
		}
		return nil
	})
	// and the incremental compile follows the State again
	r.pols.Add(denyIngress())
	r.until("isolated again", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
}
