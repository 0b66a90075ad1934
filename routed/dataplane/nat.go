package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// nftTimeout bounds one nftables transaction. The nftables library waits
// for one acknowledgement per message of a batch; when the kernel aborts
// a batch and answers once (seen while several netns load nf_tables'
// modules at the same moment, in a VM), that wait never ends and the
// daemon would stop (no node state written, no resync). With a deadline
// the transaction fails, the error is reported, and the next resync
// retries.
const nftTimeout = 10 * time.Second

// newNFT opens an nftables connection whose reads and writes give up
// after nftTimeout.
func newNFT() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *netlink.Conn) error {
		return c.SetDeadline(time.Now().Add(nftTimeout))
	}))
}

// NAT keeps the masquerade rules: traffic from this node's PodCIDRs to any
// destination outside every cluster CIDR leaves with the node's address;
// pod-to-pod traffic keeps the pod address.
type NAT struct {
	applied string // the last rule set written, to skip identical rewrites
}

// Apply replaces the table's content atomically (add, delete, re-create in
// one transaction) when the inputs changed, or, with verify, when the
// table in the kernel is not the one last written (someone deleted it or
// changed its rules: the periodic resync repairs it).
//
//	table inet podnet {
//	  chain postrouting { type nat hook postrouting priority srcnat;
//	    ip daddr <clusterCIDR> return        (one per cluster CIDR, per family)
//	    ip saddr <localPodCIDR> masquerade   (one per local PodCIDR)
//	  }
//	}
func (n *NAT) Apply(local, cluster []netip.Prefix, verify bool) error {
	key := fmt.Sprint(local, cluster)
	if key == n.applied && (!verify || natInPlace(len(local)+len(cluster))) {
		return nil
	}
	c, err := newNFT()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable}
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	chain := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	for _, p := range cluster {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: matchPrefix(p, false, &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	for _, p := range local {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: matchPrefix(p, true, &expr.Masq{})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write nftables table %s: %w", contract.NFTable, err)
	}
	n.applied = key
	return nil
}

// natInPlace tells whether podnet's table is in the kernel with its chain
// and the number of rules it was written with.
func natInPlace(rules int) bool {
	c, err := newNFT()
	if err != nil {
		return false
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable}
	got, err := c.GetRules(table, &nftables.Chain{Name: "postrouting", Table: table})
	return err == nil && len(got) == rules
}

// matchPrefix matches packets whose source (or destination) is in p, then
// runs action.
func matchPrefix(p netip.Prefix, source bool, action expr.Any) []expr.Any {
	p = p.Masked()
	proto, offset, size := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if source {
		offset = 12
	}
	if p.Addr().Is6() {
		proto, offset, size = unix.NFPROTO_IPV6, 24, 16
		if source {
			offset = 8
		}
	}
	mask := make([]byte, size)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
		action,
	}
}

// DeleteNAT removes podnet's table; a missing table is fine.
func DeleteNAT() error {
	c, err := newNFT()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == contract.NFTable }) {
		return nil
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) && !strings.Contains(err.Error(), "no such file") {
		return fmt.Errorf("delete nftables table %s: %w", contract.NFTable, err)
	}
	return nil
}
