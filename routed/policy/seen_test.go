package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestUnseenPodChangesKeepTheIndex: SetPod and DeletePod of pods Compile
// does not see (not scheduled, finished, hostNetwork) report no change and
// keep the index; every other change reports one, a pod scheduled without
// an address (arriving) among them. Over random changes, the
// compiles that reuse the index equal compiles from scratch.
func TestUnseenPodChangesKeepTheIndex(t *testing.T) {
	g := newGen(7, 3, 5, 200, 40)
	s := g.s
	before := s.Compile("n0", g.cidrs["n0"])
	ix := s.ix
	pending := Pod{Namespace: "ns0", Name: "new", Labels: map[string]string{"app": "a"}}
	host := Pod{Namespace: "ns0", Name: "host", Node: "n0", HostNetwork: true, IPs: []netip.Addr{g.nodeIPs[0]}, Labels: map[string]string{"app": "a"}}
	for what, changed := range map[string]bool{
		"a pending pod added":           s.SetPod(pending),
		"a pending pod relabelled":      s.SetPod(Pod{Namespace: "ns0", Name: "new", Labels: map[string]string{"app": "b"}}),
		"a finished pod added":          s.SetPod(Pod{Namespace: "ns0", Name: "done", Node: "n0", Finished: true, Labels: map[string]string{"app": "a"}}),
		"a finished pod deleted":        s.DeletePod("ns0", "done"),
		"a hostNetwork pod added":       s.SetPod(host),
		"a hostNetwork pod deleted":     s.DeletePod("ns0", "host"),
		"an unknown pod deleted":        s.DeletePod("ns0", "nobody"),
		"a hostNetwork pod given no IP": s.SetPod(Pod{Namespace: "ns1", Name: "host2", HostNetwork: true}),
	} {
		if changed {
			t.Errorf("%s: SetPod/DeletePod reports a change", what)
		}
	}
	if s.ix != ix {
		t.Fatalf("the index was dropped by changes Compile does not see")
	}
	if after := s.Compile("n0", g.cidrs["n0"]); !after.Equal(before) {
		t.Fatalf("the Ruleset changed")
	}
	pending.Node = "n0"
	if !s.SetPod(pending) {
		t.Errorf("the pending pod scheduled (arriving): no change reported")
	}
	if s.ix != nil {
		t.Errorf("the index survived an arriving pod")
	}
	pending.IPs = []netip.Addr{netip.MustParseAddr("10.0.9.9")}
	if !s.SetPod(pending) {
		t.Errorf("the pending pod got an address: no change reported")
	}
	if s.ix != nil {
		t.Errorf("the index survived a pod that got an address")
	}
	if !s.DeletePod("ns0", "new") {
		t.Errorf("a pod with an address deleted: no change reported")
	}

	// random changes: whenever SetPod/DeletePod says nothing changed, the
	// index kept gives the Ruleset a fresh one does
	r := rand.New(rand.NewPCG(3, 3))
	for i := range 400 {
		p := Pod{Namespace: g.nsNames[r.IntN(len(g.nsNames))], Name: fmt.Sprintf("p%d", r.IntN(220)), Node: g.nodes[r.IntN(len(g.nodes))],
			Labels: map[string]string{"app": genApps[r.IntN(len(genApps))]}}
		switch r.IntN(4) {
		case 0:
			p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 3, byte(i >> 8), byte(i)})}
		case 1:
			p.HostNetwork, p.IPs = true, []netip.Addr{g.nodeIPs[0]}
		}
		if r.IntN(5) == 0 {
			s.DeletePod(p.Namespace, p.Name)
		} else {
			s.SetPod(p)
		}
		node := g.nodes[r.IntN(len(g.nodes))]
		kept := s.Compile(node, g.cidrs[node])
		s.ix = nil
		if fresh := s.Compile(node, g.cidrs[node]); !fresh.Equal(kept) {
			t.Fatalf("change %d (%+v): the Ruleset compiled on the kept index differs from a fresh one", i, p)
		}
	}
}
