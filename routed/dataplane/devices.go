// The tunnel devices: tunl0 (IPIP, shared: only its MTU and up state are
// set) and podnet.vxlan (VXLAN, podnet-routed's own).

package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/desired"
)

// ErrNoIPIP is returned when the kernel cannot create tunl0.
var ErrNoIPIP = errors.New("this kernel has no IPIP support (the ipip module is missing or cannot load): run podnet-routed with --encap=vxlan or --encap=none")

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
