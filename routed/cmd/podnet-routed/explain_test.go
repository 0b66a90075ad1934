package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	fcache "k8s.io/client-go/tools/cache/testing"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/routed/kube"
	"github.com/podnet/podnet/routed/policy"
)

func TestParseFlow(t *testing.T) {
	f, err := parseFlow([]string{"10.244.1.5", "10.244.2.7", "53/udp"})
	if err != nil || f.port != 53 || f.proto != 17 || f.src.String() != "10.244.1.5" {
		t.Fatalf("parseFlow: %+v, %v", f, err)
	}
	if f, err := parseFlow([]string{"fd00::1", "fd00::2", "80"}); err != nil || f.proto != 6 {
		t.Fatalf("default protocol: %+v, %v", f, err)
	}
	for _, bad := range [][]string{
		nil, {"10.0.0.1", "10.0.0.2"}, {"x", "10.0.0.2", "80"}, {"10.0.0.1", "y", "80"},
		{"10.0.0.1", "fd00::2", "80"}, {"10.0.0.1", "10.0.0.2", "0"}, {"10.0.0.1", "10.0.0.2", "70000"},
		{"10.0.0.1", "10.0.0.2", "80/icmp"}, {"10.0.0.1", "10.0.0.2", "80", "extra"},
	} {
		if _, err := parseFlow(bad); err == nil {
			t.Errorf("parseFlow(%q) accepted", bad)
		}
	}
}

// TestExplain: the answer names the policy that isolates the destination
// and the rule that allows (or the absence of one).
func TestExplain(t *testing.T) {
	pods, nss, pols := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	mk := func(name, ip, app string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	pods.Add(mk("db", "10.244.1.5", "db"))
	pods.Add(mk("web", "10.244.2.7", "web"))
	port := intstr.FromInt32(5432)
	pols.Add(&networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-from-web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	})
	run := func(args ...string) string {
		f, err := parseFlow(args)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := explain(&b, pods, nss, pols, f, nil, nil); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := run("10.244.2.7", "10.244.1.5", "5432")
	if !strings.Contains(out, "shop/db-from-web") || !strings.Contains(strings.ToLower(out), "allow") {
		t.Errorf("allowed flow explained as:\n%s", out)
	}
	out = run("10.244.2.7", "10.244.1.5", "22")
	if !strings.Contains(out, "shop/db-from-web") || !strings.Contains(strings.ToLower(out), "den") && !strings.Contains(strings.ToLower(out), "refus") {
		t.Errorf("refused flow explained as:\n%s", out)
	}
	t.Logf("explain output:\n%s", out)
}

// TestExplainNodeCheck: on a node, the explanation is followed by the
// comparison's verdict; a comparison that fails (a Node that cannot be
// read) still leaves the explanation whole.
func TestExplainNodeCheck(t *testing.T) {
	pods, nss, pols := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	f, err := parseFlow([]string{"10.244.2.7", "10.244.1.5", "80"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		diff string
		err  error
		want string
	}{
		{"", nil, "node n1: its table inet podnet-policy is what the API objects compile to"},
		{"set known4: 1 element(s) missing (0af40105)", nil, "differs from what the API objects compile to (set known4: 1 element(s) missing (0af40105))"},
		{"table missing", nil, "node n1: no table inet podnet-policy here"},
		{"", errors.New(`Node n1: PodCIDR "bad": no '/'`), `node n1: cannot compare its table inet podnet-policy with the API objects: Node n1: PodCIDR "bad"`},
	} {
		var b bytes.Buffer
		node := &nodeCheck{name: "n1", check: func(policy.Ruleset) (string, error) { return tc.diff, tc.err }}
		if err := explain(&b, pods, nss, pols, f, node, nil); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if !strings.HasPrefix(out, "allowed") || !strings.Contains(out, tc.want) {
			t.Errorf("with the comparison saying %q, %v:\n%s", tc.diff, tc.err, out)
		}
	}
}

// TestNodePodCIDRs: the Node's PodCIDRs as the API server gives them; a
// broken one is an error naming it.
func TestNodePodCIDRs(t *testing.T) {
	for _, tc := range []struct {
		node string
		want string
	}{
		{`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"},"spec":{"podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"]}}`, "[10.244.1.0/24 fd00:10:244:1::/64]"},
		{`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"},"spec":{"podCIDR":"10.244.1.7/24"}}`, "[10.244.1.0/24]"},
		{`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"},"spec":{"podCIDRs":["bad"]}}`, `error: Node n1: PodCIDR "bad"`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/api/v1/nodes/n1" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, tc.node)
		}))
		core, err := kube.CoreClient(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		got, err := nodePodCIDRs(core, "n1")
		s := fmt.Sprint(got)
		if err != nil {
			s = "error: " + err.Error()
		}
		if !strings.HasPrefix(s, tc.want) {
			t.Errorf("Node %s: %s, want %s", tc.node, s, tc.want)
		}
		srv.Close()
	}
	if _, err := nodePodCIDRs(mustCore(t, "http://127.0.0.1:1"), "n1"); err == nil || !strings.Contains(err.Error(), "get Node n1") {
		t.Errorf("no API server: %v", err)
	}
}

func mustCore(t *testing.T, host string) rest.Interface {
	core, err := kube.CoreClient(&rest.Config{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	return core
}

// TestExplainClusterPolicy: with ClusterNetworkPolicies served, the answer
// names the tier and the rule that decided (an Admin Deny over a
// NetworkPolicy-free pod; a Pass down to the default); not served, a note
// says so and NetworkPolicies alone decide.
func TestExplainClusterPolicy(t *testing.T) {
	pods, nss, pols := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	cnps, nodes := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	for _, p := range []struct{ name, ip string }{{"db", "10.244.1.5"}, {"web", "10.244.2.7"}} {
		pods.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: p.name, Labels: map[string]string{"app": p.name}},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: p.ip}}}})
	}
	nodes.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "infra"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.10"}}}})
	cnps.Add(&cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: cnpv1.AdminTier, Priority: 5,
			Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []cnpv1.ClusterNetworkPolicyEgressRule{
				{Name: "pass-db", Action: cnpv1.ClusterNetworkPolicyRuleActionPass,
					To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Pods: &cnpv1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}}},
				{Name: "no-infra", Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
					To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "infra"}}}}},
			},
		},
	})
	served := true
	cl := &clusterLists{policies: cnps, nodes: nodes, served: func(context.Context) (bool, error) { return served, nil }}
	run := func(args ...string) string {
		f, err := parseFlow(args)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := explain(&b, pods, nss, pols, f, nil, cl); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := run("10.244.2.7", "192.168.0.10", "10250")
	if !strings.HasPrefix(out, "denied") || !strings.Contains(out, "Admin tier ClusterNetworkPolicy guard rule 1 (no-infra)") {
		t.Errorf("a flow to an infra node explained as:\n%s", out)
	}
	out = run("10.244.2.7", "10.244.1.5", "5432")
	if !strings.HasPrefix(out, "allowed") || !strings.Contains(out, "guard rule 0 (pass-db) passes") {
		t.Errorf("a passed flow explained as:\n%s", out)
	}
	served = false
	out = run("10.244.2.7", "192.168.0.10", "10250")
	if !strings.Contains(out, "serves no ClusterNetworkPolicies") || !strings.Contains(out, "allowed") {
		t.Errorf("without the CRD:\n%s", out)
	}
}
