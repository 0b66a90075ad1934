package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// An address belongs to the pod that holds it on its node. Two Pod objects
// can show one address: a terminating pod whose sandbox is gone (its
// address already given to a new pod), a pod whose status is stale. The
// node that allocated the address knows which sandbox holds it (its IPAM
// store names the pod, and a plugin's ADD-time wait says so at once):
// SetHolders hands that to the State, and on that node the holder gets the
// address. Every other node, which cannot read that store, resolves the
// claim by a rule that yields the same pod whenever Kubernetes itself made
// the clash: a pod that is not terminating before one that is, then the
// newer Pod object (an address is reused only after its first holder's
// sandbox is gone, so the newer claimant is the later holder), then
// namespace/name. Each clash is reported (Clashes): never a silent choice.

// LocalPort is one of this node's host-side pod interfaces: a routed host
// veth (podnet), or a port of the pods' bridge (podnet-bridge).
type LocalPort struct {
	Name    string
	Bridged bool
}

// Clash is an address more than one Pod object claims.
type Clash struct {
	Addr netip.Addr
	// Pods are the claimants (namespace/name), sorted.
	Pods []string
	// Winner is the pod the address went to; ByHolder says whether this
	// node's records decided (else the rule above did).
	Winner   string
	ByHolder bool
}

// SetHolders tells the State which pod (namespace/name) holds each of this
// node's addresses by the node's own records. It reports whether that
// changed anything.
func (s *State) SetHolders(h map[netip.Addr]string) bool {
	if maps.Equal(s.holders, h) {
		return false
	}
	// the index reads holders only to decide a contested address: it
	// stays good unless the holder of one of those changed
	if s.ix != nil {
		for _, c := range s.ix.clashes {
			if s.holders[c.Addr] != h[c.Addr] {
				s.ix = nil
				break
			}
		}
	}
	s.holders = maps.Clone(h)
	return true
}

// setHolder is SetHolders for one address, in place: pod key holds a
// (key "" holds nothing).
func (s *State) setHolder(a netip.Addr, key string) bool {
	if s.holders[a] == key {
		return false
	}
	if s.ix != nil {
		for _, c := range s.ix.clashes {
			if c.Addr == a {
				s.ix = nil
				break
			}
		}
	}
	if key == "" {
		delete(s.holders, a)
		return true
	}
	if s.holders == nil {
		s.holders = map[netip.Addr]string{}
	}
	s.holders[a] = key
	return true
}

// setPodPorts is SetLocalPorts for one pod, in place.
func (s *State) setPodPorts(key string, ps []LocalPort) bool {
	if slices.Equal(s.ports[key], ps) {
		return false
	}
	if len(ps) == 0 {
		delete(s.ports, key)
		return true
	}
	if s.ports == nil {
		s.ports = map[string][]LocalPort{}
	}
	s.ports[key] = slices.Clone(ps)
	return true
}

// SetLocalPorts tells the State this node's host-side pod interfaces, by
// pod (namespace/name). It reports whether that changed anything.
func (s *State) SetLocalPorts(p map[string][]LocalPort) bool {
	if maps.EqualFunc(s.ports, p, slices.Equal) {
		return false
	}
	s.ports = make(map[string][]LocalPort, len(p))
	for k, v := range p {
		s.ports[k] = slices.Clone(v)
	}
	return true // Compile reads them; the index does not
}

// Clashes are the addresses more than one Pod object claims, and who got
// each, sorted by address.
func (s *State) Clashes() []Clash {
	return slices.Clone(s.index().clashes)
}

// resolveClaims decides each address more than one pod claims (pods in
// namespace/name order) into winner, and records the clashes.
func (ix *index) resolveClaims(contested map[netip.Addr][]*Pod, winner map[netip.Addr]*Pod) {
	for a, pods := range contested {
		c := Clash{Addr: a}
		for _, p := range pods {
			c.Pods = append(c.Pods, p.Key())
		}
		slices.Sort(c.Pods)
		var win *Pod
		if h, ok := ix.s.holders[a]; ok {
			for _, p := range pods {
				if p.Key() == h {
					win, c.ByHolder = p, true
				}
			}
		}
		if win == nil {
			win = slices.MinFunc(pods, claimOrder)
		}
		c.Winner = win.Key()
		winner[a] = win
		ix.clashes = append(ix.clashes, c)
	}
	slices.SortFunc(ix.clashes, func(x, y Clash) int { return x.Addr.Compare(y.Addr) })
}

// claimOrder puts the pod that should get a contested address first: not
// terminating, then the newer, then by namespace/name.
func claimOrder(a, b *Pod) int {
	if a.Terminating != b.Terminating {
		if a.Terminating {
			return 1
		}
		return -1
	}
	if c := b.Created.Compare(a.Created); c != 0 {
		return c
	}
	return strings.Compare(a.Key(), b.Key())
}

// Arriving tells whether pod key (namespace/name) is scheduled and has no
// address yet (Pod.Arriving).
func (s *State) Arriving(key string) bool { return arriving(s.pods[key]) }

// LocalPods are the keys (namespace/name) of node's pods that are not
// hostNetwork, sorted.
func (s *State) LocalPods(node string) []string {
	var out []string
	for k, p := range s.pods {
		if p.Node == node && !p.HostNetwork {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
