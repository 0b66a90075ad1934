package desired

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// applied is a dataplane in memory: what applying a NewPlan state and then
// each Update's Delta leaves in place.
type applied struct {
	routes map[netip.Prefix]Route
	neighs map[netip.Addr]string
	fdbs   map[FDB]bool
}

func load(st State) *applied {
	a := &applied{routes: map[netip.Prefix]Route{}, neighs: map[netip.Addr]string{}, fdbs: map[FDB]bool{}}
	for _, r := range st.Routes {
		a.routes[r.Dst] = r
	}
	for _, n := range st.Neighbors {
		a.neighs[n.IP] = n.MAC
	}
	for _, f := range st.FDBs {
		a.fdbs[f] = true
	}
	return a
}

func (a *applied) apply(d Delta) {
	for _, r := range d.Remove {
		delete(a.routes, r.Dst)
	}
	for _, r := range d.Upsert {
		a.routes[r.Dst] = r
	}
	for _, n := range d.DelNeighbors {
		delete(a.neighs, n.IP)
	}
	for _, n := range d.SetNeighbors {
		a.neighs[n.IP] = n.MAC
	}
	for _, f := range d.DelFDBs {
		delete(a.fdbs, f)
	}
	for _, f := range d.AddFDBs {
		a.fdbs[f] = true
	}
}

func (a *applied) equal(t *testing.T, step string, want *applied) {
	t.Helper()
	if len(a.routes) != len(want.routes) {
		t.Fatalf("%s: %d routes, want %d", step, len(a.routes), len(want.routes))
	}
	for dst, r := range want.routes {
		if a.routes[dst] != r {
			t.Fatalf("%s: route %s is %v, want %v", step, dst, a.routes[dst], r)
		}
	}
	if fmt.Sprint(a.neighs) != fmt.Sprint(want.neighs) {
		t.Fatalf("%s: neighbors\n got  %v\n want %v", step, a.neighs, want.neighs)
	}
	if fmt.Sprint(a.fdbs) != fmt.Sprint(want.fdbs) {
		t.Fatalf("%s: FDB\n got  %v\n want %v", step, a.fdbs, want.fdbs)
	}
}

// TestPlanUpdateMatchesCompute drives random Node changes (new Nodes,
// deleted Nodes, moved addresses, PodCIDRs handed from one Node to
// another, Nodes losing their address, dual stack) through Plan.Update
// and checks after every step that the deltas applied so far leave
// exactly what Compute over the current Nodes wants. When Update refuses
// (a claimed destination, this node) the test does what the daemon does:
// a new plan from all Nodes, and the dataplane reloaded from its state.
func TestPlanUpdateMatchesCompute(t *testing.T) {
	for _, cfg := range []Config{
		{Self: "n00", Encap: IPIP, Underlay: underlay, ClusterCIDRs: randomCluster},
		{Self: "n00", Encap: VXLAN, Underlay: underlay, ClusterCIDRs: randomCluster},
		{Self: "n00", Encap: None, Underlay: underlay, ClusterCIDRs: randomCluster},
		{Self: "n00", Encap: VXLAN, CrossSubnet: true, Underlay: underlay, ClusterCIDRs: randomCluster},
	} {
		t.Run(fmt.Sprintf("%s-cross%v", cfg.Encap, cfg.CrossSubnet), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(cfg.Encap))))
			nodes := map[string]Node{}
			randomNode := func(name string) Node { return randomNode(rng, name, 12, 16, true) }
			list := func() []Node { return slices.Collect(maps.Values(nodes)) }
			onLink := func(ip netip.Addr) bool { return ip.Is4() && ip.As4()[2] == 0 }
			for i := 0; i < 8; i++ {
				name := fmt.Sprintf("n%02d", i)
				nodes[name] = randomNode(name)
			}
			plan, st := NewPlan(cfg, Local{}, list(), onLink)
			dp := load(st)
			patched, refused, refusals := 0, 0, 0
			for step := 0; step < 2000; step++ {
				name := fmt.Sprintf("n%02d", rng.IntN(14))
				var cur *Node
				if rng.IntN(5) == 0 {
					delete(nodes, name)
				} else {
					n := randomNode(name)
					nodes[name] = n
					cur = &n
				}
				d, ok := plan.Update(name, cur)
				want := Compute(cfg, list(), onLink)
				if !ok {
					refused++
					plan, st = NewPlan(cfg, Local{}, list(), onLink)
					dp = load(st)
				} else {
					patched++
					dp.apply(d)
				}
				dp.equal(t, fmt.Sprintf("step %d (%s)", step, name), load(want))
				if got := plan.Refused(); fmt.Sprint(got) != fmt.Sprint(want.Refused) {
					t.Fatalf("step %d: plan refuses %v, Compute %v", step, got, want.Refused)
				}
				refusals += len(want.Refused)
				if plan.Routes() != len(want.Routes) || plan.Skipped() != len(want.Skipped) {
					t.Fatalf("step %d: plan counts %d routes, %d skipped; Compute %d, %d",
						step, plan.Routes(), plan.Skipped(), len(want.Routes), len(want.Skipped))
				}
			}
			// both paths must have been exercised for the test to mean anything
			if patched < 500 || refused < 50 || refusals < 100 {
				t.Fatalf("patched %d, refused %d of 2000 steps, %d Node refusals: the random cluster does not exercise every path", patched, refused, refusals)
			}
		})
	}
}

