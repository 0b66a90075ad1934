// The revocation of connections a change no longer allows: when a
// write must be followed by a conntrack scan, and the scans themselves,
// beside the write loop.

package engine

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/podnet/podnet/internal/threadprio"
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
		all, urgent, gone := e.revokeAll, e.revokeUrgent, slices.Collect(maps.Keys(e.revokeGone))
		if ok {
			e.revokeUrgent, e.revokeAll = false, false
			clear(e.revokeGone)
		}
		e.mu.Unlock()
		if !ok || !all && len(gone) == 0 {
			continue
		}
		var n int
		var err error
		if all {
			n, err = e.w.Revoke(policy.NewMatcher(rs).Allows)
		} else {
			// only gone pods' connections: every other one keeps its
			// verdict; beside the ADDs, at a lower priority unless an
			// address is held again
			nice := e.cfg.GoneScanNice
			if urgent {
				nice = 0
			}
			threadprio.Do(nice, func() { n, err = e.w.RevokeOf(gone, policy.NewMatcher(rs).Allows) })
		}
		e.m.RevokeScans.WithLabelValues(scanKind(all)).Inc()
		if err != nil {
			e.log.Warn("cannot revoke the connections the new policy refuses", "err", err)
		}
		e.m.Revoked.Add(float64(n))
		if n > 0 {
			e.log.Info("connections revoked", "count", n)
		}
	}
}

// askScan asks the revoker for the scan a write needs (scan): of every
// connection when all, else of goneAddrs' only. A gone pod's address that
// a pod holds again (known: this node's, sorted) before the scan for its
// connections makes that scan urgent: the new holder must not inherit
// them.
func (e *Engine) askScan(scan, all bool, goneAddrs, known []netip.Addr) {
	e.mu.Lock()
	if scan {
		e.revokeUrgent = e.revokeUrgent || all
		e.revokeAll = e.revokeAll || all
		for _, a := range goneAddrs {
			e.revokeGone[a] = true
		}
	}
	if !e.revokeUrgent && e.reusedLocked(known) {
		e.revokeUrgent, scan = true, true
	}
	e.mu.Unlock()
	if scan {
		select {
		case e.revokeKick <- struct{}{}:
		default: // one is pending: it will judge by the newest Ruleset
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
// other end is gone, the scan comes within RevokeGoneGap and judges only
// the connections of goneAddrs, the addresses they had (a new pod given
// one of them meanwhile makes that scan urgent: reusedLocked). A new
// pod's entry narrows nothing: its address was unknown, so dropped, until
// now. Callers hold e.mu.
func (e *Engine) narrowsLocked(d policy.Delta) (scan, urgent bool, goneAddrs []netip.Addr) {
	if len(d.GonePolicies) > 0 {
		return true, true, nil
	}
	scan = len(d.GonePods) > 0
	for _, id := range d.GonePods {
		goneAddrs = append(goneAddrs, e.podIDs[id].Addrs...)
	}
	known := func(list []netip.Addr, a netip.Addr) bool {
		_, found := slices.BinarySearchFunc(list, a, netip.Addr.Compare)
		return found
	}
	for _, p := range d.Pods {
		if old, ok := e.podIDs[p.ID]; ok {
			if !gainedOnly(old, p, func(a netip.Addr) bool { return known(e.globals.Known, a) }) {
				return true, true, nil
			}
			continue
		}
		// a pod judged for the first time narrows unless its addresses
		// were unknown until now (a new pod's)
		for _, a := range p.Addrs {
			if known(e.globals.Known, a) {
				return true, true, nil
			}
		}
	}
	// gone: no pod holds the address any more, on this node (Known) nor
	// on another (a remote peer that only lost a label is live: its
	// connections lose their allowance now)
	var lost []netip.Addr // the addresses gone judged gone
	gone := func(a netip.Addr) bool {
		g := !known(d.Known, a) && !e.inc.Holds(a)
		if g {
			lost = append(lost, a)
		}
		return g
	}
	for _, p := range d.Policies {
		// a chain new to the kernel judges only pods whose entries
		// change with it (those are above)
		old, ok := e.pols[p.ID]
		if !ok {
			continue
		}
		switch policy.Compare(old, p, gone) {
		case policy.Narrowed:
			return true, true, nil
		case policy.LostGone:
			// every address it lost went through gone
			scan = true
			goneAddrs = append(goneAddrs, lost...)
		}
		lost = lost[:0]
	}
	return scan, false, goneAddrs
}

// reusedLocked tells whether an address a pending scan is for (a gone
// pod's) is held again: by a pod of this node (known, sorted) or of
// another. Callers hold e.mu.
func (e *Engine) reusedLocked(known []netip.Addr) bool {
	for a := range e.revokeGone {
		if _, found := slices.BinarySearchFunc(known, a, netip.Addr.Compare); found || e.inc.Holds(a) {
			return true
		}
	}
	return false
}

// scanKind is the kind label of podnet_policy_revoke_scans_total.
func scanKind(all bool) string {
	if all {
		return "all"
	}
	return "gone"
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
