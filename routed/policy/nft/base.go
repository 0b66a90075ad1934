package nft

// The three hooked chains of table inet podnet-policy and the rules they
// share (names.go has the layout).

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// baseChains are the three hooked chains.
func baseChains() []chainDef {
	accept := ptr(nftables.ChainPolicyAccept)
	eg := func(name string, hook *nftables.ChainHook) chainDef {
		return chainDef{
			chain: nftables.Chain{Name: name, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: priorityEgress, Policy: accept},
			rules: baseRules(policy.Egress),
			sig:   "base egress",
		}
	}
	return []chainDef{
		eg(chainEgressFwd, nftables.ChainHookForward),
		eg(chainEgressIn, nftables.ChainHookInput),
		{
			chain: nftables.Chain{Name: chainIngressFwd, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: priorityIngress, Policy: accept},
			rules: baseRules(policy.Ingress),
			sig:   "base ingress",
		},
	}
}

// baseRules are a base chain's rules: established and related first,
// then unknown local pod addresses dropped, then the verdict map of the
// local pod's address (the source for egress, the destination for
// ingress).
func baseRules(d policy.Direction) [][]expr.Any {
	rules := [][]expr.Any{{
		&expr.Ct{Register: unix.NFT_REG_1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  binary.NativeEndian.AppendUint32(nil, 0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: binary.NativeEndian.AppendUint32(nil, 0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}}
	source := d == policy.Egress
	if source {
		// A TCP packet that conntrack picked up mid-stream (ct state new
		// without a bare SYN) from or to an isolated local pod is dropped:
		// after a revocation deleted a connection's entry, the first
		// packet of either side would otherwise start a new entry, and one
		// from the isolated pod's side (a retransmission of data whose ACK
		// was dropped) would be judged as a new connection the other way
		// and make the peer's packets replies again: the revoked
		// connection would live on. Pods no policy isolates keep the
		// kernel's loose pickup (a conntrack flush, an entry evicted from
		// a full table), so the rule costs them nothing.
		//
		// The pods judged in either direction are looked up in a plain
		// set (judged4, judged6: the verdict maps' keys), not in the
		// verdict maps as sets: the kernel validates the whole table at
		// each commit that adds a jump (a new pod's chain and map
		// elements), and each lookup of a verdict map walks every
		// element and every pod and policy chain behind it, and makes
		// each message of map elements cost as much again. Eight such
		// lookups per egress base chain made a new pod's transaction
		// several times slower at 500 pods.
		for _, v6 := range []bool{false, true} {
			for _, src := range []bool{true, false} {
				rules = append(rules, nftutil.Join(nfproto(v6), []expr.Any{
					&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG_1},
					&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{unix.IPPROTO_TCP}},
					&expr.Ct{Register: unix.NFT_REG_1, Key: expr.CtKeySTATE},
					&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 4,
						Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW),
						Xor:  binary.NativeEndian.AppendUint32(nil, 0)},
					&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: binary.NativeEndian.AppendUint32(nil, 0)},
					&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
					&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 1,
						Mask: []byte{0x17}, Xor: []byte{0}}, // FIN|SYN|RST|ACK
					&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: []byte{0x02}}, // not a bare SYN
					loadAddr(v6, src, unix.NFT_REG_1),
					// is the pod judged in either direction
					&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: famName(setJudged, v6)},
					&expr.Verdict{Kind: expr.VerdictDrop},
				}))
			}
		}
	}
	// Neighbor discovery, which conntrack does not track, is not the
	// policy's to refuse, as ARP is not: a pod resolves its gateway (the
	// host veth) with Neighbor Solicitations from its global address (an
	// egress-isolated IPv6 pod would lose its gateway), and on
	// podnet-bridge's bridge, which br_netfilter shows to the forward
	// hook, pods resolve each other (an ingress-isolated pod would lose
	// its neighbours' advertisements). Only neighbor discovery between
	// neighbours passes: hop limit 255, which a router never forwards
	// (RFC 4861 makes receivers drop any other) and which a routed packet
	// no longer has when it reaches the forward hook. So between a pod and
	// its gateway or bridge neighbours; anything else with these ICMPv6
	// types is judged like any packet.
	rules = append(rules, nftutil.Join(nfproto(true), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{255}}, // hop limit
		&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpGte, Register: unix.NFT_REG_1, Data: []byte{133}}, // router solicitation
		&expr.Cmp{Op: expr.CmpOpLte, Register: unix.NFT_REG_1, Data: []byte{136}}, // neighbor advertisement
		&expr.Verdict{Kind: expr.VerdictAccept},
	}))
	// A packet through a pod's routed host veth is that pod's, whatever
	// its addresses (a link-local one, one the pod does not own): the
	// port decides which pod's chain judges it, before any address does.
	// A host veth the engine does not know (a pod whose policy is not in
	// the kernel yet) passes nothing.
	ifname := expr.MetaKeyIIFNAME
	if !source {
		ifname = expr.MetaKeyOIFNAME
	}
	// A pod cannot block itself (a Service hairpin): through the port of
	// a pod judged by its ports, its own address as the peer passes
	// (setHairpin).
	for _, v6 := range []bool{false, true} {
		rules = append(rules, nftutil.Join(nfproto(v6), []expr.Any{
			&expr.Meta{Key: ifname, Register: unix.NFT_REG_1},
			loadAddr(v6, !source, unix.NFT_REG_2),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: famName(setHairpin, v6)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}))
	}
	rules = append(rules,
		[]expr.Any{
			&expr.Meta{Key: ifname, Register: unix.NFT_REG_1},
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: portMapName(d), DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true},
		},
		[]expr.Any{
			&expr.Meta{Key: ifname, Register: unix.NFT_REG_1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte(contract.HostVethPrefix)},
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: setPorts, Invert: true},
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CounterUnknown},
			&expr.Verdict{Kind: expr.VerdictDrop},
		},
	)
	for _, v6 := range []bool{false, true} {
		rules = append(rules, nftutil.Join(nfproto(v6), []expr.Any{
			loadAddr(v6, source, unix.NFT_REG_1),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: famName(setLocal, v6)},
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: famName(setKnown, v6), Invert: true},
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CounterUnknown},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}))
	}
	for _, v6 := range []bool{false, true} {
		rules = append(rules, nftutil.Join(nfproto(v6), []expr.Any{
			loadAddr(v6, source, unix.NFT_REG_1),
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: mapName(d, v6), DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true},
		}))
	}
	return rules
}

// dropLog logs a pod chain's drop, at most rate packets a second (burst 5).
// The prefix names the pod and the direction; the kernel caps it at 127
// bytes.
func dropLog(p policy.PodChains, d policy.Direction, rate uint64) []expr.Any {
	prefix := fmt.Sprintf("podnet-policy drop %s/%s %s: ", p.Namespace, p.Name, d)
	if len(prefix) > 127 {
		prefix = prefix[:123] + "..: "
	}
	return []expr.Any{
		&expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Unit: expr.LimitTimeSecond, Burst: 5},
		&expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte(prefix)},
	}
}
