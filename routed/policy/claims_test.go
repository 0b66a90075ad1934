package policy

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
)

// TestClaimedAddress: two Pod objects claim one address (old, terminating,
// whose sandbox is gone, and new, which holds it now). The new pod gets
// the address, and so its own policy, on its node (where the IPAM record
// says so, even when the rule alone would not) and on every other node
// (by the rule: not terminating, then newer). The clash is reported, not
// decided silently; and namespace/name order, which decided before
// ("aaa-old" sorts first), decides nothing.
func TestClaimedAddress(t *testing.T) {
	addr := netip.MustParseAddr("10.244.1.7")
	t0 := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	mk := func(name string, created time.Time, terminating bool, role string) Pod {
		return Pod{Namespace: "shop", Name: name, Node: "n1", Labels: map[string]string{"role": role},
			IPs: []netip.Addr{addr}, Created: created, Terminating: terminating}
	}
	old := mk("aaa-old", t0, true, "open")
	young := mk("zzz-new", t0.Add(time.Minute), false, "locked")
	client := Pod{Namespace: "shop", Name: "client", Node: "n2", Labels: map[string]string{"role": "client"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.2.9")}}
	// "locked" pods take nothing; "open" ones everything
	deny := policy("shop", "deny-locked", map[string]string{"role": "locked"}, ptypes(networkingv1.PolicyTypeIngress))
	s := NewState()
	for _, p := range []Pod{old, young, client} {
		s.SetPod(p)
	}
	if err := s.SetPolicy(deny); err != nil {
		t.Fatal(err)
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	pods := func(rs Ruleset) []string {
		var out []string
		for _, p := range rs.Pods {
			if slices.Contains(p.Addrs, addr) {
				out = append(out, p.Namespace+"/"+p.Name)
			}
		}
		return out
	}
	// the pod's node, by the rule
	if got := pods(s.Compile("n1", cidrs)); !slices.Equal(got, []string{"shop/zzz-new"}) {
		t.Errorf("on the pod's node the address's chain is %v, want the new pod's (isolated by deny-locked)", got)
	}
	c := s.Clashes()
	if len(c) != 1 || c[0].Addr != addr || c[0].Winner != "shop/zzz-new" || c[0].ByHolder || !slices.Equal(c[0].Pods, []string{"shop/aaa-old", "shop/zzz-new"}) {
		t.Errorf("Clashes = %+v, want one for %s won by shop/zzz-new by the rule", c, addr)
	}
	// another node: client -> addr is judged as to the new pod (denied)
	m := NewMatcher(s.Compile("n1", cidrs))
	if m.Allows(netip.MustParseAddr("10.244.2.9"), addr, ProtoTCP, 80) {
		t.Errorf("client -> %s allowed: it is the new, isolated pod's address", addr)
	}
	// the holder decides on the pod's node, whatever the rule says: here
	// the IPAM record names the terminating pod (its sandbox is still up)
	s.SetHolders(map[netip.Addr]string{addr: "shop/aaa-old"})
	if got := pods(s.Compile("n1", cidrs)); len(got) != 0 {
		t.Errorf("with the record naming the old (open) pod, the address jumps to %v, want no chain", got)
	}
	if c := s.Clashes(); len(c) != 1 || c[0].Winner != "shop/aaa-old" || !c[0].ByHolder {
		t.Errorf("Clashes = %+v, want the holder shop/aaa-old by the node's record", c)
	}
	// order of arrival changes nothing
	s2 := NewState()
	for _, p := range []Pod{young, client, old} {
		s2.SetPod(p)
	}
	if err := s2.SetPolicy(deny); err != nil {
		t.Fatal(err)
	}
	if got := pods(s2.Compile("n1", cidrs)); !slices.Equal(got, []string{"shop/zzz-new"}) {
		t.Errorf("other arrival order: %v", got)
	}
}
