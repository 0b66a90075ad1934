// Package dataplane applies podnet-routed's desired state to the kernel with
// netlink (routes, the tunnel devices, VXLAN neighbors and FDB entries) and
// nftables (outbound masquerade). It only ever changes what podnet owns:
// routes with podnet's protocol, the podnet.vxlan device, its own nft table.
// tunl0 is shared with anyone using IPIP: it is used, never deleted, and
// only its MTU and up state are set.
package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/rtproto"
	"github.com/podnet/podnet/routed/desired"
)

// Netlink is the kernel dataplane of the current netns.
type Netlink struct {
	Encap       desired.Encap
	CrossSubnet bool
	VNI         int
	Port        int
	// MTU of the overlay; 0: underlay MTU minus the encapsulation overhead.
	MTU int
	Log *slog.Logger

	warnedMTU bool
}

// ErrNoIPIP is returned when the kernel cannot create tunl0.
var ErrNoIPIP = errors.New("this kernel has no IPIP support (the ipip module is missing or cannot load): run podnet-routed with --encap=vxlan or --encap=none")

// Underlay finds the link carrying the node's own address.
func Underlay(nodeIP netip.Addr) (netlink.Link, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("link of %s: %w", nodeIP, err)
			}
			return l, nil
		}
	}
	return nil, fmt.Errorf("no interface in this netns has the node address %s", nodeIP)
}

// OverlayMTU is the MTU pods get: the configured one, else the underlay's
// minus the encapsulation overhead (cross-subnet nodes may encapsulate, so
// the overhead applies there too).
func (d *Netlink) OverlayMTU(underlay netlink.Link) int {
	if max := underlay.Attrs().MTU - d.Encap.Overhead(); d.MTU > max {
		if !d.warnedMTU {
			d.warnedMTU = true
			d.Log.Warn("--mtu is larger than the underlay allows; using the largest that fits", "mtu", d.MTU, "max", max, "underlay", underlay.Attrs().Name)
		}
		return max
	}
	if d.MTU > 0 {
		return d.MTU
	}
	return underlay.Attrs().MTU - d.Encap.Overhead()
}

// OnLink reports whether ip is reachable without a gateway.
func OnLink(ip netip.Addr) bool {
	routes, err := netlink.RouteGet(ip.AsSlice())
	if err != nil || len(routes) == 0 {
		return false
	}
	return routes[0].Gw == nil
}

// Setup makes the devices and sysctls of the encapsulation exist. It is
// idempotent and cheap when everything is already in place.
func (d *Netlink) Setup(self desired.Node, vteps []netip.Prefix) error {
	underlay, err := Underlay(self.IP)
	if err != nil {
		return err
	}
	mtu := d.OverlayMTU(underlay)
	sysctls := [][2]string{{"net/ipv4/ip_forward", "1"}}
	for _, p := range self.PodCIDRs {
		if p.Addr().Is6() {
			sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
		}
	}
	switch d.Encap {
	case desired.IPIP:
		if err := d.ensureTunl0(mtu); err != nil {
			return err
		}
		sysctls = append(sysctls, [2]string{"net/ipv4/conf/" + desired.TunnelDevice + "/rp_filter", "2"})
	case desired.VXLAN:
		if err := d.ensureVXLAN(self.IP, underlay, mtu, vteps); err != nil {
			return err
		}
		sysctls = append(sysctls, [2]string{"net/ipv4/conf/" + desired.VXLANDevice + "/rp_filter", "2"})
	}
	for _, s := range sysctls {
		if err := setSysctl(s[0], s[1], d.Log); err != nil {
			return err
		}
	}
	return nil
}

