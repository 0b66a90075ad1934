package podfilter

// The pod filter's rules, as expressions (podfilter.go has the layout).

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// guardRule is one rule of the chain and its comment (shown by nft list).
type guardRule struct {
	comment string
	exprs   []expr.Any
}

func (r guardRule) userData() []byte {
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

// Registers: reg 1 holds a single value or the first field of a
// concatenation (the interface index, 4 bytes); the second field starts at
// the next 32-bit register, NFT_REG32_01.
const (
	reg1   = unix.NFT_REG_1
	reg2nd = unix.NFT_REG32_01
)

// l3 is a network protocol as the chain tells it apart: meta nfproto in
// the inet family; in the bridge (and netdev) family the EtherType of the
// frame as sent, read from the link-layer header: meta protocol would show
// the EtherType behind the one VLAN tag the kernel strips into the skb
// (a frame tagged VID 0 would pass as untagged IPv4), the payload
// expression puts the stripped tag back, so a tagged frame of any depth
// is never IPv4, IPv6 or ARP here.
type l3 int

const (
	l3IPv4 l3 = iota
	l3IPv6
	l3ARP
)

// EtherTypes the filter knows.
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherIPv6 = []byte{0x86, 0xdd}
	etherARP  = []byte{0x08, 0x06}
	// VLAN tags: 802.1Q, 802.1ad, and the old QinQ 0x9100
	etherVLAN = [][]byte{{0x81, 0x00}, {0x88, 0xa8}, {0x91, 0x00}}
)

const etherTypeOff = 12 // the EtherType, link-layer header

func etherType(et []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: etherTypeOff, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: et},
	}
}

func (g Guard) is(p l3) []expr.Any {
	if g.l2() {
		return etherType(map[l3][]byte{l3IPv4: etherIPv4, l3IPv6: etherIPv6, l3ARP: etherARP}[p])
	}
	nf := map[l3]byte{l3IPv4: unix.NFPROTO_IPV4, l3IPv6: unix.NFPROTO_IPV6}[p]
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{nf}},
	}
}

// icmp6Type matches ICMPv6 messages of type typ.
func icmp6Type(typ byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{typ}},
	}
}

// inSet looks up (iif . the len bytes at base+offset) in set; invert
// matches when it is absent.
func inSet(set string, base expr.PayloadBase, offset, length uint32, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
		&expr.Payload{DestRegister: reg2nd, Base: base, Offset: offset, Len: length},
		&expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert},
	}
}

// isLinkLocal6 matches when the 16 bytes at base+offset are in fe80::/10.
func isLinkLocal6(base expr.PayloadBase, offset uint32) []expr.Any {
	mask := make([]byte, 16)
	mask[0], mask[1] = 0xff, 0xc0
	ll := make([]byte, 16)
	ll[0], ll[1] = 0xfe, 0x80
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: base, Offset: offset, Len: 16},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: mask, Xor: make([]byte, 16)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: ll},
	}
}

// fromUnspecified matches IPv6 from ::.
func fromUnspecified() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv6Src, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 16)},
	}
}

// dropFor counts a drop under reason (and under the sums the reason
// belongs to) and drops.
func dropFor(reason string) []expr.Any {
	out := count(contract.PodFilterDropCounter(reason))
	switch reason {
	case contract.DropRouterAdvertisement:
		out = append(out, count(contract.PodFilterRAGuardCounter)...)
	case contract.DropVLAN, contract.DropEtherType, contract.DropOther:
	default:
		out = append(out, count(contract.PodFilterSpoofedCounter)...)
	}
	return append(out, drop)
}

// counters are the named counters of a table: the sums and one per
// reason.
func counters(reasons []string) []string {
	out := []string{contract.PodFilterSpoofedCounter, contract.PodFilterRAGuardCounter}
	for _, r := range reasons {
		out = append(out, contract.PodFilterDropCounter(r))
	}
	return out
}

// reasons are the drop reasons of g's main table.
func (g Guard) reasons() []string {
	if g.l2() {
		return contract.PodFilterDropReasons
	}
	var out []string
	for _, r := range contract.PodFilterDropReasons {
		switch r {
		case contract.DropARP, contract.DropMAC, contract.DropVLAN, contract.DropEtherType:
			continue // the netdev table's, or no such thing on a routed port
		}
		out = append(out, r)
	}
	return out
}

func count(counter string) []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counter}}
}

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

// Header offsets the rules read.
const (
	ipv4Src     = 12 // IPv4 source address, network header
	ipv6Src     = 8  // IPv6 source address, network header
	arpSrcMAC   = 8  // ARP sender hardware address, network header
	arpSrcIP    = 14 // ARP sender protocol address (Ethernet/IPv4 ARP; the kernel drops any other), network header
	etherSrc    = 6  // Ethernet source, link-layer header
	ndTarget    = 8  // Neighbor Solicitation and Advertisement target address, ICMPv6 header
	icmp6MLDRep = 131
	icmp6MLDEnd = 132
	icmp6RA     = 134
	icmp6NS     = 135
	icmp6NA     = 136
	icmp6Redir  = 137
	icmp6MLD2   = 143
)

