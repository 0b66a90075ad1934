package policynft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

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
	// one-pod-delta: the change a new pod's ADD waits for, through
	// ApplyDelta; one-pod-full: the same through Apply; one-pod-arrived:
	// the pod's chains and port written first (not timed, as the engine
	// does once its Pod object is scheduled), then what its ADD waits for
	// (its addresses), through ApplyDelta
	for _, mode := range []string{"delta", "full", "arrived"} {
		delta := mode != "full"
		b.Run("one-pod-"+mode, func(b *testing.B) {
			nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
			c := newPodChange(rs)
			// in the node netns throughout: the loop measures the writer,
			// not a setns per operation. ns/op counts everything (the way
			// back every 100 pods, the read-back of a write, which a call
			// right after the write does itself); p50 and p99 are the
			// calls that add a pod, what its ADD waits for.
			var took []time.Duration
			nettest.Do(b, node, func() error {
				for b.Loop() {
					var err error
					var d policy.Delta
					var next policy.Ruleset
					if mode == "arrived" {
						var pre policy.Delta
						pre, d, next = c.arrive()
						if _, err := w.ApplyDelta(pre); err != nil {
							return err
						}
					} else {
						d, next = c.add()
					}
					start := time.Now()
					if delta {
						_, err = w.ApplyDelta(d)
					} else {
						_, err = w.Apply(next)
					}
					took = append(took, time.Since(start))
					if err != nil {
						return err
					}
					if c.n%100 == 0 { // back to rs: the table stays of its size
						d, next := c.reset()
						if delta {
							_, err = w.ApplyDelta(d)
						} else {
							_, err = w.Apply(next)
						}
						if err != nil {
							return err
						}
					}
				}
				return nil
			})
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
			nettest.Do(b, node, func() error {
				d, err := w.Verify(c.rs)
				if err == nil && d != "" {
					err = fmt.Errorf("Verify after one-pod-%s: %s", mode, d)
				}
				return err
			})
		})
	}
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

// podChange makes the change of one new pod on a scaleRuleset node: an
// isolated pod jumping to two existing policies (one per direction), its
// addresses added to the peer sets of three policies, Known updated; and
// the way back to the Ruleset it started from.
type podChange struct {
	base, rs policy.Ruleset
	n        int
	added    []string
	changed  map[int]bool // policies whose peers changed
	// peered are the policies whose first rule has peer sets (and port
	// sets, or any port) of both families: a peer added is elements only
	peered []int
}

func newPodChange(rs policy.Ruleset) *podChange {
	c := &podChange{base: rs, rs: rs, changed: map[int]bool{}}
	both := func(v6s []bool) bool { return slices.Contains(v6s, false) && slices.Contains(v6s, true) }
	for j, p := range rs.Policies {
		r := p.Rules[0]
		var peers, ports []bool
		for _, x := range r.Peers {
			peers = append(peers, x.From.Is6())
		}
		for _, x := range r.Ports {
			ports = append(ports, x.Addrs.From.Is6())
		}
		if !r.AnyPeer && both(peers) && (r.AnyPort || both(ports)) {
			c.peered = append(c.peered, j)
		}
	}
	return c
}

// add is the Delta that adds pod n and the Ruleset it makes.
func (c *podChange) add() (policy.Delta, policy.Ruleset) {
	i := c.n
	c.n++
	a := netip.AddrFrom4([4]byte{10, 65, byte(i >> 8), byte(i)})
	b := netip.AddrFrom16([16]byte{0xfd, 0x65, 14: byte(i >> 8), 15: byte(i)})
	k := (i * 2) % len(c.rs.Policies) // an ingress and an egress policy
	p := policy.PodChains{ID: fmt.Sprintf("new%d", i), Namespace: "bench", Name: fmt.Sprintf("new%d", i), Addrs: []netip.Addr{a, b},
		IngressIsolated: true, Ingress: []string{c.rs.Policies[k].ID}, EgressIsolated: true, Egress: []string{c.rs.Policies[k+1].ID}}
	d := policy.Delta{LocalPodCIDRs: c.rs.LocalPodCIDRs, Ports: c.rs.Ports, BridgePorts: c.rs.BridgePorts, Pods: []policy.PodChains{p}}
	known := slices.Clone(c.rs.Known)
	for _, x := range []netip.Addr{a, b} {
		j, _ := slices.BinarySearchFunc(known, x, netip.Addr.Compare)
		known = slices.Insert(known, j, x)
	}
	d.Known = known
	for m := range 3 {
		j := c.peered[(i*3+m)%len(c.peered)]
		pol := c.rs.Policies[j]
		pol.Rules = slices.Clone(pol.Rules)
		r := pol.Rules[0]
		r.Peers = append(slices.Clone(r.Peers), one(a), one(b))
		pol.Rules[0] = r.Canonical()
		d.Policies = append(d.Policies, pol)
		c.changed[j] = true
	}
	c.added = append(c.added, p.ID)
	c.rs = c.rs.With(d)
	return d, c.rs
}

// arrive is add for a pod judged by its port, written first without its
// addresses (pre: its chains and port elements) and then given them (d).
func (c *podChange) arrive() (pre, d policy.Delta, next policy.Ruleset) {
	before := c.rs
	d, _ = c.add()
	port := fmt.Sprintf("pnnew%d", c.n-1)
	ports := append(slices.Clone(before.Ports), port)
	slices.Sort(ports)
	d.Ports = ports
	d.Pods[0].Ports = []string{port}
	p := d.Pods[0]
	p.Addrs = nil
	pre = policy.Delta{LocalPodCIDRs: before.LocalPodCIDRs, Known: before.Known, Ports: ports, BridgePorts: before.BridgePorts, Pods: []policy.PodChains{p}}
	c.rs = before.With(pre).With(d)
	return pre, d, c.rs
}

// reset is the Delta back to the Ruleset it started from.
func (c *podChange) reset() (policy.Delta, policy.Ruleset) {
	rs := c.base
	d := policy.Delta{LocalPodCIDRs: rs.LocalPodCIDRs, Known: rs.Known, Ports: rs.Ports, BridgePorts: rs.BridgePorts, GonePods: c.added}
	for j := range c.changed {
		d.Policies = append(d.Policies, rs.Policies[j])
	}
	c.added, c.changed = nil, map[int]bool{}
	c.rs = c.rs.With(d)
	return d, c.rs
}
