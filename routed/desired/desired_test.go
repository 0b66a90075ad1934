package desired

import (
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

const underlay = "eth0"

// The cluster used by most tests: this node "a", "b" on the same L2 subnet
// (192.168.1.0/24) and "c" behind a router (10.0.0.0/24).
func cluster() []Node {
	return []Node{
		{Name: "c", PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}, IP: addr("10.0.0.3")},
		{Name: "a", PodCIDRs: []netip.Prefix{pfx("10.244.0.0/24")}, IP: addr("192.168.1.1")},
		{Name: "b", PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24")}, IP: addr("192.168.1.2")},
	}
}

// sameL2 is the OnLink of a node on 192.168.1.0/24 and fd00:1::/64.
func sameL2(ip netip.Addr) bool {
	return pfx("192.168.1.0/24").Contains(ip) || pfx("fd00:1::/64").Contains(ip)
}

func never(netip.Addr) bool { return false }

func self(name string, ip string, cidrs ...string) *Node {
	n := &Node{Name: name}
	if ip != "" {
		n.IP = addr(ip)
	}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, pfx(c))
	}
	return n
}

func via(dst, gw, dev string, onlink bool) Route {
	return Route{Dst: pfx(dst), Gw: addr(gw), Dev: dev, OnLink: onlink}
}

func blackhole(dst string) Route { return Route{Dst: pfx(dst), Kind: Blackhole} }

func ipip(dst, node string) Route { return via(dst, node, TunnelDevice, true) }

func direct(dst, node string) Route { return via(dst, node, underlay, false) }

// vx is the route to a remote PodCIDR through the VXLAN device: next hop
// is the PodCIDR's network address (the remote VTEP).
func vx(dst string) Route {
	p := pfx(dst)
	return Route{Dst: p, Gw: p.Addr(), Dev: VXLANDevice, OnLink: true}
}

func neigh(ip, nodeIP string) Neighbor { return Neighbor{IP: addr(ip), MAC: VTEPMAC(addr(nodeIP))} }

func fdb(nodeIP string) FDB { return FDB{MAC: VTEPMAC(addr(nodeIP)), Dst: addr(nodeIP)} }

func prefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, pfx(p))
	}
	return out
}

