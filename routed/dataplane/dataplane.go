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

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/sysctl"
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
	// ProcSys is where Setup writes sysctls; "" is sysctl.DefaultRoot.
	ProcSys string
	Log     *slog.Logger

	warnedMTU bool
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
	SysctlErrors []sysctl.Error
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
