// Package dataplane applies podnet-routed's desired state to the kernel with
// netlink (routes, the tunnel devices, VXLAN neighbors and FDB entries) and
// nftables (outbound masquerade). It only ever changes what podnet-routed
// owns (internal/contract): routes with podnet's protocol that are not a
// pod's host route, the podnet.vxlan device, its own nft table.
// tunl0 is shared with anyone using IPIP: it is used, never deleted, and
// only its MTU and up state are set.
package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// Netlink is the kernel dataplane of the current netns.
type Netlink struct {
	Encap desired.Encap
	VNI   int
	Port  int
	// MTU of the overlay; 0: underlay MTU minus the encapsulation overhead.
	MTU int
	// UnderlayIP is this node's underlay address (its family decides
	// VXLAN's overhead); Setup sets it, the daemon before OverlayMTU.
	UnderlayIP netip.Addr
	// ProcSys is where Setup writes sysctls; "" is DefaultProcSys.
	ProcSys string
	Log     *slog.Logger

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

// UnderlayToward is the link of the route to the first of addrs that has
// one without a gateway of podnet's (the underlay when this node's own
// address is not known); nil when addrs is empty.
func UnderlayToward(addrs []netip.Addr) (netlink.Link, error) {
	var errs []error
	for _, a := range addrs {
		routes, err := netlink.RouteGet(a.AsSlice())
		if err != nil || len(routes) == 0 {
			errs = append(errs, fmt.Errorf("route to %s: %v", a, err))
			continue
		}
		l, err := netlink.LinkByIndex(routes[0].LinkIndex)
		if err != nil {
			errs = append(errs, fmt.Errorf("link of the route to %s: %w", a, err))
			continue
		}
		if n := l.Attrs().Name; n == desired.TunnelDevice || n == desired.VXLANDevice {
			continue
		}
		return l, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("no underlay link toward the other nodes: %w", errors.Join(errs...))
	}
	return nil, nil
}

// OverlayMTU is the MTU pods get: the configured one, else the underlay's
// minus the encapsulation overhead (cross-subnet nodes may encapsulate, so
// the overhead applies there too).
func (d *Netlink) OverlayMTU(underlay netlink.Link) int {
	overhead := d.Encap.OverheadOver(d.UnderlayIP)
	if max := underlay.Attrs().MTU - overhead; d.MTU > max {
		if !d.warnedMTU {
			d.warnedMTU = true
			d.Log.Warn("--mtu is larger than the underlay allows; using the largest that fits", "mtu", d.MTU, "max", max, "underlay", underlay.Attrs().Name)
		}
		return max
	}
	if d.MTU > 0 {
		return d.MTU
	}
	return underlay.Attrs().MTU - overhead
}

// OnLink reports whether ip is reachable without a gateway.
func OnLink(ip netip.Addr) bool {
	routes, err := netlink.RouteGet(ip.AsSlice())
	if err != nil || len(routes) == 0 {
		return false
	}
	return routes[0].Gw == nil
}

// Fix is one thing Setup found wrong in the kernel and put right.
type Fix struct {
	// Object is what was fixed, a label of podnet_repairs_total:
	// "tunnel-device" or "sysctl".
	Object string
	// What says what was done ("podnet.vxlan learning off",
	// "net.ipv4.ip_forward=1").
	What string
}

// Object labels of the fixes Setup reports.
const (
	FixTunnelDevice = "tunnel-device"
	FixSysctl       = "sysctl"
)

// SetupResult is what one Setup changed and what it could not do.
type SetupResult struct {
	// Fixes lists every change made to the kernel, in order. The first
	// Setup of a node makes them all; later ones only repair.
	Fixes []Fix
	// SysctlErrors are the sysctls that could not be set (a read-only
	// /proc/sys): each is logged as a warning and does not fail Setup.
	SysctlErrors []SysctlError
	// DeviceReset: the tunnel device was created, re-created or brought
	// up. The kernel dropped the routes through it without telling
	// (and the VXLAN entries of a new device): a routes cache is stale.
	DeviceReset bool
}

func (r *SetupResult) fix(object, format string, args ...any) {
	r.Fixes = append(r.Fixes, Fix{Object: object, What: fmt.Sprintf(format, args...)})
}

// Setup makes the devices and sysctls of the encapsulation exist and hold
// their settings, and repairs whatever differs: tunl0 up with the overlay
// MTU; podnet.vxlan with its VNI, port, local address, underlay device,
// MAC, MTU, learning off, VTEP addresses, up; the sysctls of Sysctls. It is
// idempotent and cheap (no write) when everything is in place.
//
// A sysctl that cannot be set is a warning in the log and an entry of
// SysctlErrors, never an error. The error is the device step's (or the
// underlay's): the sysctls are still set then, and the caller goes on with
// the work that does not need the device.
func (d *Netlink) Setup(self desired.Node, vteps []netip.Prefix) (SetupResult, error) {
	var res SetupResult
	underlay, err := Underlay(self.IP)
	if err != nil {
		return res, err
	}
	d.UnderlayIP = self.IP
	mtu := d.OverlayMTU(underlay)
	var link netlink.Link
	created := false
	var devErr error
	switch d.Encap {
	case desired.IPIP:
		link, devErr = d.ensureTunl0(mtu, &res)
	case desired.VXLAN:
		link, created, devErr = d.ensureVXLAN(self.IP, underlay, mtu, &res)
	}
	// the device's sysctls before it comes up: no router advertisement
	// may reach a device that accepts it
	v6 := slices.ContainsFunc(self.PodCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() })
	d.setSysctls(Sysctls(d.Encap, v6), link, created, &res)
	if link != nil && devErr == nil {
		if d.Encap != desired.VXLAN {
			vteps = nil // tunl0 has no VTEP address
		}
		devErr = d.finishDevice(link, vteps, &res)
	}
	return res, devErr
}

