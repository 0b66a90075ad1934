package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"

	"github.com/podnet/podnet/routed/desired"
)

// render writes a rule in a compact nft-like syntax, from its
// expressions, so that tests read as the rule set does. It knows the
// expressions the table uses and fails on any other.
func render(t *testing.T, exprs []expr.Any) string {
	t.Helper()
	var out []string
	var load string // what register 1 holds
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			load = map[expr.MetaKey]string{expr.MetaKeyL4PROTO: "l4proto", expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyNFPROTO: "nfproto"}[e.Key]
		case *expr.Payload:
			load = fmt.Sprintf("payload(%d,%d+%d)", e.Base, e.Offset, e.Len)
			switch {
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 12 && e.Len == 4:
				load = "ip saddr"
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 16 && e.Len == 4:
				load = "ip daddr"
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 8 && e.Len == 16:
				load = "ip6 saddr"
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 24 && e.Len == 16:
				load = "ip6 daddr"
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				load = "th dport"
			}
		case *expr.Fib:
			if !e.FlagDADDR || !e.ResultADDRTYPE {
				t.Fatalf("unexpected fib %+v", e)
			}
			load = "fib daddr type"
		case *expr.Bitwise:
			load += fmt.Sprintf("&%x", e.Mask)
		case *expr.Cmp:
			op := map[expr.CmpOp]string{expr.CmpOpEq: "==", expr.CmpOpNeq: "!="}[e.Op]
			val := fmt.Sprintf("%x", e.Data)
			switch {
			case load == "iifname":
				val = strings.TrimRight(string(e.Data), "\x00")
				if len(e.Data) < unix.IFNAMSIZ {
					val += "*"
				}
			case load == "fib daddr type" && binary.NativeEndian.Uint32(e.Data) == unix.RTN_LOCAL:
				val = "local"
			case load == "th dport":
				val = fmt.Sprint(binary.BigEndian.Uint16(e.Data))
			case load == "nfproto" || load == "l4proto":
				val = fmt.Sprint(e.Data[0])
			default:
				if a, ok := netip.AddrFromSlice(e.Data); ok {
					val = a.String()
				}
			}
			out = append(out, load+" "+op+" "+val)
		case *expr.Lookup:
			out = append(out, load+" @"+e.SetName)
		case *expr.Objref:
			if e.Type != int(nftables.ObjTypeCounter) {
				t.Fatalf("objref of type %d", e.Type)
			}
			out = append(out, "counter "+e.Name)
		case *expr.Verdict:
			v := map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop", expr.VerdictReturn: "return", expr.VerdictJump: "jump"}[e.Kind]
			if e.Chain != "" {
				v += " " + e.Chain
			}
			out = append(out, v)
		case *expr.Masq:
			out = append(out, "masquerade")
		default:
			t.Fatalf("render: unexpected expression %T", e)
		}
	}
	return strings.Join(out, " ")
}

// renderTable is every chain of def as "chain: rule" lines.
func renderTable(t *testing.T, def *nftutil.Table) []string {
	var out []string
	for _, c := range def.Chains {
		for _, r := range c.Rules {
			out = append(out, c.Def.Name+": "+render(t, r))
		}
	}
	return out
}

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

var vxlanSpec = TableSpec{
	Masquerade:     true,
	LocalPodCIDRs:  pfx("10.244.1.0/24"),
	ClusterCIDRs:   pfx("10.244.0.0/16"),
	Encap:          desired.VXLAN,
	VXLANPort:      4789,
	Peers:          addrs("172.30.0.3", "172.30.0.2"),
	RemotePodCIDRs: pfx("10.244.3.0/24", "10.244.2.0/24"),
}

