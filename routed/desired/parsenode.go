// A Node's routing fields as the API returns them, parsed (ParseNode).

package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ParseNode reads a Node's routing fields as the API returns them:
// spec.podCIDRs (or the legacy spec.podCIDR), the addresses of
// status.addresses (InternalIP is the next hop) and the node-IP
// annotation, which counts only when it is one of those addresses (a
// node's kubelet can write its own annotations; it must not point other
// nodes' traffic at an address the Node does not have).
func ParseNode(name, uid string, created time.Time, podCIDR string, podCIDRs []string, addrs []Address, annotation *string) Node {
	n := Node{Name: name, UID: uid, Created: created}
	if len(podCIDRs) == 0 && podCIDR != "" {
		podCIDRs = []string{podCIDR}
	}
	var bad []string
	for i, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("spec.podCIDRs[%d] %q does not parse", i, c))
		case p.Addr().Is4In6() || p.Addr().Zone() != "":
			bad = append(bad, fmt.Sprintf("spec.podCIDRs[%d] %q is not a plain IPv4 or IPv6 prefix", i, c))
		case p != p.Masked():
			bad = append(bad, fmt.Sprintf("spec.podCIDRs[%d] %q has host bits set (the network is %s)", i, c, p.Masked()))
			n.PodCIDRs = append(n.PodCIDRs, p.Masked())
		default:
			n.PodCIDRs = append(n.PodCIDRs, p)
		}
	}
	n.Invalid = strings.Join(bad, "; ")
	var own, internal []netip.Addr
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap() // ::ffff:a.b.c.d is an IPv4 node
		own = append(own, ip)
		if a.Internal {
			internal = append(internal, ip)
			if !n.IP.IsValid() {
				n.IP = ip
			}
		}
	}
	if annotation != nil {
		ip, err := netip.ParseAddr(*annotation)
		switch {
		case err != nil:
			n.Note = fmt.Sprintf("annotation %q does not parse: ignored", *annotation)
		case !slices.Contains(own, ip.Unmap()):
			n.Note = fmt.Sprintf("annotation %s is not one of the Node's status.addresses: ignored", ip)
		default:
			n.IP = ip.Unmap()
		}
	}
	// a dual-stack Node: its first InternalIP of the other family
	for _, ip := range internal {
		if n.IP.IsValid() && ip.Is4() != n.IP.Is4() {
			n.AltIP = ip
			break
		}
	}
	return n
}

// Address is one of a Node's status.addresses.
type Address struct {
	Internal bool // type InternalIP
	Address  string
}
