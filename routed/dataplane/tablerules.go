package dataplane

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/desired"
)

// The chains and the counter of podnet's table:
//
//	table inet podnet {
//	  counter tunnel_dropped                 encapsulated packets dropped
//	  set peers4, peers6                     remote Nodes' addresses
//	  set remote4, remote6 (interval)        remote Nodes' PodCIDRs
//	  set local4, local6 (interval)          this node's PodCIDRs
//	  set cluster4, cluster6 (interval)      the cluster CIDRs
//	  chain prerouting { type filter hook prerouting priority raw; policy accept;
//	    <encapsulated> jump tunnel_outer     ipip: meta l4proto 4; vxlan: udp dport <port>
//	    iifname <tunnel device> jump tunnel_inner
//	  }
//	  chain tunnel_outer {                   an encapsulated packet, as it arrives
//	    iifname "pn*" drop (counted)         from a pod: never (whatever its destination)
//	    iifname "podnet0" drop (counted)     from the bridge's pods: never
//	    ip saddr @cluster4 drop (counted)    from a pod address: never (and ip6)
//	    fib daddr type != local return       not for this node: not the filter's business
//	    ip saddr @peers4 accept              from a Node: yes (and ip6)
//	    drop (counted)                       from anyone else: no
//	  }
//	  chain tunnel_inner {                   a packet the tunnel device decapsulated
//	    ip saddr @remote4 ip daddr @local4 accept            remote pod to local pod
//	    ip saddr @remote4 fib daddr type local accept        remote pod to this node
//	    ip saddr @peers4 ip daddr @local4 accept             remote node to local pod
//	    (the same for ip6)
//	    drop (counted)                       anything else: forged source or transit
//	  }
//	  chain postrouting { type nat hook postrouting priority srcnat;
//	    ip daddr <clusterCIDR> return        (one per cluster CIDR, per family)
//	    ip saddr <localPodCIDR> masquerade   (one per local PodCIDR; an IPv6
//	                                         one per --masquerade-ipv6: with
//	                                         auto, unique local fc00::/7 only)
//	  }
//	}
//
// The filter runs at priority raw, before conntrack: a dropped packet
// leaves no connection state. Encapsulated packets from pods are dropped
// whatever their destination (as Calico does): sent to another node and
// masqueraded on the way, they would arrive from this node's address, a
// peer's.
const (
	chainPrerouting  = "prerouting"
	chainTunnelOuter = "tunnel_outer"
	chainTunnelInner = "tunnel_inner"
	chainPostrouting = "postrouting"
	// CounterTunnelDropped is the named counter of the encapsulated
	// packets the table drops.
	CounterTunnelDropped = "tunnel_dropped"
)

// bridgeDevice is podnet-bridge's default bridge (plugins/veth
// DefaultBridge): its pods' packets come in through it.
const bridgeDevice = "podnet0"

// buildTable is the content of the table for spec (canonical); an empty
// spec has none.
func buildTable(spec TableSpec) *nftutil.Table {
	def := &nftutil.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable}
	if spec.tunnel() {
		def.Counters = []string{CounterTunnelDropped}
		def.Sets = tunnelSets(spec)
		def.Chains = append(def.Chains, tunnelChains(spec)...)
	}
	if spec.Masquerade {
		def.Chains = append(def.Chains, masqueradeChain(spec))
	}
	return def
}

// tunnelDevice is the device that decapsulates encap's packets.
func tunnelDevice(encap desired.Encap) string {
	if encap == desired.VXLAN {
		return desired.VXLANDevice
	}
	return desired.TunnelDevice
}

// encapsulated matches the packets of spec's encapsulation: IPIP
// (protocol 4) or VXLAN (UDP to its port).
func encapsulated(spec TableSpec) []expr.Any {
	if spec.Encap == desired.VXLAN {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(spec.VXLANPort))},
		}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_IPIP}},
	}
}

func tunnelChains(spec TableSpec) []nftutil.Chain {
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	pre := nftutil.Chain{
		Def: nftables.Chain{Name: chainPrerouting, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw},
		Rules: [][]expr.Any{
			append(encapsulated(spec), &expr.Verdict{Kind: expr.VerdictJump, Chain: chainTunnelOuter}),
			append(ifname(tunnelDevice(spec.Encap), false), &expr.Verdict{Kind: expr.VerdictJump, Chain: chainTunnelInner}),
		},
	}
	outer := nftutil.Chain{Def: nftables.Chain{Name: chainTunnelOuter}}
	outer.Rules = append(outer.Rules,
		append(ifname(contract.HostVethPrefix, true), countDrop()...),
		append(ifname(bridgeDevice, false), countDrop()...),
	)
	for _, v6 := range []bool{false, true} {
		outer.Rules = append(outer.Rules, nftutil.Join(lookupAddr(v6, true, setName(setCluster, v6)), countDrop()))
	}
	outer.Rules = append(outer.Rules, nftutil.Join(fibDaddrLocal(false), []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}))
	for _, v6 := range []bool{false, true} {
		outer.Rules = append(outer.Rules, nftutil.Join(lookupAddr(v6, true, setName(setPeers, v6)), []expr.Any{accept}))
	}
	outer.Rules = append(outer.Rules, countDrop())

	inner := nftutil.Chain{Def: nftables.Chain{Name: chainTunnelInner}}
	for _, v6 := range []bool{false, true} {
		remote, peers := setName(setRemote, v6), setName(setPeers, v6)
		local := lookupAddr(v6, false, setName(setLocal, v6))[2:] // the family is matched already
		inner.Rules = append(inner.Rules,
			nftutil.Join(lookupAddr(v6, true, remote), local, []expr.Any{accept}),
			nftutil.Join(lookupAddr(v6, true, remote), fibDaddrLocal(true), []expr.Any{accept}),
			nftutil.Join(lookupAddr(v6, true, peers), local, []expr.Any{accept}),
		)
	}
	inner.Rules = append(inner.Rules, countDrop())
	return []nftutil.Chain{pre, outer, inner}
}

// masqueradeChain is the NAT chain: pod traffic to the cluster CIDRs keeps
// its address, pod traffic to anywhere else is masqueraded (IPv6 pod
// traffic as MasqueradeIPv6 says).
func masqueradeChain(spec TableSpec) nftutil.Chain {
	c := nftutil.Chain{Def: nftables.Chain{Name: chainPostrouting, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}}
	for _, p := range spec.ClusterCIDRs {
		c.Rules = append(c.Rules, matchPrefix(p, false, &expr.Verdict{Kind: expr.VerdictReturn}))
	}
	for _, p := range spec.LocalPodCIDRs {
		if spec.masquerades(p) {
			c.Rules = append(c.Rules, matchPrefix(p, true, &expr.Masq{}))
		}
	}
	return c
}

// countDrop counts the packet in the table's counter and drops it.
func countDrop() []expr.Any {
	return []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CounterTunnelDropped},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// ifname matches the input interface's name, or (prefix) its start.
func ifname(name string, prefix bool) []expr.Any {
	data := []byte(name)
	if !prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

// fibDaddrLocal matches packets addressed to this node (fib daddr type
// local), or with not, all others.
func fibDaddrLocal(is bool) []expr.Any {
	op := expr.CmpOpEq
	if !is {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: op, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// lookupAddr matches packets of the family v6 says whose source (or
// destination) address is in the named set. Its first two expressions
// match the family.
func lookupAddr(v6, source bool, set string) []expr.Any {
	proto, offset, size := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if source {
		offset = 12
	}
	if v6 {
		proto, offset, size = unix.NFPROTO_IPV6, 24, 16
		if source {
			offset = 8
		}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
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