// The tunnel filter's rules, as tablerules.go describes them: VXLAN
// (UDP to its port) or IPIP (protocol 4) into tunnel_outer, which drops
// what comes from a pod (its veth, the bridge, a cluster address) before
// it accepts the peers and drops the rest for this node; what the tunnel
// device decapsulated into tunnel_inner, which accepts only remote pod (or
// peer) sources to this node's pods or this node. Every drop is counted.
func TestTunnelFilterRules(t *testing.T) {
	outer := []string{
		"tunnel_outer: iifname == pn* counter tunnel_dropped drop",
		"tunnel_outer: iifname == podnet0 counter tunnel_dropped drop",
		"tunnel_outer: nfproto == 2 ip saddr @cluster4 counter tunnel_dropped drop",
		"tunnel_outer: nfproto == 10 ip6 saddr @cluster6 counter tunnel_dropped drop",
		"tunnel_outer: fib daddr type != local return",
		"tunnel_outer: nfproto == 2 ip saddr @peers4 accept",
		"tunnel_outer: nfproto == 10 ip6 saddr @peers6 accept",
		"tunnel_outer: counter tunnel_dropped drop",
	}
	inner := []string{
		"tunnel_inner: nfproto == 2 ip saddr @remote4 ip daddr @local4 accept",
		"tunnel_inner: nfproto == 2 ip saddr @remote4 fib daddr type == local accept",
		"tunnel_inner: nfproto == 2 ip saddr @peers4 ip daddr @local4 accept",
		"tunnel_inner: nfproto == 10 ip6 saddr @remote6 ip6 daddr @local6 accept",
		"tunnel_inner: nfproto == 10 ip6 saddr @remote6 fib daddr type == local accept",
		"tunnel_inner: nfproto == 10 ip6 saddr @peers6 ip6 daddr @local6 accept",
		"tunnel_inner: counter tunnel_dropped drop",
	}
	masq := []string{
		"postrouting: nfproto == 2 ip daddr&ffff0000 == 10.244.0.0 return",
		"postrouting: nfproto == 2 ip saddr&ffffff00 == 10.244.1.0 masquerade",
	}
	for _, tc := range []struct {
		name string
		spec TableSpec
		want []string
	}{
		{"vxlan", vxlanSpec, slices.Concat([]string{
			"prerouting: l4proto == 17 th dport == 4789 jump tunnel_outer",
			"prerouting: iifname == podnet.vxlan jump tunnel_inner",
		}, outer, inner, masq)},
		{"ipip", func() TableSpec { s := vxlanSpec; s.Encap = desired.IPIP; return s }(), slices.Concat([]string{
			"prerouting: l4proto == 4 jump tunnel_outer",
			"prerouting: iifname == tunl0 jump tunnel_inner",
		}, outer, inner, masq)},
		{"vxlan on another port, no masquerade", func() TableSpec {
			s := vxlanSpec
			s.VXLANPort, s.Masquerade = 8472, false
			return s
		}(), slices.Concat([]string{
			"prerouting: l4proto == 17 th dport == 8472 jump tunnel_outer",
			"prerouting: iifname == podnet.vxlan jump tunnel_inner",
		}, outer, inner)},
		{"no tunnel: masquerade only", func() TableSpec { s := vxlanSpec; s.Encap = desired.None; return s }(), masq},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def := buildTable(tc.spec.canonical())
			if got := renderTable(t, def); !slices.Equal(got, tc.want) {
				t.Errorf("rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if (len(def.Counters) > 0) != tc.spec.tunnel() {
				t.Errorf("counters %v, want one with the tunnel filter only", def.Counters)
			}
			// every reference resolves: sets, chains, the counter
			sets := map[string]bool{}
			for _, s := range def.Sets {
				sets[s.Def.Name] = true
			}
			chains := map[string]bool{}
			for _, c := range def.Chains {
				chains[c.Def.Name] = true
			}
			for _, c := range def.Chains {
				for _, r := range c.Rules {
					for _, e := range r {
						switch e := e.(type) {
						case *expr.Lookup:
							if !sets[e.SetName] {
								t.Errorf("chain %s looks up set %s, not in the table", c.Def.Name, e.SetName)
							}
						case *expr.Verdict:
							if e.Kind == expr.VerdictJump && !chains[e.Chain] {
								t.Errorf("chain %s jumps to %s, not in the table", c.Def.Name, e.Chain)
							}
						case *expr.Objref:
							if len(def.Counters) == 0 || e.Name != CounterTunnelDropped {
								t.Errorf("chain %s counts in %s, not in the table", c.Def.Name, e.Name)
							}
						}
					}
				}
			}
		})
	}
	// the filter's base chain runs before conntrack
	for _, c := range buildTable(vxlanSpec.canonical()).Chains {
		if c.Def.Name == chainPrerouting && (*c.Def.Priority != -300 || *c.Def.Hooknum != unix.NF_INET_PRE_ROUTING || c.Def.Type != nftables.ChainTypeFilter) {
			t.Errorf("chain prerouting: type %s hook %d priority %d, want filter, prerouting, raw (-300)", c.Def.Type, *c.Def.Hooknum, *c.Def.Priority)
		}
	}
}

