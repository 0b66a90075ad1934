package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
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

// build is the content of the table for rs. It fails on a Ruleset that
// cannot be written: a pod jumping to a policy chain it does not hold, a
// name nft refuses. cache (nil: none) is read, and replaced by what this
// build made when it succeeds.
func build(rs policy.Ruleset, opt buildOptions, cache *buildCache) (*tableDef, error) {
	def := &tableDef{pods: map[string]CounterKey{}}
	known := sortedAddrs(rs.Known)
	pods := slices.Clone(rs.Pods)
	slices.SortFunc(pods, func(a, b policy.PodChains) int { return strings.Compare(a.ID, b.ID) })
	pols := slices.Clone(rs.Policies)
	slices.SortFunc(pols, func(a, b policy.PolicyChain) int { return strings.Compare(a.ID, b.ID) })
	polIDs := map[string]bool{}
	for _, p := range pols {
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("policy chain %s/%s %s: %w", p.Namespace, p.Name, p.Direction, err)
		}
		if polIDs[p.ID] {
			return nil, fmt.Errorf("policy chain ID %q twice", p.ID)
		}
		polIDs[p.ID] = true
	}

	// the verdict maps and the pod chains
	vmaps := map[string][]nftables.SetElement{}
	portVmaps := map[string][]nftables.SetElement{}
	taken := map[string]map[netip.Addr]bool{}
	var podChains []chainDef
	for i, p := range pods {
		if err := checkName(p.ID); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if i > 0 && pods[i-1].ID == p.ID {
			return nil, fmt.Errorf("pod ID %q twice", p.ID)
		}
		addrs := sortedAddrs(p.Addrs)
		known = append(known, addrs...) // a compiled pod is known
		for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
			isolated, jumps := p.IngressIsolated, p.Ingress
			if d == policy.Egress {
				isolated, jumps = p.EgressIsolated, p.Egress
			}
			if !isolated && len(jumps) == 0 {
				continue
			}
			name := PodChain(p.ID, d)
			c := chainDef{chain: nftables.Chain{Name: name}}
			var sig strings.Builder
			fmt.Fprintf(&sig, "pod %s %v %v", d, addrs, p.Ports)
			// a pod cannot block itself (a Service hairpin): its own
			// address as the peer is accepted before any policy
			for _, a := range addrs {
				c.rules = append(c.rules, nftutil.Join(nfproto(a.Is6()), []expr.Any{
					loadAddr(a.Is6(), d == policy.Ingress, unix.NFT_REG_1),
					&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: a.AsSlice()},
					&expr.Verdict{Kind: expr.VerdictAccept},
				}))
			}
			seen := map[string]bool{}
			for _, j := range jumps {
				if !polIDs[j] {
					return nil, fmt.Errorf("pod %s/%s jumps to policy chain %q, which the ruleset lacks", p.Namespace, p.Name, j)
				}
				if seen[j] {
					continue
				}
				seen[j] = true
				c.rules = append(c.rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: PolicyChain(j)}})
				sig.WriteString(" " + j)
			}
			if opt.logDrops {
				c.rules = append(c.rules, dropLog(p, d, opt.logRate))
				fmt.Fprintf(&sig, " log %d %s/%s", opt.logRate, p.Namespace, p.Name)
			}
			c.sig = sig.String()
			c.rules = append(c.rules, []expr.Any{
				&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name},
				&expr.Verdict{Kind: expr.VerdictDrop},
			})
			podChains = append(podChains, c)
			def.counters = append(def.counters, name)
			def.pods[name] = CounterKey{PodID: p.ID, Direction: d}
			for _, port := range p.Ports {
				m := portMapName(d)
				portVmaps[m] = append(portVmaps[m], nftables.SetElement{Key: ifnameKey(port),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}})
			}
			for _, a := range addrs {
				m := mapName(d, a.Is6())
				if taken[m] == nil {
					taken[m] = map[netip.Addr]bool{}
				}
				if taken[m][a] {
					continue // two pods with one address: the first keeps it
				}
				taken[m][a] = true
				vmaps[m] = append(vmaps[m], nftables.SetElement{Key: a.AsSlice(),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}})
			}
		}
	}
	slices.SortFunc(known, netip.Addr.Compare)
	known = slices.Compact(known)
	def.counters = append(def.counters, CounterUnknown)
	slices.Sort(def.counters)

	local := policy.PrefixRanges(rs.LocalPodCIDRs)
	for _, v6 := range []bool{false, true} {
		def.sets = append(def.sets,
			setDef{name: famName(setLocal, v6), kind: kindInterval, v6: v6, elems: rangeElements(local, v6)},
			setDef{name: famName(setKnown, v6), kind: kindAddrs, v6: v6, elems: nftutil.AddrElements(known, v6)},
		)
	}
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, v6 := range []bool{false, true} {
			m := mapName(d, v6)
			def.sets = append(def.sets, setDef{name: m, kind: kindVmap, v6: v6, elems: vmaps[m]})
		}
	}
	ports, err := ifnameElements(rs.Ports)
	if err != nil {
		return nil, err
	}
	def.sets = append(def.sets, setDef{name: setPorts, kind: kindIfnames, elems: ports})
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		m := portMapName(d)
		elems := portVmaps[m]
		slices.SortFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		elems = slices.CompactFunc(elems, func(a, b nftables.SetElement) bool { return bytes.Equal(a.Key, b.Key) })
		def.sets = append(def.sets, setDef{name: m, kind: kindIfVmap, elems: elems})
	}

	// the policy chains and their sets
	var polChains []chainDef
	built := map[string]builtPolicy{}
	for _, p := range pols {
		if cache != nil && cache.opt == opt {
			if b, ok := cache.pols[p.ID]; ok && b.pc.Equal(p) {
				def.sets = append(def.sets, b.sets...)
				polChains = append(polChains, b.chain)
				built[p.ID] = b
				continue
			}
		}
		firstSet := len(def.sets)
		c := chainDef{chain: nftables.Chain{Name: PolicyChain(p.ID)}}
		var sig strings.Builder
		sig.WriteString("policy " + string(p.Direction))
		for i, r := range p.Rules {
			if r.AnyPeer && r.AnyPort {
				c.rules = append(c.rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})
				fmt.Fprintf(&sig, " r%d:any", i)
				continue
			}
			// canonical by contract (policy.Rule): merged peers,
			// disjoint ports, taken as they are
			peers, ports := r.Peers, r.Ports
			for _, v6 := range []bool{false, true} {
				// A family whose peers or ports set would be empty can
				// match nothing: no rule and no sets for it (an IPv4-only
				// cluster's policies get no IPv6 rules, which halves the
				// sets to write and to read back).
				var peerElems, portElems []nftables.SetElement
				if !r.AnyPeer {
					if peerElems = rangeElements(peers, v6); len(peerElems) == 0 {
						continue
					}
				}
				if !r.AnyPort {
					if portElems = portElements(ports, v6); len(portElems) == 0 {
						continue
					}
				}
				rule := nfproto(v6)
				if !r.AnyPeer {
					name := ruleSetName(p.ID, i, "peers", v6)
					def.sets = append(def.sets, setDef{name: name, kind: kindInterval, v6: v6, elems: peerElems})
					rule = append(rule,
						loadAddr(v6, p.Direction == policy.Ingress, unix.NFT_REG_1),
						&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
				}
				if !r.AnyPort {
					name := ruleSetName(p.ID, i, "ports", v6)
					def.sets = append(def.sets, setDef{name: name, kind: kindPorts, v6: v6, elems: portElems})
					rule = append(rule, loadPortKey(v6)...)
					rule = append(rule, &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: name})
				}
				c.rules = append(c.rules, append(rule, &expr.Verdict{Kind: expr.VerdictAccept}))
				fmt.Fprintf(&sig, " r%d:%t/%t/%t", i, v6, r.AnyPeer, r.AnyPort)
			}
		}
		c.sig = sig.String()
		polChains = append(polChains, c)
		built[p.ID] = builtPolicy{pc: clonePolicyChain(p), chain: c, sets: slices.Clone(def.sets[firstSet:])}
	}

	def.chains = append(def.chains, baseChains()...)
	def.chains = append(def.chains, polChains...)
	def.chains = append(def.chains, podChains...)
	for _, c := range def.chains {
		if len(c.chain.Name) >= unix.NFT_NAME_MAXLEN {
			return nil, fmt.Errorf("chain name %q too long", c.chain.Name)
		}
	}
	for _, s := range def.sets {
		if len(s.name) >= unix.NFT_NAME_MAXLEN {
			return nil, fmt.Errorf("set name %q too long", s.name)
		}
	}
	if cache != nil {
		cache.opt, cache.pols = opt, built
	}
	return def, nil
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
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: binaryutil.NativeEndian.PutUint32(0)},
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
		for _, v6 := range []bool{false, true} {
			for _, src := range []bool{true, false} {
				for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
					rules = append(rules, nftutil.Join(nfproto(v6), []expr.Any{
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG_1},
						&expr.Cmp{Op: expr.CmpOpEq, Register: unix.NFT_REG_1, Data: []byte{unix.IPPROTO_TCP}},
						&expr.Ct{Register: unix.NFT_REG_1, Key: expr.CtKeySTATE},
						&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 4,
							Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
							Xor:  binaryutil.NativeEndian.PutUint32(0)},
						&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: binaryutil.NativeEndian.PutUint32(0)},
						&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
						&expr.Bitwise{SourceRegister: unix.NFT_REG_1, DestRegister: unix.NFT_REG_1, Len: 1,
							Mask: []byte{0x17}, Xor: []byte{0}}, // FIN|SYN|RST|ACK
						&expr.Cmp{Op: expr.CmpOpNeq, Register: unix.NFT_REG_1, Data: []byte{0x02}}, // not a bare SYN
						loadAddr(v6, src, unix.NFT_REG_1),
						// the verdict map as a set: is the pod isolated in dir
						&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: mapName(dir, v6)},
						&expr.Verdict{Kind: expr.VerdictDrop},
					}))
				}
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
