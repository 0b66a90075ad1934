// Package contract states what podnet owns in a node's kernel, in one
// place, for the CNI plugins and podnet-routed alike: the route protocol
// that marks podnet's routes, which of those routes are a pod's host route
// (the plugins') and which podnet-routed's, the names and aliases of the
// veths the plugins create, and the nftables tables of podnet-routed and
// of the plugins. podnet only ever changes or deletes what matches it.
package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol is the rtm_protocol value of every podnet route ("proto 77"
// in `ip route`). Values 0-4 belong to the kernel, boot and static routes;
// the numbers used by well-known routing daemons (bird 12, zebra 11,
// Calico 80, bgp 186, ...) are avoided.
const RouteProtocol netlink.RouteProtocol = 77

// BlackholeMetric is the metric of podnet-routed's blackhole for the node's
// own PodCIDR: the highest of any route to it, so that it catches only what
// nothing else routes. podnet-bridge's bridge podnet0 holds the gateway
// address of the same PodCIDR, and its connected route (metric 0, or 256
// for IPv6) must win, or the node's own bridged pods are unreachable.
const BlackholeMetric = 1 << 20

// IsPodHostRoute reports whether r is a pod's host route, which the
// plugins write on ADD (podIP dev <host veth> scope link): RouteProtocol,
// neither a blackhole nor via a gateway. podnet-routed must never prune
// one: that would cut its pod off.
func IsPodHostRoute(r *netlink.Route) bool {
	return r.Protocol == RouteProtocol && r.Type != unix.RTN_BLACKHOLE && r.Gw == nil
}

// IsRoutedRoute reports whether r is podnet-routed's: RouteProtocol and not
// a pod's host route (a blackhole for the node's own pod CIDR, or a route
// via a gateway to another node's).
func IsRoutedRoute(r *netlink.Route) bool {
	return r.Protocol == RouteProtocol && !IsPodHostRoute(r)
}

// HostVethPrefix starts the name of every host-side veth the plugins
// create (the rest is theirs to choose).
const HostVethPrefix = "pn"

// DetachedVethPrefix starts the name the pod end of a veth pair takes in
// the pod netns when DEL detaches the pair instead of deleting it.
const DetachedVethPrefix = "pnd"

// IsHostVeth reports whether name is a pod's host veth by its name.
func IsHostVeth(name string) bool { return strings.HasPrefix(name, HostVethPrefix) }

// NFTable is the nftables table (family inet) podnet-routed owns.
const NFTable = "podnet"

// PodFilterTable is the nftables table the CNI plugins own: family inet
// for podnet (routed), family bridge for podnet-bridge. It drops what a
// pod sends from its host veth as someone else (another source address,
// MAC or ARP sender, a Neighbor Advertisement for an address not its own)
// and the Router Advertisements and Redirects pods send
// (internal/podfilter), and any other frame (a VLAN tag, another
// EtherType). The routed mode adds netdev tables (PodFilterL2Table) for
// what the inet family never sees (ARP, tagged and other frames). The
// plugins write them and record each guarded port in the node state dir;
// podnet-routed rebuilds them whole from those records when they are
// damaged.
const PodFilterTable = "podnet-pods"

// PodFilterL2Tables is how many netdev tables the routed mode's pod
// filter spreads its ports over (by interface index): adding a port's
// chain makes the kernel check every base chain of that port's table at
// the commit, so with one table each ADD paid for every pod of the node.
const PodFilterL2Tables = 16

// PodFilterL2Table is the name of the routed mode's netdev table k
// (0 <= k < PodFilterL2Tables), "podnet-pods-<k>".
func PodFilterL2Table(k int) string { return PodFilterTable + "-" + strconv.Itoa(k) }

// PodFilterL2TableOf is the netdev table of the host veth of interface
// index index.
func PodFilterL2TableOf(index int) string { return PodFilterL2Table(index % PodFilterL2Tables) }

// IsPodFilterL2Table tells whether name is one of the routed mode's
// netdev tables.
func IsPodFilterL2Table(name string) bool {
	k, ok := strings.CutPrefix(name, PodFilterTable+"-")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(k)
	return err == nil && n >= 0 && n < PodFilterL2Tables && PodFilterL2Table(n) == name
}

// The named counters of PodFilterTable (in each family): packets dropped
// because a pod sent them as someone else, and ICMPv6 Router
// Advertisements and Redirects dropped because a pod sent them.
const (
	PodFilterSpoofedCounter = "spoofed"
	PodFilterRAGuardCounter = "ra-guard"
)

// Why the pod filter dropped a packet a pod sent: each reason is a named
// counter "drop-<reason>" in the pod filter's tables (the routed mode's
// L2 reasons, arp, vlan and ethertype, in the netdev table of the same
// name). The spoofing reasons also count in PodFilterSpoofedCounter,
// router-advertisement in PodFilterRAGuardCounter.
const (
	DropIPv4Source          = "ipv4-source"            // IPv4 from an address not the pod's
	DropIPv6Source          = "ipv6-source"            // IPv6 from a global address not the pod's
	DropLinkLocal           = "link-local"             // IPv6 from a link-local address not the pod's own
	DropUnspecified         = "unspecified-source"     // from :: but DAD or MLD
	DropARP                 = "arp"                    // ARP with a sender address not the pod's
	DropNeighborAdvert      = "neighbor-advertisement" // NA for a target not the pod's
	DropMAC                 = "mac"                    // a source MAC not the pod's (bridge)
	DropVLAN                = "vlan"                   // an 802.1Q/802.1ad tag, of any depth
	DropEtherType           = "ethertype"              // an EtherType but IPv4, IPv6, ARP
	DropRouterAdvertisement = "router-advertisement"   // RA or redirect
	DropOther               = "other"                  // nothing above allowed it
)

// PodFilterDropReasons are the reasons, in the order metrics list them.
var PodFilterDropReasons = []string{DropIPv4Source, DropIPv6Source, DropLinkLocal, DropUnspecified, DropARP,
	DropNeighborAdvert, DropMAC, DropVLAN, DropEtherType, DropRouterAdvertisement, DropOther}

// PodFilterDropCounter is the named counter of reason.
func PodFilterDropCounter(reason string) string { return "drop-" + reason }

// The IFLA_IFALIAS of both ends of every veth pair the plugins create
// records the attachment it belongs to, so that DEL never deletes another
// sandbox's veth and GC can find leftovers:
//
//	podnet:<network>:<container ID>:<ifname>           in service
//	podnet-detached:<network>:<container ID>:<ifname>  detached by DEL (host end)
const (
	VethAliasPrefix         = "podnet:"
	DetachedVethAliasPrefix = "podnet-detached:"
)

// VethOwner identifies the attachment a veth belongs to.
type VethOwner struct {
	Network     string
	ContainerID string
	IfName      string
}

// Alias is the alias of o's veths in service.
func (o VethOwner) Alias() string {
	return VethAliasPrefix + o.fields()
}

// DetachedAlias is the alias of o's host veth once DEL detached it.
func (o VethOwner) DetachedAlias() string {
	return DetachedVethAliasPrefix + o.fields()
}

func (o VethOwner) fields() string {
	return o.Network + ":" + o.ContainerID + ":" + o.IfName
}

// ParseVethAlias reverses Alias and DetachedAlias: ok is true for every
// veth podnet created; detached says whether DEL has detached it.
func ParseVethAlias(alias string) (o VethOwner, detached, ok bool) {
	if o, ok := parseAlias(alias, DetachedVethAliasPrefix); ok {
		return o, true, true
	}
	o, ok = parseAlias(alias, VethAliasPrefix)
	return o, false, ok
}

func parseAlias(alias, prefix string) (o VethOwner, ok bool) {
	rest, found := strings.CutPrefix(alias, prefix)
	if !found {
		return VethOwner{}, false
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return VethOwner{}, false
	}
	return VethOwner{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}, true
}

// hostVethHashLen is how many hex characters of a hash follow the prefix
// in a host veth's name.
const hostVethHashLen = 11

// HostVethName returns the deterministic host-side veth name of an
// attachment: HostVethPrefix ("pn") + 11 hex characters of a hash of the
// pod (namespace/name when the runtime passes them, else the container ID)
// and the interface name inside the pod. It is 13 characters, below the
// 15-character limit. podnet-routed's NetworkPolicy engine derives the
// same name from a Pod object to know which host veth is that pod's port.
func HostVethName(podNamespace, podName, containerID, ifName string) string {
	key := containerID
	if podNamespace != "" && podName != "" {
		key = podNamespace + "/" + podName
	}
	sum := sha256.Sum256([]byte(key + "\x00" + ifName))
	return HostVethPrefix + hex.EncodeToString(sum[:])[:hostVethHashLen]
}
