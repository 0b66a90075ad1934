// The index of claims one Node is judged against: which Nodes hold which
// PodCIDRs, addresses and VTEP MACs, what the losers of conflicts claim,
// and this node's own view. Validate builds it; Plan keeps it current.

package desired

import "net/netip"

// claimIndex is what one Node is judged against besides the cluster's
// configuration: the PodCIDRs, addresses and (vxlan) VTEP MACs of the
// Nodes that passed the cluster-wide checks and won every conflict (the
// holders), their usable other-family addresses, what the losers of
// conflicts claim (a Node that comes to overlap one changes the reason it
// is refused for), and this node's own view. Validate builds it for every
// Node at once; Plan.Update judges one Node with it and keeps it current.
type claimIndex struct {
	cfg     Config
	family  int         // the underlay's (underlayFamily)
	local   localChecks // this node's own checks
	own     *prefixTrie // this node's PodCIDRs (nil: it is not valid)
	holders map[string]Node
	taken   *prefixTrie
	ips     map[netip.Addr]string
	macs    map[string]string // VTEP MACs (vxlan only; nil otherwise)
	altIPs  map[netip.Addr]string
	// what the losers of conflicts claim
	lost     *prefixTrie
	lostIPs  map[netip.Addr]string
	lostMACs map[string]string
}

// newClaimIndex is an empty index for cfg; only VXLAN uses the MACs
// (another mode has nothing to refuse for them).
func newClaimIndex(cfg Config, family int) *claimIndex {
	ix := &claimIndex{cfg: cfg, family: family, holders: map[string]Node{}, taken: &prefixTrie{},
		ips: map[netip.Addr]string{}, altIPs: map[netip.Addr]string{}, lost: &prefixTrie{}, lostIPs: map[netip.Addr]string{}}
	if cfg.Encap == VXLAN {
		ix.macs, ix.lostMACs = map[string]string{}, map[string]string{}
	}
	return ix
}

// hold records that n holds its PodCIDRs, address and VTEP MAC.
func (ix *claimIndex) hold(n Node) {
	ix.holders[n.Name] = n
	record(n, ix.taken, ix.ips, ix.macs)
}

// record puts n's PodCIDRs in cidrs, its address (when it has one) in ips
// and its VTEP MAC in macs (nil: none are kept), as n's.
func record(n Node, cidrs *prefixTrie, ips map[netip.Addr]string, macs map[string]string) {
	for _, p := range n.PodCIDRs {
		cidrs.insert(p, n.Name)
	}
	if n.IP.IsValid() {
		ips[n.IP] = n.Name
		if macs != nil {
			macs[VTEPMAC(n.IP)] = n.Name
		}
	}
}

// holdAlt records that n holds its other-family address.
func (ix *claimIndex) holdAlt(n Node) { ix.altIPs[n.AltIP] = n.Name }

// claim records that n holds what it claims: its PodCIDRs, address and
// VTEP MAC, and its other-family address unless that may not be a next
// hop (altGlobalProblem).
func (ix *claimIndex) claim(n Node) {
	ix.hold(n)
	if n.AltIP.IsValid() && altGlobalProblem(ix.cfg, n) == "" {
		ix.holdAlt(n)
	}
}

// unclaim forgets what Node name holds (nothing when it holds nothing)
// and returns it.
func (ix *claimIndex) unclaim(name string) (Node, bool) {
	n, had := ix.holders[name]
	if !had {
		return Node{}, false
	}
	delete(ix.holders, name)
	for _, c := range n.PodCIDRs {
		ix.taken.remove(c)
	}
	if ix.ips[n.IP] == n.Name {
		delete(ix.ips, n.IP)
	}
	if mac := VTEPMAC(n.IP); ix.macs != nil && ix.macs[mac] == n.Name {
		delete(ix.macs, mac)
	}
	if n.AltIP.IsValid() && ix.altIPs[n.AltIP] == n.Name {
		delete(ix.altIPs, n.AltIP)
	}
	return n, true
}

// lose records what n, the loser of a conflict, claims.
func (ix *claimIndex) lose(n Node) { record(n, ix.lost, ix.lostIPs, ix.lostMACs) }

// conflict checks n against the holders (conflicts).
func (ix *claimIndex) conflict(n Node, keeps func(loser Node, owner string) string) (conflictRefusal, bool) {
	return conflicts(n, ix.taken, ix.ips, ix.macs, keeps)
}

// touchesLoser tells whether n claims what a loser of a conflict claims.
func (ix *claimIndex) touchesLoser(n Node) bool {
	_, hit := conflicts(n, ix.lost, ix.lostIPs, ix.lostMACs, nil)
	return hit
}

// altTaken tells whether an address of n is another Node's in the other
// role (n's other-family address their primary or other-family one, n's
// primary their other-family one).
func (ix *claimIndex) altTaken(n Node) bool {
	if owner, hit := ix.altIPs[n.IP]; hit && owner != n.Name {
		return true
	}
	if !n.AltIP.IsValid() {
		return false
	}
	if owner, hit := ix.altIPs[n.AltIP]; hit && owner != n.Name {
		return true
	}
	_, hit := ix.ips[n.AltIP]
	_, lostHit := ix.lostIPs[n.AltIP]
	return hit || lostHit
}

// judge validates n, the new content of remote Node name, alone: the
// cluster-wide checks, conflicts with the holders (n's own claims
// aside), then this node's own checks. It returns the refusal (nil:
// valid) and whether n holds its PodCIDRs and address now, and why its
// other-family address may not be used ("": it may). ok is false when n
// conflicts with another Node (an address of either family among them):
// who wins is decided with every Node (Validate).
func (ix *claimIndex) judge(name string, n Node) (refusal *Refusal, claim bool, altProblem string, ok bool) {
	if !ready(n) && n.Invalid == "" {
		return nil, false, "", true
	}
	if r, bad := globalChecks(ix.cfg, ix.family, n); bad {
		return &r, false, "", true
	}
	old, had := ix.unclaim(name)
	_, lost := ix.conflict(n, nil)
	altTaken := ix.altTaken(n)
	if had {
		ix.claim(old)
	}
	if lost || ix.touchesLoser(n) || altTaken {
		return nil, false, "", false
	}
	if n.AltIP.IsValid() {
		if altProblem = altGlobalProblem(ix.cfg, n); altProblem == "" {
			altProblem = ix.local.altProblem(n)
		}
	}
	if r, bad := ix.local.check(n, ix.own); bad {
		return &r, true, altProblem, true
	}
	return nil, true, altProblem, true
}