// setSysctls sets s; a device's own are skipped when the device is
// missing, and their writes on a device just created are not fixes.
func (d *Netlink) setSysctls(s []Sysctl, link netlink.Link, created bool, res *SetupResult) {
	var dev string
	if link != nil {
		dev = link.Attrs().Name
	}
	s = slices.DeleteFunc(slices.Clone(s), func(c Sysctl) bool {
		name := deviceOf(c)
		return name != "" && name != dev
	})
	changed, failed := SysctlWriter{Root: d.ProcSys, Log: d.Log}.Set(s)
	for _, c := range changed {
		if created && deviceOf(c) != "" {
			continue
		}
		res.fix(FixSysctl, "%s=%s", c.DisplayName(), c.Value)
	}
	for _, f := range failed {
		d.Log.Warn("cannot set a sysctl; going on without it", "name", f.Sysctl.DisplayName(), "value", f.Sysctl.Value, "err", f.Err)
	}
	res.SysctlErrors = append(res.SysctlErrors, failed...)
}

// deviceOf is the device a per-device sysctl (net/ipv4/conf/DEV/...,
// net/ipv6/conf/DEV/...) is about: "" for all, default and global ones.
func deviceOf(c Sysctl) string {
	parts := strings.Split(c.Name, "/")
	if len(parts) != 5 || parts[0] != "net" || parts[2] != "conf" || parts[3] == "all" || parts[3] == "default" {
		return ""
	}
	return parts[3]
}

// finishDevice gives the tunnel device its VTEP addresses (VXLAN) and
// brings it up.
func (d *Netlink) finishDevice(link netlink.Link, vteps []netip.Prefix, res *SetupResult) error {
	name := link.Attrs().Name
	for _, v := range vteps {
		addr := &netlink.Addr{IPNet: prefixNet(v)}
		if v.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add VTEP address %s to %s: %w", v, name, err)
		} else if err == nil {
			res.fix(FixTunnelDevice, "%s address %s", name, v)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
		res.fix(FixTunnelDevice, "%s up", name)
		res.DeviceReset = true
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

// ensureTunl0 makes tunl0 exist with the overlay MTU (it is brought up by
// finishDevice, after its sysctls).
func (d *Netlink) ensureTunl0(mtu int, res *SetupResult) (netlink.Link, error) {
	link, err := tunl0()
	if err != nil {
		return nil, err
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("set %s MTU %d: %w", desired.TunnelDevice, mtu, err)
		}
		res.fix(FixTunnelDevice, "%s mtu %d", desired.TunnelDevice, mtu)
	}
	return link, nil
}

// ensureVXLAN makes podnet.vxlan exist with every setting podnet-routed
// gives it: created when missing; VNI and port, which the kernel cannot
// change on a device, by re-creating it; local address, underlay device
// and learning in place (re-created when the kernel refuses); MAC and MTU
// in place. It is brought up by finishDevice, after its sysctls. created
// tells that the device is new (created or re-created).
func (d *Netlink) ensureVXLAN(selfIP netip.Addr, underlay netlink.Link, mtu int, res *SetupResult) (link netlink.Link, created bool, err error) {
	mac, _ := net.ParseMAC(desired.VTEPMAC(selfIP))
	want := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: desired.VXLANDevice, MTU: mtu, HardwareAddr: mac},
		VxlanId:      d.VNI,
		Port:         d.Port,
		VtepDevIndex: underlay.Attrs().Index,
		SrcAddr:      selfIP.AsSlice(),
		Learning:     false,
	}
	dev := desired.VXLANDevice
	link, err = netlinksafe.LinkByName(dev)
	switch {
	case err == nil:
	case isNotFound(err):
		link = nil
	default:
		return nil, false, fmt.Errorf("look up %s: %w", dev, err)
	}
	recreate := func(why string) error {
		d.Log.Info("re-creating the VXLAN device", "dev", dev, "why", why)
		if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete %s (%s): %w", dev, why, err)
		}
		link = nil
		return nil
	}
	if link != nil {
		cur, ok := link.(*netlink.Vxlan)
		switch {
		case !ok:
			err = recreate("not a VXLAN device: " + link.Type())
		case cur.VxlanId != d.VNI:
			err = recreate(fmt.Sprintf("VNI %d, want %d", cur.VxlanId, d.VNI))
		case cur.Port != d.Port:
			err = recreate(fmt.Sprintf("port %d, want %d", cur.Port, d.Port))
		default:
			err = d.changeVXLAN(cur, want, res, recreate)
		}
		if err != nil {
			return nil, false, err
		}
	}
	if link == nil {
		if err := netlink.LinkAdd(want); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("%w (another device already uses VNI %d and port %d, or holds the name)", err, d.VNI, d.Port)
			}
			return nil, false, fmt.Errorf("create %s: %w", dev, err)
		}
		if link, err = netlinksafe.LinkByName(dev); err != nil {
			return nil, false, fmt.Errorf("look up %s: %w", dev, err)
		}
		res.fix(FixTunnelDevice, "%s created", dev)
		res.DeviceReset = true
		created = true
	}
	if link.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return nil, false, fmt.Errorf("set %s MAC %s: %w", dev, mac, err)
		}
		res.fix(FixTunnelDevice, "%s mac %s", dev, mac)
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, false, fmt.Errorf("set %s MTU %d: %w", dev, mtu, err)
		}
		res.fix(FixTunnelDevice, "%s mtu %d", dev, mtu)
	}
	return link, created, nil
}

