package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// incSteps drives random changes of every kind into an Incremental and,
// after each, checks that its Ruleset is the whole compile's, that the
// Delta it gave makes the last Ruleset into the new one, and that its
// clashes are the whole index's.
type incSteps struct {
	t    *testing.T
	g    *cnpGen
	inc  *Incremental
	node string
	last Ruleset
	ops  map[string]int
}

func newIncSteps(t *testing.T, seed uint64) *incSteps {
	g := newCNPGen(seed, 3, 5, 60, 15, 6)
	st := &incSteps{t: t, g: g, node: "n0", ops: map[string]int{}}
	st.inc = NewIncremental(g.s, st.node, g.cidrs[st.node])
	st.check("start")
	return st
}

// sortedByID is rs with its entries sorted by ID (a Delta's With keeps
// no compile order).
func sortedByID(rs Ruleset) Ruleset {
	rs.Pods = slices.Clone(rs.Pods)
	slices.SortFunc(rs.Pods, func(a, b PodChains) int { return strings.Compare(a.ID, b.ID) })
	rs.Policies = slices.Clone(rs.Policies)
	slices.SortFunc(rs.Policies, func(a, b PolicyChain) int { return strings.Compare(a.ID, b.ID) })
	return rs
}

func (st *incSteps) check(what string) {
	st.t.Helper()
	d := st.inc.Flush()
	got := st.inc.Ruleset()
	want := st.g.s.Compile(st.node, st.inc.LocalPodCIDRs())
	if !got.Equal(want) {
		st.t.Fatalf("after %s: incremental Ruleset differs from the whole compile:\n%s", what, rulesetDiff(got, want))
	}
	if applied := st.last.With(d); !sortedByID(applied).Equal(sortedByID(want)) {
		st.t.Fatalf("after %s: the Delta does not make the last Ruleset into the new one:\n%s", what, rulesetDiff(sortedByID(applied), sortedByID(want)))
	}
	if gc, wc := st.inc.Clashes(), st.g.s.Clashes(); !slices.EqualFunc(gc, wc, func(a, b Clash) bool {
		return a.Addr == b.Addr && slices.Equal(a.Pods, b.Pods) && a.Winner == b.Winner && a.ByHolder == b.ByHolder
	}) {
		st.t.Fatalf("after %s: clashes %v, the whole index says %v", what, gc, wc)
	}
	st.last = want
}

// rulesetDiff says where two Rulesets differ first.
func rulesetDiff(a, b Ruleset) string {
	var out []string
	if !slices.Equal(a.Known, b.Known) {
		out = append(out, fmt.Sprintf("known %v vs %v", a.Known, b.Known))
	}
	if !slices.Equal(a.Ports, b.Ports) || !slices.Equal(a.BridgePorts, b.BridgePorts) {
		out = append(out, fmt.Sprintf("ports %v %v vs %v %v", a.Ports, a.BridgePorts, b.Ports, b.BridgePorts))
	}
	if !slices.Equal(a.LocalPodCIDRs, b.LocalPodCIDRs) {
		out = append(out, "cidrs")
	}
	for i := range max(len(a.Pods), len(b.Pods)) {
		if i >= len(a.Pods) || i >= len(b.Pods) || !a.Pods[i].Equal(b.Pods[i]) {
			var x, y any
			if i < len(a.Pods) {
				x = a.Pods[i]
			}
			if i < len(b.Pods) {
				y = b.Pods[i]
			}
			out = append(out, fmt.Sprintf("pod #%d: %+v\n  vs %+v", i, x, y))
			break
		}
	}
	for i := range max(len(a.Policies), len(b.Policies)) {
		if i >= len(a.Policies) || i >= len(b.Policies) || !a.Policies[i].Equal(b.Policies[i]) {
			var x, y any
			if i < len(a.Policies) {
				x = a.Policies[i]
			}
			if i < len(b.Policies) {
				y = b.Policies[i]
			}
			out = append(out, fmt.Sprintf("policy #%d (of %d vs %d): %+v\n  vs %+v", i, len(a.Policies), len(b.Policies), x, y))
			break
		}
	}
	return strings.Join(out, "\n")
}

