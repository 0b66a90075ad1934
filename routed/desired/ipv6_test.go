package desired

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// Two IPv6 node addresses that differ only above their low 32 bits (two
// subnets numbered alike) get different MACs; no IPv6 MAC is ever an
// IPv4 one (the spaces start 0a and 0e); IPv4 MACs stay what they were.
func TestVTEPMACIPv6(t *testing.T) {
	pairs := [][2]string{
		{"fd00:1::c0a8:102", "fd00:2::c0a8:102"},
		{"2001:db8:a::1", "2001:db8:b::1"},
		{"fd00::1", "fe00::1"},
	}
	for _, p := range pairs {
		a, b := VTEPMAC(addr(p[0])), VTEPMAC(addr(p[1]))
		if a == b {
			t.Errorf("VTEPMAC(%s) = VTEPMAC(%s) = %s: the low 32 bits alone decide", p[0], p[1], a)
		}
		for _, m := range []string{a, b} {
			if !strings.HasPrefix(m, "0a:") {
				t.Errorf("IPv6 VTEPMAC %s: want the 0a space", m)
			}
		}
	}
	// the whole address counts: 10,000 IPv6 addresses with equal low
	// 32 bits, all apart
	seen := map[string]netip.Addr{}
	for i := range 10000 {
		b := addr("fd00::c0a8:102").As16()
		b[2], b[3] = byte(i>>8), byte(i)
		ip := netip.AddrFrom16(b)
		m := VTEPMAC(ip)
		if prev, dup := seen[m]; dup {
			t.Fatalf("VTEPMAC(%s) = VTEPMAC(%s) = %s", ip, prev, m)
		}
		seen[m] = ip
		hw, _ := net.ParseMAC(m)
		if hw[0] != 0x0a {
			t.Fatalf("VTEPMAC(%s) = %s: want first byte 0a (locally administered unicast)", ip, m)
		}
	}
	// IPv4: byte for byte what every earlier podnet computed
	if got := VTEPMAC(addr("172.30.0.3")); got != "0e:70:ac:1e:00:03" {
		t.Errorf("VTEPMAC(172.30.0.3) = %s, want 0e:70:ac:1e:00:03 (unchanged: a rolling upgrade keeps its FDB)", got)
	}
}

// collidingV6 are two IPv6 addresses whose VTEP MACs are equal (found by
// a birthday search over fd00:172:30::/96; 40 bits of hash).
var collidingV6 = [2]string{"fd00:172:30::d:cf22", "fd00:172:30::13:5ed3"}

// Should two Nodes' VTEP MACs ever collide, the older keeps its MAC and
// the younger is refused (vtep-mac-conflict), whatever the order or the
// names; the refusal goes when the older goes. Only VXLAN uses the MACs:
// in the other modes both Nodes are routed.
func TestValidateVTEPMACConflict(t *testing.T) {
	if a, b := VTEPMAC(addr(collidingV6[0])), VTEPMAC(addr(collidingV6[1])); a != b {
		t.Fatalf("the test's pair does not collide: %s, %s", a, b)
	}
	cluster := []netip.Prefix{pfx("fd00:10:244::/48")}
	nodes := func() []Node {
		return []Node{
			vnode("self", "fd00:172:30::1", 0, "fd00:10:244::/64"),
			vnode("z-old", collidingV6[1], 1, "fd00:10:244:1::/64"),
			vnode("a-young", collidingV6[0], 2, "fd00:10:244:2::/64"),
		}
	}
	for _, encap := range []Encap{VXLAN, None, IPIP} {
		t.Run(string(encap), func(t *testing.T) {
			cfg := Config{Self: "self", Encap: encap, ClusterCIDRs: cluster, Underlay: underlay}
			for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
				var ns []Node
				for _, i := range order {
					ns = append(ns, nodes()[i])
				}
				v := Validate(cfg, Local{}, ns)
				r, refused := v.Refused["a-young"]
				if encap != VXLAN {
					if len(v.Refused) != 0 {
						t.Fatalf("order %v: refused %v: the MACs matter only with vxlan", order, v.Refused)
					}
					continue
				}
				if !refused || r.Reason != VTEPMACConflict || !strings.Contains(r.Detail, "z-old") || !strings.Contains(r.Detail, VTEPMAC(addr(collidingV6[0]))) {
					t.Fatalf("order %v: a-young %+v, want refused for %s naming z-old and the MAC", order, r, VTEPMACConflict)
				}
				if _, bad := v.Refused["z-old"]; bad || len(v.Refused) != 1 {
					t.Fatalf("order %v: refused %v, want a-young only", order, v.Refused)
				}
				st := Compute(cfg, ns, never)
				if len(st.FDBs) != 1 || st.FDBs[0].Dst != addr(collidingV6[1]) {
					t.Fatalf("order %v: FDB %v, want z-old's alone", order, st.FDBs)
				}
			}
			if encap != VXLAN {
				return
			}
			// a Node event that brings the collision cannot be patched
			// alone; the full computation refuses the younger
			all := nodes()
			plan, _ := NewPlan(cfg, Local{}, all[:2], never)
			if _, ok := plan.Update("a-young", &all[2]); ok {
				t.Fatal("Update patched in a Node whose VTEP MAC is taken")
			}
			// the older gone, the younger is routed
			if v := Validate(cfg, Local{}, []Node{all[0], all[2]}); len(v.Refused) != 0 {
				t.Fatalf("without z-old: refused %v", v.Refused)
			}
		})
	}
	if !slices.Contains(Reasons, VTEPMACConflict) {
		t.Errorf("Reasons lacks %s (the metric's label values)", VTEPMACConflict)
	}
}