// equalState compares two states, nil and empty slices alike. Routes are
// compared in order: Compute sorts them by the text of Dst, so
// "fd00:10:244:1::/64" comes before "fd00:10:244::/64" and
// "10.244.10.0/24" before "10.244.2.0/24".
func equalState(t *testing.T, got, want State) {
	t.Helper()
	check := func(what string, g, w any) {
		t.Helper()
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n got  %s\n want %s", what, show(g), show(w))
		}
	}
	check("Routes", nonNil(got.Routes), nonNil(want.Routes))
	check("Neighbors", nonNil(got.Neighbors), nonNil(want.Neighbors))
	check("FDBs", nonNil(got.FDBs), nonNil(want.FDBs))
	check("VTEPs", nonNil(got.VTEPs), nonNil(want.VTEPs))
	check("Skipped", nonNil(got.Skipped), nonNil(want.Skipped))
	switch {
	case got.Self == nil && want.Self == nil:
	case got.Self == nil || want.Self == nil:
		t.Errorf("Self: got %v, want %v", got.Self, want.Self)
	default:
		check("Self", *got.Self, *want.Self)
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func show(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return fmt.Sprintf("%+v", v)
	}
	parts := make([]string, rv.Len())
	for i := range parts {
		parts[i] = fmt.Sprintf("%v", rv.Index(i).Interface())
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func TestComputeEncap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		nodes []Node
		want  State
	}{
		{
			name:  "ipip",
			cfg:   Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay},
			nodes: cluster(),
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					ipip("10.244.1.0/24", "192.168.1.2"),
					ipip("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
		{
			name:  "vxlan",
			cfg:   Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay},
			nodes: cluster(),
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					vx("10.244.1.0/24"),
					vx("10.244.2.0/24"),
				},
				// Neighbors and FDBs follow the node names.
				Neighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.2"), neigh("10.244.2.0", "10.0.0.3")},
				FDBs:      []FDB{fdb("192.168.1.2"), fdb("10.0.0.3")},
				Self:      self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs:     prefixes("10.244.0.0/32"),
			},
		},
		{
			name:  "none",
			cfg:   Config{ClusterCIDRs: testCluster, Self: "a", Encap: None, Underlay: underlay},
			nodes: cluster(),
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					direct("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
		{
			name: "ipip IPv6",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay},
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("fd00:10:244::/64"), IP: addr("fd00:1::1")},
				{Name: "b", PodCIDRs: prefixes("fd00:10:244:1::/64"), IP: addr("fd00:1::2")},
			},
			// tunl0 is IPv4-in-IPv4: an IPv6 route through it would
			// drop every packet.
			want: State{
				Routes:  []Route{blackhole("fd00:10:244::/64")},
				Self:    self("a", "fd00:1::1", "fd00:10:244::/64"),
				VTEPs:   prefixes("fd00:10:244::/128"),
				Skipped: []Skip{{"b", "PodCIDR fd00:10:244:1::/64: IPIP carries IPv4 only (use vxlan or none)"}},
			},
		},
		{
			name: "vxlan IPv6",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay},
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("fd00:10:244::/64"), IP: addr("fd00:1::1")},
				{Name: "b", PodCIDRs: prefixes("fd00:10:244:1::/64"), IP: addr("fd00:1::2")},
			},
			want: State{
				Routes:    []Route{vx("fd00:10:244:1::/64"), blackhole("fd00:10:244::/64")},
				Neighbors: []Neighbor{neigh("fd00:10:244:1::", "fd00:1::2")},
				FDBs:      []FDB{fdb("fd00:1::2")},
				Self:      self("a", "fd00:1::1", "fd00:10:244::/64"),
				VTEPs:     prefixes("fd00:10:244::/128"),
			},
		},
		{
			name: "none IPv6",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: None, Underlay: underlay},
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("fd00:10:244::/64"), IP: addr("fd00:1::1")},
				{Name: "b", PodCIDRs: prefixes("fd00:10:244:1::/64"), IP: addr("fd00:1::2")},
			},
			want: State{
				Routes: []Route{direct("fd00:10:244:1::/64", "fd00:1::2"), blackhole("fd00:10:244::/64")},
				Self:   self("a", "fd00:1::1", "fd00:10:244::/64"),
				VTEPs:  prefixes("fd00:10:244::/128"),
			},
		},
		{
			name:  "self unknown: remote routes only",
			cfg:   Config{ClusterCIDRs: testCluster, Self: "z", Encap: IPIP, Underlay: underlay},
			nodes: cluster(),
			want: State{
				Routes: []Route{
					ipip("10.244.0.0/24", "192.168.1.1"),
					ipip("10.244.1.0/24", "192.168.1.2"),
					ipip("10.244.2.0/24", "10.0.0.3"),
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			equalState(t, Compute(tc.cfg, tc.nodes, never), tc.want)
		})
	}
}

