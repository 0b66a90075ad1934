package main

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	fcache "k8s.io/client-go/tools/cache/testing"
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
		if err := explain(&b, pods, nss, pols, f, nil); err != nil {
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
