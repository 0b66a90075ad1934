package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// The bridge half of the policy: podnet-bridge's pods of one node talk
// through the bridge podnet0, and br_netfilter shows their IP traffic to
// the inet table's forward hook with the bridge, not the port, as its
// interfaces. There a pod is found by its address, which the pod filter
// guarantees for what a pod sends from its global addresses; what carries
// no address of the pod (its link-local source, a link-local, multicast or
// broadcast destination) is judged here, by port, in the bridge family,
// before br_netfilter hands the packet on:
//
//	table bridge podnet-policy {
//	  set ports { type ifname }          bridge ports of the pods the engine knows
//	  set isolated-in, isolated-eg       ports of pods isolated for ingress, egress
//	  counter unknown_dropped, counter link_dropped, counter unfiltered_dropped
//	  chain forward { type filter hook forward priority -200; policy accept
//	    TCP but a bare SYN (a connection under way) accept
//	    neighbor discovery between neighbours (hop limit 255) accept
//	    br_netfilter off: IP between two pod ports -> unfiltered_dropped, drop
//	    IP from or to a pod port not in @ports -> unknown_dropped, drop
//	    from @isolated-eg with an IPv6 link-local source -> link_dropped, drop
//	    to @isolated-in for a link-local, multicast or broadcast destination -> link_dropped, drop
//	  }
//	  chain input { type filter hook input priority -200; policy accept
//	    the same for what a pod port sends to the node itself
//	  }
//	}
//
// An isolated pod's link-local, multicast and broadcast traffic on the
// bridge is so dropped whatever its policies allow (neighbor discovery
// and ARP aside): a NetworkPolicy peer is a pod or an ipBlock, and none of
// these addresses is a pod's.
const (
	bridgeChainForward = "forward"
	bridgeChainInput   = "input"
	bridgeSetPorts     = "ports"
	bridgeSetIn        = "isolated-in"
	bridgeSetEg        = "isolated-eg"
	// CounterLinkDropped and CounterUnfiltered are the bridge table's
	// counters of isolated pods' link-local, multicast and broadcast
	// packets, and of bridged packets dropped because br_netfilter is off.
	CounterLinkDropped = "link_dropped"
	CounterUnfiltered  = "unfiltered_dropped"
)

var bridgePriority = nftables.ChainPriorityRef(-200)

// bridgeDef is the bridge table's content for a Ruleset.
type bridgeDef struct {
	ports, in, eg []nftables.SetElement
	unfiltered    bool
}

func bridgeTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName}
}

func buildBridge(rs policy.Ruleset) (*bridgeDef, error) {
	var b bridgeDef
	var err error
	if b.ports, err = ifnameElements(rs.BridgePorts); err != nil {
		return nil, fmt.Errorf("bridge ports: %w", err)
	}
	var in, eg []string
	for _, p := range rs.Pods {
		if p.Judged(policy.Ingress) {
			in = append(in, p.BridgePorts...)
		}
		if p.Judged(policy.Egress) {
			eg = append(eg, p.BridgePorts...)
		}
	}
	if b.in, err = ifnameElements(in); err != nil {
		return nil, fmt.Errorf("bridge ports: %w", err)
	}
	if b.eg, err = ifnameElements(eg); err != nil {
		return nil, fmt.Errorf("bridge ports: %w", err)
	}
	b.unfiltered = rs.BridgeUnfiltered
	return &b, nil
}

func (b *bridgeDef) equal(o *bridgeDef) bool {
	return o != nil && b.unfiltered == o.unfiltered &&
		sameElements(b.ports, o.ports) && sameElements(b.in, o.in) && sameElements(b.eg, o.eg)
}

// spec is the bridge table as data.
func (b *bridgeDef) spec() *nftutil.Table {
	set := func(name string, elems []nftables.SetElement) nftutil.Set {
		return nftutil.Set{Def: nftables.Set{Name: name, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}, Elems: elems}
	}
	return &nftutil.Table{
		Family:   nftables.TableFamilyBridge,
		Name:     TableName,
		Counters: []string{CounterUnknown, CounterLinkDropped, CounterUnfiltered},
		Sets:     []nftutil.Set{set(bridgeSetPorts, b.ports), set(bridgeSetIn, b.in), set(bridgeSetEg, b.eg)},
		Chains:   bridgeChains(b),
	}
}