// Route invariants per mode, on every route of a larger cluster.
func TestComputeRouteShape(t *testing.T) {
	var nodes []Node
	for i := 1; i <= 20; i++ {
		nodes = append(nodes, Node{
			Name:     fmt.Sprintf("n%02d", i),
			PodCIDRs: prefixes(fmt.Sprintf("10.244.%d.0/24", i)),
			IP:       addr(fmt.Sprintf("192.168.%d.%d", i%3, i)),
		})
	}
	for _, e := range []Encap{IPIP, VXLAN, None} {
		t.Run(string(e), func(t *testing.T) {
			st := Compute(Config{ClusterCIDRs: testCluster, Self: "n01", Encap: e, Underlay: underlay}, nodes, never)
			if len(st.Routes) != len(nodes) {
				t.Fatalf("%d routes for %d nodes", len(st.Routes), len(nodes))
			}
			byCIDR := map[netip.Prefix]Node{}
			for _, n := range nodes {
				byCIDR[n.PodCIDRs[0]] = n
			}
			for _, r := range st.Routes {
				n := byCIDR[r.Dst]
				if n.Name == "n01" {
					if r != blackhole(r.Dst.String()) {
						t.Errorf("own PodCIDR: %v, want blackhole", r)
					}
					continue
				}
				var want Route
				switch e {
				case IPIP:
					want = Route{Dst: r.Dst, Gw: n.IP, Dev: TunnelDevice, OnLink: true}
				case VXLAN:
					want = Route{Dst: r.Dst, Gw: r.Dst.Addr(), Dev: VXLANDevice, OnLink: true}
				case None:
					want = Route{Dst: r.Dst, Gw: n.IP, Dev: underlay}
				}
				if r != want {
					t.Errorf("route %v, want %v", r, want)
				}
			}
			if e != VXLAN && (len(st.Neighbors) != 0 || len(st.FDBs) != 0) {
				t.Errorf("%s: neighbors %v, FDBs %v: want none", e, st.Neighbors, st.FDBs)
			}
			if e == VXLAN && (len(st.Neighbors) != len(nodes)-1 || len(st.FDBs) != len(nodes)-1) {
				t.Errorf("vxlan: %d neighbors, %d FDBs: want %d each", len(st.Neighbors), len(st.FDBs), len(nodes)-1)
			}
		})
	}
}

func TestComputeCrossSubnet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		onLink OnLink
		want   State
	}{
		{
			name:   "ipip: same subnet direct, other subnet tunneled",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					ipip("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "vxlan: same subnet direct without peer entries, other subnet encapsulated",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, CrossSubnet: true, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					vx("10.244.2.0/24"),
				},
				Neighbors: []Neighbor{neigh("10.244.2.0", "10.0.0.3")},
				FDBs:      []FDB{fdb("10.0.0.3")},
				Self:      self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs:     prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "ipip: everything on link",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true, Underlay: underlay},
			onLink: func(netip.Addr) bool { return true },
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					direct("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "vxlan: nothing on link",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, CrossSubnet: true, Underlay: underlay},
			onLink: never,
			want: State{
				Routes:    []Route{blackhole("10.244.0.0/24"), vx("10.244.1.0/24"), vx("10.244.2.0/24")},
				Neighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.2"), neigh("10.244.2.0", "10.0.0.3")},
				FDBs:      []FDB{fdb("192.168.1.2"), fdb("10.0.0.3")},
				Self:      self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs:     prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "ipip: onLink ignored without cross-subnet",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					ipip("10.244.1.0/24", "192.168.1.2"),
					ipip("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "vxlan: onLink ignored without cross-subnet",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes:    []Route{blackhole("10.244.0.0/24"), vx("10.244.1.0/24"), vx("10.244.2.0/24")},
				Neighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.2"), neigh("10.244.2.0", "10.0.0.3")},
				FDBs:      []FDB{fdb("192.168.1.2"), fdb("10.0.0.3")},
				Self:      self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs:     prefixes("10.244.0.0/32"),
			},
		},
		{
			name:   "ipip: nil onLink means encapsulate",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true, Underlay: underlay},
			onLink: nil,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					ipip("10.244.1.0/24", "192.168.1.2"),
					ipip("10.244.2.0/24", "10.0.0.3"),
				},
				Self:  self("a", "192.168.1.1", "10.244.0.0/24"),
				VTEPs: prefixes("10.244.0.0/32"),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			equalState(t, Compute(tc.cfg, cluster(), tc.onLink), tc.want)
		})
	}
}

// onLink is asked about remote node addresses only, and only when it can
// change anything.
func TestComputeOnLinkCalls(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want []netip.Addr
	}{
		{Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true}, []netip.Addr{addr("192.168.1.2"), addr("10.0.0.3")}},
		{Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, CrossSubnet: true}, []netip.Addr{addr("192.168.1.2"), addr("10.0.0.3")}},
		{Config{ClusterCIDRs: testCluster, Self: "a", Encap: None, CrossSubnet: true}, nil},
		{Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP}, nil},
		{Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN}, nil},
	} {
		t.Run(fmt.Sprintf("%s cross=%v", tc.cfg.Encap, tc.cfg.CrossSubnet), func(t *testing.T) {
			var asked []netip.Addr
			Compute(tc.cfg, cluster(), func(ip netip.Addr) bool {
				asked = append(asked, ip)
				return true
			})
			slices.SortFunc(asked, netip.Addr.Compare)
			slices.SortFunc(tc.want, netip.Addr.Compare)
			if !slices.Equal(asked, tc.want) {
				t.Errorf("onLink asked about %v, want %v", asked, tc.want)
			}
		})
	}
}