// dualNode is a dual-stack Node: IPv4 primary, IPv6 other-family address.
func dualNode(name, ip, ip6 string, age int, cidrs ...string) Node {
	n := vnode(name, ip, age, cidrs...)
	if ip6 != "" {
		n.AltIP = addr(ip6)
	}
	return n
}

// A dual-stack Node's IPv6 PodCIDR is routed directly via its IPv6
// InternalIP in none mode and in cross-subnet mode when that address is on
// link, over VXLAN (through the IPv4 underlay) otherwise. A bad IPv6
// address (reserved, inside a pod, cluster or service CIDR, this node's
// own, another Node's) gets no route and a reason; the Node's IPv4 half
// is routed all the same.
func TestDualStackNodeAddresses(t *testing.T) {
	cluster := []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:10:244::/56")}
	self := dualNode("a", "192.168.1.1", "fd00:1::1", 0, "10.244.0.0/24", "fd00:10:244::/64")
	b := func(ip6 string) Node {
		return dualNode("b", "192.168.1.2", ip6, 1, "10.244.1.0/24", "fd00:10:244:1::/64")
	}
	v4 := direct("10.244.1.0/24", "192.168.1.2")
	cfgNone := Config{Self: "a", Encap: None, ClusterCIDRs: cluster, ServiceCIDRs: []netip.Prefix{pfx("fd00:96::/108")}, Underlay: underlay}
	local := Local{Addrs: []netip.Addr{addr("192.168.1.1"), addr("fd00:1::1"), addr("fd00:1::7")}}
	for _, tc := range []struct {
		name  string
		cfg   Config
		b     Node
		other []Node
		on    OnLink
		want  []Route
		skip  string // a skip reason of b's IPv6 PodCIDR
	}{
		{"none: v6 via the v6 address", cfgNone, b("fd00:1::2"), nil, never,
			[]Route{v4, direct("fd00:10:244:1::/64", "fd00:1::2")}, ""},
		{"none: no v6 address", cfgNone, b(""), nil, never, []Route{v4}, "no InternalIP of that family"},
		{"none: v6 address link-local", cfgNone, b("fe80::2"), nil, never, []Route{v4}, "link-local"},
		{"none: v6 address reserved (v4-compatible)", cfgNone, b("::a00:2"), nil, never, []Route{v4}, "reserved range"},
		{"none: v6 address inside the cluster CIDR", cfgNone, b("fd00:10:244:9::2"), nil, never, []Route{v4}, "inside fd00:10:244::/56"},
		{"none: v6 address in a service CIDR", cfgNone, b("fd00:96::5"), nil, never, []Route{v4}, "inside fd00:96::/108"},
		{"none: v6 address is this node's", cfgNone, b("fd00:1::7"), nil, never, []Route{v4}, "this node's own address"},
		{"none: v6 address is an older Node's", cfgNone, b("fd00:1::3"),
			[]Node{dualNode("c", "192.168.1.3", "fd00:1::3", -1, "10.244.3.0/24", "fd00:10:244:3::/64")}, never,
			[]Route{v4, direct("10.244.3.0/24", "192.168.1.3"), direct("fd00:10:244:3::/64", "fd00:1::3")}, "also Node c's"},
		{"none: v6 address is a younger Node's too: the older keeps it", cfgNone, b("fd00:1::3"),
			[]Node{dualNode("c", "192.168.1.3", "fd00:1::3", 5, "10.244.3.0/24", "fd00:10:244:3::/64")}, never,
			[]Route{v4, direct("fd00:10:244:1::/64", "fd00:1::3"), direct("10.244.3.0/24", "192.168.1.3")}, ""},
		{"none: v6 address is this node's other-family one", cfgNone, b("fd00:1::1"), nil, never, []Route{v4}, "also Node a's"},
		{"vxlan: v6 over the v4 underlay", func() Config { c := cfgNone; c.Encap = VXLAN; return c }(), b("fd00:1::2"), nil, never,
			[]Route{vx("10.244.1.0/24"), vx("fd00:10:244:1::/64")}, ""},
		{"vxlan cross-subnet, v6 on link: direct", func() Config { c := cfgNone; c.Encap, c.CrossSubnet = VXLAN, true; return c }(), b("fd00:1::2"), nil,
			func(ip netip.Addr) bool { return ip.Is6() },
			[]Route{vx("10.244.1.0/24"), direct("fd00:10:244:1::/64", "fd00:1::2")}, ""},
		{"vxlan cross-subnet, bad v6 address: encapsulated", func() Config { c := cfgNone; c.Encap, c.CrossSubnet = VXLAN, true; return c }(), b("fd00:1::1"), nil,
			func(netip.Addr) bool { return true },
			[]Route{v4, vx("fd00:10:244:1::/64")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := append([]Node{self, tc.b}, tc.other...)
			_, st := NewPlan(tc.cfg, local, nodes, tc.on)
			if len(st.Refused) != 0 || st.SelfProblem != "" {
				t.Fatalf("refused %v, self problem %q: a bad other-family address refuses nobody", st.Refused, st.SelfProblem)
			}
			var got []Route
			for _, r := range st.Routes {
				if r.Kind != Blackhole {
					got = append(got, r)
				}
			}
			want := slices.Clone(tc.want)
			sortByDst(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("routes\n  %v\nwant\n  %v", got, want)
			}
			var skips []string
			for _, s := range st.Skipped {
				if s.Node == "b" {
					skips = append(skips, s.Reason)
				}
			}
			switch {
			case tc.skip == "" && len(skips) > 0:
				t.Errorf("b skipped: %v", skips)
			case tc.skip != "" && (len(skips) != 1 || !strings.Contains(skips[0], "fd00:10:244:1::/64") || !strings.Contains(skips[0], tc.skip)):
				t.Errorf("b skipped %q, want its IPv6 PodCIDR skipped for %q", skips, tc.skip)
			}
		})
	}
}