// changeVXLAN puts back, in place, the settings of podnet.vxlan the kernel
// lets change on a live device: learning, local address, underlay device.
// When the kernel refuses, it calls recreate.
func (d *Netlink) changeVXLAN(cur, want *netlink.Vxlan, res *SetupResult, recreate func(why string) error) error {
	var attrs []*nl.RtAttr
	var what []string
	if cur.Learning != want.Learning {
		attrs = append(attrs, nl.NewRtAttr(nl.IFLA_VXLAN_LEARNING, boolAttr(want.Learning)))
		what = append(what, fmt.Sprintf("learning %v", want.Learning))
	}
	if !cur.SrcAddr.Equal(want.SrcAddr) {
		if ip4 := want.SrcAddr.To4(); ip4 != nil {
			attrs = append(attrs, nl.NewRtAttr(nl.IFLA_VXLAN_LOCAL, ip4))
		} else {
			attrs = append(attrs, nl.NewRtAttr(nl.IFLA_VXLAN_LOCAL6, want.SrcAddr.To16()))
		}
		what = append(what, "local "+want.SrcAddr.String())
	}
	if cur.VtepDevIndex != want.VtepDevIndex {
		attrs = append(attrs, nl.NewRtAttr(nl.IFLA_VXLAN_LINK, nl.Uint32Attr(uint32(want.VtepDevIndex))))
		what = append(what, fmt.Sprintf("underlay device index %d", want.VtepDevIndex))
	}
	if len(attrs) == 0 {
		return nil
	}
	if err := vxlanChangeLink(cur.Attrs().Index, attrs); err != nil {
		return recreate(fmt.Sprintf("%s cannot be changed in place: %v", strings.Join(what, ", "), err))
	}
	for _, w := range what {
		res.fix(FixTunnelDevice, "%s %s", cur.Attrs().Name, w)
	}
	return nil
}

// vxlanChangeLink changes the VXLAN attributes attrs of the device with
// index, and nothing else (netlink.LinkModify sends every attribute,
// those the kernel cannot change on a live device included).
func vxlanChangeLink(index int, attrs []*nl.RtAttr) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	for _, a := range attrs {
		data.AddChild(a)
	}
	req.AddData(info)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

func boolAttr(v bool) []byte {
	if v {
		return []byte{1}
	}
	return []byte{0}
}

// routeKernel is what route apply needs from the kernel: the seam that
// lets the delta logic be unit-tested (and its writes counted) without
// root. netlinkRoutes is the real one.
type routeKernel interface {
	// ListMain dumps the main routing table, every protocol, both families.
	ListMain() ([]netlink.Route, error)
	Replace(r *netlink.Route) error
	// Add creates r and fails with EEXIST when any route holds its
	// destination (NLM_F_EXCL).
	Add(r *netlink.Route) error
	Delete(r *netlink.Route) error
	LinkIndex(name string) (int, error)
	LinkName(index int) string
}

// netlinkRoutes is routeKernel on the current netns, through one netlink
// socket kept for the whole apply (netlink's package functions open,
// bind and close a socket for every request: most of the cost of writing
// thousands of routes).
type netlinkRoutes struct {
	h     netlinksafe.Handle
	names map[int]string
}

