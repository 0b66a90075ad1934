package policynft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestArrivingPodAddsNoVerdict: a pod judged by its routed port, written
// before it has addresses (what the engine does once its Pod object is
// scheduled to the node), then given them (its ADD's wait): the second
// write adds set elements only, no verdict map element and no rule, so
// the kernel does not validate the whole table at its commit; the verdict
// maps by address never hold the pod, the hairpin sets hold its port and
// addresses; and the pod is judged by its policy from its first packet.
func TestArrivingPodAddsNoVerdict(t *testing.T) {
	e := newEnv(t, "a", "b")
	a, b := e.pods["a"], e.pods["b"]
	for _, port := range []int{8080, 8081} {
		server(t, a.ns, port)
	}
	full := e.withPorts(trafficRulesetAB(e)) // a isolated, b -> a tcp 8080
	if !slices.Equal(full.Pods[0].Ports, []string{"pna"}) {
		t.Fatalf("a's ports %v, want pna", full.Pods[0].Ports)
	}
	arriving := full
	arriving.Known = []netip.Addr{b.v4, b.v6}
	arriving.Pods = slices.Clone(full.Pods)
	arriving.Pods[0].Addrs = nil
	e.apply(arriving)
	st := e.apply(full)
	if st.Full || st.Verdicts != 0 || st.Chains != 0 || st.Sets != 0 || st.Elements == 0 {
		t.Errorf("a's addresses came with %+v, want set elements only", st)
	}
	for _, m := range []string{"ingress4", "ingress6"} {
		if out := e.nft("list", "map", "inet", "podnet-policy", m); strings.Contains(out, "jump") {
			t.Errorf("%s holds an element for a pod judged by its port:\n%s", m, out)
		}
	}
	if out := e.nft("list", "set", "inet", "podnet-policy", "hairpin4"); !strings.Contains(out, fmt.Sprintf(`"pna" . %s`, a.v4)) {
		t.Errorf("hairpin4 lacks pna . %s:\n%s", a.v4, out)
	}
	runChecks(t, []check{
		{"b->a tcp:8080", true, func() error { return flow(b.ns, "tcp", a.v4, 8080) }},
		{"IPv6 b->a tcp:8080", true, func() error { return flow(b.ns, "tcp", a.v6, 8080) }},
		{"b->a tcp:8081", false, func() error { return flow(b.ns, "tcp", a.v4, 8081) }},
		{"IPv6 b->a tcp:8081", false, func() error { return flow(b.ns, "tcp", a.v6, 8081) }},
	})
	// and back: the addresses go (the pod's DEL, its Pod object still
	// there), set elements only again
	if st := e.apply(arriving); st.Full || st.Verdicts != 0 || st.Chains != 0 || st.Sets != 0 {
		t.Errorf("a's addresses went with %+v, want set elements only", st)
	}
}
