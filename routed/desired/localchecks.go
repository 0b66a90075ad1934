// The checks of a Node only this node can make: against its own
// addresses, routes and PodCIDRs and the API server it talks to.

package desired

import (
	"fmt"
	"net/netip"
)

// localChecks are the checks only this node can make: against its own
// addresses, routes, PodCIDRs and the API server it talks to. A PodCIDR
// route must not take traffic the node sends elsewhere today:
//   - it may not hold one of the node's addresses;
//   - it may not equal a route of another protocol (the exclusive create
//     would fail anyway);
//   - it may not overlap a connected subnet either way (inside one, it
//     would cut off part of the node's own L2 neighbours; around one, it
//     takes the underlay's space).
//
// A more specific route of another protocol inside it (an operator's
// blackhole for one pod address: every PodCIDR lies inside the cluster
// CIDRs, so such a route is the pod network's) and one around it through
// a gateway (10.0.0.0/8 via a VPN, the default route) are left alone.
type localChecks struct {
	cfg       Config
	addrs     map[netip.Addr]bool
	nodeAddrs *prefixTrie // this node's addresses
	exact     map[netip.Prefix]bool
	connected *prefixTrie
}

// newLocalChecks indexes local for the checks, leaving out the pod
// network's own addresses and routes (inside self's PodCIDRs).
func newLocalChecks(cfg Config, local Local, self *Node) localChecks {
	lc := localChecks{cfg: cfg, addrs: map[netip.Addr]bool{}, nodeAddrs: &prefixTrie{}, exact: map[netip.Prefix]bool{},
		connected: &prefixTrie{}}
	var own []netip.Prefix
	if self != nil {
		own = self.PodCIDRs
	}
	// the pod network's own addresses and routes (a bridge's gateway and
	// connected route, the VTEP) are not the node's network
	ours := func(p netip.Prefix) bool { return insideAny(p, own) }
	usable := func(p netip.Prefix) bool {
		return p.Bits() > 0 && !p.Addr().IsLinkLocalUnicast() && !p.Addr().IsMulticast() && !ours(p)
	}
	for _, a := range local.Addrs {
		a = a.Unmap()
		lc.addrs[a] = true
		if p := netip.PrefixFrom(a, a.BitLen()); !a.IsLinkLocalUnicast() && !ours(p) {
			lc.nodeAddrs.insert(p, "address "+a.String())
		}
	}
	for _, r := range local.Routes {
		if r = r.Masked(); usable(r) {
			lc.exact[r] = true
		}
	}
	for _, r := range local.Connected {
		if r = r.Masked(); usable(r) {
			lc.connected.insert(r, "connected subnet "+r.String())
		}
	}
	return lc
}

// network says which part of this node's network p would take.
func (lc localChecks) network(p netip.Prefix) (string, bool) {
	if _, what, hit := lc.nodeAddrs.within(p); hit {
		return what, true
	}
	if lc.exact[p] {
		return "route " + p.String() + " (not podnet's)", true
	}
	if _, what, hit := lc.connected.overlap(p); hit {
		return what, true
	}
	return "", false
}

// check refuses n for what only this node can tell: a PodCIDR holding
// the API server's address, overlapping this node's network or (own not
// nil) its own PodCIDRs, or this node's address as n's.
func (lc localChecks) check(n Node, own *prefixTrie) (Refusal, bool) {
	for _, p := range n.PodCIDRs {
		for _, a := range lc.cfg.APIServers {
			if p.Contains(a) {
				return refusal(n, OverlapsAPIServer, "PodCIDR %s holds the API server's address %s", p, a)
			}
		}
		if what, hit := lc.network(p); hit {
			return refusal(n, OverlapsNodeNetwork, "PodCIDR %s overlaps this node's %s", p, what)
		}
		if own != nil {
			if q, _, hit := own.overlap(p); hit {
				return refusal(n, OverlapsOwnPodCIDR, "PodCIDR %s overlaps PodCIDR %s of this node's own Node %s, which never yields its own PodCIDRs to another Node", p, q, lc.cfg.Self)
			}
		}
	}
	if lc.addrs[n.IP] {
		return refusal(n, OwnNodeIP, "node address %s is this node's own address (Node %s keeps it)", n.IP, lc.cfg.Self)
	}
	return Refusal{}, false
}

// altProblem is why n's other-family address may not be a next hop from
// this node: it is one of this node's own addresses.
func (lc localChecks) altProblem(n Node) string {
	if n.AltIP.IsValid() && lc.addrs[n.AltIP] && n.Name != lc.cfg.Self {
		return fmt.Sprintf("its other-family address %s is this node's own address", n.AltIP)
	}
	return ""
}
