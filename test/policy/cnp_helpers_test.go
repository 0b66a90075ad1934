package policy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// crdLimit bounds the API server's work on the CRD (established, or gone
// with its objects): not podnet's.
const crdLimit = 60 * time.Second

// cnpOff: PODNET_POLICY_CNP=off runs the ClusterNetworkPolicy subtests
// without creating their ClusterNetworkPolicies (the CRD is installed):
// every one of them must then fail, which is how they were checked not
// to be vacuous.
var cnpOff = os.Getenv("PODNET_POLICY_CNP") == "off"

// cnpReady installs the ClusterNetworkPolicy CRD unless it is there and
// waits until both nodes' engines watch ClusterNetworkPolicies
// (podnet_policy_cluster_watching 1; the engine asks discovery every 5 s,
// then lists them and the Nodes); it also puts back the NetworkPolicies
// the CNP subtests build on (deny-in and allow-client in prod) if an
// earlier subtest deleted them or did not run.
func (e *env) cnpReady(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := e.c.InstallCNPCRD(ctx, crdLimit); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*cluster.Node{e.n1, e.n2} {
		waitMetric(t, n, 2*converge, "podnet_policy_cluster_watching", 1)
	}
	for _, np := range []*networkingv1.NetworkPolicy{ingressPolicy("prod", "deny-in", sel()), allowClient()} {
		_, err := e.c.Client.NetworkingV1().NetworkPolicies(np.Namespace).Get(ctx, np.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			e.create(t, np)
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// waitMetric waits up to limit until node n's metric name{labels} is want.
func waitMetric(t *testing.T, n *cluster.Node, limit time.Duration, name string, want float64, labels ...string) {
	t.Helper()
	var got string
	err := nettest.Poll(context.Background(), limit, 200*time.Millisecond, func() error {
		body, err := n.MetricsText()
		if err != nil {
			got = err.Error()
			return err
		}
		v, ok := cluster.Metric(body, name, labels...)
		got = fmt.Sprintf("%v (present %v)", v, ok)
		if !ok || v != want {
			return fmt.Errorf("%s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %s%v = %s, want %v", n.Name, name, labels, got, want)
	}
}

// createCNP creates a ClusterNetworkPolicy, deleted when the test ends
// if the test has not deleted it (deleteCNP).
func (e *env) createCNP(t *testing.T, p *cnpv1.ClusterNetworkPolicy) {
	t.Helper()
	if cnpOff {
		t.Logf("PODNET_POLICY_CNP=off: ClusterNetworkPolicy %s not created", p.Name)
		return
	}
	ctx := context.Background()
	if err := e.c.CreateClusterPolicy(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.c.DeleteClusterPolicy(ctx, p.Name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func (e *env) deleteCNP(t *testing.T, name string) {
	t.Helper()
	if err := e.c.DeleteClusterPolicy(context.Background(), name); err != nil {
		t.Fatal(err)
	}
}

// ---- ClusterNetworkPolicies ----

func cnp(name string, tier cnpv1.Tier, priority int32, subject cnpv1.ClusterNetworkPolicySubject) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: priority, Subject: subject},
	}
}

// subjectPods selects the pods labelled pods in the namespaces labelled
// ns (nil: every namespace).
func subjectPods(ns, pods *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: namespacedPod(ns, pods)}
}

func namespacedPod(ns, pods *metav1.LabelSelector) *cnpv1.NamespacedPod {
	np := &cnpv1.NamespacedPod{PodSelector: *pods}
	if ns != nil {
		np.NamespaceSelector = *ns
	}
	return np
}

// webSubject is web (prod's app=web pods).
func webSubject() cnpv1.ClusterNetworkPolicySubject {
	return subjectPods(sel("team", "prod"), sel("app", "web"))
}

// fromPods is an ingress peer: the pods labelled pods in the namespaces
// labelled ns (nil: every namespace).
func fromPods(ns, pods *metav1.LabelSelector) cnpv1.ClusterNetworkPolicyIngressPeer {
	return cnpv1.ClusterNetworkPolicyIngressPeer{Pods: namespacedPod(ns, pods)}
}

func ingressRule(action cnpv1.ClusterNetworkPolicyRuleAction, name string, from ...cnpv1.ClusterNetworkPolicyIngressPeer) cnpv1.ClusterNetworkPolicyIngressRule {
	return cnpv1.ClusterNetworkPolicyIngressRule{Action: action, Name: name, From: from}
}

func egressRule(action cnpv1.ClusterNetworkPolicyRuleAction, name string, to ...cnpv1.ClusterNetworkPolicyEgressPeer) cnpv1.ClusterNetworkPolicyEgressRule {
	return cnpv1.ClusterNetworkPolicyEgressRule{Action: action, Name: name, To: to}
}

func tcpPort(p int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: p}}}
}

func udpPort(p int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnpv1.Port{Number: p}}}
}

// denyClients is an Admin policy on web: no ingress from any pod
// labelled role=client (which allow-client lets in on port 80), by its
// rule 0 named deny-clients.
func denyClients(name string) *cnpv1.ClusterNetworkPolicy {
	p := cnp(name, cnpv1.AdminTier, 10, webSubject())
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
		ingressRule(cnpv1.ClusterNetworkPolicyRuleActionDeny, "deny-clients", fromPods(nil, sel("role", "client"))),
	}
	return p
}

// ---- probes of addresses that are no pod's ----

// addrFlow is a TCP probe to an echo server (echoOn) at an address that
// is no pod's (a node's).
type addrFlow struct {
	from    *cluster.Pod
	to      netip.AddrPort
	what    string
	allowed bool
}

func (f addrFlow) check(ctx context.Context) string {
	err := cluster.ProbeTCP(ctx, f.from.NS, f.to, cluster.ProbeTimeout)
	switch {
	case f.allowed && err != nil:
		return fmt.Sprintf("%s → %s %s: want allowed, got %v", f.from.Name, f.what, f.to, err)
	case !f.allowed && err == nil:
		return fmt.Sprintf("%s → %s %s: want refused, got an answer", f.from.Name, f.what, f.to)
	}
	return ""
}

// expectAddrs is expect for addrFlows.
func (e *env) expectAddrs(t *testing.T, what string, fs ...addrFlow) {
	t.Helper()
	var bad []string
	for deadline := time.Now().Add(converge); ; time.Sleep(100 * time.Millisecond) {
		out := make([]string, len(fs))
		var wg sync.WaitGroup
		for i, f := range fs {
			wg.Go(func() { out[i] = f.check(context.Background()) })
		}
		wg.Wait()
		bad = bad[:0]
		for _, s := range out {
			if s != "" {
				bad = append(bad, s)
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("%s: after %s, %d of %d flows not as expected:\n  %s", what, converge, len(bad), len(fs), strings.Join(bad, "\n  "))
}