func (k netlinkRoutes) ListMain() ([]netlink.Route, error) {
	routes, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list the main routing table: %w", err)
	}
	return routes, nil
}
func (k netlinkRoutes) Replace(r *netlink.Route) error { return k.h.RouteReplace(r) }
func (k netlinkRoutes) Add(r *netlink.Route) error     { return k.h.RouteAdd(r) }
func (k netlinkRoutes) Delete(r *netlink.Route) error  { return k.h.RouteDel(r) }
func (k netlinkRoutes) LinkIndex(name string) (int, error) {
	l, err := k.h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}
func (k netlinkRoutes) LinkName(index int) string {
	if name, ok := k.names[index]; ok {
		return name
	}
	name := ""
	if l, err := k.h.LinkByIndex(index); err == nil {
		name = l.Attrs().Name
	}
	k.names[index] = name
	return name
}

// withRoutes runs f with a netlinkRoutes on the current netns.
func withRoutes(f func(netlinkRoutes) error) error {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer h.Close()
	return f(netlinkRoutes{h: h, names: map[int]string{}})
}

// routeTable is the main table as route apply knows it, indexed by
// destination: the routes podnet-routed owns, and which destinations
// another protocol holds.
type routeTable struct {
	owned   map[netip.Prefix]desired.Route
	foreign map[netip.Prefix]netlink.RouteProtocol
	// oldBlackholes are podnet blackholes without contract.BlackholeMetric
	// (made by an older podnet-routed, which shadowed podnet0's connected
	// route): write deletes them once the new one is in.
	oldBlackholes []netlink.Route
}

// readRoutes dumps the main table once.
func readRoutes(k routeKernel) (*routeTable, error) {
	routes, err := k.ListMain()
	if err != nil {
		return nil, err
	}
	t := &routeTable{owned: map[netip.Prefix]desired.Route{}, foreign: map[netip.Prefix]netlink.RouteProtocol{}}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		if r.Protocol != contract.RouteProtocol {
			t.foreign[dst] = r.Protocol
			continue
		}
		if r.Type == unix.RTN_BLACKHOLE && r.Priority != contract.BlackholeMetric && contract.IsRoutedRoute(&r) {
			t.oldBlackholes = append(t.oldBlackholes, r)
			continue
		}
		if dr, ok := ownedRoute(k, r, dst); ok {
			t.owned[dst] = dr
		}
	}
	return t, nil
}

// ownedRoute converts a podnet-protocol route to a desired.Route when it
// is podnet-routed's (contract.IsRoutedRoute): a blackhole or a route via
// a gateway. The plugin's pod host routes carry the same protocol but are
// the pods': pruning one would cut its pod off.
func ownedRoute(k routeKernel, r netlink.Route, dst netip.Prefix) (desired.Route, bool) {
	if !contract.IsRoutedRoute(&r) {
		return desired.Route{}, false
	}
	dr := desired.Route{Dst: dst}
	if r.Type == unix.RTN_BLACKHOLE {
		dr.Kind = desired.Blackhole
		return dr, true
	}
	dr.Gw, _ = netip.AddrFromSlice(r.Gw)
	dr.Gw = dr.Gw.Unmap()
	dr.OnLink = r.Flags&int(netlink.FLAG_ONLINK) != 0
	dr.Dev = k.LinkName(r.LinkIndex)
	return dr, true
}

// OwnedRoutes lists the routes podnet-routed manages: podnet's protocol in
// the main table, blackholes and routes via a gateway, sorted.
func OwnedRoutes() ([]desired.Route, error) {
	var t *routeTable
	err := withRoutes(func(k netlinkRoutes) (err error) {
		t, err = readRoutes(k)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]desired.Route, 0, len(t.owned))
	for _, r := range t.owned {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b desired.Route) int { return strings.Compare(a.Dst.String(), b.Dst.String()) })
	return out, nil
}

// RouteCache is route apply's view of the main table between dumps: what
// the last dump read, what applies wrote since, and what the route
// subscription reported since (Observe). Without a complete view (never
// dumped, a failed write, a lost notification: Invalidate) the next apply
// dumps again. The zero value is empty: the first apply dumps.
type RouteCache struct {
	mu    sync.Mutex
	table *routeTable
	// written is the route podnet-routed last wrote (or found in place
	// and kept) to each destination, kept across dumps: a route the
	// kernel then lacks or holds otherwise was deleted or edited behind
	// its back (a repair), while one that differs only from the new
	// plan is an ordinary change.
	written map[netip.Prefix]desired.Route
	// repaired are the destinations written back since TakeRepairs.
	repaired []netip.Prefix
}

// TakeRepairs returns the destinations whose route was put back since
// the last call because the kernel no longer held what podnet-routed had
// written there (deleted or edited by someone else), and forgets them.
func (c *RouteCache) TakeRepairs() []netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.repaired
	c.repaired = nil
	return r
}

