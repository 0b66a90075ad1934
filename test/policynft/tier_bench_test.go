package policynft

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// tierScaleRuleset is scaleRuleset with cnps ClusterNetworkPolicies (2
// rules each, Admin and Baseline alternating, both directions) selecting
// every pod.
func tierScaleRuleset(pods, policies, cnps int) policy.Ruleset {
	return withTiers(scaleRuleset(1, pods, policies), cnps, func(policy.PodChains) bool { return true })
}

// withTiers is rs with cnps ClusterNetworkPolicies (tierPolicy: Admin and
// Baseline alternating, both directions) selecting the pods sel says.
func withTiers(rs policy.Ruleset, cnps int, sel func(policy.PodChains) bool) policy.Ruleset {
	rs.Policies = slices.Clone(rs.Policies)
	rs.Pods = slices.Clone(rs.Pods)
	for i := range cnps {
		tier := policy.TierAdmin
		if i%2 == 1 {
			tier = policy.TierBaseline
		}
		for d, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			rs.Policies = append(rs.Policies, tierPolicy(i, tier, dir, 0))
			for j := range rs.Pods {
				p := &rs.Pods[j]
				if !sel(*p) {
					continue
				}
				id := fmt.Sprintf("c%d-%s", i, dir)
				if tier == policy.TierAdmin {
					p.Admin[d] = append(slices.Clone(p.Admin[d]), id)
				} else {
					p.Baseline[d] = append(slices.Clone(p.Baseline[d]), id)
				}
			}
		}
	}
	return rs
}

func tierPolicy(i int, tier policy.Tier, d policy.Direction, extra int) policy.PolicyChain {
	peer := netip.AddrFrom4([4]byte{10, 99, byte(i), byte(extra)})
	return policy.PolicyChain{ID: fmt.Sprintf("c%d-%s", i, d), Name: fmt.Sprintf("c%d", i), Direction: d, Tier: tier, Priority: int32(i),
		Rules: []policy.Rule{
			{Action: policy.ActionDeny, Peers: []policy.Range{one(peer)}, Ports: port(policy.ProtoTCP, 22, 22)},
			{Action: policy.ActionPass, Peers: []policy.Range{{From: netip.MustParseAddr("10.64.0.0"), To: netip.MustParseAddr("10.64.255.255")}}, AnyPort: true},
		}}
}

// BenchmarkApplyTiers: a node of 200 pods, 1,000 NetworkPolicies and 100
// ClusterNetworkPolicies selecting every pod. "cnp-added" adds one more
// to every pod's Admin lists (and takes it away again: two writes per
// loop); "cnp-peer" changes one's peers (elements only).
func BenchmarkApplyTiers(b *testing.B) {
	node := nettest.NewNetNS(b)
	w := &nft.Writer{}
	b.Cleanup(w.Close)
	rs := tierScaleRuleset(200, 1000, 100)
	nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
	b.Run("cnp-added", func(b *testing.B) {
		next := rs
		next.Policies = slices.Clone(rs.Policies)
		for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
			next.Policies = append(next.Policies, tierPolicy(999, policy.TierAdmin, d, 0))
		}
		next.Pods = slices.Clone(rs.Pods)
		for j := range next.Pods {
			p := &next.Pods[j]
			for d, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
				p.Admin[d] = append(slices.Clone(p.Admin[d]), fmt.Sprintf("c999-%s", dir))
			}
		}
		for b.Loop() {
			var st1, st2 nft.Stats
			nettest.Do(b, node, func() error { var err error; st1, err = w.Apply(next); return err })
			nettest.Do(b, node, func() error { var err error; st2, err = w.Apply(rs); return err })
			b.ReportMetric(float64(st1.Chains+st2.Chains)/2, "chains/write")
		}
	})
	b.Run("cnp-peer", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			next := rs
			next.Policies = slices.Clone(rs.Policies)
			for k, p := range next.Policies {
				if p.ID == "c4-ingress" {
					next.Policies[k] = tierPolicy(4, policy.TierAdmin, policy.Ingress, i%200+1)
				}
			}
			nettest.Do(b, node, func() error { _, err := w.Apply(next); return err })
		}
	})
}
