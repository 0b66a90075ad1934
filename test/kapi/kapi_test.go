package kapi

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestServerServesNodes proves the harness: a Node written through the
// admin client is read back, and survives an API server restart (etcd keeps
// it).
func TestServerServesNodes(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}
	if _, err := s.Client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.StopAPIServer()
	if err := s.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Client().CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.PodCIDR != "10.244.1.0/24" {
		t.Fatalf("podCIDR = %q", got.Spec.PodCIDR)
	}
}