// ForgetDevice forgets what was written through the device name: the
// kernel drops a link's routes when it goes down or away, so writing them
// back is no repair of a route (the link's change is the event, and
// podnet's own tunnel device counts as a tunnel-device repair).
func (c *RouteCache) ForgetDevice(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for dst, r := range c.written {
		if r.Kind != desired.Blackhole && r.Dev == name {
			delete(c.written, dst)
		}
	}
}

// wrote records r as what podnet-routed holds at its destination now.
// The caller holds c.mu.
func (c *RouteCache) wrote(r desired.Route) {
	if c.written == nil {
		c.written = map[netip.Prefix]desired.Route{}
	}
	c.written[r.Dst] = r
}

// Invalidate makes the next apply read the kernel again.
func (c *RouteCache) Invalidate() {
	c.mu.Lock()
	c.table = nil
	c.mu.Unlock()
}

// Observe keeps the cache current with one route notification of the
// main table and tells whether it removed a route podnet-routed wants
// (someone deleted it, or the kernel with its device): the caller then
// applies again, from the cache, to put it back. Notifications of routes
// podnet-routed wrote itself change nothing; a pod's host route is not
// routed's. A new route of another protocol marks its destination as
// foreign; when one goes, the destination is free again (a second foreign
// route on it would still make the exclusive create fail, never be
// overwritten).
func (c *RouteCache) Observe(u netlink.RouteUpdate) (lost bool) {
	del := u.Type == unix.RTM_DELROUTE
	if u.Table != unix.RT_TABLE_MAIN || u.Dst == nil {
		return false
	}
	if u.Protocol == contract.RouteProtocol && (!del || contract.IsPodHostRoute(&u.Route)) {
		// ours, just written (a burst of thousands after a full apply,
		// which must not wait for the lock that apply holds); or a
		// pod's host route
		return false
	}
	dst, ok := netipPrefix(u.Dst)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.table
	if u.Protocol != contract.RouteProtocol {
		if t != nil {
			if del {
				delete(t.foreign, dst)
			} else {
				t.foreign[dst] = u.Protocol
			}
		}
		return false
	}
	if t == nil {
		return true // nothing to compare with: let an apply dump and see
	}
	if u.Type == unix.RTN_BLACKHOLE && u.Priority != contract.BlackholeMetric {
		return false // an old blackhole, which write deletes
	}
	if _, ok := t.owned[dst]; !ok {
		return false // we deleted it
	}
	delete(t.owned, dst)
	return true
}

// ApplyRoutes makes podnet-routed's routes equal to want and writes only
// what differs (nothing when nothing changed). With dump, or when cache holds
// nothing valid, it reads the main table first (one dump, indexed by
// destination); otherwise it trusts cache. It returns how many routes it
// changed and how many of its routes are programmed afterwards.
func ApplyRoutes(want []desired.Route, cache *RouteCache, dump bool) (changed, programmed int, err error) {
	err = withRoutes(func(k netlinkRoutes) (err error) {
		changed, programmed, err = applyRoutes(k, want, cache, dump)
		return err
	})
	return changed, programmed, err
}

// ApplyRouteDelta writes upsert and deletes remove (routes of one Node's
// change) against the cache, reading the table only when the cache holds
// nothing valid: a Node event costs the routes of that Node.
func ApplyRouteDelta(upsert, remove []desired.Route, cache *RouteCache) (changed, programmed int, err error) {
	err = withRoutes(func(k netlinkRoutes) (err error) {
		changed, programmed, err = applyRouteDelta(k, upsert, remove, cache)
		return err
	})
	return changed, programmed, err
}

func applyRoutes(k routeKernel, want []desired.Route, cache *RouteCache, dump bool) (changed, programmed int, err error) {
	if cache == nil {
		cache = &RouteCache{}
	}
	cache.mu.Lock()
	defer cache.mu.Unlock()
	t, err := cache.load(k, dump)
	if err != nil {
		return 0, 0, err
	}
	wanted := make(map[netip.Prefix]bool, len(want))
	var upsert, remove []desired.Route
	for _, r := range want {
		wanted[r.Dst] = true
		if cur, ok := t.owned[r.Dst]; !ok || cur != r {
			upsert = append(upsert, r)
		} else {
			cache.wrote(r) // in place already (a previous run's): ours now
		}
	}
	for dst, r := range t.owned {
		if !wanted[dst] {
			remove = append(remove, r)
		}
	}
	return cache.write(k, t, upsert, remove)
}

func applyRouteDelta(k routeKernel, upsert, remove []desired.Route, cache *RouteCache) (changed, programmed int, err error) {
	cache.mu.Lock()
	defer cache.mu.Unlock()
	t, err := cache.load(k, false)
	if err != nil {
		return 0, 0, err
	}
	up := upsert[:0:0]
	for _, r := range upsert {
		if cur, ok := t.owned[r.Dst]; !ok || cur != r {
			up = append(up, r)
		}
	}
	var rm []desired.Route
	for _, r := range remove {
		if _, ok := t.owned[r.Dst]; ok {
			rm = append(rm, r)
		}
	}
	return cache.write(k, t, up, rm)
}

