package desired

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// peerSets is the tunnel filter's sets as a dataplane in memory holds
// them: a NewPlan's Peers, then each Update's changes.
type peerSets struct {
	peers map[netip.Addr]bool
	cidrs map[netip.Prefix]bool
}

func loadPeers(p *Plan) peerSets {
	s := peerSets{peers: map[netip.Addr]bool{}, cidrs: map[netip.Prefix]bool{}}
	peers, cidrs := p.Peers()
	for _, a := range peers {
		s.peers[a] = true
	}
	for _, c := range cidrs {
		s.cidrs[c] = true
	}
	return s
}

func (s peerSets) apply(t *testing.T, step string, d Delta) {
	t.Helper()
	for _, a := range d.AddPeers {
		if s.peers[a] {
			t.Fatalf("%s: peer %s added twice", step, a)
		}
		s.peers[a] = true
	}
	for _, c := range d.AddRemote {
		s.cidrs[c] = true
	}
	for _, a := range d.DelPeers {
		if !s.peers[a] {
			t.Fatalf("%s: peer %s removed but not there", step, a)
		}
		delete(s.peers, a)
	}
	for _, c := range d.DelRemote {
		delete(s.cidrs, c)
	}
}

func (s peerSets) equal(o peerSets) error {
	if len(s.peers) != len(o.peers) || len(s.cidrs) != len(o.cidrs) {
		return fmt.Errorf("%d peers, %d PodCIDRs; want %d, %d", len(s.peers), len(s.cidrs), len(o.peers), len(o.cidrs))
	}
	for a := range o.peers {
		if !s.peers[a] {
			return fmt.Errorf("peer %s missing", a)
		}
	}
	for c := range o.cidrs {
		if !s.cidrs[c] {
			return fmt.Errorf("PodCIDR %s missing", c)
		}
	}
	return nil
}

// The tunnel filter's peers follow Node events: after any sequence of
// Updates, the sets patched by each Delta's AddPeers/DelPeers and
// AddRemote/DelRemote equal those of a plan computed from scratch, a peer
// is never added twice nor removed when absent (two Nodes with one
// address), and every route Compute wants has its PodCIDR and next hop
// (IPIP) in them.
func TestPlanPeersFollowUpdates(t *testing.T) {
	for _, cfg := range []Config{
		{Self: "n00", Encap: IPIP, Underlay: underlay, ClusterCIDRs: testCluster},
		{Self: "n00", Encap: VXLAN, Underlay: underlay, ClusterCIDRs: testCluster},
		{Self: "n00", Encap: VXLAN, CrossSubnet: true, Underlay: underlay, ClusterCIDRs: testCluster},
	} {
		t.Run(fmt.Sprintf("%s-cross%v", cfg.Encap, cfg.CrossSubnet), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(2, uint64(len(cfg.Encap))))
			nodes := map[string]Node{}
			randomNode := func(name string) Node { return randomNode(rng, name, 10, 40, false) }
			list := func() []Node { return slices.Collect(maps.Values(nodes)) }
			onLink := func(ip netip.Addr) bool { return ip.As4()[2] == 0 }
			for i := 0; i < 8; i++ {
				name := fmt.Sprintf("n%02d", i)
				nodes[name] = randomNode(name)
			}
			plan, _ := NewPlan(cfg, Local{}, list(), onLink)
			sets := loadPeers(plan)
			patched, moved := 0, 0
			for step := 0; step < 2000; step++ {
				name := fmt.Sprintf("n%02d", 1+rng.IntN(13))
				var cur *Node
				if rng.IntN(5) == 0 {
					delete(nodes, name)
				} else {
					n := randomNode(name)
					nodes[name] = n
					cur = &n
				}
				at := fmt.Sprintf("step %d (%s)", step, name)
				d, ok := plan.Update(name, cur)
				if ok {
					patched++
					if len(d.AddPeers)+len(d.DelPeers) > 0 {
						moved++
					}
					sets.apply(t, at, d)
				} else {
					plan, _ = NewPlan(cfg, Local{}, list(), onLink)
					sets = loadPeers(plan)
				}
				fresh, st := NewPlan(cfg, Local{}, list(), onLink)
				if err := sets.equal(loadPeers(fresh)); err != nil {
					t.Fatalf("%s: %v", at, err)
				}
				for _, r := range st.Routes {
					if r.Kind == Blackhole {
						continue
					}
					if !sets.cidrs[r.Dst] {
						t.Fatalf("%s: route %s: PodCIDR not in the filter's remote set", at, r)
					}
					if r.Dev == TunnelDevice && !sets.peers[r.Gw] {
						t.Fatalf("%s: route %s: next hop not in the filter's peers", at, r)
					}
				}
			}
			if patched < 500 || moved < 100 {
				t.Fatalf("patched %d, moved peers %d of 2000 steps: the random cluster does not exercise the deltas", patched, moved)
			}
		})
	}
}

