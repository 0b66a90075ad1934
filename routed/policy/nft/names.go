package nft

// The layout of table inet podnet-policy and the names of its chains,
// sets and counters.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/policy"
)

// The table a Ruleset becomes (policy's package comment has the design):
//
//	table inet podnet-policy {
//	  counter unknown_dropped                 packets of unknown local pod addresses
//	  counter pod-<ID>-in, pod-<ID>-eg        each pod chain's drops
//	  set local4, local6 (interval)           LocalPodCIDRs
//	  set known4, known6                      Known (and every address of Pods)
//	  set judged4, judged6                    the addresses of the pods judged (with a pod chain)
//	  set hairpin4, hairpin6 { ifname . ipv4_addr|ipv6_addr }
//	                                          host veth . address of the pods judged by their ports
//	  map ingress4, ingress6, egress4, egress6 { ipv4_addr|ipv6_addr : verdict }
//	                                          address : jump pod-<ID>-in|eg of the pods judged by
//	                                          their addresses (byAddress: bridged, or no port)
//	  set pol-<ID>-r<N>-peers4|6 (interval)   a rule's peers
//	  set pol-<ID>-r<N>-ports4|6 { ipv4_addr . inet_proto . inet_service } (interval)
//	                                          a rule's (daddr . l4proto . dport)
//	  chain egress-fwd { type filter hook forward priority filter - 1; policy accept;
//	    ct state established,related accept
//	    meta l4proto tcp ct state new tcp flags & (fin|syn|rst|ack) != syn ip saddr|daddr @judged4 drop
//	                                          (egress, and ip6: no mid-stream pickup for isolated pods, see baseRules)
//	    meta nfproto ipv6 meta l4proto icmpv6 icmpv6 type 133-136 accept   (neighbor discovery)
//	    meta nfproto ipv4 iifname . ip daddr @hairpin4 accept                 (and ip6; a pod to itself)
//	    iifname vmap @egress-ports                                             (a pod's routed host veth)
//	    iifname "pn*" iifname != @ports counter unknown_dropped drop           (a host veth of no pod known)
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
	// setJudged holds the addresses of the pods judged in a direction
	// (the verdict maps' keys) for the base chains' mid-stream rule
	setJudged = "judged"
	// setHairpin holds (host veth . address) of the pods judged by their
	// ports (not byAddress): a packet through a pod's port whose peer is
	// the pod itself (a Service hairpin) is accepted before its chain, as
	// a pod cannot block itself
	setHairpin = "hairpin"
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

// TierChain is the name of the chain of a list of ClusterNetworkPolicy
// chains of tier t ("adm-" or "bl-", a hash of the list, "-in" or "-eg"):
// pods with the same policies in a tier share it.
func TierChain(t policy.Tier, d policy.Direction, ids []string) string {
	sum := sha256.Sum256([]byte(strings.Join(ids, ",")))
	prefix := "adm-"
	if t == policy.TierBaseline {
		prefix = "bl-"
	}
	suffix := "-eg"
	if d == policy.Ingress {
		suffix = "-in"
	}
	return prefix + hex.EncodeToString(sum[:8]) + suffix
}

// CNPCounter is the name of the counter of rule i (a Deny rule) of a
// ClusterNetworkPolicy chain.
func CNPCounter(id string, i int) string { return fmt.Sprintf("cnp-%s-r%d", id, i) }

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

// byAddress tells whether the verdict maps by address (ingress4, ...)
// lead to p's chains. Not for a pod whose host veths are all routed:
// every packet of it passes one of them, and the port maps lead there
// first. So a new pod's addresses, which its ADD waits for, add no
// verdict to the table: the kernel validates the whole table at each
// commit that adds one, and its chains and port elements can be written
// before (issue 34). A pod on podnet-bridge's bridge (br_netfilter shows
// the inet table the bridge, not the port) or without a known port is
// judged by its addresses.
func byAddress(p policy.PodChains) bool { return len(p.Ports) == 0 || len(p.BridgePorts) > 0 }

// hairpinKey is the hairpin sets' key of port and a.
func hairpinKey(port string, a netip.Addr) []byte { return append(ifnameKey(port), a.AsSlice()...) }

// hairpinV6 tells whether hairpin key k holds an IPv6 address.
func hairpinV6(k string) bool { return len(k) == unix.IFNAMSIZ+16 }

// famIndex is 0 for IPv4, 1 for IPv6.
func famIndex(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
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
