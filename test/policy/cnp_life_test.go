package policy

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// cnpRevocation: established streams client → web and local → web
// (allowed by allow-client) stop once an Admin Deny of role=client pods
// is created: their next lines get no echo.
func (e *env) cnpRevocation(t *testing.T) {
	e.cnpReady(t)
	ctx := context.Background()
	type stream struct {
		what string
		s    *cluster.Stream
	}
	var streams []stream
	for _, from := range []*cluster.Pod{e.client, e.local} {
		for _, a := range []netip.Addr{e.web.IP, e.web.IP6} {
			s, err := cluster.OpenStream(ctx, from.NS, netip.AddrPortFrom(a, portMain))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			what := from.Name + " → web " + a.String()
			if err := s.Echo(3 * time.Second); err != nil {
				t.Fatalf("stream %s before the Admin Deny: %v", what, err)
			}
			streams = append(streams, stream{what, s})
		}
	}
	e.createCNP(t, denyClients("cnp-revoke"))
	for _, s := range streams {
		// one line every 200 ms while the stream still echoes, for up to
		// converge: the first line without echo ends it
		stopped := false
		for end := time.Now().Add(converge); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if err := s.s.Echo(time.Second); err != nil {
				stopped = true
				break
			}
		}
		if !stopped {
			ct, _ := e.n1.NS.Exec(ctx, "conntrack", "-L", "-p", "tcp")
			t.Errorf("stream %s still echoes %s after the Admin Deny; %s conntrack:\n%s", s.what, converge, e.n1.Name, ct)
			continue
		}
		if err := s.s.Echo(2 * time.Second); err == nil {
			t.Errorf("stream %s echoes again after it stopped", s.what)
		}
	}
	e.expect(t, "new connections after the Admin Deny", converge, e.clientsToWeb80(false)...)
	e.deleteCNP(t, "cnp-revoke")
	e.expect(t, "Admin Deny deleted", converge, e.clientsToWeb80(true)...)
}