// A Node that moves to another address: the new address is added and the
// old one removed in the same delta, and its PodCIDR is not touched; a
// Node deleted takes its address and PodCIDR with it; a refused Node is
// no peer until it is fixed.
func TestPlanPeersDelta(t *testing.T) {
	cfg := Config{Self: "a", Encap: IPIP, Underlay: underlay, ClusterCIDRs: testCluster}
	b := Node{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")}
	c := Node{Name: "c", PodCIDRs: prefixes("10.244.2.0/24"), IP: addr("192.168.1.3")}
	self := Node{Name: "a", PodCIDRs: prefixes("10.244.0.0/24"), IP: addr("192.168.1.1")}
	plan, _ := NewPlan(cfg, Local{}, []Node{self, b, c}, never)
	if peers, cidrs := plan.Peers(); fmt.Sprint(sortedAddrs(peers), sortedPrefixes(cidrs)) != "[192.168.1.2 192.168.1.3] [10.244.1.0/24 10.244.2.0/24]" {
		t.Fatalf("Peers() = %v %v", peers, cidrs)
	}

	moved := b
	moved.IP = addr("192.168.1.9")
	d, ok := plan.Update("b", &moved)
	if !ok || fmt.Sprint(d.AddPeers, d.DelPeers, d.AddRemote, d.DelRemote) != "[192.168.1.9] [192.168.1.2] [] []" {
		t.Fatalf("b moved: ok %v, peers +%v -%v, PodCIDRs +%v -%v", ok, d.AddPeers, d.DelPeers, d.AddRemote, d.DelRemote)
	}
	if d, ok = plan.Update("c", nil); !ok || fmt.Sprint(d.AddPeers, d.DelPeers, d.DelRemote) != "[] [192.168.1.3] [10.244.2.0/24]" {
		t.Fatalf("c deleted: ok %v, peers +%v -%v, PodCIDRs -%v", ok, d.AddPeers, d.DelPeers, d.DelRemote)
	}
	// c comes back with a PodCIDR outside the cluster CIDR: refused, no
	// route, no peer; fixed, it is both
	bad := c
	bad.PodCIDRs = prefixes("10.0.0.0/8")
	if d, ok = plan.Update("c", &bad); !ok || len(d.AddPeers)+len(d.AddRemote)+len(d.Upsert) != 0 {
		t.Fatalf("c refused: ok %v, %+v", ok, d)
	}
	if d, ok = plan.Update("c", &c); !ok || fmt.Sprint(d.AddPeers, d.AddRemote) != "[192.168.1.3] [10.244.2.0/24]" {
		t.Fatalf("c fixed: ok %v, peers +%v, PodCIDRs +%v", ok, d.AddPeers, d.AddRemote)
	}
	for _, name := range []string{"b", "c"} {
		if _, ok = plan.Update(name, nil); !ok {
			t.Fatalf("%s deleted: refused", name)
		}
	}
	if peers, cidrs := plan.Peers(); len(peers)+len(cidrs) != 0 {
		t.Fatalf("no remote Node left, Peers() = %v %v", peers, cidrs)
	}
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}

func sortedPrefixes(p []netip.Prefix) []netip.Prefix {
	slices.SortFunc(p, func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) })
	return p
}

// Two Nodes changed in one batch: one gives up an address and a PodCIDR,
// the other takes them. Whatever order the batch is patched in, the merged
// delta leaves both in the filter's sets (AddPeers are written before
// DelPeers).
func TestPlanPeersHandOverInOneBatch(t *testing.T) {
	cfg := Config{Self: "a", Encap: IPIP, Underlay: underlay, ClusterCIDRs: testCluster}
	self := Node{Name: "a", PodCIDRs: prefixes("10.244.0.0/24"), IP: addr("192.168.1.1")}
	b := Node{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")}
	c := Node{Name: "c", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")} // b's, once b is gone
	plan, _ := NewPlan(cfg, Local{}, []Node{self, b}, never)
	sets := loadPeers(plan)
	var merged Delta
	for _, step := range []struct {
		name string
		n    *Node
	}{{"b", nil}, {"c", &c}} {
		d, ok := plan.Update(step.name, step.n)
		if !ok {
			t.Fatalf("Update %s refused", step.name)
		}
		merged.Merge(d)
	}
	// applied as the daemon does: additions, then removals
	for _, a := range merged.AddPeers {
		sets.peers[a] = true
	}
	for _, p := range merged.AddRemote {
		sets.cidrs[p] = true
	}
	for _, a := range merged.DelPeers {
		delete(sets.peers, a)
	}
	for _, p := range merged.DelRemote {
		delete(sets.cidrs, p)
	}
	if err := sets.equal(loadPeers(plan)); err != nil {
		t.Fatalf("after b hands its address and PodCIDR to c in one batch (delta %+v): %v", merged, err)
	}
}