// The sets' elements: addresses and prefixes sorted by family; each
// prefix an interval from its first address to the one after its last
// (open at the top of the address space); a prefix inside another left
// out; adjacent prefixes kept apart.
func TestTunnelFilterSets(t *testing.T) {
	spec := TableSpec{
		Encap:          desired.VXLAN,
		VXLANPort:      4789,
		LocalPodCIDRs:  pfx("10.244.1.0/24", "fd00:1::/64"),
		ClusterCIDRs:   pfx("10.244.0.0/16", "fd00::/48"),
		Peers:          addrs("172.30.0.3", "::ffff:172.30.0.2", "fe80::1", "172.30.0.3"),
		RemotePodCIDRs: pfx("10.244.3.0/24", "10.244.2.0/24", "10.244.2.128/25", "255.255.255.0/24", "fd00:2::/64", "ffff::/16"),
	}
	got := map[string]string{}
	for _, s := range tunnelSets(spec.canonical()) {
		var elems []string
		for _, e := range s.Elems {
			a, _ := netip.AddrFromSlice(e.Key)
			if e.IntervalEnd {
				elems = append(elems, "<"+a.String())
			} else {
				elems = append(elems, a.String())
			}
		}
		kind := ""
		if s.Def.Interval {
			kind = "interval "
		}
		got[s.Def.Name] = kind + strings.Join(elems, " ")
	}
	want := map[string]string{
		"peers4":   "172.30.0.2 172.30.0.3",
		"peers6":   "fe80::1",
		"remote4":  "interval 10.244.2.0 <10.244.3.0 10.244.3.0 <10.244.4.0 255.255.255.0",
		"remote6":  "interval fd00:2:: <fd00:2:0:1:: ffff::",
		"local4":   "interval 10.244.1.0 <10.244.2.0",
		"local6":   "interval fd00:1:: <fd00:1:0:1::",
		"cluster4": "interval 10.244.0.0 <10.245.0.0",
		"cluster6": "interval fd00:: <fd00:0:1::",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("set %s: %q, want %q", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("sets %v, want %d", got, len(want))
	}
}

// Two specs that write the same table are equal once canonical; what the
// table does not use is left out (no tunnel: no peers; no VXLAN: no
// port; nothing to do: no table).
func TestTableSpecCanonical(t *testing.T) {
	a := vxlanSpec
	b := vxlanSpec
	b.Peers = addrs("172.30.0.2", "172.30.0.3", "172.30.0.2")
	b.RemotePodCIDRs = pfx("10.244.2.7/24", "10.244.3.0/24")
	if !a.canonical().equal(b.canonical()) {
		t.Errorf("same table, different specs:\n%+v\n%+v", a.canonical(), b.canonical())
	}
	b.Peers = addrs("172.30.0.2")
	if a.canonical().equal(b.canonical()) {
		t.Error("a peer less compares equal")
	}
	none := vxlanSpec
	none.Encap = desired.None
	if c := none.canonical(); len(c.Peers)+len(c.RemotePodCIDRs) != 0 || c.VXLANPort != 0 || !c.Masquerade {
		t.Errorf("no tunnel: canonical %+v, want masquerade only", c)
	}
	ipip := vxlanSpec
	ipip.Encap = desired.IPIP
	if c := ipip.canonical(); c.VXLANPort != 0 || len(c.Peers) != 2 {
		t.Errorf("ipip: canonical %+v, want peers and no port", c)
	}
	none.Masquerade = false
	if c := none.canonical(); !c.empty() || !c.equal(TableSpec{}) {
		t.Errorf("nothing to do: canonical %+v, want the empty spec", c)
	}
}

// Deltas write only the elements that change; the comparison names what
// differs.
func TestElementChanges(t *testing.T) {
	before := intervalElements(pfx("10.244.2.0/24", "10.244.3.0/24"), false)
	after := intervalElements(pfx("10.244.3.0/24", "10.244.4.0/24"), false)
	del, add := nftutil.Changes(before, after)
	key := func(es []nftables.SetElement) string {
		var s []string
		for _, e := range es {
			s = append(s, nftutil.ElementKey(e))
		}
		return strings.Join(s, " ")
	}
	// 10.244.3.0 is the end of .2/24 and the start of .3/24: both kept
	// apart by the end flag
	if key(del) != "0af40200 0af40300(end)" || key(add) != "0af40400 0af40500(end)" {
		t.Errorf("delete %q add %q", key(del), key(add))
	}
	if d := nftutil.ElementsDiff(after, before); d != "2 element(s) missing (0af40400), 2 element(s) not wanted (0af40200)" {
		t.Errorf("elementsDiff: %q", d)
	}
	if d := nftutil.ElementsDiff(after, after); d != "" {
		t.Errorf("elementsDiff of equal sets: %q", d)
	}
	written := []string{"table podnet: 1=aa;", "rule 1 of chain c: 4=01;", "rule 2 of chain c: 4=02;"}
	for _, tc := range []struct {
		have []string
		want string
	}{
		{written, ""},
		{[]string{"table podnet: 1=aa;", "rule 1 of chain c: 4=01;"}, "rule 2 of chain c missing"},
		{[]string{"table podnet: 1=aa;", "rule 1 of chain c: 4=01;", "rule 2 of chain c: 4=03;"}, "rule 2 of chain c changed"},
		{append(slices.Clone(written), "set x: 2=00;"), "set x added"},
		// the same objects in another order: rules are numbered in their chain
		{[]string{"rule 1 of chain c: 4=01;", "table podnet: 1=aa;", "rule 2 of chain c: 4=02;"}, ""},
		{[]string{"table podnet: 1=aa;", "rule 1 of chain c: 4=02;", "rule 2 of chain c: 4=01;"}, "rule 1 of chain c changed, rule 2 of chain c changed"},
	} {
		if got := nftutil.StructureDiff(written, tc.have); got != tc.want {
			t.Errorf("structureDiff(%q) = %q, want %q", tc.have, got, tc.want)
		}
	}
}

// IPv6 egress is masqueraded only where it is wanted: with auto (the
// default), from a unique local (fc00::/7) PodCIDR alone, which the
// internet does not route; a global PodCIDR keeps its address. true and
// false force it; --masquerade=false turns off both families.
func TestMasqueradeIPv6(t *testing.T) {
	base := TableSpec{
		Masquerade:    true,
		Encap:         desired.None,
		LocalPodCIDRs: pfx("10.244.1.0/24", "fd00:10:244:1::/64", "2001:db8:244:1::/64"),
		ClusterCIDRs:  pfx("10.244.0.0/16", "fd00:10:244::/56", "2001:db8:244::/56"),
	}
	ret := []string{
		"postrouting: nfproto == 2 ip daddr&ffff0000 == 10.244.0.0 return",
		"postrouting: nfproto == 10 ip6 daddr&ffffffffffffff000000000000000000 == 2001:db8:244:: return",
		"postrouting: nfproto == 10 ip6 daddr&ffffffffffffff000000000000000000 == fd00:10:244:: return",
	}
	v4 := "postrouting: nfproto == 2 ip saddr&ffffff00 == 10.244.1.0 masquerade"
	global := "postrouting: nfproto == 10 ip6 saddr&ffffffffffffffff0000000000000000 == 2001:db8:244:1:: masquerade"
	ula := "postrouting: nfproto == 10 ip6 saddr&ffffffffffffffff0000000000000000 == fd00:10:244:1:: masquerade"
	for _, tc := range []struct {
		mode       MasqueradeIPv6
		masquerade bool
		want       []string
	}{
		{"", true, append(slices.Clone(ret), v4, ula)}, // the zero value is auto
		{MasqueradeIPv6Auto, true, append(slices.Clone(ret), v4, ula)},
		{MasqueradeIPv6True, true, append(slices.Clone(ret), v4, global, ula)},
		{MasqueradeIPv6False, true, append(slices.Clone(ret), v4)},
		{MasqueradeIPv6True, false, nil},
	} {
		t.Run(fmt.Sprintf("%s-%v", tc.mode, tc.masquerade), func(t *testing.T) {
			s := base
			s.MasqueradeIPv6, s.Masquerade = tc.mode, tc.masquerade
			if got := renderTable(t, buildTable(s.canonical())); !slices.Equal(got, tc.want) {
				t.Errorf("rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
	// a change of mode is a change of table: it is written again
	a, b := base, base
	b.MasqueradeIPv6 = MasqueradeIPv6True
	if a.canonical().equal(b.canonical()) {
		t.Error("auto and true compare equal: a flag change would not rewrite the table")
	}
	b.MasqueradeIPv6 = MasqueradeIPv6Auto
	if !a.canonical().equal(b.canonical()) {
		t.Error(`"" and auto differ: the same table written twice`)
	}
}
