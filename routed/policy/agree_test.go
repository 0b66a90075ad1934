package policy

import (
	"net/netip"
	"testing"
)

// TestExplainAgreesWithCompile generates clusters with random pods,
// namespaces and policies over all of the API, and checks, for random
// flows (pods, hostNetwork pods, outside addresses; every protocol; ports
// that policies name and others) that Explain, which reads the objects,
// agrees with the AND of the Matchers of the compiled Rulesets of the
// nodes of the two ends. It also counts both verdicts, so that a generator
// that only produces one of them fails.
func TestExplainAgreesWithCompile(t *testing.T) {
	for seed := range uint64(6) {
		g := newGen(seed, 3, 4, 80, 30)
		matchers := map[string]*Matcher{}
		for _, n := range g.nodes {
			rs := g.s.Compile(n, g.cidrs[n])
			checkRuleset(t, rs)
			matchers[n] = NewMatcher(rs)
		}
		var allowed, denied, isolated, byRule int
		for range 20000 {
			src, dst := g.flowAddrs()
			proto, port := g.flowPort(src.Is4())
			v := g.s.Explain(src, dst, proto, port)
			got := true
			for _, x := range []netip.Addr{src, dst} {
				if n := g.s.nodeOf(x); n != "" {
					got = got && matchers[n].Allows(src, dst, proto, port)
				}
			}
			if got != v.Allowed {
				t.Fatalf("seed %d: %s -> %s proto %d port %d: compiled %v, Explain %v\n%s", seed, src, dst, proto, port, got, v.Allowed, v)
			}
			if v.Allowed {
				allowed++
			} else {
				denied++
			}
			if len(v.Egress.Isolating)+len(v.Ingress.Isolating) > 0 {
				isolated++
				if v.Allowed && src != dst {
					byRule++
				}
			}
		}
		t.Logf("seed %d: %d allowed (%d of them isolated, by a rule), %d denied", seed, allowed, byRule, denied)
		if allowed < 2000 || denied < 2000 || byRule < 1000 {
			t.Errorf("seed %d: the generator is lopsided: %d allowed, %d by a rule, %d denied", seed, allowed, byRule, denied)
		}
	}
}
