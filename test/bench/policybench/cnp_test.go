//go:build bench

package policybench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/test/cluster"
)

// cnpScale is the admin tier (issue 33): the last count of
// NetworkPolicies again, with ClusterNetworkPolicies beside them.
type cnpScale struct {
	Policies        int `json:"policies"`
	ClusterPolicies int `json:"cluster_policies"`
	// SetupS: the last create of them all -> enforced and held by both
	// nodes' engines
	SetupS float64 `json:"setup_s"`
	// ClusterRefused: podnet_policy_cluster_refused on node 1 (0: every
	// one of them read whole)
	ClusterRefused float64 `json:"cluster_refused"`
	IsolatedPods   float64 `json:"isolated_pods"`
	TableLines     int     `json:"table_lines"`
	TableBytes     int     `json:"table_bytes"`
	TableSets      int     `json:"table_sets"`
	TableChains    int     `json:"table_chains"`
	// SrvAdmin: the rules of the Admin tier chain srv's ingress chain
	// (node 1) jumps to that the first packet cli -> srv walks, up to and
	// including the Pass of pass-intra-cluster, and the chain's rules;
	// CliAdmin: the same in cli's egress chain on node 2
	SrvAdmin [2]int `json:"srv_admin"`
	CliAdmin [2]int `json:"cli_admin"`
	// Phases: 0 policies vs Policies + ClusterPolicies, in pairs
	Phases []phase `json:"phases"`
	// Swap: the same two arms by table swaps, finely alternated
	Swap *swapArms `json:"swap,omitempty"`
	// Flips: quarantine-probe, an Admin Deny ClusterNetworkPolicy of
	// probe-cli -> probe-srv, created (refused) and deleted (allowed)
	// while allow-probe allows the flow
	Flips []flip `json:"flips"`
	// RevocationMs: quarantine-probe created -> send time of the
	// established stream's first line never echoed; -1: kept echoing
	RevocationMs           []float64 `json:"revocation_ms"`
	IncrementalApplyCount  float64   `json:"incremental_apply_count"`
	IncrementalApplyMeanMs float64   `json:"incremental_apply_mean_ms"`
	Repairs                float64   `json:"repairs"`
	AttachMs               []float64 `json:"attach_ms"`
}

// The Admin policy that passes cli -> srv (and every pod-to-pod flow)
// to the NetworkPolicy tier, and the one the flips and revocations
// create and delete.
const (
	passIntra  = "pass-intra-cluster"
	quarantine = "quarantine-probe"
)

// cnpScale runs the admin phase: 0 vs pols + cnps, the Admin tier's walk,
// enforcement of an Admin Deny created and deleted, revocation by it, the
// attach. pols and cnps are in place when it returns.
func (b *bench) cnpScale(pols []*networkingv1.NetworkPolicy, cnps []*cnpv1.ClusterNetworkPolicy, rounds, revokes int) *cnpScale {
	t, ctx, n1 := b.t, b.ctx, b.n1
	cs := &cnpScale{Policies: len(pols), ClusterPolicies: len(cnps)}
	cs.Phases = b.phases(pols, cnps, &cs.SetupS)
	cs.Swap = b.swap(len(pols), len(cnps), envInt("PODNET_BENCH_POLICY_SWAP_ROUNDS", 60), envInt("PODNET_BENCH_POLICY_SWAP_BATCHES", 16), envInt("PODNET_BENCH_POLICY_SWAP_BATCH", 50), envInt("PODNET_BENCH_POLICY_SWAP_WARM", 10), envInt("PODNET_BENCH_POLICY_SWAP_SEGMENTS", 8), time.Duration(envInt("PODNET_BENCH_POLICY_SWAP_SEGMENT_MS", 250))*time.Millisecond)
	if body, err := n1.MetricsText(); err == nil {
		cs.IsolatedPods, _ = cluster.Metric(body, "podnet_policy_isolated_pods")
		cs.ClusterRefused, _ = cluster.Metric(body, "podnet_policy_cluster_refused")
	}
	cs.TableLines, cs.TableBytes, cs.TableSets, cs.TableChains = tableStats(n1)
	cs.SrvAdmin = adminWalk(t, n1, b.srv, policy.Ingress)
	cs.CliAdmin = adminWalk(t, b.n2, b.cli, policy.Egress)
	t.Logf("%d policies + %d cluster policies: table %d lines, %d chains; refused %.0f; srv's first packet walks %d of the %d rules of its Admin chain (node 1 ingress), cli's %d of %d (node 2 egress)",
		len(pols), len(cnps), cs.TableLines, cs.TableChains, cs.ClusterRefused, cs.SrvAdmin[0], cs.SrvAdmin[1], cs.CliAdmin[0], cs.CliAdmin[1])

	// allow-probe in place: the probe flow is allowed but for the Admin
	// Deny
	b.must(b.c.CreatePolicy(ctx, allowProbePolicy()))
	waitVerdict(t, b.probeCli.NS, b.probeAddr, true, 30*time.Second)
	applyBefore := applyStats(n1)
	create := func() error { return b.c.CreateClusterPolicy(ctx, quarantineProbe()) }
	del := func() error { return b.c.DeleteClusterPolicy(ctx, quarantine) }
	// two flips a round: as many rounds as the NetworkPolicy flips' 4
	for range 2 * rounds {
		for _, step := range []struct {
			kind   string
			allow  bool
			change func() error
		}{{"cnp-create", false, create}, {"cnp-delete", true, del}} {
			f := measureFlip(t, b.probeCli.NS, b.probeAddr, step.allow, step.change)
			f.Kind, f.Policies = step.kind, len(pols)
			cs.Flips = append(cs.Flips, f)
			t.Logf("%d policies + %d cluster policies, flip %s -> %s: %.1f ms (%d attempts)", len(pols), len(cnps), f.Kind, f.To, f.Ms, f.Attempts)
		}
	}
	applyAfter := applyStats(n1)
	if dc := applyAfter[1] - applyBefore[1]; dc > 0 {
		cs.IncrementalApplyCount = dc
		cs.IncrementalApplyMeanMs = (applyAfter[0] - applyBefore[0]) / dc * 1000
	}
	for range revokes {
		ms := revocation(t, b.probeCli.NS, b.probeAddr, create)
		cs.RevocationMs = append(cs.RevocationMs, ms)
		t.Logf("revocation by a ClusterNetworkPolicy: %.1f ms", ms)
		waitVerdict(t, b.probeCli.NS, b.probeAddr, false, 10*time.Second)
		b.must(del())
		waitVerdict(t, b.probeCli.NS, b.probeAddr, true, 10*time.Second)
	}
	b.must(b.c.DeletePolicy(ctx, nsBench, "allow-probe"))
	waitVerdict(t, b.probeCli.NS, b.probeAddr, false, 10*time.Second)
	cs.AttachMs = b.attach(fmt.Sprintf("attach, %d policies + %d cluster policies", len(pols), len(cnps)))
	if body, err := n1.MetricsText(); err == nil {
		cs.Repairs, _ = cluster.Metric(body, "podnet_repairs_total", `object="policy-table"`)
	}
	waitVerdict(t, b.cli.NS, b.srvAddr, true, 30*time.Second)
	return cs
}

