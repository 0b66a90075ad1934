package engine

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"sync"
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
// adds its addresses and nothing else, and starts no conntrack scan
// (test/policynft's TestArrivingPodAddsNoVerdict: in the kernel, set
// elements only); a pod that finished, one of another node and one gone
// leave nothing.
func TestEngineWritesArrivingPodsFirst(t *testing.T) {
	veth := contract.HostVethName("shop", "db-1", "", "eth0")
	// the node's links: db-1's host veth once its ADD made it
	var mu sync.Mutex
	links := map[string]portLink{}
	r := newRig(t, func(e *Engine) {
		e.scanLinks = func() (map[string]portLink, error) {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(links), nil
		}
		e.lookupLink = func(name string) (portLink, bool) {
			mu.Lock()
			defer mu.Unlock()
			l, ok := links[name]
			return l, ok
		}
	})
	r.pols.Add(denyIngress())
	r.pods.Add(pod("db-1", "", map[string]string{"app": "db"}))
	rs := r.until("db-1's chains before its ADD", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	p := rs.Pods[0]
	if p.Name != "db-1" || !p.IngressIsolated || len(p.Addrs) != 0 || !slices.Equal(p.Ports, []string{veth}) || !slices.Contains(rs.Ports, veth) {
		t.Fatalf("arriving db-1 written as %+v (ports %v), want isolated, no address, port %s", p, rs.Ports, veth)
	}
	time.Sleep(200 * time.Millisecond) // the policy's revocation, if any
	r.w.mu.Lock()
	scans := r.w.revokes
	r.w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mu.Lock()
	links[veth] = portLink{ifName: "eth0"}
	mu.Unlock()
	req := policysock.Request{Namespace: "shop", Name: "db-1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.20")}, HostVeth: veth}
	if err := policysock.Wait(ctx, r.sock, req); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// addresses no pod had narrow nothing: no conntrack scan
	time.Sleep(200 * time.Millisecond)
	r.w.mu.Lock()
	if r.w.revokes != scans {
		t.Errorf("the arriving pod's addresses made %d conntrack scans, want none", r.w.revokes-scans)
	}
	r.w.mu.Unlock()
	after, _ := r.w.last()
	if len(after.Pods) != 1 {
		t.Fatalf("after the wait: pods %+v", after.Pods)
	}
	q := after.Pods[0]
	if !slices.Equal(q.Addrs, req.IPs) || !known(after, "10.244.1.20") {
		t.Fatalf("after the wait db-1 is %+v, want its address", q)
	}
	q.Addrs = nil
	if !q.Equal(p) {
		t.Fatalf("the wait changed more than db-1's addresses:\n%+v\nvs %+v", q, p)
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

func TestGainedOnly(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	base := policy.PodChains{ID: "p", Ports: []string{"pn1"}, IngressIsolated: true, Ingress: []string{"x"}}
	with := func(p policy.PodChains, addrs ...netip.Addr) policy.PodChains { p.Addrs = addrs; return p }
	knownC := func(x netip.Addr) bool { return x == c }
	other := base
	other.Ingress = []string{"y"}
	for _, tc := range []struct {
		what     string
		old, new policy.PodChains
		want     bool
	}{
		{"addresses no pod had", with(base), with(base, a, b), true},
		{"one more", with(base, a), with(base, a, b), true},
		{"an address another pod had", with(base), with(base, c), false},
		{"an address gone", with(base, a, b), with(base, a), false},
		{"its chains changed too", with(base), with(other, a), false},
		{"nothing changed", with(base, a), with(base, a), true},
	} {
		if got := gainedOnly(tc.old, tc.new, knownC); got != tc.want {
			t.Errorf("%s: gainedOnly %v, want %v", tc.what, got, tc.want)
		}
	}
}
