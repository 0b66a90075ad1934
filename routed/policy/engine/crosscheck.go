// The resync's cross-check of the incremental compile against a whole
// compile, and what the write loop knows of what it wrote.

package engine

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/podnet/podnet/routed/policy"
)

// writtenLocked is the Ruleset in the kernel (false: nothing written
// yet). Callers hold e.mu.
func (e *Engine) writtenLocked() (policy.Ruleset, bool) {
	if !e.written {
		return policy.Ruleset{}, false
	}
	rs := e.inc.Ruleset()
	rs.BridgeUnfiltered = e.bridgeOff
	return rs, true
}

// startCheck starts the cross-check a resync asked for, with the state
// and the Ruleset just written.
func (e *Engine) startCheck() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.check || !e.written || e.gen != e.doneGen {
		return // a change pending: after its write
	}
	e.check = false
	go e.crossCheck(e.state.Snapshot(), e.inc.Ruleset(), e.inc.LocalPodCIDRs())
}

// sameGlobals tells whether d's own fields are those last written.
func sameGlobals(a, b policy.Delta) bool {
	return slices.Equal(a.LocalPodCIDRs, b.LocalPodCIDRs) && slices.Equal(a.Known, b.Known) &&
		slices.Equal(a.Ports, b.Ports) && slices.Equal(a.BridgePorts, b.BridgePorts) && a.BridgeUnfiltered == b.BridgeUnfiltered
}

// crossCheck compiles snap whole (beside the write loop: the snapshot is
// the engine's state when incRS was written) and compares: a difference
// is a bug of the incremental compile, logged and counted, and the next
// write is the whole compile's.
func (e *Engine) crossCheck(snap *policy.State, incRS policy.Ruleset, cidrs []netip.Prefix) {
	full := snap.Compile(e.cfg.NodeName, cidrs)
	if full.Equal(incRS) {
		return
	}
	e.m.Mismatches.Inc()
	e.log.Error("the incremental NetworkPolicy compile differs from the whole one (a bug): writing the whole compile",
		"incremental", fmt.Sprintf("%d pods, %d chains", len(incRS.Pods), len(incRS.Policies)),
		"whole", fmt.Sprintf("%d pods, %d chains", len(full.Pods), len(full.Policies)))
	e.mu.Lock()
	e.mismatch = true
	e.changedLocked()
	e.mu.Unlock()
}
