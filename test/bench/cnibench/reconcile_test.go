package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/test/nettest"
)

// TestReconcileStack runs the bench's podnet+podnet-ipam+reconcile stack
// once, small: the reconcile passes during both phases, frees every dead
// reservation planted before each, and leaves the node and the store as
// they were (the leak check, which would report a planted reservation
// left); the live pods keep their pod filter elements.
func TestReconcileStack(t *testing.T) {
	needRoot(t)
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	const dead, pods = 7, 3
	s := newStack(t.TempDir(), reconcileStackName, "podnet", "podnet-ipam", "10.205.0.0/16", []string{bin}).withReconcile("10.205.0.0/16", 10*time.Millisecond, dead)
	if err := s.prepare(nettest.NewNode(t).NS, 1); err != nil {
		t.Fatal(err)
	}
	pool := make([]ns.NetNS, pods)
	for i := range pool {
		pool[i] = nettest.NewNetNS(t)
	}
	r := s.run(pool, "sequential", 1, 1)
	if len(r.Errors) > 0 || r.Leak != "" {
		t.Fatalf("errors %q, leak %q", r.Errors, r.Leak)
	}
	if r.ReconcilePlanted != 2*dead || r.ReconcileReclaimed != 2*dead {
		t.Errorf("planted %d, freed %d dead reservations; want %d both", r.ReconcilePlanted, r.ReconcileReclaimed, 2*dead)
	}
	if r.ReconcilePasses < 2 || len(r.ReconcilePassMs) != r.ReconcilePasses || r.ReconcileHolds < 2 || r.ReconcileMaxLockHoldMs <= 0 {
		t.Errorf("passes %d (%d times), lock holds %d, longest %.3f ms: want a pass or more per phase, each phase's dead freed under the lock",
			r.ReconcilePasses, len(r.ReconcilePassMs), r.ReconcileHolds, r.ReconcileMaxLockHoldMs)
	}
	if len(r.AddMs) != pods || len(r.DelMs) != pods {
		t.Errorf("%d ADDs and %d DELs timed, want %d", len(r.AddMs), len(r.DelMs), pods)
	}
}

// TestCheckLivePods: the check after the ADD phase passes with every pod
// attached and fails when a pod's pod filter element is gone or a pod is
// missing.
func TestCheckLivePods(t *testing.T) {
	needRoot(t)
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	s := newStack(t.TempDir(), "podnet+podnet-ipam", "podnet", "podnet-ipam", "10.201.0.0/16", []string{bin})
	if err := s.prepare(nettest.NewNode(t).NS, 0); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNetNS(t)
	rt := s.rtConf("live", pod)
	if _, err := s.add(rt); err != nil {
		t.Fatal(err)
	}
	if err := checkLivePods(s.node, 1); err != nil {
		t.Fatalf("one pod attached: %v", err)
	}
	if err := checkLivePods(s.node, 2); err == nil || !strings.Contains(err.Error(), "1 pods attached") {
		t.Errorf("want 2 pods, 1 attached: %v", err)
	}
	idx := -1
	for _, e := range must(nettest.ReadPodFilter(s.node)) {
		if e.Set == "ports" {
			idx = e.Index
		}
	}
	nft(t, s.node, fmt.Sprintf("delete element inet podnet-pods ports { %d }", idx))
	if err := checkLivePods(s.node, 1); err == nil || !strings.Contains(err.Error(), "1 live pods lost their pod filter elements") {
		t.Errorf("ports element deleted: %v", err)
	}
	if _, err := s.del(rt); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