// cnpNewPod: pods added under an Admin policy (app=guarded: no ingress
// from prod, no egress to app=dns) are judged by it from their first
// packet, probed right after ADD (before the kubelet's status report),
// one on each node, from and to a pod of their node and of the other.
func (e *env) cnpNewPod(t *testing.T) {
	e.cnpReady(t)
	ctx := context.Background()
	p := cnp("cnp-guard", cnpv1.AdminTier, 10, subjectPods(nil, sel("app", "guarded")))
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
		ingressRule(actDeny, "deny-prod", cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel("team", "prod")}),
	}
	p.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{
		egressRule(actDeny, "deny-dns", cnpv1.ClusterNetworkPolicyEgressPeer{Pods: namespacedPod(nil, sel("app", "dns"))}),
	}
	e.createCNP(t, p)
	// both engines hold it (and no other) before the pods come
	if !cnpOff {
		for _, n := range []*cluster.Node{e.n1, e.n2} {
			waitMetric(t, n, converge, "podnet_policy_cluster_policies", 1)
		}
	}
	var newPods []*cluster.Pod
	var mismatches []string
	for i, n := range []*cluster.Node{e.n1, e.n2} {
		g := addServing(t, n, cluster.PodSpec{Namespace: "dev", Name: "guarded" + string(rune('1'+i)),
			Labels: map[string]string{"app": "guarded"}, LateStatus: true})
		newPods = append(newPods, g)
		fs := both(deny(e.local, g, "tcp", portMain), deny(e.client, g, "udp", portMain), deny(g, e.dns, "tcp", portDNS),
			allow(e.devclient, g, "tcp", portMain), allow(g, e.devclient, "udp", portMain))
		for _, f := range fs {
			if f.allowed {
				f.timeout = firstAnswer // see newPod
			}
			if s := f.check(ctx); s != "" {
				mismatches = append(mismatches, s)
			}
		}
	}
	if len(mismatches) > 0 {
		t.Errorf("first connections of new pods under cnp-guard (probed right after ADD):\n  %s", strings.Join(mismatches, "\n  "))
	}
	for _, g := range newPods {
		if err := e.c.ReportPodIPs(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	g1, g2 := newPods[0], newPods[1]
	e.expect(t, "after the kubelet's status report", converge, both(deny(e.client, g1, "tcp", portMain),
		deny(e.local, g2, "tcp", portMain), deny(g2, e.dns, "udp", portDNS), allow(e.devclient, g1, "tcp", portMain))...)
	e.deleteCNP(t, "cnp-guard")
	e.expect(t, "cnp-guard deleted", converge, both(allow(e.client, g1, "tcp", portMain), allow(g2, e.dns, "udp", portDNS))...)
}

// cnpDrops: the flows an Admin Deny refuses are counted by its rule on
// the node of the pod it isolates
// (podnet_policy_cluster_drops_total{tier="Admin",policy,rule}), and
// `podnet-routed --explain-policy` there names the tier and the rule.
func (e *env) cnpDrops(t *testing.T) {
	e.cnpReady(t)
	ctx := context.Background()
	const rule = "ingress 0 deny-clients"
	e.createCNP(t, denyClients("cnp-drops"))
	e.expect(t, "Admin Deny", converge, e.clientsToWeb80(false)...)
	probeAll(e.clientsToWeb80(false)) // a few more drops
	if err := nettest.Poll(ctx, converge, 200*time.Millisecond, func() error {
		return clusterDrops(e.n1, "cnp-drops", rule, 0)
	}); err != nil {
		t.Errorf("drops not counted: %v\n%s", err, dropsDiag(e.n1))
	}
	body, _ := e.n1.MetricsText()
	before, _ := clusterDropsIn(body, "cnp-drops", rule)
	probeAll(e.clientsToWeb80(false))
	if err := nettest.Poll(ctx, converge, 200*time.Millisecond, func() error {
		return clusterDrops(e.n1, "cnp-drops", rule, before)
	}); err != nil {
		t.Errorf("drops after more refused flows: %v", err)
	}
	out, err := e.n1.ExplainPolicy(ctx, e.client.IP, e.web.IP, "80/tcp")
	if err != nil {
		t.Fatalf("explain client -> web 80/tcp: %v\n%s", err, out)
	}
	for _, w := range []string{"denied", "Admin tier ClusterNetworkPolicy cnp-drops rule 0 (deny-clients) denies"} {
		if !strings.Contains(out, w) {
			t.Errorf("explain client -> web 80/tcp: no %q in:\n%s", w, out)
		}
	}
	e.deleteCNP(t, "cnp-drops")
	e.expect(t, "Admin Deny deleted", converge, e.clientsToWeb80(true)...)
}

// cnpCRDLifecycle: with an Admin Deny in place, the CRD deleted (its
// ClusterNetworkPolicies with it) while the pods run lifts the Deny and
// the engines stop watching; the CRD installed again and the policy
// created again, the Deny is back. podnet-routed runs and answers
// throughout.
func (e *env) cnpCRDLifecycle(t *testing.T) {
	e.cnpReady(t)
	ctx := context.Background()
	alive := func(when string) {
		t.Helper()
		for _, n := range []*cluster.Node{e.n1, e.n2} {
			if !n.RoutedRunning() {
				t.Fatalf("%s: %s: podnet-routed exited; log:\n%s", when, n.Name, cluster.Tail(n.RoutedLog(), 30))
			}
			if _, err := n.MetricsText(); err != nil {
				t.Errorf("%s: %s: /metrics: %v", when, n.Name, err)
			}
		}
	}
	e.createCNP(t, denyClients("cnp-crd"))
	e.expect(t, "Admin Deny", converge, e.clientsToWeb80(false)...)
	if err := e.c.DeleteCNPCRD(ctx, crdLimit); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "CRD deleted", converge, e.clientsToWeb80(true)...)
	for _, n := range []*cluster.Node{e.n1, e.n2} {
		waitMetric(t, n, 2*converge, "podnet_policy_cluster_watching", 0)
	}
	alive("CRD deleted")
	e.cnpReady(t)
	e.expect(t, "CRD installed again, no ClusterNetworkPolicy", converge, e.clientsToWeb80(true)...)
	e.createCNP(t, denyClients("cnp-crd"))
	e.expect(t, "Admin Deny created again", converge, e.clientsToWeb80(false)...)
	e.deleteCNP(t, "cnp-crd")
	e.expect(t, "Admin Deny deleted", converge, e.clientsToWeb80(true)...)
	alive("at the end")
}
