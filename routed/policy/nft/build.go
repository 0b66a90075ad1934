package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// The table a Ruleset becomes (policy's package comment has the design):
//
//	table inet podnet-policy {
//	  counter unknown_dropped                 packets of unknown local pod addresses
//	  counter pod-<ID>-in, pod-<ID>-eg        each pod chain's drops
//	  set local4, local6 (interval)           LocalPodCIDRs
//	  set known4, known6                      Known (and every address of Pods)
//	  map ingress4, ingress6, egress4, egress6 { ipv4_addr|ipv6_addr : verdict }
//	                                          local pod address : jump pod-<ID>-in|eg
//	  set pol-<ID>-r<N>-peers4|6 (interval)   a rule's peers
//	  set pol-<ID>-r<N>-ports4|6 { ipv4_addr . inet_proto . inet_service } (interval)
//	                                          a rule's (daddr . l4proto . dport)
//	  chain egress-fwd { type filter hook forward priority filter - 1; policy accept;
//	    ct state established,related accept
//	    meta l4proto tcp ct state new tcp flags & (fin|syn|rst|ack) != syn ip saddr|daddr @ingress4|@egress4 drop
//	                                          (egress, and ip6: no mid-stream pickup for isolated pods, see baseRules)
//	    meta nfproto ipv6 meta l4proto icmpv6 icmpv6 type 133-136 accept   (neighbor discovery)
//	    meta nfproto ipv4 ip saddr @local4 ip saddr != @known4 counter unknown_dropped drop   (and ip6)
//	    meta nfproto ipv4 ip saddr vmap @egress4                                              (and ip6)
//	  }
//	  chain egress-in { type filter hook input priority filter - 1; the same rules }
//	  chain ingress-fwd { type filter hook forward priority filter; the same on daddr,
//	                      with the ingress maps }
//	  chain pod-<ID>-in|eg { jump pol-<P> ...; counter pod-<ID>-in|eg drop }
//	  chain pol-<ID> {                        per rule, per family:
//	    meta nfproto ipv4 ip saddr|daddr @pol-<ID>-r<N>-peers4
//	      ip daddr . meta l4proto . th dport @pol-<ID>-r<N>-ports4 accept
//	    (AnyPeer: no peer lookup; AnyPort: no port lookup; both: one "accept";
//	    no rule and no sets for a family whose peers or ports set would be
//	    empty: it could match nothing)
//	  }
//	}
//
// Ingress judges the source (the peer) and the local pod's port; egress
// the destination (the peer) and its port: the ports set's address is
// always the packet's destination. The protocol is part of the ports
// key, so ICMP (or anything not TCP, UDP, SCTP) never matches a rule with
// ports, and a rule without ports matches it. The meta nfproto match
// before each address load is the dependency nft adds by itself to
// "ip saddr" in an inet table and google/nftables does not; the
// transport header load fails (the rule does not match) on a packet
// without one.
const (
	// TableName is the table's name (family inet).
	TableName = "podnet-policy"

	chainEgressFwd  = "egress-fwd"
	chainEgressIn   = "egress-in"
	chainIngressFwd = "ingress-fwd"
	// CounterUnknown counts the packets dropped because their local pod
	// address (inside LocalPodCIDRs) is not Known.
	CounterUnknown = "unknown_dropped"

	setLocal = "local"
	setKnown = "known"
	// setPorts holds the routed host veths of the pods the engine knows;
	// mapIngressPorts and mapEgressPorts jump from an isolated pod's host
	// veth to its chain.
	setPorts        = "ports"
	mapIngressPorts = "ingress-ports"
	mapEgressPorts  = "egress-ports"
)

// Priorities of the base chains: egress just before the filter priority,
// ingress at it, so that a packet between two local pods is judged as its
// sender's egress, then as its receiver's ingress.
var (
	priorityEgress  = nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 1)
	priorityIngress = nftables.ChainPriorityRef(*nftables.ChainPriorityFilter)
)

