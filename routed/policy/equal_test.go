package policy

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// TestRulesetEqual: Equal finds every kind of change of a compiled
// Ruleset, and a field added to the Ruleset's types without Equal knowing
// it fails here.
func TestRulesetEqual(t *testing.T) {
	for typ, fields := range map[reflect.Type]int{
		reflect.TypeFor[Ruleset]():     7,
		reflect.TypeFor[PodChains]():   12,
		reflect.TypeFor[PolicyChain](): 7,
		reflect.TypeFor[Rule]():        6,
	} {
		if typ.NumField() != fields {
			t.Errorf("%s has %d fields, Equal compares %d: teach Equal the new ones", typ, typ.NumField(), fields)
		}
	}
	g := newGen(42, 1, 4, 60, 20)
	rs := g.s.Compile("n0", g.cidrs["n0"])
	if len(rs.Pods) == 0 || len(rs.Policies) == 0 || len(rs.Policies[0].Rules) == 0 {
		t.Fatalf("the generated Ruleset is too small to test: %d pods, %d policies", len(rs.Pods), len(rs.Policies))
	}
	g.s.ix = nil
	if again := g.s.Compile("n0", g.cidrs["n0"]); !rs.Equal(again) || !reflect.DeepEqual(rs, again) {
		t.Fatalf("two compiles of one state differ")
	}
	clone := func() Ruleset {
		c := rs
		c.LocalPodCIDRs, c.Known = slices.Clone(rs.LocalPodCIDRs), slices.Clone(rs.Known)
		c.Ports, c.BridgePorts = slices.Clone(rs.Ports), slices.Clone(rs.BridgePorts)
		c.Pods = slices.Clone(rs.Pods)
		for i := range c.Pods {
			p := &c.Pods[i]
			p.Addrs, p.Ingress, p.Egress = slices.Clone(p.Addrs), slices.Clone(p.Ingress), slices.Clone(p.Egress)
			p.Ports, p.BridgePorts = slices.Clone(p.Ports), slices.Clone(p.BridgePorts)
			for d := range 2 {
				p.Admin[d], p.Baseline[d] = slices.Clone(p.Admin[d]), slices.Clone(p.Baseline[d])
			}
		}
		c.Policies = slices.Clone(rs.Policies)
		for i := range c.Policies {
			p := &c.Policies[i]
			p.Rules = slices.Clone(p.Rules)
			for j := range p.Rules {
				p.Rules[j].Peers, p.Rules[j].Ports = slices.Clone(p.Rules[j].Peers), slices.Clone(p.Rules[j].Ports)
			}
		}
		return c
	}
	a := netip.MustParseAddr("10.99.0.1")
	for name, change := range map[string]func(*Ruleset){
		"PodCIDR":           func(r *Ruleset) { r.LocalPodCIDRs = append(r.LocalPodCIDRs, netip.MustParsePrefix("10.99.0.0/24")) },
		"known address":     func(r *Ruleset) { r.Known = append(r.Known, a) },
		"host veth":         func(r *Ruleset) { r.Ports = append(r.Ports, "pnx") },
		"bridge port":       func(r *Ruleset) { r.BridgePorts = append(r.BridgePorts, "pnx") },
		"bridge unfiltered": func(r *Ruleset) { r.BridgeUnfiltered = !r.BridgeUnfiltered },
		"pod port":          func(r *Ruleset) { r.Pods[0].Ports = append(r.Pods[0].Ports, "pnx") },
		"pod bridge port":   func(r *Ruleset) { r.Pods[0].BridgePorts = append(r.Pods[0].BridgePorts, "pnx") },
		"pod gone":          func(r *Ruleset) { r.Pods = r.Pods[1:] },
		"pod ID":            func(r *Ruleset) { r.Pods[0].ID += "x" },
		"pod namespace":     func(r *Ruleset) { r.Pods[0].Namespace += "x" },
		"pod name":          func(r *Ruleset) { r.Pods[0].Name += "x" },
		"pod address":       func(r *Ruleset) { r.Pods[0].Addrs = append(r.Pods[0].Addrs, a) },
		"ingress isolated":  func(r *Ruleset) { r.Pods[0].IngressIsolated = !r.Pods[0].IngressIsolated },
		"ingress jumps":     func(r *Ruleset) { r.Pods[0].Ingress = append(r.Pods[0].Ingress, "x") },
		"egress isolated":   func(r *Ruleset) { r.Pods[0].EgressIsolated = !r.Pods[0].EgressIsolated },
		"egress jumps":      func(r *Ruleset) { r.Pods[0].Egress = append(r.Pods[0].Egress, "x") },
		"admin ingress":     func(r *Ruleset) { r.Pods[0].Admin[0] = append(r.Pods[0].Admin[0], "x") },
		"admin egress":      func(r *Ruleset) { r.Pods[0].Admin[1] = append(r.Pods[0].Admin[1], "x") },
		"baseline ingress":  func(r *Ruleset) { r.Pods[0].Baseline[0] = append(r.Pods[0].Baseline[0], "x") },
		"baseline egress":   func(r *Ruleset) { r.Pods[0].Baseline[1] = append(r.Pods[0].Baseline[1], "x") },
		"tier":              func(r *Ruleset) { r.Policies[0].Tier = TierAdmin },
		"priority":          func(r *Ruleset) { r.Policies[0].Priority++ },
		"action":            func(r *Ruleset) { r.Policies[0].Rules[0].Action = ActionDeny },
		"rule name":         func(r *Ruleset) { r.Policies[0].Rules[0].Name += "x" },
		"policy gone":       func(r *Ruleset) { r.Policies = r.Policies[1:] },
		"policy ID":         func(r *Ruleset) { r.Policies[0].ID += "x" },
		"policy namespace":  func(r *Ruleset) { r.Policies[0].Namespace += "x" },
		"policy name":       func(r *Ruleset) { r.Policies[0].Name += "x" },
		"direction":         func(r *Ruleset) { r.Policies[0].Direction += "x" },
		"rule gone":         func(r *Ruleset) { r.Policies[0].Rules = r.Policies[0].Rules[1:] },
		"any peer":          func(r *Ruleset) { r.Policies[0].Rules[0].AnyPeer = !r.Policies[0].Rules[0].AnyPeer },
		"any port":          func(r *Ruleset) { r.Policies[0].Rules[0].AnyPort = !r.Policies[0].Rules[0].AnyPort },
		"peer":              func(r *Ruleset) { r.Policies[0].Rules[0].Peers = append(r.Policies[0].Rules[0].Peers, Range{a, a}) },
		"port": func(r *Ruleset) {
			r.Policies[0].Rules[0].Ports = append(r.Policies[0].Rules[0].Ports, PortRange{Range{a, a}, ProtoTCP, 1, 2})
		},
	} {
		c := clone()
		if !rs.Equal(c) {
			t.Fatalf("%s: a clone is not Equal", name)
		}
		change(&c)
		if rs.Equal(c) || c.Equal(rs) {
			t.Errorf("%s changed: Equal still says true", name)
		}
		// which addresses and ports are known, and the bridge's
		// state, change no chain: no connection's verdict in the
		// conntrack revocation's terms
		chains := !slices.Contains([]string{"PodCIDR", "known address", "host veth", "bridge port", "bridge unfiltered"}, name)
		if rs.ChainsEqual(c) == chains {
			t.Errorf("%s changed: ChainsEqual = %v", name, !chains)
		}
	}
	// nil and empty lists make the same table
	empty := Ruleset{Known: []netip.Addr{}, Pods: []PodChains{}}
	if !empty.Equal(Ruleset{}) {
		t.Errorf("an empty Ruleset with empty lists is not Equal to the zero one")
	}
}
