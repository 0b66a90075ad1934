package policy

import (
	"reflect"
	"testing"
)

// TestDeterministic: the same objects give the same Ruleset, whatever the
// order of map iteration, and a fresh index gives what a cached one does.
func TestDeterministic(t *testing.T) {
	g1 := newGen(42, 10, 20, 1000, 100)
	g2 := newGen(42, 10, 20, 1000, 100)
	for _, n := range g1.nodes {
		r1 := g1.s.Compile(n, g1.cidrs[n])
		r2 := g2.s.Compile(n, g2.cidrs[n])
		if !reflect.DeepEqual(r1, r2) {
			t.Fatalf("node %s: two identical clusters compile differently", n)
		}
		g1.s.ix = nil
		if r3 := g1.s.Compile(n, g1.cidrs[n]); !reflect.DeepEqual(r1, r3) {
			t.Fatalf("node %s: recompiling differs", n)
		}
	}
}
