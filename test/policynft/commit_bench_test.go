package policynft

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// BenchmarkCommitKinds: what one element costs the kernel's commit in
// the table of a node with 200 pods, 1,000 NetworkPolicies and 100
// ClusterNetworkPolicies (what a new pod's write adds): "set" one address
// in known4 (a plain set), "vmap" one address in ingress4 jumping to a
// pod chain (a verdict: the kernel then validates the whole table at
// commit), each added in one transaction and deleted in another.
func BenchmarkCommitKinds(b *testing.B) {
	node := nettest.NewNetNS(b)
	w := &nft.Writer{}
	b.Cleanup(w.Close)
	rs := tierScaleRuleset(200, 1000, 100)
	nettest.Do(b, node, func() error { return w.ApplyFull(rs) })
	addr := netip.MustParseAddr("10.64.250.250")
	for _, kind := range []string{"set", "vmap"} {
		b.Run(kind, func(b *testing.B) {
			nettest.Do(b, node, func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				defer c.CloseLasting()
				t := &nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName}
				name := "known4"
				if kind == "vmap" {
					name = "ingress4"
				}
				s, err := c.GetSetByName(t, name)
				if err != nil {
					return fmt.Errorf("set %s: %w", name, err)
				}
				chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
				if err != nil {
					return err
				}
				target := ""
				for _, ch := range chains {
					if ch.Table.Name == nft.TableName && strings.HasPrefix(ch.Name, "pod-") {
						target = ch.Name
						break
					}
				}
				el := []nftables.SetElement{{Key: addr.AsSlice()}}
				if kind == "vmap" {
					el[0].VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: target}
				}
				for b.Loop() {
					if err := c.SetAddElements(s, el); err != nil {
						return err
					}
					if err := c.Flush(); err != nil {
						return fmt.Errorf("add: %w", err)
					}
					b.StopTimer()
					if err := c.SetDeleteElements(s, el); err != nil {
						return err
					}
					if err := c.Flush(); err != nil {
						return fmt.Errorf("delete: %w", err)
					}
					b.StartTimer()
				}
				return nil
			})
		})
	}
}
