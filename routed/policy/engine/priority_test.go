package engine

import (
	"context"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/routed/policy"
)

// The write loop writes at Config.LoopNice (a thread of its own), and the
// goroutines that are not the loop keep the process's priority.
func TestLoopWritesAtItsNice(t *testing.T) {
	base, err := threadprio.Nice()
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(e *Engine) { e.cfg.LoopNice = -7 })
	r.pods.Add(pod("web-0", "10.244.1.10", map[string]string{"app": "web"}))
	r.until("web-0", func(rs policy.Ruleset) bool { return len(rs.Pods) > 0 || len(rs.Known) > 0 })
	r.w.mu.Lock()
	nice := slices.Clone(r.w.nice)
	r.w.mu.Unlock()
	if len(nice) == 0 {
		t.Fatal("no write recorded its thread's nice value")
	}
	for i, n := range nice {
		if n != -7 {
			t.Fatalf("write %d ran at nice %d, want -7 (all: %v)", i, n, nice)
		}
	}
	// the other threads are untouched: a new goroutine's thread
	got := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		n, _ := threadprio.Nice()
		got <- n
	}()
	if n := <-got; n != base {
		t.Fatalf("another thread runs at nice %d, the process at %d", n, base)
	}
}

// LoopNice 0 leaves the loop at the process's priority.
func TestLoopNiceZeroKeepsTheProcesssPriority(t *testing.T) {
	base, err := threadprio.Nice()
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.pods.Add(pod("web-0", "10.244.1.10", map[string]string{"app": "web"}))
	r.until("web-0", func(rs policy.Ruleset) bool { return len(rs.Pods) > 0 || len(rs.Known) > 0 })
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	for i, n := range r.w.nice {
		if n != base {
			t.Fatalf("write %d ran at nice %d, the process at %d", i, n, base)
		}
	}
}

// TestWaitAnsweredFromTheWriteLoop: an ADD-time wait's answer is sent by
// the write loop right after the write that holds the pod (on its thread,
// at LoopNice), not by the waiting goroutine once it is scheduled again;
// the answer comes once, and the wait's metric counts it.
func TestWaitAnsweredFromTheWriteLoop(t *testing.T) {
	r := newRig(t, func(e *Engine) { e.cfg.LoopNice = -7 })
	r.pods.Add(pod("cart-0", "", map[string]string{"app": "cart"}))
	r.until("first write", func(policy.Ruleset) bool { return true })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type answer struct {
		err  error
		nice int
	}
	answers := make(chan answer, 4)
	req := policysock.Request{Namespace: "shop", Name: "cart-0", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9")}}
	if err := r.e.handleWait(ctx, req, func(err error) {
		n, _ := threadprio.Nice()
		answers <- answer{err, n}
	}); err != nil {
		t.Fatalf("wait: %v", err)
	}
	a := <-answers
	if a.err != nil || a.nice != -7 {
		t.Fatalf("answered %v at nice %d, want OK from the write loop (nice -7)", a.err, a.nice)
	}
	if rs, _ := r.w.last(); !known(rs, "10.244.1.9") {
		t.Fatal("answered before the pod's address was written")
	}
	select {
	case a := <-answers:
		t.Fatalf("a second answer: %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var waits uint64
	for _, mf := range mfs {
		if mf.GetName() == "podnet_policy_wait_seconds" {
			waits = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if waits != 1 {
		t.Fatalf("podnet_policy_wait_seconds counted %d waits, want 1", waits)
	}
}