// writeBridge writes the bridge table whole (whole: its counters start
// at 0) or only its sets' elements, in one transaction on c.
func (w *Writer) writeBridge(c *nftables.Conn, b *bridgeDef, whole bool) error {
	spec := b.spec()
	if whole {
		if err := spec.QueueWhole(c, nil, setElementsPerMessage); err != nil {
			return err
		}
	} else {
		t := spec.Ref()
		for i := range spec.Sets {
			s := spec.Sets[i].SetOf(t)
			c.FlushSet(s)
			if err := nftutil.QueueElements(c, s, spec.Sets[i].Elems, false, setElementsPerMessage); err != nil {
				return err
			}
		}
	}
	w.ours++ // (a failed one too: a generation check then fails, which only costs a read)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write nftables table bridge %s: %w", TableName, err)
	}
	return nil
}

// applyBridge puts b in the kernel when it is not what was last written
// there. Callers hold w.mu.
func (w *Writer) applyBridge(b *bridgeDef) error {
	if b.equal(w.bridgeLast) {
		return nil
	}
	c, err := w.nft()
	if err != nil {
		return err
	}
	whole := w.bridgeLast == nil || w.bridgeLast.unfiltered != b.unfiltered || w.bridgeWritten == nil
	if err := w.writeBridge(c, b, whole); err != nil {
		w.bridgeLast, w.bridgeWritten = nil, nil
		if whole {
			return err
		}
		// the table or a set is gone: write it whole
		if err := w.writeBridge(c, b, true); err != nil {
			return err
		}
		whole = true
	}
	if whole {
		written, err := nftutil.ReadBack(w.conn.Netlink(), nftables.TableFamilyBridge, TableName, nil, nil)
		if err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		w.bridgeWritten = written
	}
	w.bridgeLast = b
	return nil
}

// bridgeDiffers compares the kernel's bridge table with b and written, its
// structure read back after b was written: "" when they are the same.
func bridgeDiffers(c *nftables.Conn, nl *netlink.Conn, b *bridgeDef, written []string) (string, error) {
	d, err := nftutil.Differs(c, nl, b.spec(), written)
	if d != "" {
		d = "bridge table: " + d
	}
	return d, err
}

// bridgeChains are the bridge table's two base chains.
func bridgeChains(b *bridgeDef) []nftutil.Chain {
	accept := ptr(nftables.ChainPolicyAccept)
	base := func(name string, hook *nftables.ChainHook) nftables.Chain {
		return nftables.Chain{Name: name, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: bridgePriority, Policy: accept}
	}
	fwd := [][]expr.Any{established(), bridgeND()}
	if b.unfiltered {
		for _, v6 := range []bool{false, true} {
			fwd = append(fwd, nftutil.Join(etherIs(v6), podPort(expr.MetaKeyIIFNAME), podPort(expr.MetaKeyOIFNAME), countDrop(CounterUnfiltered)))
		}
	}
	fwd = append(fwd, unknownPort(expr.MetaKeyIIFNAME)...)
	fwd = append(fwd, unknownPort(expr.MetaKeyOIFNAME)...)
	fwd = append(fwd, isolatedLinkSource())
	fwd = append(fwd, isolatedNonPodDestination()...)
	in := [][]expr.Any{established(), bridgeND()}
	in = append(in, unknownPort(expr.MetaKeyIIFNAME)...)
	in = append(in, isolatedLinkSource())
	return []nftutil.Chain{
		{Def: base(bridgeChainForward, nftables.ChainHookForward), Rules: fwd},
		{Def: base(bridgeChainInput, nftables.ChainHookInput), Rules: in},
	}
}