func TestComputeDualStack(t *testing.T) {
	dual := func() []Node {
		return []Node{
			{Name: "a", PodCIDRs: prefixes("10.244.0.0/24", "fd00:10:244::/64"), IP: addr("192.168.1.1")},
			{Name: "b", PodCIDRs: prefixes("10.244.1.0/24", "fd00:10:244:1::/64"), IP: addr("192.168.1.2")},
			{Name: "c", PodCIDRs: prefixes("fd00:10:244:2::/64", "10.244.2.0/24"), IP: addr("fd00:2::3")},
		}
	}
	selfA := self("a", "192.168.1.1", "10.244.0.0/24", "fd00:10:244::/64")
	vteps := prefixes("10.244.0.0/32", "fd00:10:244::/128")
	skipB6 := Skip{"b", "PodCIDR fd00:10:244:1::/64 has no node address of its family: the Node has no InternalIP of that family"}
	// c's only address is IPv6 while this node's underlay is IPv4: no
	// tunnel or route can reach it, it is refused
	for _, tc := range []struct {
		name   string
		cfg    Config
		onLink OnLink
		want   State
	}{
		{
			name: "ipip skips the other family, and IPv6",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay},
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					ipip("10.244.1.0/24", "192.168.1.2"),
					blackhole("fd00:10:244::/64"),
				},
				Self: selfA, VTEPs: vteps,
				Skipped: []Skip{skipB6},
			},
		},
		{
			name: "none skips the other family",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: None, Underlay: underlay},
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					blackhole("fd00:10:244::/64"),
				},
				Self: selfA, VTEPs: vteps,
				Skipped: []Skip{skipB6},
			},
		},
		{
			name: "vxlan routes both families, one FDB per node",
			cfg:  Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, Underlay: underlay},
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					vx("10.244.1.0/24"),
					vx("fd00:10:244:1::/64"),
					blackhole("fd00:10:244::/64"),
				},
				Neighbors: []Neighbor{
					neigh("10.244.1.0", "192.168.1.2"),
					neigh("fd00:10:244:1::", "192.168.1.2"),
				},
				FDBs: []FDB{fdb("192.168.1.2")},
				Self: selfA, VTEPs: vteps,
			},
		},
		{
			// A node on the same L2 subnet is reached directly in the
			// family of its address; the other family still needs the
			// VXLAN device (which carries either family).
			name:   "vxlan cross-subnet on link: other family still encapsulated",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN, CrossSubnet: true, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					vx("fd00:10:244:1::/64"),
					blackhole("fd00:10:244::/64"),
				},
				Neighbors: []Neighbor{
					neigh("fd00:10:244:1::", "192.168.1.2"),
				},
				FDBs: []FDB{fdb("192.168.1.2")},
				Self: selfA, VTEPs: vteps,
			},
		},
		{
			name:   "ipip cross-subnet on link: other family still skipped",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true, Underlay: underlay},
			onLink: sameL2,
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					blackhole("fd00:10:244::/64"),
				},
				Self: selfA, VTEPs: vteps,
				Skipped: []Skip{skipB6},
			},
		},
		{
			name:   "ipip cross-subnet all on link: direct in each node's family, IPv6 included",
			cfg:    Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, CrossSubnet: true, Underlay: underlay},
			onLink: func(netip.Addr) bool { return true },
			want: State{
				Routes: []Route{
					blackhole("10.244.0.0/24"),
					direct("10.244.1.0/24", "192.168.1.2"),
					blackhole("fd00:10:244::/64"),
				},
				Self: selfA, VTEPs: vteps,
				Skipped: []Skip{skipB6},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := Compute(tc.cfg, dual(), tc.onLink)
			equalState(t, st, tc.want)
			if r := st.Refused["c"]; r.Reason != InvalidNodeIP {
				t.Errorf("c: refused %+v, want %s", r, InvalidNodeIP)
			}
		})
	}
}