// PodChain is the name of a pod's chain (and counter) for a direction.
func PodChain(id string, d policy.Direction) string {
	if d == policy.Ingress {
		return "pod-" + id + "-in"
	}
	return "pod-" + id + "-eg"
}

// PolicyChain is the name of a policy's chain.
func PolicyChain(id string) string { return "pol-" + id }

func mapName(d policy.Direction, v6 bool) string {
	base := "egress"
	if d == policy.Ingress {
		base = "ingress"
	}
	return famName(base, v6)
}

func portMapName(d policy.Direction) string {
	if d == policy.Ingress {
		return mapIngressPorts
	}
	return mapEgressPorts
}

// ifnameKey is an interface name as nftables keys it (meta iifname: 16
// bytes, zero-padded).
func ifnameKey(name string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, name)
	return k
}

// ifnameElements are the set elements of names, sorted; a name that is
// no interface name is refused.
func ifnameElements(names []string) ([]nftables.SetElement, error) {
	var out []nftables.SetElement
	for _, n := range names {
		if n == "" || len(n) >= unix.IFNAMSIZ || strings.ContainsAny(n, "/ \x00") {
			return nil, fmt.Errorf("%q is not an interface name", n)
		}
		out = append(out, nftables.SetElement{Key: ifnameKey(n)})
	}
	slices.SortFunc(out, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b nftables.SetElement) bool { return bytes.Equal(a.Key, b.Key) }), nil
}

func famName(base string, v6 bool) string {
	if v6 {
		return base + "6"
	}
	return base + "4"
}

func ruleSetName(polID string, rule int, kind string, v6 bool) string {
	return famName(fmt.Sprintf("pol-%s-r%d-%s", polID, rule, kind), v6)
}

// setKind is the shape of a set.
type setKind int

const (
	kindAddrs    setKind = iota // addresses
	kindInterval                // address ranges
	kindPorts                   // (address . protocol . port) ranges
	kindVmap                    // address : verdict
	kindIfnames                 // interface names
	kindIfVmap                  // interface name : verdict
)

// isMap says whether sets of kind k are verdict maps (written after the
// chains their jumps name).
func (k setKind) isMap() bool { return k == kindVmap || k == kindIfVmap }

// setDef is a named set (or verdict map) and its elements.
type setDef struct {
	name  string
	kind  setKind
	v6    bool
	elems []nftables.SetElement
}

func (d setDef) set(t *nftables.Table) *nftables.Set {
	addr := nftables.TypeIPAddr
	if d.v6 {
		addr = nftables.TypeIP6Addr
	}
	s := &nftables.Set{Table: t, Name: d.name, KeyType: addr}
	switch d.kind {
	case kindInterval:
		s.Interval = true
	case kindPorts:
		s.Interval, s.Concatenation = true, true
		s.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	case kindVmap:
		s.IsMap, s.DataType = true, nftables.TypeVerdict
	case kindIfnames:
		s.KeyType = nftables.TypeIFName
	case kindIfVmap:
		s.KeyType = nftables.TypeIFName
		s.IsMap, s.DataType = true, nftables.TypeVerdict
	}
	return s
}

// chainDef is a chain (without Table) and its rules.
type chainDef struct {
	chain nftables.Chain
	rules [][]expr.Any
	// sig is everything build made the rules from: two chainDefs of one
	// name with the same sig have the same rules, which an incremental
	// write compares without walking the expressions.
	sig string
}

// tableDef is the whole content of the table for a Ruleset.
type tableDef struct {
	counters []string // named counters, sorted
	sets     []setDef // in the order they are written
	chains   []chainDef
	// pods maps each pod counter's name to its pod and direction.
	pods map[string]CounterKey
}

// spec is the table as data, for a whole write and the repair rule.
func (d *tableDef) spec() *nftutil.Table {
	t := &nftutil.Table{Family: nftables.TableFamilyINet, Name: TableName, Counters: d.counters,
		Sets: make([]nftutil.Set, len(d.sets)), Chains: make([]nftutil.Chain, len(d.chains))}
	for i, s := range d.sets {
		t.Sets[i] = nftutil.Set{Def: *s.set(nil), Elems: s.elems}
	}
	for i, c := range d.chains {
		t.Chains[i] = nftutil.Chain{Def: c.chain, Rules: c.rules}
	}
	return t
}