// established accepts the TCP segments of connections under way (any
// but a bare SYN: the replies to what an isolated pod opened over
// link-local). The bridge family has no conntrack of its own here (it
// would need nf_conntrack_bridge, which does not go with br_netfilter), so
// a connection is told by its flags: a SYN, which opens one, is judged;
// an ACK or RST that belongs to no connection opens nothing. UDP and ICMP
// replies to an isolated pod's link-local address are dropped.
func established() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 1, Mask: []byte{0x16}, Xor: []byte{0}}, // SYN|RST|ACK
		&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: []byte{0x02}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: []byte{0x00}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// etherIs matches IPv4 (or IPv6) frames: meta protocol, the EtherType the
// bridge family sees (the pod filter drops tagged frames before this).
func etherIs(v6 bool) []expr.Any {
	et := []byte{0x08, 0x00}
	if v6 {
		et = []byte{0x86, 0xdd}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: et},
	}
}

// podPort matches a host-side pod interface ("pn*") as key's interface.
func podPort(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte(contract.HostVethPrefix)},
	}
}

func countDrop(counter string) []expr.Any {
	return []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counter},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// bridgeND accepts neighbor discovery between neighbours (hop limit 255).
func bridgeND() []expr.Any {
	return nftutil.Join(etherIs(true), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{255}},
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpGte, Register: unix.NFT_REG_1, Data: []byte{133}},
		&expr.Cmp{Op: expr.CmpOpLte, Register: unix.NFT_REG_1, Data: []byte{136}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	})
}

// unknownPort drops IP through a pod port (as key's interface) that is not
// in @ports.
func unknownPort(key expr.MetaKey) [][]expr.Any {
	var out [][]expr.Any
	for _, v6 := range []bool{false, true} {
		out = append(out, nftutil.Join(etherIs(v6), podPort(key), []expr.Any{
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: bridgeSetPorts, Invert: true},
		}, countDrop(CounterUnknown)))
	}
	return out
}

// inIsolated matches key's interface in set.
func inIsolated(key expr.MetaKey, set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: unix.NFT_REG_1},
		&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: set},
	}
}

// prefixMatch matches the len(prefix) bytes at offset of the network
// header against prefix under mask.
func prefixMatch(offset uint32, prefix, mask []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(prefix))},
		&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: uint32(len(prefix)), Mask: mask, Xor: make([]byte, len(prefix))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: prefix},
	}
}

func v6Prefix(first ...byte) []byte { p := make([]byte, 16); copy(p, first); return p }

// isolatedLinkSource drops what an egress-isolated pod sends from its
// IPv6 link-local address.
func isolatedLinkSource() []expr.Any {
	return nftutil.Join(etherIs(true), inIsolated(expr.MetaKeyIIFNAME, bridgeSetEg),
		prefixMatch(8, v6Prefix(0xfe, 0x80), v6Prefix(0xff, 0xc0)), countDrop(CounterLinkDropped))
}

// isolatedNonPodDestination drops, to an ingress-isolated pod, what is
// addressed to no pod: IPv6 link-local and multicast, IPv4 multicast and
// the limited broadcast.
func isolatedNonPodDestination() [][]expr.Any {
	to := expr.MetaKeyOIFNAME
	return [][]expr.Any{
		nftutil.Join(etherIs(true), inIsolated(to, bridgeSetIn), prefixMatch(24, v6Prefix(0xfe, 0x80), v6Prefix(0xff, 0xc0)), countDrop(CounterLinkDropped)),
		nftutil.Join(etherIs(true), inIsolated(to, bridgeSetIn), prefixMatch(24, v6Prefix(0xff), v6Prefix(0xff)), countDrop(CounterLinkDropped)),
		nftutil.Join(etherIs(false), inIsolated(to, bridgeSetIn), prefixMatch(16, []byte{224, 0, 0, 0}, []byte{0xf0, 0, 0, 0}), countDrop(CounterLinkDropped)),
		nftutil.Join(etherIs(false), inIsolated(to, bridgeSetIn), prefixMatch(16, []byte{255, 255, 255, 255}, []byte{0xff, 0xff, 0xff, 0xff}), countDrop(CounterLinkDropped)),
	}
}