func TestComputeSkipped(t *testing.T) {
	nodes := func() []Node {
		return []Node{
			{Name: "a", PodCIDRs: prefixes("10.244.0.0/24"), IP: addr("192.168.1.1")},
			{Name: "nocidr", IP: addr("192.168.1.5")},
			{Name: "noip", PodCIDRs: prefixes("10.244.6.0/24")},
			{Name: "neither"},
			{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")},
		}
	}
	for _, e := range []Encap{IPIP, VXLAN, None} {
		t.Run(string(e), func(t *testing.T) {
			st := Compute(Config{ClusterCIDRs: testCluster, Self: "a", Encap: e, Underlay: underlay}, nodes(), never)
			reasons := map[string]string{}
			for _, s := range st.Skipped {
				if s.Reason == "" {
					t.Errorf("node %s skipped without a reason", s.Node)
				}
				reasons[s.Node] = s.Reason
			}
			wantSkipped := map[string]string{"nocidr": "podCIDRs", "noip": "InternalIP", "neither": "podCIDRs"}
			if len(reasons) != len(wantSkipped) || len(st.Skipped) != len(wantSkipped) {
				t.Errorf("skipped %v, want exactly %v", st.Skipped, wantSkipped)
			}
			for n, word := range wantSkipped {
				if !strings.Contains(reasons[n], word) {
					t.Errorf("node %s: reason %q, want one mentioning %s", n, reasons[n], word)
				}
			}
			var dsts []string
			for _, r := range st.Routes {
				dsts = append(dsts, r.Dst.String())
			}
			if want := []string{"10.244.0.0/24", "10.244.1.0/24"}; !slices.Equal(dsts, want) {
				t.Errorf("routes to %v, want %v", dsts, want)
			}
			for _, nb := range st.Neighbors {
				if nb.IP == addr("10.244.6.0") {
					t.Errorf("neighbor for skipped node: %v", nb)
				}
			}
			if e == VXLAN && len(st.FDBs) != 1 {
				t.Errorf("FDBs %v, want only b's", st.FDBs)
			}
		})
	}
}

func TestComputeSelf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		want  State
	}{
		{
			name: "without IP still gets its blackhole",
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("10.244.0.0/24", "fd00:10:244::/64")},
				{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")},
			},
			want: State{
				Routes: []Route{blackhole("10.244.0.0/24"), ipip("10.244.1.0/24", "192.168.1.2"), blackhole("fd00:10:244::/64")},
				Self:   self("a", "", "10.244.0.0/24", "fd00:10:244::/64"),
				VTEPs:  prefixes("10.244.0.0/32", "fd00:10:244::/128"),
			},
		},
		{
			name: "without PodCIDR is skipped and not Self",
			nodes: []Node{
				{Name: "a", IP: addr("192.168.1.1")},
				{Name: "b", PodCIDRs: prefixes("10.244.1.0/24"), IP: addr("192.168.1.2")},
			},
			want: State{
				// not Self: State.SelfProblem says why (TestValidate)
				Routes: []Route{ipip("10.244.1.0/24", "192.168.1.2")},
			},
		},
		{
			name: "unmasked PodCIDR: blackhole and VTEP use the network",
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("10.244.0.77/24"), IP: addr("192.168.1.1")},
			},
			want: State{
				Routes: []Route{blackhole("10.244.0.0/24")},
				Self:   &Node{Name: "a", PodCIDRs: prefixes("10.244.0.77/24"), IP: addr("192.168.1.1")},
				VTEPs:  prefixes("10.244.0.0/32"),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			equalState(t, Compute(Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP, Underlay: underlay}, tc.nodes, never), tc.want)
		})
	}
}

