package engine

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/routed/policy"
)

// TestEngineWritesArrivingPodsFirst: a Pod object scheduled to the node
// without an address yet gets its chains and its port (the host veth
// the plugins will name after it) written before its ADD; the ADD's wait
// adds its addresses (test/policynft's TestArrivingPodAddsNoVerdict: with
// its link there, nothing else changes in the kernel); a pod that
// finished, one of another node and one gone leave nothing.
func TestEngineWritesArrivingPodsFirst(t *testing.T) {
	r := newRig(t)
	r.pols.Add(denyIngress())
	veth := contract.HostVethName("shop", "db-1", "", "eth0")
	r.pods.Add(pod("db-1", "", map[string]string{"app": "db"}))
	rs := r.until("db-1's chains before its ADD", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	p := rs.Pods[0]
	if p.Name != "db-1" || !p.IngressIsolated || len(p.Addrs) != 0 || !slices.Equal(p.Ports, []string{veth}) || !slices.Contains(rs.Ports, veth) {
		t.Fatalf("arriving db-1 written as %+v (ports %v), want isolated, no address, port %s", p, rs.Ports, veth)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := policysock.Request{Namespace: "shop", Name: "db-1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.20")}}
	if err := policysock.Wait(ctx, r.sock, req); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	after, _ := r.w.last()
	if len(after.Pods) != 1 {
		t.Fatalf("after the wait: pods %+v", after.Pods)
	}
	q := after.Pods[0]
	if !slices.Equal(q.Addrs, req.IPs) || !known(after, "10.244.1.20") {
		t.Fatalf("after the wait db-1 is %+v, want its address", q)
	}
	// (no link of that name on this machine: the pod is judged by its
	// addresses from now on, its chains the same)
	if !slices.Equal(q.Ingress, p.Ingress) || q.IngressIsolated != p.IngressIsolated || len(q.Ports) != 0 {
		t.Fatalf("after the wait db-1 is %+v, want the same chains and no port (no link %s here)", q, veth)
	}

	// a pod that finished, one being deleted and one of another node are
	// not arriving: no chains, no port
	done := pod("job-1", "", map[string]string{"app": "db"})
	done.Status.Phase = corev1.PodSucceeded
	r.pods.Add(done)
	other := pod("db-2", "", map[string]string{"app": "db"})
	other.Spec.NodeName = "node-b"
	r.pods.Add(other)
	r.pods.Delete(pod("db-1", "", nil))
	r.until("db-1 gone, nothing for the others", func(rs policy.Ruleset) bool {
		return len(rs.Pods) == 0 && len(rs.Ports) == 0 && !known(rs, "10.244.1.20")
	})
}
