package contract

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestVethAlias(t *testing.T) {
	for _, o := range []VethOwner{
		{Network: "podnet", ContainerID: "0123456789abcdef", IfName: "eth0"},
		{Network: "k8s-pod-network", ContainerID: "ctr_1.a-b", IfName: "net1"},
	} {
		alias := o.Alias()
		if !strings.HasPrefix(alias, "podnet:") {
			t.Errorf("alias %q lacks the podnet: prefix", alias)
		}
		got, detached, ok := ParseVethAlias(alias)
		if !ok || detached || got != o {
			t.Errorf("ParseVethAlias(%q) = %+v, %v, %v; want %+v, false, true", alias, got, detached, ok, o)
		}
	}
	o := VethOwner{Network: "n", ContainerID: "c", IfName: "i"}
	if got := o.Alias(); got != "podnet:n:c:i" {
		t.Errorf("Alias() = %q, want %q", got, "podnet:n:c:i")
	}
	if got := o.DetachedAlias(); got != "podnet-detached:n:c:i" {
		t.Errorf("DetachedAlias() = %q, want %q", got, "podnet-detached:n:c:i")
	}
}

func TestParseVethAliasRejectsForeignAliases(t *testing.T) {
	for _, alias := range []string{
		"",
		"foo",
		"podnet",
		"podnet:",
		"podnet:a:b",  // missing a part
		"podnet:a::c", // empty part
		"podnet::b:c",
		"podnet:a:b:",
		"podnet:::",
		"calico:a:b:c", // another tool's alias
		"PODNET:a:b:c",
		" podnet:a:b:c",
		"podnet-detached:",
		"podnet-detached:a:b",
	} {
		if o, detached, ok := ParseVethAlias(alias); ok {
			t.Errorf("ParseVethAlias(%q) = %+v, %v, true; want false", alias, o, detached)
		} else if o != (VethOwner{}) || detached {
			t.Errorf("ParseVethAlias(%q) returned %+v, detached %v with ok=false", alias, o, detached)
		}
	}
}

func TestDetachedVethAlias(t *testing.T) {
	o := VethOwner{Network: "podnet", ContainerID: "c1", IfName: "eth0"}
	for _, tc := range []struct {
		alias    string
		detached bool
	}{{o.Alias(), false}, {o.DetachedAlias(), true}} {
		got, detached, ok := ParseVethAlias(tc.alias)
		if !ok || got != o || detached != tc.detached {
			t.Errorf("ParseVethAlias(%q) = %+v %v %v, want %+v %v true", tc.alias, got, detached, ok, o, tc.detached)
		}
	}
}

// TestRouteOwnership: every podnet route is either a pod's host route or
// podnet-routed's; other protocols are neither.
func TestRouteOwnership(t *testing.T) {
	_, dst, _ := net.ParseCIDR("10.244.1.0/24")
	for _, tc := range []struct {
		what    string
		r       netlink.Route
		podHost bool
		routed  bool
	}{
		{"pod host route", netlink.Route{Dst: dst, Protocol: RouteProtocol, LinkIndex: 7, Scope: netlink.SCOPE_LINK}, true, false},
		{"blackhole", netlink.Route{Dst: dst, Protocol: RouteProtocol, Type: unix.RTN_BLACKHOLE}, false, true},
		{"via a gateway", netlink.Route{Dst: dst, Protocol: RouteProtocol, Gw: net.ParseIP("10.0.0.2"), LinkIndex: 3}, false, true},
		{"another protocol's host route", netlink.Route{Dst: dst, Protocol: unix.RTPROT_STATIC, LinkIndex: 7}, false, false},
		{"another protocol's blackhole", netlink.Route{Dst: dst, Protocol: unix.RTPROT_BOOT, Type: unix.RTN_BLACKHOLE}, false, false},
	} {
		if got := IsPodHostRoute(&tc.r); got != tc.podHost {
			t.Errorf("%s: IsPodHostRoute = %v, want %v", tc.what, got, tc.podHost)
		}
		if got := IsRoutedRoute(&tc.r); got != tc.routed {
			t.Errorf("%s: IsRoutedRoute = %v, want %v", tc.what, got, tc.routed)
		}
	}
}

func TestIsHostVeth(t *testing.T) {
	for name, want := range map[string]bool{"pn0123456789a": true, "eth0": false, "podnet.vxlan": false, "tunl0": false} {
		if got := IsHostVeth(name); got != want {
			t.Errorf("IsHostVeth(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestPodFilterL2Tables: the routed mode's netdev tables are exactly
// podnet-pods-0 to -15, each port's the one of its index modulo 16; no
// other name (another number's spelling, the main table's, one past the
// last) is taken for one of them.
func TestPodFilterL2Tables(t *testing.T) {
	seen := map[string]bool{}
	for k := range PodFilterL2Tables {
		name := PodFilterL2Table(k)
		if !IsPodFilterL2Table(name) || seen[name] {
			t.Errorf("table %d: %q (seen %v)", k, name, seen[name])
		}
		seen[name] = true
	}
	for index, want := range map[int]string{1: "podnet-pods-1", 16: "podnet-pods-0", 33: "podnet-pods-1", 1000: "podnet-pods-8"} {
		if got := PodFilterL2TableOf(index); got != want {
			t.Errorf("index %d: %q, want %q", index, got, want)
		}
	}
	for _, name := range []string{"podnet-pods", "podnet-pods-", "podnet-pods-16", "podnet-pods-01", "podnet-pods--1", "podnet-pods-+1", "podnet-pods-1 ", "podnet-pods-1x", "xpodnet-pods-1", "podnet-policy"} {
		if IsPodFilterL2Table(name) {
			t.Errorf("%q taken for an L2 table", name)
		}
	}
}