func TestComputeMasksRemotePodCIDR(t *testing.T) {
	nodes := []Node{{Name: "b", PodCIDRs: prefixes("10.244.1.9/24"), IP: addr("192.168.1.2")}}
	st := Compute(Config{ClusterCIDRs: testCluster, Self: "a", Encap: VXLAN}, nodes, never)
	equalState(t, st, State{
		Routes:    []Route{vx("10.244.1.0/24")},
		Neighbors: []Neighbor{neigh("10.244.1.0", "192.168.1.2")},
		FDBs:      []FDB{fdb("192.168.1.2")},
	})
}

func deepCopy(nodes []Node) []Node {
	out := slices.Clone(nodes)
	for i := range out {
		out[i].PodCIDRs = slices.Clone(out[i].PodCIDRs)
	}
	return out
}

// The result does not depend on the order of the nodes, and the input is
// left alone.
func TestComputeDeterministic(t *testing.T) {
	base := []Node{
		{Name: "a", PodCIDRs: prefixes("10.244.0.0/24", "fd00:10:244::/64"), IP: addr("192.168.1.1")},
		{Name: "b", PodCIDRs: prefixes("10.244.1.0/24", "fd00:10:244:1::/64"), IP: addr("192.168.1.2")},
		{Name: "c", PodCIDRs: prefixes("10.244.10.0/24"), IP: addr("10.0.0.3")},
		{Name: "d", PodCIDRs: prefixes("10.244.2.0/24"), IP: addr("10.0.0.4")},
		{Name: "e", PodCIDRs: prefixes("10.244.3.0/24")},
		{Name: "f", IP: addr("10.0.0.6")},
		{Name: "g", PodCIDRs: prefixes("10.244.100.0/24"), IP: addr("192.168.1.7")},
	}
	for _, e := range []Encap{IPIP, VXLAN, None} {
		for _, cross := range []bool{false, true} {
			cfg := Config{ClusterCIDRs: testCluster, Self: "a", Encap: e, CrossSubnet: cross, Underlay: underlay}
			t.Run(fmt.Sprintf("%s cross=%v", e, cross), func(t *testing.T) {
				ref := Compute(cfg, deepCopy(base), sameL2)
				if !slices.IsSortedFunc(ref.Routes, func(x, y Route) int { return strings.Compare(x.Dst.String(), y.Dst.String()) }) {
					t.Errorf("routes not sorted: %v", ref.Routes)
				}
				for i := 1; i < len(ref.Routes); i++ {
					if ref.Routes[i-1].Dst == ref.Routes[i].Dst {
						t.Errorf("duplicate route to %s", ref.Routes[i].Dst)
					}
				}
				perms := [][]int{{6, 5, 4, 3, 2, 1, 0}, {3, 0, 6, 1, 5, 2, 4}, {1, 2, 3, 4, 5, 6, 0}}
				for _, perm := range perms {
					in := make([]Node, len(base))
					for i, j := range perm {
						in[i] = base[j]
					}
					in = deepCopy(in)
					before := deepCopy(in)
					got := Compute(cfg, in, sameL2)
					if !reflect.DeepEqual(in, before) {
						t.Errorf("Compute modified its input:\n got  %v\n want %v", in, before)
					}
					if !reflect.DeepEqual(got, ref) {
						t.Errorf("order %v:\n got  %+v\n want %+v", perm, got, ref)
					}
				}
			})
		}
	}
}

// The returned Self does not alias the caller's node.
func TestComputeSelfIsACopy(t *testing.T) {
	nodes := []Node{{Name: "a", PodCIDRs: prefixes("10.244.0.0/24"), IP: addr("192.168.1.1")}}
	st := Compute(Config{ClusterCIDRs: testCluster, Self: "a", Encap: IPIP}, nodes, never)
	if st.Self == nil {
		t.Fatal("no Self")
	}
	st.Self.Name = "changed"
	if nodes[0].Name != "a" {
		t.Errorf("Self aliases the input node")
	}
}