// adminWalk reads the Admin tier chain p's pod chain for d on node jumps
// to, and returns the rules a packet walks
// up to and including pass-intra-cluster's Pass (all of them when it is
// not there), and the chain's rules.
func adminWalk(t *testing.T, n *cluster.Node, p *cluster.Pod, d policy.Direction) [2]int {
	t.Helper()
	ctx := context.Background()
	out, err := n.NS.Exec(ctx, "nft", "list", "chain", "inet", "podnet-policy", podChainOf(p, d))
	if err != nil {
		t.Fatalf("%s: nft list chain: %v", n.Name, err)
	}
	adm := ""
	for _, l := range strings.Split(out, "\n") {
		if _, v, ok := strings.Cut(l, "jump adm-"); ok {
			adm = "adm-" + strings.TrimSpace(v)
		}
	}
	if adm == "" {
		t.Fatalf("%s: %s's chain jumps to no Admin tier chain:\n%s", n.Name, p.Name, out)
	}
	if out, err = n.NS.Exec(ctx, "nft", "list", "chain", "inet", "podnet-policy", adm); err != nil {
		t.Fatalf("%s: nft list chain %s: %v", n.Name, adm, err)
	}
	// the rules: the lines between "chain adm-... {" and its "}"
	var rules []string
	in := false
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "chain "):
			in = true
		case l == "}" || l == "":
			in = in && l == ""
		case in:
			rules = append(rules, l)
		}
	}
	// the Pass rule: its peers set is named after pass-intra-cluster's
	// chain ID; a Pass with any peer has no set: the first bare return
	set := "@pol-" + policy.PolicyID("", passIntra, d) + "-r"
	walked := len(rules)
	for i, r := range rules {
		if strings.Contains(r, set) {
			walked = i + 1
			break
		}
	}
	if walked == len(rules) {
		for i, r := range rules {
			if strings.HasSuffix(r, "return") && !strings.Contains(r, "@") {
				walked = i + 1
				break
			}
		}
	}
	return [2]int{walked, len(rules)}
}

// quarantineProbe is the flips' and revocations' Admin Deny: probe-srv
// quarantined from probe-cli, as a security team's incident response
// would (priority 500: before pass-intra-cluster).
func quarantineProbe() *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: quarantine},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: cnpv1.AdminTier, Priority: 500,
			Subject: cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{
				NamespaceSelector: *sel("kubernetes.io/metadata.name", nsBench), PodSelector: *sel("app", "probe")}},
			Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{
				Name: "quarantine", Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel(), PodSelector: *sel("role", "probe-cli")}}},
			}},
		},
	}
}