// A Node update that does not change what podnet reads gives an empty
// delta; one that moves a Node's address changes exactly its route (and,
// with VXLAN, its neighbor and FDB entries).
func TestPlanUpdateTouchesOnlyThatNode(t *testing.T) {
	cfg := Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay}
	plan, _ := NewPlan(cfg, Local{}, cluster(), never)

	b := Node{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")}
	if d, ok := plan.Update("b", &b); !ok || !d.Empty() {
		t.Fatalf("unchanged Node b: delta %+v, ok %v; want empty", d, ok)
	}

	b.IP = addr("192.168.1.20")
	d, ok := plan.Update("b", &b)
	if !ok {
		t.Fatal("moving b was refused")
	}
	want := Delta{
		Upsert:       nil, // the VXLAN route goes via the VTEP: unchanged
		SetNeighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.20")},
		AddFDBs:      []FDB{fdb("192.168.1.20")},
		DelFDBs:      []FDB{fdb("192.168.1.2")},
		AddPeers:     []netip.Addr{addr("192.168.1.20")}, // the tunnel filter's
		DelPeers:     []netip.Addr{addr("192.168.1.2")},
	}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Fatalf("moving b:\n got  %+v\n want %+v", d, want)
	}

	d, ok = plan.Update("c", nil)
	if !ok || len(d.Remove) != 1 || d.Remove[0] != vx("10.244.2.0/24") || len(d.Upsert) != 0 ||
		!slices.Equal(d.DelNeighbors, []Neighbor{neigh("10.244.2.0", "10.0.0.3")}) || !slices.Equal(d.DelFDBs, []FDB{fdb("10.0.0.3")}) {
		t.Fatalf("deleting c: %+v", d)
	}
	if plan.Routes() != 2 { // a's blackhole, b
		t.Fatalf("plan wants %d routes after deleting c, want 2", plan.Routes())
	}
}

// Changes that cannot be patched in one Node at a time are refused, and
// leave the plan as it was.
func TestPlanUpdateRefuses(t *testing.T) {
	cfg := Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay}
	plan, _ := NewPlan(cfg, Local{}, cluster(), never)
	if _, ok := plan.Update("a", self("a", "192.168.1.1", "10.244.9.0/24")); ok {
		t.Error("an update of this node itself was patched")
	}
	// d takes b's PodCIDR: b's route must not be overwritten or removed
	// one Node at a time
	if _, ok := plan.Update("d", self("d", "10.0.0.4", "10.244.1.0/24")); ok {
		t.Error("a Node claiming another Node's PodCIDR was patched")
	}
	if _, ok := plan.Update("d", self("d", "10.0.0.4", "10.244.0.0/24")); ok {
		t.Error("a Node claiming this node's PodCIDR was patched")
	}
	if plan.Routes() != 3 {
		t.Errorf("refused updates changed the plan: %d routes, want 3", plan.Routes())
	}
	d, ok := plan.Update("d", self("d", "10.0.0.4", "10.244.3.0/24"))
	if !ok || !slices.Equal(d.Upsert, []Route{ipip("10.244.3.0/24", "10.0.0.4")}) || len(d.Remove) != 0 {
		t.Errorf("a new Node with its own PodCIDR: %+v, ok %v", d, ok)
	}
}

