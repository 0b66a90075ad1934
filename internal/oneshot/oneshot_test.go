package oneshot

import (
	"runtime"
	"testing"
)

func TestStartOneP(t *testing.T) {
	prev := runtime.GOMAXPROCS(4)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	t.Setenv("GOMAXPROCS", "")
	Start()
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS after Start = %d, want 1", got)
	}
}

func TestStartKeepsTheCallersSetting(t *testing.T) {
	prev := runtime.GOMAXPROCS(3)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	t.Setenv("GOMAXPROCS", "3")
	Start()
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Fatalf("GOMAXPROCS after Start with GOMAXPROCS=3 in the environment = %d, want 3", got)
	}
}