// rules are the chain's rules, in order (see the top of this file). It is
// an allow-list: what a pod may send is accepted by name, and everything
// else meets a counted drop at the end of the chain (the chain's accept
// policy is for the ports that are not pods').
func (g Guard) rules() []guardRule {
	nh, th, ll := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader, expr.PayloadBaseLLHeader
	rules := []guardRule{
		{"not a pod's host veth", nftutil.Join([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: setPorts, Invert: true},
		}, []expr.Any{accept})},
	}
	if g.l2() {
		rules = append(rules, guardRule{"source MAC is not the pod's",
			nftutil.Join(inSet(setMACs, ll, etherSrc, 6, true), dropFor(contract.DropMAC))})
	}
	// The fast path: a pod's ordinary traffic (IPv4, and IPv6 other than
	// ICMPv6, from its own address) is accepted here, after 2 or 3 rules.
	// addrs6 holds the pod's own link-local address too.
	rules = append(rules,
		guardRule{"IPv4 from the pod's address", nftutil.Join(g.is(l3IPv4), inSet(setAddrs4, nh, ipv4Src, 4, false), []expr.Any{accept})},
		guardRule{"IPv6 other than ICMPv6 from the pod's address", nftutil.Join(g.is(l3IPv6), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		}, inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
		guardRule{"router advertisement from a pod", nftutil.Join(g.is(l3IPv6), icmp6Type(icmp6RA), dropFor(contract.DropRouterAdvertisement))},
		guardRule{"redirect from a pod", nftutil.Join(g.is(l3IPv6), icmp6Type(icmp6Redir), dropFor(contract.DropRouterAdvertisement))},
		// a pod's NA for another pod's address (link-local ones included:
		// on the bridge every pod shares the link) would take it over in
		// its neighbors' tables
		guardRule{"neighbor advertisement for an address not the pod's",
			nftutil.Join(g.is(l3IPv6), icmp6Type(icmp6NA), inSet(setAddrs6, th, ndTarget, 16, true), dropFor(contract.DropNeighborAdvert))},
		guardRule{"ICMPv6 from the pod's address", nftutil.Join(g.is(l3IPv6), inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
		// from :: only what an address without one sends: DAD for one of
		// its own addresses, and MLD reports
		guardRule{"DAD neighbor solicitation for the pod's address", nftutil.Join(g.is(l3IPv6), fromUnspecified(), icmp6Type(icmp6NS),
			inSet(setAddrs6, th, ndTarget, 16, false), []expr.Any{accept})},
	)
	for _, typ := range []byte{icmp6MLD2, icmp6MLDRep, icmp6MLDEnd} {
		rules = append(rules, guardRule{fmt.Sprintf("MLD (ICMPv6 type %d) from ::", typ), nftutil.Join(g.is(l3IPv6), fromUnspecified(), icmp6Type(typ), []expr.Any{accept})})
	}
	rules = append(rules,
		guardRule{"IPv6 from :: otherwise", nftutil.Join(g.is(l3IPv6), fromUnspecified(), dropFor(contract.DropUnspecified))},
		guardRule{"IPv6 from a link-local address not the pod's", nftutil.Join(g.is(l3IPv6), isLinkLocal6(nh, ipv6Src), dropFor(contract.DropLinkLocal))},
		guardRule{"IPv6 from another address", nftutil.Join(g.is(l3IPv6), dropFor(contract.DropIPv6Source))},
		guardRule{"IPv4 from another address", nftutil.Join(g.is(l3IPv4), dropFor(contract.DropIPv4Source))},
	)
	if g.l2() {
		rules = append(rules, arpRules(true)...)
		rules = append(rules, l2Tail()...)
	} else {
		rules = append(rules, guardRule{"anything else from a pod", dropFor(contract.DropOther)})
	}
	return rules
}

// arpRules admit ARP from the pod's IPv4 address (and probes from
// 0.0.0.0); withMAC: its sender hardware address must be the pod's MAC
// too (the bridge, where the MAC set exists).
func arpRules(withMAC bool) []guardRule {
	nh := expr.PayloadBaseNetworkHeader
	var out []guardRule
	if withMAC {
		out = append(out, guardRule{"ARP with a sender MAC not the pod's", nftutil.Join(etherType(etherARP), inSetPadded(setMACs, nh, arpSrcMAC, 6), dropFor(contract.DropARP))})
	}
	return append(out,
		guardRule{"ARP probe", nftutil.Join(etherType(etherARP), []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: nh, Offset: arpSrcIP, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0, 0, 0, 0}},
			accept,
		})},
		guardRule{"ARP from the pod's IPv4 address", nftutil.Join(etherType(etherARP), inSet(setAddrs4, nh, arpSrcIP, 4, false), []expr.Any{accept})},
		guardRule{"ARP from another address", nftutil.Join(etherType(etherARP), dropFor(contract.DropARP))},
	)
}

// inSetPadded is inSet (inverted) for a 6-byte MAC, whose set key is
// padded to 8 bytes.
func inSetPadded(set string, base expr.PayloadBase, offset, length uint32) []expr.Any {
	return inSet(set, base, offset, length, true)
}

// l2Tail drops, counted by reason, the frames no rule above allowed:
// tagged ones and other EtherTypes.
func l2Tail() []guardRule {
	var out []guardRule
	for _, vt := range etherVLAN {
		out = append(out, guardRule{fmt.Sprintf("VLAN tag %x", vt), nftutil.Join(etherType(vt), dropFor(contract.DropVLAN))})
	}
	return append(out, guardRule{"any other EtherType", dropFor(contract.DropEtherType)})
}
