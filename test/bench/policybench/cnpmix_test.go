//go:build bench

package policybench

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// clusterPolicies are n ClusterNetworkPolicies (at least the 4 fixed
// ones) of a platform team, in both tiers, priorities over 0-1000, most
// selecting every pod so that every local pod's tier chains are long:
//
//   - deny-cloud-metadata (Admin 10): no egress to 169.254.169.254/32;
//   - pass-intra-cluster (Admin 900): ingress from and egress to every
//     pod passed to the namespace owners' NetworkPolicies; it is what
//     decides cli -> srv in the Admin tier, after the walk of the Admin
//     policies before it;
//   - baseline-egress (Baseline 100): no SSH to 10.0.0.0/8, nothing to
//     172.16.0.0/16;
//   - baseline-isolate-teams (Baseline 800): the bns-* namespaces closed
//     to the other teams' namespaces;
//   - the rest varied (clusterPolicy).
//
// None changes the verdict of the measured flows: cli -> srv passes to
// the NetworkPolicy tier (web-allow-cli, cli-egress-web); probe-cli ->
// probe-srv too (bench's deny-all, allow-probe), cli's and probe-cli's
// Baseline egress rules match neither srv's address nor its ports.
func clusterPolicies(n int) []*cnpv1.ClusterNetworkPolicy {
	all := &metav1.LabelSelector{}
	out := []*cnpv1.ClusterNetworkPolicy{
		cnp("deny-cloud-metadata", cnpv1.AdminTier, 10, cnpv1.ClusterNetworkPolicySubject{Namespaces: all}, nil,
			[]cnpv1.ClusterNetworkPolicyEgressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1.CIDR{"169.254.169.254/32"}}}}}),
		cnp(passIntra, cnpv1.AdminTier, 900, cnpv1.ClusterNetworkPolicySubject{Namespaces: all},
			[]cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionPass,
				From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: all}}}},
			[]cnpv1.ClusterNetworkPolicyEgressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionPass,
				To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Namespaces: all}}}}),
		cnp("baseline-egress", cnpv1.BaselineTier, 100, cnpv1.ClusterNetworkPolicySubject{Namespaces: all}, nil,
			[]cnpv1.ClusterNetworkPolicyEgressRule{
				{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny, To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1.CIDR{"10.0.0.0/8"}}},
					Protocols: []cnpv1.ClusterNetworkPolicyProtocol{tcpCNP(22, 0)}},
				{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny, To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1.CIDR{"172.16.0.0/16"}}}},
			}),
		cnp("baseline-isolate-teams", cnpv1.BaselineTier, 800, cnpv1.ClusterNetworkPolicySubject{Namespaces: teams()},
			[]cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "team", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"t0", "t1", "t2"}}}}}}}}, nil),
	}
	for k := 0; len(out) < n; k++ {
		out = append(out, clusterPolicy(k))
	}
	return out
}