// A PodCIDR two Nodes claim is routed to the older of them only, the
// other is refused (whatever their names), so the route does not flip
// between them on every resync; a Node claiming this node's PodCIDR is
// refused whatever its age.
func TestComputeClaimedTwice(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nodes := cluster()
	for i := range nodes {
		nodes[i].Created = t0.Add(time.Duration(i) * time.Hour)
	}
	nodes = append(nodes,
		Node{Name: "a-thief", PodCIDRs: prefixes("10.244.2.0/24"), IP: addr("10.0.0.4"), Created: t0.Add(time.Minute)}, // c's, and c is older
		Node{Name: "e", PodCIDRs: prefixes("10.244.0.0/24"), IP: addr("10.0.0.5"), Created: t0.Add(6 * time.Hour)},     // this node's
		Node{Name: "f", PodCIDRs: prefixes("10.244.4.0/23"), IP: addr("10.0.0.6"), Created: t0.Add(4 * time.Hour)},     // its own
		Node{Name: "g", PodCIDRs: prefixes("10.244.4.0/24"), IP: addr("10.0.0.7"), Created: t0.Add(5 * time.Hour)})     // inside f's
	selfA := nodes[1]
	st := Compute(Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay}, nodes, never)
	equalState(t, st, State{
		Routes:    []Route{blackhole("10.244.0.0/24"), vx("10.244.1.0/24"), vx("10.244.2.0/24"), vx("10.244.4.0/23")},
		Neighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.2"), neigh("10.244.2.0", "10.0.0.3"), neigh("10.244.4.0", "10.0.0.6")},
		FDBs:      []FDB{fdb("192.168.1.2"), fdb("10.0.0.3"), fdb("10.0.0.6")},
		Self:      &selfA,
		VTEPs:     prefixes("10.244.0.0/32"),
	})
	// e is refused by a's own check first (it would lose the conflict
	// with a everywhere anyway: a is older)
	want := map[string]Reason{"a-thief": PodCIDRConflict, "e": OverlapsOwnPodCIDR, "g": PodCIDRConflict}
	if len(st.Refused) != len(want) {
		t.Errorf("refused %v, want %v", st.Refused, want)
	}
	for name, r := range want {
		if st.Refused[name].Reason != r {
			t.Errorf("%s: refused %+v, want %s", name, st.Refused[name], r)
		}
	}
}

// randomCluster holds every PodCIDR randomNode makes.
var randomCluster = []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:1024::/32")}

// randomNode is a Node of a small random cluster: one of ips addresses
// (none one time in ten: Nodes share one now and then), one of cidrs
// IPv4 PodCIDRs (none one time in ten), an IPv6 one a time in four with
// v6, and a creation time among a few (equal ones are ordered by name).
func randomNode(rng *rand.Rand, name string, ips, cidrs int, v6 bool) Node {
	n := Node{Name: name, UID: "uid-" + name, Created: time.Unix(int64(rng.IntN(4)), 0)}
	if rng.IntN(10) > 0 {
		n.IP = netip.AddrFrom4([4]byte{192, 168, byte(rng.IntN(2)), byte(1 + rng.IntN(ips))})
	}
	if rng.IntN(10) > 0 {
		n.PodCIDRs = append(n.PodCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(cidrs)), 0}), 24))
	}
	if v6 && rng.IntN(4) == 0 {
		n.PodCIDRs = append(n.PodCIDRs, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0x24, 0, 0, 0, byte(rng.IntN(cidrs))}), 64))
		// an IPv6 InternalIP most of the time: one of a few, shared now
		// and then, inside the cluster CIDR one time in eight
		if n.IP.IsValid() && rng.IntN(4) > 0 {
			b := [16]byte{0xfd, 0x99, 15: byte(1 + rng.IntN(ips))}
			if rng.IntN(8) == 0 {
				b[1], b[2], b[3] = 0, 0x10, 0x24
			}
			n.AltIP = netip.AddrFrom16(b)
		}
	}
	return n
}
