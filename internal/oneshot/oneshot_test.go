package oneshot

import (
	"runtime"
	"testing"
)

// TestStart: one P, unless the caller's environment says how many.
func TestStart(t *testing.T) {
	for _, c := range []struct {
		env       string
		before    int
		wantAfter int
	}{{"", 4, 1}, {"3", 3, 3}} {
		prev := runtime.GOMAXPROCS(c.before)
		t.Setenv("GOMAXPROCS", c.env)
		Start()
		got := runtime.GOMAXPROCS(prev)
		if got != c.wantAfter {
			t.Errorf("GOMAXPROCS=%q: %d Ps after Start, want %d", c.env, got, c.wantAfter)
		}
	}
}
