package engine

import (
	"runtime"
	"slices"
	"testing"

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