// Hostile IPv6 PodCIDRs are refused like IPv4 ones: the default route and
// its halves, link-local, multicast, loopback, v4-mapped and -compatible
// ranges, host bits, one that covers this node's own IPv6 address.
func TestValidateIPv6Hostile(t *testing.T) {
	cfg := Config{Self: "a", Encap: VXLAN, ClusterCIDRs: []netip.Prefix{pfx("fd00::/8"), pfx("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{pfx("fd00:96::/108")}}
	// this node's underlay is IPv4; its eth0 has an IPv6 address too
	// (inside the broad cluster CIDR: a PodCIDR can cover it)
	local := Local{Addrs: []netip.Addr{addr("192.168.1.1"), addr("fd00:172:30::1"), addr("fe80::1")}, Connected: []netip.Prefix{pfx("fd00:172:30::/64")}}
	self := vnode("a", "192.168.1.1", 0, "fd00:10:244::/64")
	for _, tc := range []struct {
		name     string
		podCIDRs []string
		want     Reason
	}{
		{"valid", []string{"fd00:10:244:5::/64"}, ""},
		{"::/0", []string{"::/0"}, ReservedRange},
		{"::/1", []string{"::/1"}, ReservedRange},
		{"8000::/1", []string{"8000::/1"}, ReservedRange}, // holds ff00::/8
		{"fe80::/64", []string{"fe80::/64"}, ReservedRange},
		{"ff02::/16", []string{"ff02::/16"}, ReservedRange},
		{"::1/128", []string{"::1/128"}, ReservedRange},
		{"v4-compatible ::/96", []string{"::/96"}, ReservedRange},
		{"v4-mapped ::ffff:0:0/96", []string{"::ffff:0:0/96"}, InvalidPodCIDR},
		{"v4-mapped PodCIDR", []string{"::ffff:10.244.1.0/120"}, InvalidPodCIDR},
		{"host bits", []string{"fd00:10:244:5::1/64"}, InvalidPodCIDR},
		{"covers this node's IPv6 address", []string{"fd00:172:30::/112"}, OverlapsNodeNetwork},
		{"around this node's IPv6 subnet", []string{"fd00:172::/32"}, OverlapsNodeNetwork},
		{"this node's IPv6 PodCIDR", []string{"fd00:10:244::/64"}, OverlapsOwnPodCIDR},
		{"a service CIDR", []string{"fd00:96::/112"}, OverlapsServiceCIDR},
		{"outside the cluster", []string{"2001:db8::/64"}, OutsideClusterCIDR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := []Address{{Internal: true, Address: "192.168.1.9"}}
			x := ParseNode("x", "uid-x", t0.Add(5), "", tc.podCIDRs, addrs, nil)
			x.Created = t0.AddDate(0, 0, 1)
			v := Validate(cfg, local, []Node{self, x})
			if v.Self == nil {
				t.Fatalf("this node not usable: %s", v.SelfProblem)
			}
			r, refused := v.Refused["x"]
			if tc.want == "" {
				if refused {
					t.Fatalf("refused %+v", r)
				}
				return
			}
			if !refused || r.Reason != tc.want {
				t.Fatalf("x %v: %+v, want refused for %s", tc.podCIDRs, r, tc.want)
			}
		})
	}
}

// --encap=ipip with an IPv4-only cluster CIDR: this node's own IPv6
// PodCIDR is outside it, so this node is not usable and says why.
func TestIPIPOwnIPv6PodCIDR(t *testing.T) {
	cfg := Config{Self: "a", Encap: IPIP, ClusterCIDRs: []netip.Prefix{pfx("10.244.0.0/16")}}
	v := Validate(cfg, Local{}, []Node{vnode("a", "192.168.1.1", 0, "10.244.0.0/24", "fd00:10:244::/64")})
	if v.Self != nil || !strings.Contains(v.SelfProblem, "fd00:10:244::/64 is not inside the cluster CIDR") {
		t.Fatalf("self %v, problem %q: want this node unusable, its IPv6 PodCIDR outside the cluster CIDR", v.Self, v.SelfProblem)
	}
}

// A Node with PodCIDRs of one family in a dual-stack cluster is noted
// (its pods get no address of the other family); a dual-stack Node, a
// Node without PodCIDRs yet and a single-family cluster are not.
func TestMissingFamily(t *testing.T) {
	dual := []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:10:244::/56")}
	for _, tc := range []struct {
		cluster []netip.Prefix
		n       Node
		want    string
	}{
		{dual, vnode("n2", "192.168.1.2", 0, "10.244.2.0/24"), "Node n2 has no IPv6 PodCIDR but the cluster CIDRs are 10.244.0.0/16, fd00:10:244::/56: its pods get no IPv6 address; is kube-controller-manager running with both --cluster-cidr families?"},
		{dual, vnode("n3", "fd00::3", 0, "fd00:10:244:3::/64"), "Node n3 has no IPv4 PodCIDR"},
		{dual, vnode("n1", "192.168.1.1", 0, "10.244.1.0/24", "fd00:10:244:1::/64"), ""},
		{dual, vnode("n0", "192.168.1.9", 0), ""},
		{dual[:1], vnode("n2", "192.168.1.2", 0, "10.244.2.0/24"), ""},
	} {
		got := MissingFamily(tc.cluster, tc.n)
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s %v in %v: %q, want %q", tc.n.Name, tc.n.PodCIDRs, tc.cluster, got, tc.want)
		}
	}
}