// load returns the table to apply against: the cached one, or a new dump.
// The caller holds c.mu.
func (c *RouteCache) load(k routeKernel, dump bool) (*routeTable, error) {
	if !dump && c.table != nil {
		return c.table, nil
	}
	c.table = nil
	t, err := readRoutes(k)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// write deletes remove and creates or replaces upsert, keeping t equal to
// what the kernel then holds. A route of another protocol is never
// replaced: a destination known to be foreign is reported, and one podnet
// does not own is only ever created exclusively (NLM_F_EXCL), so a route
// that appeared unseen makes the create fail (and is reported) instead of
// being overwritten. After any failure the cache is dropped: the next
// apply reads the kernel. The caller holds c.mu.
func (c *RouteCache) write(k routeKernel, t *routeTable, upsert, remove []desired.Route) (changed, programmed int, err error) {
	c.table = nil // valid again only if every write below succeeds
	var errs []error
	for _, r := range remove {
		if err := k.Delete(kernelRoute(r, 0)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
			continue
		}
		changed++
		delete(t.owned, r.Dst)
		delete(c.written, r.Dst)
	}
	links := map[string]int{}
	for _, r := range upsert {
		// A blackhole goes under any other route to its destination
		// (contract.BlackholeMetric): podnet0's connected route to the
		// node's PodCIDR holds it already in bridge mode.
		if proto, held := t.foreign[r.Dst]; held && r.Kind != desired.Blackhole {
			errs = append(errs, foreignError(r, proto))
			continue
		}
		idx := 0
		if r.Kind != desired.Blackhole {
			if _, ok := links[r.Dev]; !ok {
				i, err := k.LinkIndex(r.Dev)
				if err != nil {
					errs = append(errs, fmt.Errorf("route %s: device: %w", r, err))
					continue
				}
				links[r.Dev] = i
			}
			idx = links[r.Dev]
		}
		kr := kernelRoute(r, idx)
		write := k.Add
		cur, ours := t.owned[r.Dst]
		if ours {
			write = k.Replace // ours: change it in place
		}
		// a repair when the kernel no longer holds what was written
		// there last, whatever the plan wants now
		last, written := c.written[r.Dst]
		repair := written && (!ours || cur != last)
		if err := write(kr); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("a route to %s that is not podnet-routed's exists (it appeared after the last read of the routing table); leaving it alone", r.Dst)
			}
			errs = append(errs, fmt.Errorf("install route %s: %w", r, err))
			continue
		}
		changed++
		t.owned[r.Dst] = r
		c.wrote(r)
		if repair {
			c.repaired = append(c.repaired, r.Dst)
		}
	}
	// An older podnet-routed's blackholes, after the new ones are in (at
	// the highest metric, so that podnet0's connected route wins).
	for _, old := range t.oldBlackholes {
		if err := k.Delete(&old); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete blackhole %s of an older podnet-routed: %w", old.Dst, err))
			continue
		}
		changed++
	}
	t.oldBlackholes = nil
	if len(errs) == 0 {
		c.table = t
	}
	return changed, len(t.owned), errors.Join(errs...)
}

func foreignError(r desired.Route, proto netlink.RouteProtocol) error {
	return fmt.Errorf("install route %s: a route to %s with protocol %d (not podnet's) exists; leaving it alone", r, r.Dst, proto)
}

func kernelRoute(r desired.Route, linkIndex int) *netlink.Route {
	kr := &netlink.Route{Dst: prefixNet(r.Dst), Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if r.Kind == desired.Blackhole {
		kr.Type = unix.RTN_BLACKHOLE
		kr.Priority = contract.BlackholeMetric
		return kr
	}
	kr.LinkIndex = linkIndex
	kr.Gw = r.Gw.AsSlice()
	if r.OnLink {
		kr.Flags = int(netlink.FLAG_ONLINK)
	}
	return kr
}

// vxlanHandle opens a netlink socket and finds podnet.vxlan's index.
func vxlanHandle() (netlinksafe.Handle, int, error) {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return h, 0, fmt.Errorf("netlink socket: %w", err)
	}
	link, err := h.LinkByName(desired.VXLANDevice)
	if err != nil {
		h.Close()
		return h, 0, fmt.Errorf("look up %s: %w", desired.VXLANDevice, err)
	}
	return h, link.Attrs().Index, nil
}

// VXLANChanges counts the entries a full VXLAN apply wrote or deleted.
type VXLANChanges struct {
	Neighbors, FDBs int
	// of them, the entries written back because the device no longer
	// held what podnet-routed had written there (VXLANRecord): deleted or
	// edited by someone else
	RepairedNeighbors, RepairedFDBs int
}