// CheckIPIP makes sure tunl0 exists (creating it loads the kernel's ipip
// support), or returns ErrNoIPIP. A module that is still loading (another
// process asked first) can answer "not supported" for a moment, so it
// retries for up to 2 s.
func CheckIPIP() error {
	var err error
	for i := 0; i < 20; i++ {
		if _, err = tunl0(); !errors.Is(err, ErrNoIPIP) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// tunl0 returns the IPIP fallback device, creating it when absent. With
// the ipip module loaded it exists in every netns: EEXIST means "use it".
func tunl0() (netlink.Link, error) {
	link, err := netlinksafe.LinkByName(desired.TunnelDevice)
	if err == nil {
		return link, nil
	}
	if !isNotFound(err) {
		return nil, fmt.Errorf("look up %s: %w", desired.TunnelDevice, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = desired.TunnelDevice
	err = netlink.LinkAdd(&netlink.Iptun{LinkAttrs: attrs})
	switch {
	case err == nil, errors.Is(err, unix.EEXIST):
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTSUP), strings.Contains(err.Error(), "not supported"):
		return nil, ErrNoIPIP
	default:
		return nil, fmt.Errorf("create %s: %w (%v)", desired.TunnelDevice, err, ErrNoIPIP)
	}
	if link, err = netlinksafe.LinkByName(desired.TunnelDevice); err != nil {
		return nil, fmt.Errorf("look up %s: %w", desired.TunnelDevice, err)
	}
	return link, nil
}

func (d *Netlink) ensureTunl0(mtu int) error {
	link, err := tunl0()
	if err != nil {
		return err
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("set %s MTU %d: %w", desired.TunnelDevice, mtu, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", desired.TunnelDevice, err)
		}
	}
	return nil
}

func (d *Netlink) ensureVXLAN(selfIP netip.Addr, underlay netlink.Link, mtu int, vteps []netip.Prefix) error {
	mac, _ := net.ParseMAC(desired.VTEPMAC(selfIP))
	want := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: desired.VXLANDevice, MTU: mtu, HardwareAddr: mac},
		VxlanId:      d.VNI,
		Port:         d.Port,
		VtepDevIndex: underlay.Attrs().Index,
		SrcAddr:      selfIP.AsSlice(),
		Learning:     false,
	}
	link, err := netlinksafe.LinkByName(desired.VXLANDevice)
	if err == nil {
		cur, ok := link.(*netlink.Vxlan)
		if !ok || cur.VxlanId != d.VNI || cur.Port != d.Port || cur.VtepDevIndex != want.VtepDevIndex ||
			!cur.SrcAddr.Equal(want.SrcAddr) || cur.HardwareAddr.String() != mac.String() {
			d.Log.Info("recreating VXLAN device with new parameters", "dev", desired.VXLANDevice)
			if err := netlink.LinkDel(link); err != nil {
				return fmt.Errorf("delete outdated %s: %w", desired.VXLANDevice, err)
			}
			link = nil
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("look up %s: %w", desired.VXLANDevice, err)
	} else {
		link = nil
	}
	if link == nil {
		if err := netlink.LinkAdd(want); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create %s: %w", desired.VXLANDevice, err)
		}
		if link, err = netlinksafe.LinkByName(desired.VXLANDevice); err != nil {
			return fmt.Errorf("look up %s: %w", desired.VXLANDevice, err)
		}
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("set %s MTU: %w", desired.VXLANDevice, err)
		}
	}
	for _, v := range vteps {
		addr := &netlink.Addr{IPNet: prefixNet(v)}
		if v.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add VTEP address %s: %w", v, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", desired.VXLANDevice, err)
		}
	}
	return nil
}

// OwnedRoutes lists the routes podnet-routed manages: podnet's protocol in
// the main table, blackholes and routes via a gateway. The plugin's pod host
// routes carry the same protocol but have neither, and are left out.
func OwnedRoutes() ([]desired.Route, error) {
	filter := &netlink.Route{Protocol: rtproto.Podnet, Table: unix.RT_TABLE_MAIN}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list podnet routes: %w", err)
	}
	names := map[int]string{}
	out := make([]desired.Route, 0, len(routes))
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		dr := desired.Route{Dst: dst}
		if r.Type == unix.RTN_BLACKHOLE {
			dr.Kind = desired.Blackhole
		} else {
			if r.Gw == nil {
				// A pod's host route (podIP dev <host veth> scope link),
				// installed by the CNI plugin with the same protocol. Every
				// route podnet-routed installs has a gateway or is a
				// blackhole: pruning this one would cut the pod off.
				continue
			}
			dr.Gw, _ = netip.AddrFromSlice(r.Gw)
			dr.Gw = dr.Gw.Unmap()
			dr.OnLink = r.Flags&int(netlink.FLAG_ONLINK) != 0
			if _, seen := names[r.LinkIndex]; !seen {
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					names[r.LinkIndex] = l.Attrs().Name
				}
			}
			dr.Dev = names[r.LinkIndex]
		}
		out = append(out, dr)
	}
	return out, nil
}

