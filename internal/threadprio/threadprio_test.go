package threadprio

import (
	"runtime"
	"testing"
)

// onThread runs f on a goroutine locked to a fresh thread that ends with
// it, so that no test leaves a thread with a changed priority behind.
func onThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends here
		f()
	}()
	<-done
}

func TestCheckGivesThePriorityBack(t *testing.T) {
	onThread(func() {
		base, err := Nice()
		if err != nil {
			t.Error(err)
			return
		}
		if err := Check(-3); err != nil {
			t.Error(err)
			return
		}
		if n, _ := Nice(); n != base {
			t.Errorf("nice %d after Check(-3), was %d", n, base)
		}
	})
}

func TestDoGivesThePriorityBack(t *testing.T) {
	onThread(func() {
		base, err := Nice()
		if err != nil {
			t.Error(err)
			return
		}
		inside := 99
		Do(-4, func() { inside, _ = Nice() })
		if inside != -4 {
			t.Errorf("nice %d inside Do(-4)", inside)
		}
		if n, _ := Nice(); n != base {
			t.Errorf("nice %d after Do, was %d", n, base)
		}
	})
}

func TestOutOfRange(t *testing.T) {
	for _, n := range []int{-21, 20, 1 << 20} {
		onThread(func() {
			base, _ := Nice()
			if err := Check(n); err == nil {
				t.Errorf("Check(%d) took it", n)
			}
			ran := false
			Do(n, func() { ran = true })
			if !ran {
				t.Errorf("Do(%d) did not run f", n)
			}
			if got, _ := Nice(); got != base {
				t.Errorf("nice %d after Check/Do(%d), was %d", got, n, base)
			}
		})
	}
}

func TestZeroChangesNothing(t *testing.T) {
	onThread(func() {
		base, _ := Nice()
		if err := Check(0); err != nil {
			t.Error(err)
		}
		Do(0, func() {})
		if n, _ := Nice(); n != base {
			t.Errorf("nice %d after Check(0), Do(0), was %d", n, base)
		}
	})
}