func TestComputeFDBDedup(t *testing.T) {
	nodes := []Node{
		{Name: "b", PodCIDRs: prefixes("10.244.1.0/24", "fd00:10:244:1::/64", "10.245.1.0/24"), IP: addr("192.168.1.2")},
		{Name: "c", PodCIDRs: prefixes("10.244.2.0/24", "fd00:10:244:2::/64"), IP: addr("192.168.1.3")},
	}
	st := Compute(Config{ClusterCIDRs: append(testCluster, pfx("10.245.0.0/16")), Self: "a", Encap: VXLAN}, nodes, never)
	if want := []FDB{fdb("192.168.1.2"), fdb("192.168.1.3")}; !reflect.DeepEqual(st.FDBs, want) {
		t.Errorf("FDBs %v, want %v", st.FDBs, want)
	}
	if len(st.Neighbors) != 5 || len(st.Routes) != 5 {
		t.Errorf("%d neighbors, %d routes: want 5 each", len(st.Neighbors), len(st.Routes))
	}
}

func TestDiff(t *testing.T) {
	r1 := ipip("10.244.1.0/24", "192.168.1.2")
	r2 := ipip("10.244.2.0/24", "10.0.0.3")
	bh := blackhole("10.244.0.0/24")
	r6 := vx("fd00:10:244:1::/64")
	for _, tc := range []struct {
		name         string
		want, actual []Route
		upsert       []Route
		remove       []Route
	}{
		{name: "both empty"},
		{name: "equal", want: []Route{bh, r1, r2, r6}, actual: []Route{r6, r2, bh, r1}},
		{name: "all missing", want: []Route{bh, r1}, upsert: []Route{bh, r1}},
		{name: "one missing", want: []Route{bh, r1, r2}, actual: []Route{bh, r2}, upsert: []Route{r1}},
		{name: "all extra", actual: []Route{r1, r6}, remove: []Route{r1, r6}},
		{name: "one extra", want: []Route{bh, r1}, actual: []Route{r2, bh, r1}, remove: []Route{r2}},
		{
			name:   "gateway changed",
			want:   []Route{r1},
			actual: []Route{ipip("10.244.1.0/24", "192.168.1.99")},
			upsert: []Route{r1},
		},
		{
			name:   "device changed",
			want:   []Route{r1},
			actual: []Route{via("10.244.1.0/24", "192.168.1.2", "eth9", true)},
			upsert: []Route{r1},
		},
		{
			name:   "onlink changed",
			want:   []Route{r1},
			actual: []Route{via("10.244.1.0/24", "192.168.1.2", TunnelDevice, false)},
			upsert: []Route{r1},
		},
		{
			name:   "ipip to direct",
			want:   []Route{direct("10.244.1.0/24", "192.168.1.2")},
			actual: []Route{r1},
			upsert: []Route{direct("10.244.1.0/24", "192.168.1.2")},
		},
		{
			name:   "blackhole wanted, via present",
			want:   []Route{blackhole("10.244.1.0/24")},
			actual: []Route{r1},
			upsert: []Route{blackhole("10.244.1.0/24")},
		},
		{
			name:   "via wanted, blackhole present",
			want:   []Route{r1},
			actual: []Route{blackhole("10.244.1.0/24")},
			upsert: []Route{r1},
		},
		{
			name:   "mixed",
			want:   []Route{bh, r1, r6},
			actual: []Route{bh, ipip("10.244.1.0/24", "192.168.1.3"), r2},
			upsert: []Route{r1, r6},
			remove: []Route{r2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, rm := Diff(tc.want, tc.actual)
			if !reflect.DeepEqual(nonNil(up), nonNil(tc.upsert)) {
				t.Errorf("upsert %v, want %v", up, tc.upsert)
			}
			if !reflect.DeepEqual(nonNil(rm), nonNil(tc.remove)) {
				t.Errorf("remove %v, want %v", rm, tc.remove)
			}
			// Applying the diff converges.
			after := map[netip.Prefix]Route{}
			for _, r := range tc.actual {
				after[r.Dst] = r
			}
			for _, r := range rm {
				delete(after, r.Dst)
			}
			for _, r := range up {
				after[r.Dst] = r
			}
			var got []Route
			for _, r := range after {
				got = append(got, r)
			}
			if up, rm := Diff(tc.want, got); len(up)+len(rm) != 0 {
				t.Errorf("after applying: still upsert %v, remove %v", up, rm)
			}
		})
	}
}

