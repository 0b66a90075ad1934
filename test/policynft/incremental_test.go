package policynft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// clusterSteps makes random changes of a small cluster (3 nodes, 4
// namespaces, pods, NetworkPolicies, ClusterNetworkPolicies, Nodes, the
// node's holders and ports) through a policy.Incremental, as the engine
// does.
type clusterSteps struct {
	r     *rand.Rand
	inc   *policy.Incremental
	node  string
	cidrs []netip.Prefix
	pods  map[string]policy.Pod
}

var (
	stepNS     = []string{"ns0", "ns1", "ns2", "ns3"}
	stepApps   = []string{"web", "db", "cache"}
	stepTiers  = []string{"fe", "be"}
	stepTeams  = []string{"a", "b"}
	stepNodes  = []string{"n0", "n1", "n2"}
	stepNamed  = []string{"http", "metrics"}
	stepCIDRs4 = []string{"10.70.0.0/24", "10.71.0.0/24", "10.72.0.0/24"}
)

func newClusterSteps(seed uint64) *clusterSteps {
	c := &clusterSteps{r: rand.New(rand.NewPCG(seed, 7)), node: "n0", pods: map[string]policy.Pod{},
		cidrs: []netip.Prefix{netip.MustParsePrefix(stepCIDRs4[0]), netip.MustParsePrefix("fd70::/64")}}
	c.inc = policy.NewIncremental(policy.NewState(), c.node, c.cidrs)
	for _, ns := range stepNS {
		c.inc.SetNamespace(policy.Namespace{Name: ns, Labels: map[string]string{"team": c.pick(stepTeams)}})
	}
	for range 30 {
		c.setPod()
	}
	for i := range 8 {
		_ = c.inc.SetPolicy(c.networkPolicy(i))
	}
	for i := range 3 {
		_ = c.inc.SetClusterPolicy(c.clusterPolicy(i))
	}
	return c
}

func (c *clusterSteps) pick(xs []string) string { return xs[c.r.IntN(len(xs))] }

// addr is one of a small pool of node n's addresses (pods collide on
// them now and then).
func (c *clusterSteps) addr(n int, v6 bool) netip.Addr {
	k := byte(2 + c.r.IntN(30))
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0x70 + byte(n), 15: k})
	}
	return netip.AddrFrom4([4]byte{10, 70 + byte(n), 0, k})
}

func (c *clusterSteps) setPod() string {
	n := c.r.IntN(len(stepNodes))
	p := policy.Pod{Namespace: c.pick(stepNS), Name: fmt.Sprintf("p%d", c.r.IntN(40)), Node: stepNodes[n],
		Labels:  map[string]string{"app": c.pick(stepApps), "tier": c.pick(stepTiers)},
		Created: time.Unix(int64(c.r.IntN(4)), 0), Terminating: c.r.IntN(8) == 0}
	switch c.r.IntN(6) {
	case 0: // pending
	case 1:
		p.IPs = []netip.Addr{c.addr(n, true)}
	case 2:
		p.IPs = []netip.Addr{c.addr(n, false)}
	default:
		p.IPs = []netip.Addr{c.addr(n, false), c.addr(n, true)}
	}
	if c.r.IntN(2) == 0 {
		p.Ports = []policy.NamedPort{{Name: c.pick(stepNamed), Protocol: policy.ProtoTCP, Port: uint16(8000 + c.r.IntN(3))}}
	}
	c.pods[p.Key()] = p
	c.inc.SetPod(p)
	return "set pod " + p.Key()
}

func (c *clusterSteps) sel(kv ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{kv[0]: kv[1]}}
}

func (c *clusterSteps) peer() networkingv1.NetworkPolicyPeer {
	switch c.r.IntN(4) {
	case 0:
		return networkingv1.NetworkPolicyPeer{PodSelector: c.sel("app", c.pick(stepApps))}
	case 1:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: c.sel("team", c.pick(stepTeams)), PodSelector: c.sel("tier", c.pick(stepTiers))}
	case 2:
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.71.0.0/16", Except: []string{"10.71.0.0/28"}}}
	}
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}}
}

func (c *clusterSteps) port() []networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	switch c.r.IntN(3) {
	case 0:
		return nil
	case 1:
		p := intstr.FromInt32(int32(80 + c.r.IntN(3)))
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
	}
	p := intstr.FromString(c.pick(stepNamed))
	return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
}

func (c *clusterSteps) networkPolicy(i int) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: c.pick(stepNS), Name: fmt.Sprintf("np%d", i)}}
	np.Spec.PodSelector = *c.sel("app", c.pick(stepApps))
	types := [][]networkingv1.PolicyType{{"Ingress"}, {"Egress"}, {"Ingress", "Egress"}}[c.r.IntN(3)]
	np.Spec.PolicyTypes = types
	for range c.r.IntN(3) {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{c.peer()}, Ports: c.port()})
	}
	for range c.r.IntN(3) {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{c.peer()}, Ports: c.port()})
	}
	return np
}