// VXLANRecord is what podnet-routed last wrote to podnet.vxlan (or found
// there and kept): each neighbor's MAC by IP and each FDB entry's
// destination by MAC. An entry written back is a repair only when the
// device no longer held what was written; one that changes with the plan
// is not. The zero value is empty.
type VXLANRecord struct {
	mu    sync.Mutex
	neigh map[netip.Addr]string
	fdb   map[string]netip.Addr
}

// Forget forgets every entry: the device went down or away (or was
// re-created), and its entries with it.
func (r *VXLANRecord) Forget() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.neigh, r.fdb = nil, nil
}

// setNeigh and setFDB record an entry as written (mac "" / an invalid
// dst: deleted). The caller holds r.mu.
func (r *VXLANRecord) setNeigh(ip netip.Addr, mac string) {
	if r.neigh == nil {
		r.neigh = map[netip.Addr]string{}
	}
	if mac == "" {
		delete(r.neigh, ip)
		return
	}
	r.neigh[ip] = mac
}

func (r *VXLANRecord) setFDB(mac string, dst netip.Addr) {
	if r.fdb == nil {
		r.fdb = map[string]netip.Addr{}
	}
	if !dst.IsValid() {
		delete(r.fdb, mac)
		return
	}
	r.fdb[mac] = dst
}

// neighKernel is what VXLAN peer apply needs from the kernel (the seam that
// lets its ordering be unit-tested): netlinksafe.Handle is the real one.
type neighKernel interface {
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
	// NeighSet creates or replaces an entry: a neighbor by its IP, an FDB
	// entry by its MAC (NLM_F_CREATE|NLM_F_REPLACE).
	NeighSet(n *netlink.Neigh) error
	// NeighDel deletes a neighbor by IP (whatever its MAC), an FDB entry's
	// remote by MAC and destination.
	NeighDel(n *netlink.Neigh) error
}

// ApplyVXLANPeers makes the neighbor and FDB entries of podnet.vxlan equal
// to the desired ones. It lists what the device has first, writes only the
// entries that are missing or differ, and deletes the stale ones: a
// resync with nothing changed writes nothing. It returns how many entries
// it wrote or deleted.
// rec (nil: none) is what was written before, kept current: the entries
// written back that the device had lost or changed are counted as
// repaired.
func ApplyVXLANPeers(neighs []desired.Neighbor, fdbs []desired.FDB, rec *VXLANRecord) (VXLANChanges, error) {
	h, idx, err := vxlanHandle()
	if err != nil {
		return VXLANChanges{}, err
	}
	defer h.Close()
	return applyVXLANPeers(h, idx, neighs, fdbs, rec)
}

