package podfilter

import (
	"fmt"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/testns"
)

// TestPruneDeadL2Chains: Prune deletes the routed mode's port chains of
// veths that are gone (DEL leaves them: deleting one would hold the next
// close of an nftables socket for a grace period) and keeps a live
// port's.
func TestPruneDeadL2Chains(t *testing.T) {
	n := testns.New(t)
	g := Routed.At(t.TempDir())
	err := n.Do(func(ns.NetNS) error {
		ports, err := installPorts(g, 5)
		if err != nil {
			return err
		}
		for _, p := range ports[1:] { // their pods are gone
			if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.Name}}); err != nil {
				return err
			}
		}
		c, _, err := nftutil.Dial(nftTimeout, 0, ReceiveBuffer)
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		got, err := portChains(c)
		if err != nil {
			return err
		}
		if len(got) != len(ports) {
			t.Fatalf("port chains before Prune: %v, want one per port (%d)", got, len(ports))
		}
		if err := Prune(g); err != nil {
			return err
		}
		if got, err = portChains(c); err != nil {
			return err
		}
		if !slices.Equal(got, []int{ports[0].Index}) {
			t.Errorf("port chains after Prune: %v, want the live port's only (%d)", got, ports[0].Index)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// portChains are the interface indexes of the routed mode's port chains.
func portChains(c *nftables.Conn) ([]int, error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, ch := range chains {
		var i int
		if _, err := fmt.Sscanf(ch.Name, "port-%d", &i); err == nil && contract.IsPodFilterL2Table(ch.Table.Name) {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out, nil
}