func (c *clusterSteps) clusterPolicy(i int) *cnpv1.ClusterNetworkPolicy {
	tier := []cnpv1.Tier{cnpv1.AdminTier, cnpv1.BaselineTier}[c.r.IntN(2)]
	cp := &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp%d", i)},
		Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: int32(c.r.IntN(3)),
			Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: c.sel("team", c.pick(stepTeams))}}}
	actions := []cnpv1.ClusterNetworkPolicyRuleAction{cnpv1.ClusterNetworkPolicyRuleActionAccept, cnpv1.ClusterNetworkPolicyRuleActionDeny, cnpv1.ClusterNetworkPolicyRuleActionPass}
	for range 1 + c.r.IntN(2) {
		cp.Spec.Ingress = append(cp.Spec.Ingress, cnpv1.ClusterNetworkPolicyIngressRule{Action: actions[c.r.IntN(3)],
			From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Pods: &cnpv1.NamespacedPod{NamespaceSelector: metav1.LabelSelector{},
				PodSelector: *c.sel("tier", c.pick(stepTiers))}}}})
	}
	if c.r.IntN(2) == 0 {
		cp.Spec.Egress = append(cp.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{Action: actions[c.r.IntN(3)],
			To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Nodes: c.sel("zone", c.pick([]string{"a", "b"}))}}})
	}
	return cp
}

// step makes one random change and says which.
func (c *clusterSteps) step() string {
	switch op := c.r.IntN(20); {
	case op < 7:
		return c.setPod()
	case op < 9:
		for k := range c.pods {
			ns, name, _ := strings.Cut(k, "/")
			delete(c.pods, k)
			c.inc.DeletePod(ns, name)
			return "delete pod " + k
		}
	case op < 11:
		for k, p := range c.pods {
			p.Labels = map[string]string{"app": c.pick(stepApps), "tier": c.pick(stepTiers)}
			c.pods[k] = p
			c.inc.SetPod(p)
			return "relabel pod " + k
		}
	case op < 12:
		ns := c.pick(stepNS)
		c.inc.SetNamespace(policy.Namespace{Name: ns, Labels: map[string]string{"team": c.pick(stepTeams)}})
		return "namespace " + ns
	case op < 15:
		np := c.networkPolicy(c.r.IntN(10))
		if c.r.IntN(4) == 0 {
			c.inc.DeletePolicy(np.Namespace, np.Name)
			return "delete policy " + np.Name
		}
		_ = c.inc.SetPolicy(np)
		return "set policy " + np.Namespace + "/" + np.Name
	case op < 17:
		cp := c.clusterPolicy(c.r.IntN(4))
		if c.r.IntN(4) == 0 {
			c.inc.DeleteClusterPolicy(cp.Name)
			return "delete cnp " + cp.Name
		}
		_ = c.inc.SetClusterPolicy(cp)
		return "set cnp " + cp.Name
	case op < 18:
		n := policy.Node{Name: c.pick(stepNodes), Labels: map[string]string{"zone": c.pick([]string{"a", "b"})},
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 70, byte(1 + c.r.IntN(3))})}}
		c.inc.SetNode(n)
		return "node " + n.Name
	case op < 19:
		for k, p := range c.pods {
			if p.Node == c.node && len(p.IPs) > 0 {
				c.inc.SetHolder(p.IPs[0], k)
				return "holder " + k
			}
		}
	default:
		for k, p := range c.pods {
			if p.Node == c.node {
				c.inc.SetPodPorts(k, []policy.LocalPort{{Name: "pv" + strings.ReplaceAll(k, "/", "")[:min(10, len(k)-1)]}})
				return "ports " + k
			}
		}
	}
	return "nothing"
}

// TestIncrementalKernel: thousands of random pod, namespace, policy,
// ClusterNetworkPolicy and Node changes; after each, the incremental
// compile equals a whole compile of the same state, and the kernel's
// table, written only through the Deltas (ApplyDelta), is the table of
// that whole compile (Verify reads it back whole).
func TestIncrementalKernel(t *testing.T) {
	node := nettest.NewNetNS(t)
	// tier chains of more than 2 rules cut in segments: every change of
	// a tier chain's policies rewrites its segments and guard sets
	w := &nft.Writer{TierSegment: 2}
	t.Cleanup(w.Close)
	c := newClusterSteps(1)
	steps := 2000
	if testing.Short() {
		steps = 300
	}
	deltas, elements := 0, 0
	for i := range steps + 1 {
		what := "start"
		if i > 0 {
			what = c.step()
		}
		d := c.inc.Flush()
		got := c.inc.Ruleset()
		want := c.inc.State().Compile(c.node, c.cidrs)
		if !got.Equal(want) {
			t.Fatalf("step %d (%s): the incremental Ruleset differs from the whole compile", i, what)
		}
		nettest.Do(t, node, func() error {
			st, err := w.ApplyDelta(d)
			elements += st.Elements
			return err
		})
		if !d.Empty() {
			deltas++
		}
		var diff string
		nettest.Do(t, node, func() error {
			var err error
			diff, err = w.Verify(want)
			return err
		})
		if diff != "" {
			t.Fatalf("step %d (%s): the kernel's table is not the whole compile's: %s", i, what, diff)
		}
	}
	rs := c.inc.Ruleset()
	t.Logf("%d steps, %d non-empty Deltas, %d elements written; at the end %d pod entries, %d chains, %d known addresses",
		steps, deltas, elements, len(rs.Pods), len(rs.Policies), len(rs.Known))
	if deltas < steps/4 || len(rs.Policies) == 0 {
		t.Fatalf("the steps changed too little to prove anything: %d Deltas, %d chains", deltas, len(rs.Policies))
	}
}