// clusterPolicy is the k-th varied ClusterNetworkPolicy, priority
// (k*97+13)%1001, of one of 8 kinds (k%8); all but kind 3 select every
// pod (kind 5 the bench namespace and one team's), and none matches
// srv's, cli's or the probes' addresses as peers:
//
//	0 Admin Deny ingress from one app's pods of a team's namespaces;
//	1 Admin Accept ingress from a team's backends on the named port metrics;
//	2 Admin Deny egress to 10.<k%200>.0.0/16 and an IPv6 /32;
//	3 Admin Accept egress of a team's frontends to another team's backends on 8080;
//	4 Admin Pass egress to a team's namespaces on TCP 443;
//	5 Admin Deny ingress from one bns namespace's v2 pods, UDP 5353 and TCP 30000-32767;
//	6 Baseline Deny ingress from a team's namespaces;
//	7 Baseline Accept egress to 192.168.<k%256>.0/24 on 5432, Deny to 172.31.<k%256>.0/24.
func clusterPolicy(k int) *cnpv1.ClusterNetworkPolicy {
	all := cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}
	team := sel("team", fmt.Sprintf("t%d", k%3))
	prio := int32((k*97 + 13) % 1001)
	name := fmt.Sprintf("cnp-%d", k)
	deny, accept, pass := cnpv1.ClusterNetworkPolicyRuleActionDeny, cnpv1.ClusterNetworkPolicyRuleActionAccept, cnpv1.ClusterNetworkPolicyRuleActionPass
	in := func(a cnpv1.ClusterNetworkPolicyRuleAction, peer cnpv1.ClusterNetworkPolicyIngressPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) []cnpv1.ClusterNetworkPolicyIngressRule {
		return []cnpv1.ClusterNetworkPolicyIngressRule{{Action: a, From: []cnpv1.ClusterNetworkPolicyIngressPeer{peer}, Protocols: protos}}
	}
	eg := func(a cnpv1.ClusterNetworkPolicyRuleAction, peer cnpv1.ClusterNetworkPolicyEgressPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) cnpv1.ClusterNetworkPolicyEgressRule {
		return cnpv1.ClusterNetworkPolicyEgressRule{Action: a, To: []cnpv1.ClusterNetworkPolicyEgressPeer{peer}, Protocols: protos}
	}
	switch k % 8 {
	case 0:
		return cnp(name, cnpv1.AdminTier, prio, all, in(deny, cnpv1.ClusterNetworkPolicyIngressPeer{Pods: &cnpv1.NamespacedPod{
			NamespaceSelector: *team, PodSelector: *sel("app", fmt.Sprintf("a%d", k%fakeApps))}}), nil)
	case 1:
		return cnp(name, cnpv1.AdminTier, prio, all, in(accept, cnpv1.ClusterNetworkPolicyIngressPeer{Pods: &cnpv1.NamespacedPod{
			NamespaceSelector: *team, PodSelector: *sel("tier", "backend")}}, cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: "metrics"}), nil)
	case 2:
		return cnp(name, cnpv1.AdminTier, prio, all, nil, []cnpv1.ClusterNetworkPolicyEgressRule{eg(deny, cnpv1.ClusterNetworkPolicyEgressPeer{
			Networks: []cnpv1.CIDR{cnpv1.CIDR(fmt.Sprintf("10.%d.0.0/16", k%200)), cnpv1.CIDR(fmt.Sprintf("fd00:%x::/32", k))}})})
	case 3:
		subj := cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *team, PodSelector: *sel("tier", "frontend")}}
		return cnp(name, cnpv1.AdminTier, prio, subj, nil, []cnpv1.ClusterNetworkPolicyEgressRule{eg(accept, cnpv1.ClusterNetworkPolicyEgressPeer{
			Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("team", fmt.Sprintf("t%d", (k+1)%3)), PodSelector: *sel("tier", "backend")}}, tcpCNP(8080, 0))})
	case 4:
		return cnp(name, cnpv1.AdminTier, prio, all, nil, []cnpv1.ClusterNetworkPolicyEgressRule{eg(pass, cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: team}, tcpCNP(443, 0))})
	case 5:
		subj := cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"bench", fmt.Sprintf("t%d", k%3)}}}}}
		udp := cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnpv1.Port{Number: 5353}}}
		return cnp(name, cnpv1.AdminTier, prio, subj, in(deny, cnpv1.ClusterNetworkPolicyIngressPeer{Pods: &cnpv1.NamespacedPod{
			NamespaceSelector: *sel("kubernetes.io/metadata.name", fmt.Sprintf("bns-%d", k%fakeNSCount)), PodSelector: *sel("version", "v2")}},
			udp, tcpCNP(30000, 32767)), nil)
	case 6:
		return cnp(name, cnpv1.BaselineTier, prio, all, in(deny, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: team}), nil)
	default:
		return cnp(name, cnpv1.BaselineTier, prio, all, nil, []cnpv1.ClusterNetworkPolicyEgressRule{
			eg(accept, cnpv1.ClusterNetworkPolicyEgressPeer{Networks: []cnpv1.CIDR{cnpv1.CIDR(fmt.Sprintf("192.168.%d.0/24", k%256))}}, tcpCNP(5432, 0)),
			eg(deny, cnpv1.ClusterNetworkPolicyEgressPeer{Networks: []cnpv1.CIDR{cnpv1.CIDR(fmt.Sprintf("172.31.%d.0/24", k%256))}}),
		})
	}
}

func cnp(name string, tier cnpv1.Tier, prio int32, subj cnpv1.ClusterNetworkPolicySubject,
	in []cnpv1.ClusterNetworkPolicyIngressRule, eg []cnpv1.ClusterNetworkPolicyEgressRule) *cnpv1.ClusterNetworkPolicy {
	for i := range in {
		in[i].Name = fmt.Sprintf("in-%d", i)
	}
	for i := range eg {
		eg[i].Name = fmt.Sprintf("eg-%d", i)
	}
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subj, Ingress: in, Egress: eg},
	}
}

// tcpCNP is TCP to port, or to the range port-end when end > 0.
func tcpCNP(port, end int32) cnpv1.ClusterNetworkPolicyProtocol {
	p := &cnpv1.Port{Number: port}
	if end > 0 {
		p = &cnpv1.Port{Range: &cnpv1.PortRange{Start: port, End: end}}
	}
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: p}}
}

// teams selects the bns-* namespaces (team t0, t1 or t2).
func teams() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"t0", "t1", "t2"}}}}
}
