// The sysctls of the encapsulation, and Setup's writing them (through
// internal/sysctl).

package dataplane

import (
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/sysctl"
	"github.com/podnet/podnet/routed/desired"
)

// Sysctls are the settings the dataplane needs for encap: forwarding (IPv6
// forwarding too with v6, when an IPv6 pod CIDR is routed), loose
// reverse-path filtering on the tunnel device (packets from other nodes'
// pods arrive on it from addresses it has no route back through), and no
// router advertisement or address autoconfiguration on podnet.vxlan (an
// interface podnet creates must not let anyone add a route or an address
// to the node).
func Sysctls(encap desired.Encap, v6 bool) []sysctl.Setting {
	s := []sysctl.Setting{{Name: "net/ipv4/ip_forward", Value: "1"}}
	if v6 {
		s = append(s, sysctl.Setting{Name: "net/ipv6/conf/all/forwarding", Value: "1"})
	}
	switch encap {
	case desired.IPIP:
		s = append(s, sysctl.Setting{Name: "net/ipv4/conf/" + desired.TunnelDevice + "/rp_filter", Value: "2"})
	case desired.VXLAN:
		s = append(s,
			sysctl.Setting{Name: "net/ipv4/conf/" + desired.VXLANDevice + "/rp_filter", Value: "2"},
			sysctl.Setting{Name: "net/ipv6/conf/" + desired.VXLANDevice + "/accept_ra", Value: "0", IPv6Only: true},
			sysctl.Setting{Name: "net/ipv6/conf/" + desired.VXLANDevice + "/autoconf", Value: "0", IPv6Only: true})
	}
	return s
}

// setSysctls sets s; a device's own are skipped when the device is
// missing, and their writes on a device just created are not fixes.
func (d *Netlink) setSysctls(s []sysctl.Setting, link netlink.Link, created bool, res *SetupResult) {
	var dev string
	if link != nil {
		dev = link.Attrs().Name
	}
	s = slices.DeleteFunc(slices.Clone(s), func(c sysctl.Setting) bool {
		name := deviceOf(c)
		return name != "" && name != dev
	})
	changed, failed := sysctl.Writer{Root: d.ProcSys, Log: d.Log}.Set(s)
	for _, c := range changed {
		if created && deviceOf(c) != "" {
			continue
		}
		res.fix(FixSysctl, "%s=%s", c.DisplayName(), c.Value)
	}
	for _, f := range failed {
		d.Log.Warn("cannot set a sysctl; going on without it", "name", f.Setting.DisplayName(), "value", f.Setting.Value, "err", f.Err)
	}
	res.SysctlErrors = append(res.SysctlErrors, failed...)
}

// deviceOf is the device a per-device sysctl (net/ipv4/conf/DEV/...,
// net/ipv6/conf/DEV/...) is about: "" for all, default and global ones.
func deviceOf(c sysctl.Setting) string {
	parts := strings.Split(c.Name, "/")
	if len(parts) != 5 || parts[0] != "net" || parts[2] != "conf" || parts[3] == "all" || parts[3] == "default" {
		return ""
	}
	return parts[3]
}
