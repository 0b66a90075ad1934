package policy

import (
	"net/netip"
	"testing"
)

// TestCNPChainIDNoClash: a NetworkPolicy "foo" in namespace "cnp" and a
// ClusterNetworkPolicy "foo" both select a pod of the node. Their chain
// keys ("cnp/foo/ingress") are the same string, so idSet hands both the
// same ID: the Ruleset has two chains with one ID, and the Matcher (and the
// kernel table) keeps one of them, the NetworkPolicy then judging with the
// ClusterNetworkPolicy's rules.
func TestCNPChainIDNoClash(t *testing.T) {
	s := cnpTestState()
	s.SetNamespace(Namespace{Name: "cnp"})
	s.SetPod(Pod{Namespace: "cnp", Name: "w", Node: "n1", Labels: map[string]string{"app": "w"}, IPs: []netip.Addr{a("10.0.1.50")}})
	// the NetworkPolicy allows ingress from team b only
	if err := s.SetPolicy(policy("cnp", "foo", nil, ingress(nil, nsPeer(sel("team", "b"))))); err != nil {
		t.Fatal(err)
	}
	// the ClusterNetworkPolicy Passes everything from everywhere
	if err := s.SetClusterPolicy(cnpol("foo", admin, 0, subjNS(sel()), cin(pass, "", nil, cNS(sel())))); err != nil {
		t.Fatal(err)
	}
	rs := s.Compile("n1", nodeCIDRs["n1"])
	checkRuleset(t, rs) // duplicate ID
	for _, f := range []struct {
		src  string
		want bool
	}{{"10.0.2.2", true}, {"10.0.2.3", false}} { // y/a (team b), z/c (team c)
		if got := clusterAllows(s, nodeCIDRs, a(f.src), a("10.0.1.50"), tcp, 80); got != f.want {
			t.Errorf("%s -> cnp/w: compiled %v, want %v (Explain %v)", f.src, got, f.want, s.Explain(a(f.src), a("10.0.1.50"), tcp, 80).Allowed)
		}
	}
}

// TestCNPRefusedTierDoesNotOpen: a Baseline policy whose tier is misspelt
// ("baseline") is refused and judged in the Admin tier. Its Accept rule
// then overrides the NetworkPolicy that isolates the pod: the refused
// policy allows what it could not allow in either valid tier (a Baseline
// Accept never overrides a NetworkPolicy). Fail closed would be: the
// refused policy's Accept rules match nothing and its Pass rules deny
// (what the API asks of an unreadable rule), or the policy is judged in
// the Baseline tier when its rules are all Accept.
func TestCNPRefusedTierDoesNotOpen(t *testing.T) {
	s := cnpTestState()
	if err := s.SetPolicy(policy("x", "deny", nil)); err != nil {
		t.Fatal(err)
	}
	if s.SetClusterPolicy(cnpol("typo", "baseline", 10, subjNS(sel()), cin(accept, "", nil, cNS(sel())))) == nil {
		t.Fatal("tier baseline accepted")
	}
	if clusterAllows(s, nodeCIDRs, a("10.0.2.2"), a("10.0.1.1"), tcp, 80) {
		t.Errorf("y/a -> x/a allowed: the refused policy's Accept overrides x's deny-all NetworkPolicy")
	}
}

// TestCNPRefusedSubjectDoesNotOpen: an Admin policy with an unreadable
// subject applies to every pod (right for its Deny rules), so its Accept
// rule accepts, for every pod of the cluster, what their NetworkPolicies
// deny; and its Pass rule skips the Admin Deny that follows for every pod.
// Fail closed would keep the Deny rules on every pod and turn the Accept
// rules into "match nothing" and the Pass rules into Deny.
func TestCNPRefusedSubjectDoesNotOpen(t *testing.T) {
	s := cnpTestState()
	if err := s.SetPolicy(policy("x", "deny", nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetClusterPolicy(cnpol("deny-c", admin, 20, subjNS(sel()), cin(deny, "", nil, cNS(sel("team", "c"))))); err != nil {
		t.Fatal(err)
	}
	broken := cnpol("broken", admin, 10, subjNS(badSel()),
		cin(accept, "", nil, cNS(sel("team", "b"))),
		cin(pass, "", nil, cNS(sel("team", "c"))))
	if s.SetClusterPolicy(broken) == nil {
		t.Fatal("bad subject accepted")
	}
	if clusterAllows(s, nodeCIDRs, a("10.0.2.2"), a("10.0.1.1"), tcp, 80) {
		t.Errorf("y/a -> x/a allowed: the refused subject's Accept overrides x's deny-all NetworkPolicy")
	}
	if clusterAllows(s, nodeCIDRs, a("10.0.2.3"), a("10.0.2.2"), tcp, 80) {
		t.Errorf("z/c -> y/a allowed: the refused subject's Pass skips deny-c")
	}
}