// addr is one of a small pool of addresses of node n (0-2), so that pods
// collide on addresses now and then.
func (st *incSteps) addr(n int, v6 bool) netip.Addr {
	k := 2 + st.g.r.IntN(40)
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 7: byte(n), 15: byte(k)})
	}
	return netip.AddrFrom4([4]byte{10, byte(n), 0, byte(k)})
}

func (st *incSteps) podKeys() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range st.g.s.pods {
			if !yield(k) {
				return
			}
		}
	})
}

func (st *incSteps) randomPod() Pod {
	g := st.g
	n := g.r.IntN(3)
	p := Pod{Namespace: g.pick(g.nsNames), Name: fmt.Sprintf("q%d", g.r.IntN(40)), Node: g.nodes[n],
		Labels: map[string]string{"app": g.pick(genApps)}, Created: time.Unix(int64(g.r.IntN(5)), 0)}
	if keys := st.podKeys(); len(keys) > 0 && g.r.IntN(2) == 0 {
		p.Namespace, p.Name, _ = strings.Cut(keys[g.r.IntN(len(keys))], "/")
	}
	if g.r.IntN(3) > 0 {
		p.Labels["role"] = g.pick(genRoles)
	}
	p.Terminating = g.r.IntN(6) == 0
	switch x := g.r.IntN(12); {
	case x == 0:
		p.HostNetwork = true
		p.IPs = []netip.Addr{g.nodeIPs[n]}
	case x == 1: // arriving (scheduled, no address yet), or finished
		p.Finished = g.r.IntN(3) == 0
	case x < 5:
		p.IPs = []netip.Addr{st.addr(n, false)}
	case x < 7:
		p.IPs = []netip.Addr{st.addr(n, true)}
	default:
		p.IPs = []netip.Addr{st.addr(n, false), st.addr(n, true)}
	}
	for _, name := range genNamed[:4] {
		if g.r.IntN(3) == 0 {
			proto := map[string]uint8{"http": ProtoTCP, "dns": ProtoUDP, "metrics": ProtoTCP, "sctp": ProtoSCTP}[name]
			p.Ports = append(p.Ports, NamedPort{Name: name, Protocol: proto, Port: uint16(genPorts[g.r.IntN(len(genPorts))])})
		}
	}
	return p
}

// contested are the contested addresses, sorted.
func (st *incSteps) contested() []netip.Addr {
	return slices.SortedFunc(func(yield func(netip.Addr) bool) {
		for a := range st.inc.contested {
			if !yield(a) {
				return
			}
		}
	}, netip.Addr.Compare)
}

