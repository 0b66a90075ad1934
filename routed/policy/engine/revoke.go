// The revocation of connections a change no longer allows: when a
// write must be followed by a conntrack scan, and the scans themselves,
// beside the write loop.

package engine

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/podnet/podnet/routed/policy"
)

// revoker deletes the conntrack entries of the connections the Ruleset in
// the kernel no longer allows, after each change of the chains, beside
// the write loop: the conntrack table's scan (tens of milliseconds with
// many connections) never delays the next change, nor a new pod's ADD.
// Changes that come during a scan make one more scan, by the newest
// Ruleset (what the kernel holds).
func (e *Engine) revoker(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.revokeKick:
		}
		// the gap since the last scan's start: RevokeGap when the change
		// may have taken an allowance from a live connection, else
		// RevokeGoneGap (an urgent kick meanwhile shortens it)
		for {
			e.mu.Lock()
			gap := e.cfg.RevokeGoneGap
			if e.revokeUrgent {
				gap = e.cfg.RevokeGap
			}
			e.mu.Unlock()
			wait := gap - time.Since(last)
			if wait <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			case <-e.revokeKick:
			}
		}
		last = time.Now()
		e.mu.Lock()
		rs, ok := e.writtenLocked()
		e.revokeUrgent = false
		e.mu.Unlock()
		if !ok {
			continue
		}
		n, err := e.w.Revoke(policy.NewMatcher(rs).Allows)
		if err != nil {
			e.log.Warn("cannot revoke the connections the new policy refuses", "err", err)
		}
		e.m.Revoked.Add(float64(n))
		if n > 0 {
			e.log.Info("connections revoked", "count", n)
		}
	}
}

// narrowsLocked tells whether d can take an allowance from a connection
// (scan: a conntrack scan must follow its write) and whether from a live
// one (urgent). Urgent: a policy chain went or changed other than by
// widening (policy.Compare: a new pod that became a peer, a named port
// that now resolves), a pod entry already in the kernel changed, a known
// pod became judged. Not urgent: only pods that were deleted lost their
// entries or their place among a policy's peers; their connections'
// other end is gone, and the scan comes within RevokeGoneGap (an address
// given to a new pod meanwhile is judged by that scan too). A new pod's
// entry narrows nothing: its address was unknown, so dropped, until now.
// Callers hold e.mu.
func (e *Engine) narrowsLocked(d policy.Delta) (scan, urgent bool) {
	if len(d.GonePolicies) > 0 {
		return true, true
	}
	scan = len(d.GonePods) > 0
	known := func(list []netip.Addr, a netip.Addr) bool {
		_, found := slices.BinarySearchFunc(list, a, netip.Addr.Compare)
		return found
	}
	for _, p := range d.Pods {
		if old, ok := e.podIDs[p.ID]; ok {
			if !gainedOnly(old, p, func(a netip.Addr) bool { return known(e.globals.Known, a) }) {
				return true, true
			}
			continue
		}
		// a pod judged for the first time narrows unless its addresses
		// were unknown until now (a new pod's)
		for _, a := range p.Addrs {
			if known(e.globals.Known, a) {
				return true, true
			}
		}
	}
	// gone: no pod holds the address any more, on this node (Known) nor
	// on another (a remote peer that only lost a label is live: its
	// connections lose their allowance now)
	gone := func(a netip.Addr) bool { return !known(d.Known, a) && !e.inc.Holds(a) }
	for _, p := range d.Policies {
		// a chain new to the kernel judges only pods whose entries
		// change with it (those are above)
		old, ok := e.pols[p.ID]
		if !ok {
			continue
		}
		switch policy.Compare(old, p, gone) {
		case policy.Narrowed:
			return true, true
		case policy.LostGone:
			scan = true
		}
	}
	return scan, false
}

// gainedOnly tells whether pod entry p is old with addresses added that
// no pod had (known says which were known) and nothing else changed: an
// arriving pod getting its addresses at its ADD (its chains were written
// before) narrows nothing, as a new pod does not.
func gainedOnly(old, p policy.PodChains, known func(netip.Addr) bool) bool {
	for _, a := range old.Addrs {
		if !slices.Contains(p.Addrs, a) {
			return false
		}
	}
	for _, a := range p.Addrs {
		if !slices.Contains(old.Addrs, a) && known(a) {
			return false
		}
	}
	q := p
	q.Addrs = old.Addrs
	return q.Equal(old)
}
