package reconcile

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// routedHostMAC is the fixed MAC of a routed (podnet) host veth; a
// podnet-bridge host veth has a bridge master instead.
const routedHostMAC = "ee:ee:ee:ee:ee:ee"

// attachmentInService returns l's attachment when l is a host veth podnet
// made that DEL has not detached.
func attachmentInService(l netlink.Link) (contract.VethOwner, bool) {
	o, detached, ok := contract.ParseVethAlias(l.Attrs().Alias)
	return o, ok && !detached
}

// hostRoutes are the pod host routes of the node (podnet's protocol, not
// via a gateway), by destination: the link each goes to.
type hostRoutes map[netip.Addr]int

func listHostRoutes() (hostRoutes, error) {
	filter := &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
	routes, err := attachment.CompleteRouteList(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("podnet routes: %w", err)
	}
	out := hostRoutes{}
	for i := range routes {
		r := &routes[i]
		if !contract.IsPodHostRoute(r) || r.Dst == nil {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != bits {
			continue
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			out[a.Unmap()] = r.LinkIndex
		}
	}
	return out, nil
}

// liveRepair is a live routed pod whose host state needs putting back.
type liveRepair struct {
	owner  allocator.Owner
	record store.Record
	host   netlink.Link
	routes []netip.Addr // addresses without their host route
}

// needsRepair returns what a live pod's host side lacks (nil when
// nothing): a host route per address; the sysctls are checked and put
// back by repairSysctls. Only a routed host veth in service, up, of a
// record older than the grace is looked at: podnet-bridge's pods are
// reached through the bridge, a veth of an ADD in flight is not finished
// yet, one that is down is being detached by DEL.
func (l *Loop) needsRepair(o allocator.Owner, r store.Record, links []netlink.Link) *liveRepair {
	var host netlink.Link
	for _, link := range links {
		if _, ok := attachmentInService(link); ok {
			host = link
		}
	}
	if host == nil || host.Attrs().MasterIndex != 0 || host.Attrs().HardwareAddr.String() != routedHostMAC ||
		host.Attrs().Flags&net.FlagUp == 0 || l.routes == nil {
		return nil
	}
	lr := &liveRepair{owner: o, record: r, host: host}
	for _, ip := range r.IPs {
		idx, ok := l.routes[ip]
		switch {
		case !ok:
			lr.routes = append(lr.routes, ip)
		case idx != host.Attrs().Index:
			l.log.Warn("repair: the host route of a live pod goes to another interface; left alone", "container", o.ContainerID, "addr", ip, "ifindex", idx)
		}
	}
	return lr
}

// repairRoutes adds the missing host routes of lr, in the locked store d:
// only while the record is still there (DEL releases it after detaching
// the veth) and the veth, looked up again, is still in service and up.
func (l *Loop) repairRoutes(d *store.Disk, network string, lr *liveRepair) int {
	r, ok, err := d.Record(lr.owner)
	if err != nil || !ok || !sameRecord(r, lr.record) {
		return 0
	}
	host, err := netlink.LinkByIndex(lr.host.Attrs().Index)
	if err != nil || host.Attrs().Name != lr.host.Attrs().Name || host.Attrs().Flags&net.FlagUp == 0 {
		return 0
	}
	if o, ok := attachmentInService(host); !ok || o.ContainerID != lr.owner.ContainerID || o.IfName != lr.owner.IfName {
		return 0
	}
	log := l.log.With("network", network, "container", lr.owner.ContainerID, "ifname", lr.owner.IfName, "hostVeth", host.Attrs().Name)
	n := 0
	for _, ip := range lr.routes {
		route := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())},
			Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
		if ip.Is4() {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := netlink.RouteAdd(route); err != nil {
			if errors.Is(err, unix.EEXIST) {
				log.Warn("repair: a route that is not podnet's holds a live pod's address; left alone", "addr", ip)
			} else {
				log.Warn("repair: add host route", "addr", ip, "err", err)
			}
			continue
		}
		log.Info("repaired: the host route of a live pod was missing", "addr", ip)
		l.m.Repairs.WithLabelValues("pod-route").Inc()
		n++
	}
	return n
}

// repairSysctls puts back proxy ARP without delay and forwarding on a live
// routed pod's host veth (IPv4): without them the pod's default gateway
// 169.254.1.1 does not answer. It returns how many it wrote.
func (l *Loop) repairSysctls(network string, lr *liveRepair) int {
	v4 := false
	for _, ip := range lr.record.IPs {
		v4 = v4 || ip.Is4()
	}
	if !v4 {
		return 0
	}
	name := lr.host.Attrs().Name
	n := 0
	for _, s := range [][2]string{
		{"net/ipv4/conf/" + name + "/proxy_arp", "1"},
		{"net/ipv4/neigh/" + name + "/proxy_delay", "0"},
		{"net/ipv4/conf/" + name + "/forwarding", "1"},
	} {
		p := filepath.Join(l.cfg.ProcSys, s[0])
		got, err := os.ReadFile(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) { // gone with its veth meanwhile
				l.log.Warn("repair: read sysctl", "name", s[0], "err", err)
			}
			continue
		}
		if strings.TrimSpace(string(got)) == s[1] {
			continue
		}
		if err := os.WriteFile(p, []byte(s[1]), 0o644); err != nil {
			l.log.Warn("repair: write sysctl", "name", s[0], "err", err)
			continue
		}
		l.log.Info("repaired: a sysctl of a live pod's host veth", "network", network, "container", lr.owner.ContainerID, "hostVeth", name,
			"name", strings.ReplaceAll(s[0], "/", "."), "was", strings.TrimSpace(string(got)), "now", s[1])
		l.m.Repairs.WithLabelValues("pod-sysctl").Inc()
		n++
	}
	return n
}

// repairLive puts back the host routes of live attachments under the
// store's lock, in holds of about LockBudget, as release.
func (l *Loop) repairLive(dir, network string, repairs []*liveRepair, res *Result) error {
	return l.inHolds(dir, network, len(repairs), res, func(d *store.Disk, i int) error {
		res.Repaired += l.repairRoutes(d, network, repairs[i])
		return nil
	})
}