func applyVXLANPeers(k neighKernel, idx int, neighs []desired.Neighbor, fdbs []desired.FDB, rec *VXLANRecord) (VXLANChanges, error) {
	if rec == nil {
		rec = &VXLANRecord{}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var ch VXLANChanges
	var errs []error
	gone := func(err error) bool { return err == nil || errors.Is(err, unix.ENOENT) }

	// Neighbors: the kernel keys them by IP. A peer whose MAC changed is
	// replaced in place; the stale ones deleted (by IP) are only those of
	// an IP no Node asks for, so a delete never takes a new entry along.
	have := map[netip.Addr]netlink.Neigh{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		cur, err := k.NeighList(idx, fam)
		if err != nil {
			return ch, fmt.Errorf("list neighbors of %s: %w", desired.VXLANDevice, err)
		}
		for _, c := range cur {
			if ip, ok := netip.AddrFromSlice(c.IP); ok && c.State == netlink.NUD_PERMANENT {
				have[ip.Unmap()] = c
			}
		}
	}
	for _, n := range neighs {
		mac, _ := net.ParseMAC(n.MAC)
		cur, ok := have[n.IP]
		delete(have, n.IP)
		if ok && cur.HardwareAddr.String() == mac.String() {
			rec.setNeigh(n.IP, mac.String()) // in place: ours now
			continue
		}
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}
		if err := k.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("neighbor %s: %w", n.IP, err))
			continue
		}
		ch.Neighbors++
		if last, wrote := rec.neigh[n.IP]; wrote && (!ok || cur.HardwareAddr.String() != last) {
			ch.RepairedNeighbors++
		}
		rec.setNeigh(n.IP, mac.String())
	}
	for ip, c := range have { // permanent entries no Node asks for
		e := &netlink.Neigh{LinkIndex: idx, Family: c.Family, IP: c.IP}
		if err := k.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete neighbor %s: %w", ip, err))
			continue
		}
		ch.Neighbors++
		rec.setNeigh(ip, "")
	}

	// FDB: the kernel keys an entry by MAC, with a list of remote
	// destinations. The desired one is set first (replacing a wrong
	// destination in place), then the other destinations of that MAC go,
	// each deleted by MAC and destination: never the desired one.
	curFDB, err := k.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return ch, errors.Join(append(errs, fmt.Errorf("list FDB of %s: %w", desired.VXLANDevice, err))...)
	}
	haveFDB := map[string][]netlink.Neigh{}
	for _, c := range curFDB {
		if c.IP == nil || c.HardwareAddr == nil {
			continue
		}
		haveFDB[c.HardwareAddr.String()] = append(haveFDB[c.HardwareAddr.String()], c)
	}
	fdbEntry := func(mac net.HardwareAddr, dst net.IP) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: dst, HardwareAddr: mac}
	}
	delFDB := func(c netlink.Neigh) {
		if err := k.NeighDel(fdbEntry(c.HardwareAddr, c.IP)); !gone(err) {
			errs = append(errs, fmt.Errorf("delete fdb %s -> %s: %w", c.HardwareAddr, c.IP, err))
			return
		}
		ch.FDBs++
	}
	for _, f := range fdbs {
		mac, _ := net.ParseMAC(f.MAC)
		cur := haveFDB[mac.String()]
		delete(haveFDB, mac.String())
		right := func(c netlink.Neigh) bool {
			ip, _ := netip.AddrFromSlice(c.IP)
			return ip.Unmap() == f.Dst
		}
		if !(len(cur) == 1 && right(cur[0]) && cur[0].State == netlink.NUD_PERMANENT) {
			e := fdbEntry(mac, f.Dst.AsSlice())
			e.State = netlink.NUD_PERMANENT
			if err := k.NeighSet(e); err != nil {
				errs = append(errs, fmt.Errorf("fdb %s -> %s: %w", f.MAC, f.Dst, err))
				continue
			}
			ch.FDBs++
			// a repair when the entry last written is not there as it
			// was (the plan unchanged: any difference; moved: the old
			// destination gone or not permanent)
			if last, wrote := rec.fdb[mac.String()]; wrote && (last == f.Dst || !slices.ContainsFunc(cur, func(c netlink.Neigh) bool {
				ip, _ := netip.AddrFromSlice(c.IP)
				return ip.Unmap() == last && c.State == netlink.NUD_PERMANENT
			})) {
				ch.RepairedFDBs++
			}
		}
		rec.setFDB(mac.String(), f.Dst)
		for _, c := range cur {
			if !right(c) {
				delFDB(c)
			}
		}
	}
	for mac, cur := range haveFDB { // entries no Node asks for
		for _, c := range cur {
			delFDB(c)
		}
		rec.setFDB(mac, netip.Addr{})
	}
	return ch, errors.Join(errs...)
}

// ApplyVXLANDelta writes the neighbor and FDB entries of one Node's
// change to podnet.vxlan and deletes the ones it no longer has, without
// listing the others.
//
// rec (nil: none) records what was written and deleted.
func ApplyVXLANDelta(setNeigh, delNeigh []desired.Neighbor, addFDB, delFDB []desired.FDB, rec *VXLANRecord) error {
	h, idx, err := vxlanHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	if rec == nil {
		rec = &VXLANRecord{}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var errs []error
	gone := func(err error) bool { return err == nil || errors.Is(err, unix.ENOENT) }
	for _, n := range delNeigh {
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), IP: n.IP.AsSlice()}
		if err := h.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete neighbor %s: %w", n.IP, err))
			continue
		}
		rec.setNeigh(n.IP, "")
	}
	for _, f := range delFDB {
		mac, _ := net.ParseMAC(f.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: f.Dst.AsSlice(), HardwareAddr: mac}
		if err := h.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete fdb %s -> %s: %w", f.MAC, f.Dst, err))
			continue
		}
		if rec.fdb[mac.String()] == f.Dst {
			rec.setFDB(mac.String(), netip.Addr{})
		}
	}
	for _, n := range setNeigh {
		mac, _ := net.ParseMAC(n.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}
		if err := h.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("neighbor %s: %w", n.IP, err))
			continue
		}
		rec.setNeigh(n.IP, mac.String())
	}
	for _, f := range addFDB {
		mac, _ := net.ParseMAC(f.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: f.Dst.AsSlice(), HardwareAddr: mac}
		if err := h.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("fdb %s -> %s: %w", f.MAC, f.Dst, err))
			continue
		}
		rec.setFDB(mac.String(), f.Dst)
	}
	return errors.Join(errs...)
}

// Cleanup removes every route podnet-routed owns (pods' host routes stay:
// they are the plugin's) and the VXLAN device. tunl0 is left (it is the
// kernel's shared fallback device).
func Cleanup() error {
	var errs []error
	if _, _, err := ApplyRoutes(nil, nil, true); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlinksafe.LinkByName(desired.VXLANDevice); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", desired.VXLANDevice, err))
		}
	}
	return errors.Join(errs...)
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