// step makes one random change.
func (st *incSteps) step() string {
	g, inc := st.g, st.inc
	op := g.r.IntN(100)
	var what string
	switch {
	case op < 30:
		p := st.randomPod()
		what = "set pod " + p.Key()
		inc.SetPod(p)
	case op < 38:
		if keys := st.podKeys(); len(keys) > 0 {
			k := keys[g.r.IntN(len(keys))]
			ns, name, _ := strings.Cut(k, "/")
			what = "delete pod " + k
			inc.DeletePod(ns, name)
		}
	case op < 46: // relabel a pod, nothing else
		if keys := st.podKeys(); len(keys) > 0 {
			k := keys[g.r.IntN(len(keys))]
			p := *g.s.pods[k]
			p.Labels = map[string]string{"app": g.pick(genApps), "role": g.pick(genRoles)}
			what = "relabel pod " + k
			inc.SetPod(p)
		}
	case op < 52:
		l := map[string]string{}
		if g.r.IntN(3) > 0 {
			l["team"] = g.pick(genTeams)
		}
		if g.r.IntN(2) == 0 {
			l["env"] = g.pick([]string{"prod", "dev"})
		}
		ns := g.pick(g.nsNames)
		what = "namespace " + ns
		if g.r.IntN(8) == 0 {
			inc.DeleteNamespace(ns)
		} else {
			inc.SetNamespace(Namespace{Name: ns, Labels: l})
		}
	case op < 66:
		p := g.policy(g.r.IntN(20))
		what = "set policy " + p.Namespace + "/" + p.Name
		_ = inc.SetPolicy(p)
	case op < 72:
		if len(g.s.policies) > 0 {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range g.s.policies {
					if !yield(k) {
						return
					}
				}
			})
			k := keys[g.r.IntN(len(keys))]
			ns, name, _ := strings.Cut(k, "/")
			what = "delete policy " + k
			inc.DeletePolicy(ns, name)
		}
	case op < 80:
		c := g.cnp(g.r.IntN(8))
		what = "set cnp " + c.Name
		_ = inc.SetClusterPolicy(c)
	case op < 84:
		name := fmt.Sprintf("cnp%d", g.r.IntN(8))
		what = "delete cnp " + name
		inc.DeleteClusterPolicy(name)
	case op < 88:
		i := g.r.IntN(len(g.nodeObjs))
		n := g.nodeObjs[i].DeepCopy()
		n.Labels = map[string]string{"role": g.pick([]string{"control", "worker"}), "zone": g.pick([]string{"a", "b"})}
		what = "node " + n.Name
		if g.r.IntN(5) == 0 {
			inc.DeleteNode(n.Name)
		} else {
			inc.SetNode(FromNode(n))
		}
	case op < 90: // one holder, as a plugin's wait sets it
		a := st.addr(0, g.r.IntN(2) == 0)
		if cs := st.contested(); len(cs) > 0 && g.r.IntN(2) == 0 {
			a = cs[g.r.IntN(len(cs))]
		}
		key := ""
		if ks := st.podKeys(); len(ks) > 0 && g.r.IntN(4) > 0 {
			key = ks[g.r.IntN(len(ks))]
		}
		if ks := inc.claims[a]; len(ks) > 0 && g.r.IntN(2) == 0 {
			key = ks[g.r.IntN(len(ks))]
		}
		what = "holder " + a.String() + " " + key
		inc.SetHolder(a, key)
	case op < 93:
		h := map[netip.Addr]string{}
		keys := st.podKeys()
		for range g.r.IntN(6) {
			if len(keys) > 0 {
				h[st.addr(0, g.r.IntN(2) == 0)] = keys[g.r.IntN(len(keys))]
			}
		}
		// and the holder of a contested address, one of its claimants
		for _, a := range st.contested() {
			if ks := inc.claims[a]; g.r.IntN(2) == 0 {
				h[a] = ks[g.r.IntN(len(ks))]
			}
		}
		what = "holders"
		inc.SetHolders(h)
	case op < 95: // one pod's ports, as a plugin's wait sets them
		if keys := st.podKeys(); len(keys) > 0 {
			k := keys[g.r.IntN(len(keys))]
			var ps []LocalPort
			if g.r.IntN(3) > 0 {
				ps = []LocalPort{{Name: "pw" + k[len(k)-2:], Bridged: g.r.IntN(3) == 0}}
			}
			what = "podports " + k
			inc.SetPodPorts(k, ps)
		}
	case op < 98:
		ports := map[string][]LocalPort{}
		for _, k := range st.podKeys() {
			if p := g.s.pods[k]; p.Node == st.node && g.r.IntN(2) == 0 {
				ports[k] = []LocalPort{{Name: "pv" + k[len(k)-2:], Bridged: g.r.IntN(3) == 0}}
			}
		}
		what = "ports"
		inc.SetLocalPorts(ports)
	default:
		cidrs := g.cidrs[st.node]
		if g.r.IntN(2) == 0 {
			cidrs = cidrs[:1]
		}
		what = "cidrs"
		inc.SetLocalPodCIDRs(cidrs)
	}
	st.ops[strings.Fields(what + " x")[0]]++
	return what
}

