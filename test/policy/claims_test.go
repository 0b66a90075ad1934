package policy

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podnet/podnet/test/cluster"
)

// claimedTwice: two Pod objects claim one address. "aaa-old" is a
// terminating Pod object (held by a finalizer, its sandbox gone) whose
// status still lists the addresses IPAM has since given to "zzz-new";
// "aaa-old" sorts first by name, which decided before. The new pod stays
// under its own policy on both nodes: on the other node (by the rule every
// node applies: not terminating, then newer) a client whose egress goes
// only to app=open pods cannot reach new, which old's labels would let
// it; on its node (by the IPAM record of the pod that holds the address)
// new refuses what deny-locked refuses. Each node counts the clash
// (podnet_policy_address_clashes). With the address given by name order,
// both views fail.
func (e *env) claimedTwice(t *testing.T) {
	ctx := context.Background()
	const ns = "claims"
	if err := e.c.CreateNamespace(ctx, ns, map[string]string{"team": "claims"}); err != nil {
		t.Fatal(err)
	}
	add := func(n *cluster.Node, name string, labels map[string]string) *cluster.Pod {
		return addServing(t, n, cluster.PodSpec{Namespace: ns, Name: name, Labels: labels})
	}
	open := add(e.n1, "open", map[string]string{"app": "open"})
	newPod := add(e.n1, "zzz-new", map[string]string{"app": "locked"})
	cl := add(e.n2, "cl", map[string]string{"role": "claims-client"})
	free := add(e.n2, "free", map[string]string{"role": "free"})
	// node 2's view: cl may send only to app=open pods, and new is not
	// isolated for ingress, so only node 2's idea of whose address new's
	// is decides cl -> new
	e.create(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cl-to-open"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("role", "claims-client"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "open")}}}},
		},
	})
	remoteView := both(
		allow(cl, open, "tcp", portMain),     // control: open pods stay reachable
		allow(free, newPod, "tcp", portMain), // control: new is not isolated yet
		deny(cl, newPod, "tcp", portMain),    // node 2 judges new's address as new's
	)
	e.expect(t, "before the clash, node 2's view", converge, remoteView...)

	// the old Pod object: created, held by a finalizer, deleted (so
	// terminating), its status naming new's addresses
	pods := e.c.Client.CoreV1().Pods(ns)
	old := cluster.PodObject(cluster.PodSpec{Namespace: ns, Name: "aaa-old", Labels: map[string]string{"app": "open"}}, e.n1.Name)
	old.Finalizers = []string{"podnet.test/hold"}
	if _, err := pods.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pods.Patch(ctx, "aaa-old", types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
		_ = pods.Delete(ctx, "aaa-old", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	if err := pods.Delete(ctx, "aaa-old", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.SetPodStatusIPs(ctx, e.c.Client, ns, "aaa-old", e.n1.IP.String(),
		[]string{newPod.IP.String(), newPod.IP6.String()}); err != nil {
		t.Fatal(err)
	}
	if p, err := pods.Get(ctx, "aaa-old", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil || len(p.Status.PodIPs) != 2 {
		t.Fatalf("aaa-old: want a terminating Pod object listing zzz-new's addresses, got %v (err %v)", podSummary(p), err)
	}
	// each node sees the clash (both addresses)
	for _, n := range []*cluster.Node{e.n1, e.n2} {
		waitGauge(t, n, "podnet_policy_address_clashes", 2)
	}
	e.expect(t, "two Pod objects claim new's addresses, node 2's view", converge, remoteView...)

	// node 1's view: new isolated for ingress by deny-locked refuses
	// free (another node, judged by address on podnet-bridge, where the
	// packet reaches the bridge, not new's port) and open (its node)
	e.create(t, ingressPolicy(ns, "deny-locked", sel("app", "locked")))
	localView := append(both(deny(free, newPod, "tcp", portMain), deny(open, newPod, "tcp", portMain)), remoteView[:2]...)
	e.expect(t, "two Pod objects claim new's addresses, node 1's view", converge, localView...)
	// and it holds over a few resyncs (2 s each here)
	time.Sleep(5 * time.Second)
	e.expect(t, "after resyncs", converge, localView...)
	e.delete(t, ns, "deny-locked")
	e.delete(t, ns, "cl-to-open")
}

func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "nothing"
	}
	return fmt.Sprintf("deletionTimestamp %v, podIPs %v", p.DeletionTimestamp, p.Status.PodIPs)
}

// waitGauge waits until node n's metric name (no labels) is want.
func waitGauge(t *testing.T, n *cluster.Node, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(converge)
	var got float64
	for time.Now().Before(deadline) {
		body, err := n.MetricsText()
		if err == nil {
			if v, ok := cluster.Metric(body, name); ok {
				if got = v; got == want {
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("%s: %s = %v, want %v", n.Name, name, got, want)
}
