package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fcache "k8s.io/client-go/tools/cache/testing"

	"github.com/podnet/podnet/routed/desired"
)

// TestNodeInformerLabels: the daemon's Node informer is one object, made
// once; it keeps the labels only when asked (WithNodeLabels: the policy
// engine shares it for ClusterNetworkPolicy's nodes peers, with the
// addresses as they are), and never what neither reads: each Node is a
// desired.Record.
func TestNodeInformerLabels(t *testing.T) {
	for _, labels := range []bool{false, true} {
		src := fcache.NewFakeControllerSource()
		src.Add(&corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"kubernetes.io/os": "linux"},
				Annotations: map[string]string{"big": "x"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}},
				Images: []corev1.ContainerImage{{Names: []string{"a"}}}},
		})
		d := New(Config{NodeName: "n1"}, src, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if labels {
			d.WithNodeLabels()
		}
		inf, err := d.NodeInformer()
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := d.NodeInformer(); again != inf {
			t.Fatal("NodeInformer made a second informer")
		}
		stop := make(chan struct{})
		go inf.Run(stop)
		deadline := time.Now().Add(5 * time.Second)
		for !inf.HasSynced() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		obj, ok, err := inf.GetIndexer().GetByKey("n1")
		close(stop)
		if err != nil || !ok {
			t.Fatalf("labels %v: n1 not in the store: %v", labels, err)
		}
		n := obj.(*desired.Record)
		if n.Name != "n1" || n.IP != netip.MustParseAddr("192.168.0.1") {
			t.Errorf("labels %v: the store keeps %+v", labels, n)
		}
		if got := n.Labels["kubernetes.io/os"] == "linux"; got != labels {
			t.Errorf("WithNodeLabels %v: labels %v", labels, n.Labels)
		}
		if got := len(n.Addresses) == 1; got != labels {
			t.Errorf("WithNodeLabels %v: addresses %v", labels, n.Addresses)
		}
	}
}