// TestIncrementalMatchesCompile: thousands of random changes of pods
// (addresses shared and reused, terminating, hostNetwork, pending, moved
// between nodes), namespaces, NetworkPolicies, ClusterNetworkPolicies,
// Nodes, holders, ports and PodCIDRs; after each, the incremental
// Ruleset is the whole compile's, and its Delta leads there.
func TestIncrementalMatchesCompile(t *testing.T) {
	steps := 3000
	if testing.Short() {
		steps = 600
	}
	for seed := range uint64(3) {
		st := newIncSteps(t, 100+seed)
		for i := range steps {
			what := st.step()
			st.check(fmt.Sprintf("step %d (seed %d): %s", i, seed, what))
			if i%97 == 0 { // now and then several changes in one Flush
				for range 1 + st.g.r.IntN(5) {
					st.step()
				}
				st.check(fmt.Sprintf("step %d (seed %d): a batch", i, seed))
			}
		}
		t.Logf("seed %d: %d steps %v; %d pods, %d chains at the end", seed, steps, st.ops, len(st.last.Pods), len(st.last.Policies))
	}
}

// TestIncrementalReset: Reset after changes gives the Delta from what
// was last given to the whole compile.
func TestIncrementalReset(t *testing.T) {
	st := newIncSteps(t, 7)
	for range 200 {
		st.step()
	}
	st.inc.Reset()
	st.check("reset")
	if d := st.inc.Flush(); !d.Empty() {
		t.Fatalf("a Flush with nothing changed gave %+v", d)
	}
}

// TestIncrementalIDCollision: two keys with one short ID make the
// compile whole, and it still equals Compile.
func TestIncrementalIDCollision(t *testing.T) {
	st := newIncSteps(t, 9)
	// force a collision: claim the ID of a live pod for another key
	var id string
	for _, p := range st.last.Pods {
		id = p.ID
		break
	}
	if id == "" {
		t.Fatal("seed 9 gives no judged pod on n0")
	}
	st.inc.ids[id] = "someone/else"
	st.inc.dirtyPod[st.last.Pods[0].Namespace+"/"+st.last.Pods[0].Name] = true
	d := st.inc.Flush()
	if !st.inc.whole {
		t.Fatal("a collision did not make the compile whole")
	}
	want := st.g.s.Compile(st.node, st.inc.LocalPodCIDRs())
	if !sortedByID(st.last.With(d)).Equal(sortedByID(want)) {
		t.Fatalf("whole mode's Delta does not lead to the compile")
	}
	st.last = want
	for i := range 50 {
		st.check(fmt.Sprintf("whole step %d: %s", i, st.step()))
	}
}

// TestAddrRangeSet: random adds and drops (of both families, at the
// family's edges, counted more than once) keep the ranges of the
// addresses counted at least once, merged.
func TestAddrRangeSet(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	pool := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"),
		netip.MustParseAddr("::"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	for i := range 12 {
		pool = append(pool, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), netip.AddrFrom16([16]byte{0xfd, 15: byte(i)}))
	}
	s := addrRangeSetOf(nil)
	count := map[netip.Addr]int{}
	for step := range 20000 {
		a := pool[r.IntN(len(pool))]
		if r.IntN(2) == 0 {
			s.add(a)
			count[a]++
		} else {
			s.drop(a)
			if count[a] > 0 {
				count[a]--
			}
		}
		var in []netip.Addr
		for x, n := range count {
			if n > 0 {
				in = append(in, x)
			}
		}
		slices.SortFunc(in, netip.Addr.Compare)
		if want := addrRanges(in); !slices.Equal(s.ranges, want) {
			t.Fatalf("step %d: ranges %v, want %v", step, s.ranges, want)
		}
	}
}
