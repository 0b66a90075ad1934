package dataplane

import (
	"slices"
	"testing"

	"github.com/podnet/podnet/internal/sysctl"
	"github.com/podnet/podnet/routed/desired"
)

func TestSysctls(t *testing.T) {
	set := func(name, value string) sysctl.Setting { return sysctl.Setting{Name: name, Value: value} }
	v6Only := func(name, value string) sysctl.Setting {
		return sysctl.Setting{Name: name, Value: value, IPv6Only: true}
	}
	for _, tc := range []struct {
		encap desired.Encap
		v6    bool
		want  []sysctl.Setting
	}{
		{desired.None, false, []sysctl.Setting{set("net/ipv4/ip_forward", "1")}},
		{desired.None, true, []sysctl.Setting{set("net/ipv4/ip_forward", "1"), set("net/ipv6/conf/all/forwarding", "1")}},
		{desired.IPIP, false, []sysctl.Setting{set("net/ipv4/ip_forward", "1"), set("net/ipv4/conf/tunl0/rp_filter", "2")}},
		{desired.VXLAN, true, []sysctl.Setting{set("net/ipv4/ip_forward", "1"), set("net/ipv6/conf/all/forwarding", "1"),
			set("net/ipv4/conf/podnet.vxlan/rp_filter", "2"),
			v6Only("net/ipv6/conf/podnet.vxlan/accept_ra", "0"), v6Only("net/ipv6/conf/podnet.vxlan/autoconf", "0")}},
	} {
		if got := Sysctls(tc.encap, tc.v6); !slices.Equal(got, tc.want) {
			t.Errorf("Sysctls(%s, v6 %v) = %v, want %v", tc.encap, tc.v6, got, tc.want)
		}
	}
}

func TestDeviceOf(t *testing.T) {
	for name, want := range map[string]string{
		"net/ipv4/ip_forward":                  "",
		"net/ipv6/conf/all/forwarding":         "",
		"net/ipv4/conf/default/rp_filter":      "",
		"net/ipv4/conf/podnet.vxlan/rp_filter": "podnet.vxlan",
		"net/ipv6/conf/podnet.vxlan/accept_ra": "podnet.vxlan",
		"net/ipv4/conf/tunl0/rp_filter":        "tunl0",
	} {
		if got := deviceOf(sysctl.Setting{Name: name}); got != want {
			t.Errorf("deviceOf(%s) = %q, want %q", name, got, want)
		}
	}
}