// ApplyRoutes makes the podnet routes equal to want. It returns how many
// routes it changed.
func ApplyRoutes(want []desired.Route) (changed int, err error) {
	actual, err := OwnedRoutes()
	if err != nil {
		return 0, err
	}
	upsert, remove := desired.Diff(want, actual)
	var errs []error
	for _, r := range remove {
		if err := netlink.RouteDel(kernelRoute(r, 0)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
			continue
		}
		changed++
	}
	links := map[string]int{}
	for _, r := range upsert {
		idx := 0
		if r.Kind != desired.Blackhole {
			if _, ok := links[r.Dev]; !ok {
				l, err := netlinksafe.LinkByName(r.Dev)
				if err != nil {
					errs = append(errs, fmt.Errorf("route %s: device: %w", r, err))
					continue
				}
				links[r.Dev] = l.Attrs().Index
			}
			idx = links[r.Dev]
		}
		if err := replaceOwned(kernelRoute(r, idx)); err != nil {
			errs = append(errs, fmt.Errorf("install route %s: %w", r, err))
			continue
		}
		changed++
	}
	return changed, errors.Join(errs...)
}

// replaceOwned installs r unless a route of another protocol holds its
// destination: foreign routes are never replaced.
func replaceOwned(r *netlink.Route) error {
	filter := &netlink.Route{Dst: r.Dst, Table: unix.RT_TABLE_MAIN}
	existing, err := netlinksafe.RouteListFiltered(familyOf(r.Dst.IP), filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return err
	}
	for _, e := range existing {
		if e.Protocol != rtproto.Podnet {
			return fmt.Errorf("a route to %s with protocol %d (not podnet's) exists; leaving it alone", r.Dst, e.Protocol)
		}
	}
	return netlink.RouteReplace(r)
}

func kernelRoute(r desired.Route, linkIndex int) *netlink.Route {
	kr := &netlink.Route{Dst: prefixNet(r.Dst), Protocol: rtproto.Podnet, Table: unix.RT_TABLE_MAIN}
	if r.Kind == desired.Blackhole {
		kr.Type = unix.RTN_BLACKHOLE
		return kr
	}
	kr.LinkIndex = linkIndex
	kr.Gw = r.Gw.AsSlice()
	if r.OnLink {
		kr.Flags = int(netlink.FLAG_ONLINK)
	}
	return kr
}

// ApplyVXLANPeers makes the neighbor and FDB entries of podnet.vxlan equal
// to the desired ones.
func ApplyVXLANPeers(neighs []desired.Neighbor, fdbs []desired.FDB) error {
	link, err := netlinksafe.LinkByName(desired.VXLANDevice)
	if err != nil {
		return fmt.Errorf("look up %s: %w", desired.VXLANDevice, err)
	}
	idx := link.Attrs().Index
	var errs []error
	wantNeigh := map[string]bool{}
	for _, n := range neighs {
		mac, _ := net.ParseMAC(n.MAC)
		wantNeigh[n.IP.String()+" "+n.MAC] = true
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}
		if err := netlink.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("neighbor %s: %w", n.IP, err))
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		cur, err := netlink.NeighList(idx, fam)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range cur {
			if c.State == netlink.NUD_PERMANENT && !wantNeigh[c.IP.String()+" "+c.HardwareAddr.String()] {
				if err := netlink.NeighDel(&c); err != nil {
					errs = append(errs, fmt.Errorf("delete neighbor %s: %w", c.IP, err))
				}
			}
		}
	}
	wantFDB := map[string]bool{}
	for _, f := range fdbs {
		mac, _ := net.ParseMAC(f.MAC)
		wantFDB[f.MAC+" "+f.Dst.String()] = true
		e := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: f.Dst.AsSlice(), HardwareAddr: mac}
		if err := netlink.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("fdb %s -> %s: %w", f.MAC, f.Dst, err))
		}
	}
	cur, err := netlink.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range cur {
		if c.IP == nil || c.HardwareAddr == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(c.IP)
		if !wantFDB[c.HardwareAddr.String()+" "+ip.Unmap().String()] {
			if err := netlink.NeighDel(&c); err != nil {
				errs = append(errs, fmt.Errorf("delete fdb %s: %w", c.HardwareAddr, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Cleanup removes every podnet route and the VXLAN device. tunl0 is left
// (it is the kernel's shared fallback device).
func Cleanup() error {
	var errs []error
	if _, err := ApplyRoutes(nil); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlinksafe.LinkByName(desired.VXLANDevice); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", desired.VXLANDevice, err))
		}
	}
	return errors.Join(errs...)
}

func setSysctl(name, value string, log *slog.Logger) error {
	p := filepath.Join("/proc/sys", name)
	cur, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, err)
	}
	if log != nil {
		log.Info("sysctl set", "name", strings.ReplaceAll(name, "/", "."), "value", value)
	}
	return nil
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

func familyOf(ip net.IP) int {
	if ip.To4() != nil {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}