// CounterKey names a pod chain's drop counter.
type CounterKey struct {
	PodID     string
	Direction policy.Direction
}

// buildOptions are the Writer's settings that shape the table.
type buildOptions struct {
	logDrops bool
	logRate  uint64
}

// buildCache keeps what build made of each policy chain, for the next
// build: a policy chain equal to the one built before (policy.PolicyChain
// Equal, the same options) is not built again. At 1,000 policies that is
// most of build's time, and a change touches a few of them.
type buildCache struct {
	opt  buildOptions
	pols map[string]builtPolicy
}

type builtPolicy struct {
	pc    policy.PolicyChain // a deep copy: the caller's may change
	chain chainDef
	sets  []setDef
}

// clonePolicyChain is a deep copy of p.
func clonePolicyChain(p policy.PolicyChain) policy.PolicyChain {
	p.Rules = slices.Clone(p.Rules)
	for i := range p.Rules {
		p.Rules[i].Peers = slices.Clone(p.Rules[i].Peers)
		p.Rules[i].Ports = slices.Clone(p.Rules[i].Ports)
	}
	return p
}

// checkName refuses an ID nft could not take in a name.
func checkName(id string) error {
	if id == "" {
		return fmt.Errorf("empty ID")
	}
	for _, r := range id {
		if r < 0x21 || r > 0x7e || r == '"' || r == '\\' {
			return fmt.Errorf("ID %q: not a printable ASCII name", id)
		}
	}
	return nil
}

// nfproto matches the family (meta nfproto ipv4|ipv6).
func nfproto(v6 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: unix.NFT_REG_1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{p}},
	}
}

// loadAddr loads the source (or destination) address into reg.
func loadAddr(v6, source bool, reg uint32) expr.Any {
	offset, size := uint32(16), uint32(4)
	if source {
		offset = 12
	}
	if v6 {
		offset, size = 24, 16
		if source {
			offset = 8
		}
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size}
}

// loadPortKey loads ip daddr . meta l4proto . th dport, each field in
// the next 32-bit registers after the previous one.
func loadPortKey(v6 bool) []expr.Any {
	words := uint32(1)
	if v6 {
		words = 4
	}
	return []expr.Any{
		loadAddr(v6, false, unix.NFT_REG_1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG32_00 + words},
		&expr.Payload{DestRegister: unix.NFT_REG32_00 + words + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

func ptr[T any](v T) *T { return &v }

func sortedAddrs(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(in))
	for _, a := range in {
		if a.IsValid() {
			out = append(out, a.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// rangeElements are an interval set's elements for ranges (merged and
// sorted, as the policy model hands them) of the family v6 says: each
// range's first address, and the address after its last flagged as the
// interval's end (none at the top of the address space: the interval is
// then open).
func rangeElements(ranges []policy.Range, v6 bool) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range ranges {
		if r.From.Is6() != v6 {
			continue
		}
		out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
		if end := r.To.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// portElements are a ports set's elements (disjoint, as the policy model
// hands them) of the
// family v6 says: the key is the box's first corner, KeyEnd its last.
func portElements(ports []policy.PortRange, v6 bool) []nftables.SetElement {
	var out []nftables.SetElement
	for _, p := range ports {
		if p.Addrs.From.Is6() != v6 {
			continue
		}
		out = append(out, nftables.SetElement{
			Key:    portKey(p.Addrs.From, p.Proto, p.PortFrom),
			KeyEnd: portKey(p.Addrs.To, p.Proto, p.PortTo),
		})
	}
	return out
}

// portKey is addr . proto . port, each field padded to 4 bytes.
func portKey(a netip.Addr, proto uint8, port uint16) []byte {
	b := a.AsSlice()
	b = append(b, proto, 0, 0, 0)
	return append(b, byte(port>>8), byte(port), 0, 0)
}
