package policynft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/nftables"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// scaleRuleset: pods local pods, policies policies of 1-3 rules, each pod
// selected by 2 policies.
func scaleRuleset(seed uint64, pods, policies int) policy.Ruleset {
	g := &gen{r: rand.New(rand.NewPCG(seed, seed))}
	rs := policy.Ruleset{LocalPodCIDRs: localCIDRs}
	for i := range policies {
		rs.Policies = append(rs.Policies, g.policy(i))
	}
	for i := range pods {
		a := netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i + 2)})
		b := netip.AddrFrom16([16]byte{0xfd, 0x64, 0, 1, 14: byte(i >> 8), 15: byte(i + 2)})
		p := policy.PodChains{ID: fmt.Sprintf("pod%d", i), Addrs: []netip.Addr{a, b}}
		for k := range 2 {
			pol := rs.Policies[(i*2+k)%policies]
			if pol.Direction == policy.Ingress {
				p.IngressIsolated, p.Ingress = true, append(p.Ingress, pol.ID)
			} else {
				p.EgressIsolated, p.Egress = true, append(p.Egress, pol.ID)
			}
		}
		rs.Known = append(rs.Known, a, b)
		rs.Pods = append(rs.Pods, p)
	}
	return rs
}

// BenchmarkApplyScale: a node of 500 isolated pods and 1,000 policies.
// "one-policy-peer" adds a peer to one policy (an incremental write and
// its read-back of what it changed); "resync" is a resync with nothing
// committed since the last write (the generation says so: no reading).
func BenchmarkApplyScale(b *testing.B) {
	node := nettest.NewNetNS(b)
	w := &nft.Writer{}
	b.Cleanup(w.Close)
	rs := scaleRuleset(1, 500, 1000)
	nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
	b.Run("one-policy-peer", func(b *testing.B) {
		i := 0
		for b.Loop() {
			next := rs
			next.Policies = append([]policy.PolicyChain(nil), rs.Policies...)
			p := next.Policies[7]
			p.Rules = append([]policy.Rule(nil), p.Rules...)
			r := p.Rules[0]
			r.AnyPeer = false
			r.Peers = append(append([]policy.Range(nil), r.Peers...), one(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})))
			p.Rules[0] = r
			next.Policies[7] = p
			i++
			nettest.Do(b, node, func() error { _, err := w.Apply(next); return err })
		}
	})
	b.Run("resync", func(b *testing.B) {
		nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
		for b.Loop() {
			nettest.Do(b, node, func() error { _, err := w.Resync(rs); return err })
		}
	})
	// a commit to another table before each resync: the whole table is
	// read and compared
	b.Run("resync-after-foreign-commit", func(b *testing.B) {
		nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
		other := &nftables.Table{Family: nftables.TableFamilyINet, Name: "someone-else"}
		for b.Loop() {
			nettest.Do(b, node, func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				c.AddTable(other)
				if err := c.Flush(); err != nil {
					return err
				}
				repaired, err := w.Resync(rs)
				if err == nil && repaired {
					err = fmt.Errorf("resync repaired an untouched table")
				}
				return err
			})
		}
	})
}