func TestParseEncap(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Encap
		ok   bool
	}{
		{"ipip", IPIP, true},
		{"vxlan", VXLAN, true},
		{"none", None, true},
		{"", "", false},
		{"IPIP", "", false},
		{"VXLAN", "", false},
		{"gre", "", false},
		{"geneve", "", false},
		{" ipip", "", false},
		{"ipip ", "", false},
		{"direct", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEncap(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("ParseEncap(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)) {
				t.Errorf("error %q does not name the value", err)
			}
		})
	}
}

func TestOverhead(t *testing.T) {
	for e, want := range map[Encap]int{IPIP: 20, VXLAN: 50, None: 0, "bogus": 0} {
		if got := e.Overhead(); got != want {
			t.Errorf("%q.Overhead() = %d, want %d", e, got, want)
		}
		if got := e.OverheadOver(addr("192.168.1.1")); got != want {
			t.Errorf("%q.OverheadOver(IPv4) = %d, want %d", e, got, want)
		}
	}
	// an IPv6 outer header is 20 bytes longer
	if got := VXLAN.OverheadOver(addr("fd00::1")); got != 70 {
		t.Errorf("vxlan over IPv6: overhead %d, want 70", got)
	}
}

func TestVTEPMAC(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"10.0.0.1", "0e:70:0a:00:00:01"},
		{"192.168.1.2", "0e:70:c0:a8:01:02"},
		{"255.255.255.255", "0e:70:ff:ff:ff:ff"},
		{"::ffff:192.168.1.2", "0e:70:c0:a8:01:02"},
		// IPv6: 0a + 5 bytes of the SHA-256 of the whole address
		{"fd00::c0a8:102", "0a:e1:e0:56:26:04"},
		{"fd01::c0a8:102", ""}, // same low 32 bits: another MAC (checked below)
	} {
		got := VTEPMAC(addr(tc.ip))
		if tc.want != "" && got != tc.want {
			t.Errorf("VTEPMAC(%s) = %s, want %s", tc.ip, got, tc.want)
		}
		if again := VTEPMAC(addr(tc.ip)); again != got {
			t.Errorf("VTEPMAC(%s) not deterministic: %s then %s", tc.ip, got, again)
		}
		hw, err := net.ParseMAC(got)
		if err != nil || len(hw) != 6 {
			t.Fatalf("VTEPMAC(%s) = %q: not a MAC-48 (%v)", tc.ip, got, err)
		}
		if hw[0]&0x02 == 0 {
			t.Errorf("VTEPMAC(%s) = %s: not locally administered", tc.ip, got)
		}
		if hw[0]&0x01 != 0 {
			t.Errorf("VTEPMAC(%s) = %s: multicast", tc.ip, got)
		}
	}
	seen := map[string]string{}
	for i := range 1024 {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(i * 7)}).String()
		m := VTEPMAC(addr(ip))
		if prev, dup := seen[m]; dup {
			t.Fatalf("VTEPMAC(%s) = VTEPMAC(%s) = %s", ip, prev, m)
		}
		seen[m] = ip
	}
}

func TestRouteString(t *testing.T) {
	for _, tc := range []struct {
		r    Route
		want string
	}{
		{blackhole("10.244.0.0/24"), "blackhole 10.244.0.0/24"},
		{ipip("10.244.1.0/24", "192.168.1.2"), "10.244.1.0/24 via 192.168.1.2 dev tunl0 onlink"},
		{direct("10.244.1.0/24", "192.168.1.2"), "10.244.1.0/24 via 192.168.1.2 dev eth0"},
		{vx("fd00:10:244:1::/64"), "fd00:10:244:1::/64 via fd00:10:244:1:: dev podnet.vxlan onlink"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// testCluster is the cluster CIDR of the tests' Nodes.
var testCluster = []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:10:244::/48")}
