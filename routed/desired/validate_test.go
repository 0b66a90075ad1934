package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// vnode is a Node created at t0 plus age minutes.
func vnode(name, ip string, age int, cidrs ...string) Node {
	n := Node{Name: name, Created: t0.Add(time.Duration(age) * time.Minute), UID: "uid-" + name}
	if ip != "" {
		n.IP = addr(ip)
	}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, pfx(c))
	}
	return n
}

// The validation table: this node "a" (192.168.1.1 on 192.168.1.0/24,
// PodCIDR 10.244.0.0/24), a good Node "b", and one hostile or careless
// Node "x" per case. x must be refused for the reason given, b must stay
// valid, and a must stay usable.
func TestValidate(t *testing.T) {
	cfg := Config{
		Self: "a", Encap: VXLAN,
		ClusterCIDRs: []netip.Prefix{pfx("10.244.0.0/16"), pfx("172.30.0.0/16"), pfx("fd00:10:244::/48")},
		ServiceCIDRs: []netip.Prefix{pfx("10.96.0.0/12")},
		APIServers:   []netip.Addr{addr("172.30.9.9")},
	}
	local := Local{
		Addrs: []netip.Addr{addr("192.168.1.1"), addr("172.30.5.1"), addr("127.0.0.1"), addr("10.244.0.1")},
		Routes: []netip.Prefix{pfx("0.0.0.0/0"), pfx("192.168.1.0/24"), pfx("172.30.6.0/24"), pfx("10.244.0.0/24"),
			pfx("10.0.0.0/8"), pfx("10.244.7.9/32"), pfx("10.244.8.0/24"), pfx("203.0.113.0/24")},
		Connected: []netip.Prefix{pfx("192.168.1.0/24"), pfx("172.30.6.0/24")},
	}
	good := func() []Node {
		return []Node{vnode("a", "192.168.1.1", 0, "10.244.0.0/24"), vnode("b", "192.168.1.2", 1, "10.244.5.0/24")}
	}
	for _, tc := range []struct {
		name string
		x    Node
		want Reason // "": x is valid
	}{
		{"valid", vnode("x", "192.168.1.3", 5, "10.244.3.0/24"), ""},
		{"valid dual stack", vnode("x", "192.168.1.3", 5, "10.244.3.0/24", "fd00:10:244:3::/64"), ""},
		{"default route", vnode("x", "192.168.1.3", 5, "0.0.0.0/0"), ReservedRange},
		{"half the internet", vnode("x", "192.168.1.3", 5, "0.0.0.0/1"), ReservedRange},
		{"the other half", vnode("x", "192.168.1.3", 5, "128.0.0.0/1"), ReservedRange},
		{"IPv6 default", vnode("x", "192.168.1.3", 5, "::/0"), ReservedRange},
		{"loopback", vnode("x", "192.168.1.3", 5, "127.0.0.0/24"), ReservedRange},
		{"link-local", vnode("x", "192.168.1.3", 5, "169.254.1.0/24"), ReservedRange},
		{"multicast", vnode("x", "192.168.1.3", 5, "224.0.0.0/24"), ReservedRange},
		{"IPv6 link-local", vnode("x", "192.168.1.3", 5, "fe80::/64"), ReservedRange},
		{"swallows the cluster", vnode("x", "192.168.1.3", 5, "10.0.0.0/8"), OutsideClusterCIDR},
		{"outside the cluster", vnode("x", "192.168.1.3", 5, "10.245.0.0/24"), OutsideClusterCIDR},
		{"one of two PodCIDRs outside", vnode("x", "192.168.1.3", 5, "10.244.3.0/24", "fd00:99::/64"), OutsideClusterCIDR},
		{"service CIDR", Node{}, OverlapsServiceCIDR}, // filled below: needs a cluster CIDR over it
		{"holds the API server", vnode("x", "192.168.1.3", 5, "172.30.9.0/24"), OverlapsAPIServer},
		{"covers a node address", vnode("x", "192.168.1.3", 5, "172.30.5.0/24"), OverlapsNodeNetwork},
		{"inside a connected subnet", vnode("x", "192.168.1.3", 5, "172.30.6.128/25"), OverlapsNodeNetwork},
		{"around a connected subnet", vnode("x", "192.168.1.3", 5, "172.30.6.0/23"), OverlapsNodeNetwork},
		{"a route of another protocol on it", vnode("x", "192.168.1.3", 5, "10.244.8.0/24"), OverlapsNodeNetwork},
		{"a pod blackhole of an operator inside it", vnode("x", "192.168.1.3", 5, "10.244.7.0/24"), ""},
		{"inside a gateway route (10.0.0.0/8 via a VPN)", vnode("x", "192.168.1.3", 5, "10.244.3.0/24"), ""},
		{"covers the underlay and more", vnode("x", "192.168.1.3", 5, "172.30.0.0/16"), OverlapsAPIServer},
		{"inside this node's PodCIDR", vnode("x", "192.168.1.3", 5, "10.244.0.128/25"), OverlapsOwnPodCIDR},
		{"this node's PodCIDR", vnode("x", "192.168.1.3", 5, "10.244.0.0/24"), OverlapsOwnPodCIDR},
		{"b's PodCIDR, newer, name first", vnode("0-thief", "192.168.1.3", 5, "10.244.5.0/24"), PodCIDRConflict},
		{"over this node's and b's", vnode("x", "192.168.1.3", 5, "10.244.0.0/21"), OverlapsOwnPodCIDR},
		{"around b's PodCIDR", vnode("x", "192.168.1.3", 5, "10.244.4.0/23"), PodCIDRConflict},
		{"inside b's PodCIDR", vnode("x", "192.168.1.3", 5, "10.244.5.64/26"), PodCIDRConflict},
		{"host bits", Node{Name: "x", IP: addr("192.168.1.3"), Invalid: `spec.podCIDRs[0] "10.244.3.1/24" has host bits set`}, InvalidPodCIDR},
		{"no address of the underlay's family", vnode("x", "fd00:1::3", 5, "10.244.3.0/24"), InvalidNodeIP},
		{"address inside the cluster CIDR", vnode("x", "10.244.9.9", 5, "10.244.3.0/24"), InvalidNodeIP},
		{"address inside its own PodCIDR", vnode("x", "172.30.7.1", 5, "172.30.7.0/24"), InvalidNodeIP},
		{"address loopback", vnode("x", "127.0.0.2", 5, "10.244.3.0/24"), InvalidNodeIP},
		{"address multicast", vnode("x", "239.1.1.1", 5, "10.244.3.0/24"), InvalidNodeIP},
		{"address in a service CIDR", vnode("x", "10.96.0.10", 5, "10.244.3.0/24"), InvalidNodeIP},
		{"this node's address", vnode("x", "192.168.1.1", 5, "10.244.3.0/24"), OwnNodeIP},
		{"this node's other address", vnode("x", "172.30.5.1", 5, "10.244.3.0/24"), InvalidNodeIP}, // inside a cluster CIDR first
		{"b's address", vnode("x", "192.168.1.2", 5, "10.244.3.0/24"), NodeIPConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			x := tc.x
			if tc.want == OverlapsServiceCIDR {
				c.ClusterCIDRs = append(c.ClusterCIDRs, pfx("10.96.0.0/11"))
				x = vnode("x", "192.168.1.3", 5, "10.96.1.0/24")
			}
			nodes := append(good(), x)
			v := Validate(c, local, nodes)
			if v.Self == nil || v.SelfProblem != "" {
				t.Fatalf("this node not usable: %q", v.SelfProblem)
			}
			if r, refused := v.Refused["b"]; refused {
				t.Fatalf("b refused: %+v", r)
			}
			r, refused := v.Refused[x.Name]
			if tc.want == "" {
				if refused {
					t.Fatalf("x refused: %+v", r)
				}
				if len(v.Valid) != 3 {
					t.Fatalf("valid %d Nodes, want 3", len(v.Valid))
				}
				return
			}
			if !refused || r.Reason != tc.want {
				t.Fatalf("x: %+v, want refused for %s", r, tc.want)
			}
			if !strings.HasPrefix(r.Detail, "Node "+x.Name+": ") || len(r.Detail) < 30 {
				t.Errorf("detail %q does not say what is wrong", r.Detail)
			}
			plan, st := NewPlan(c, local, nodes, never)
			if got := plan.byNode[x.Name]; len(got.Routes) != 0 {
				t.Errorf("refused Node routed: %v", got.Routes)
			}
			if len(st.Routes) != 2 { // a's blackhole, b's route
				t.Errorf("routes %v, want a's blackhole and b's route", st.Routes)
			}
		})
	}
}

// Between two other Nodes, the older keeps a PodCIDR or an address both
// claim, whatever the order the Nodes come in and whatever their names;
// creation times equal to the second (the API's resolution) are decided
// by the name, never by the UID: the same verdict on every observer and
// in every input order.
func TestValidateConflictsOlderWins(t *testing.T) {
	cfg := Config{Self: "a", Encap: IPIP, ClusterCIDRs: testCluster}
	old := vnode("z-old", "192.168.1.5", 1, "10.244.5.0/24")
	young := vnode("a-young", "192.168.1.6", 2, "10.244.5.0/24")
	// same second; the UID (random) sorts the other way round from the
	// name: it must not matter
	same1 := vnode("s1", "192.168.1.7", 3, "10.244.7.0/24")
	same2 := vnode("s2", "192.168.1.8", 3, "10.244.7.0/25")
	same1.UID, same2.UID = "bbb", "aaa"
	// same second, one address
	ip1 := vnode("ip-m", "192.168.1.20", 4, "10.244.20.0/24")
	ip2 := vnode("ip-n", "192.168.1.20", 4, "10.244.21.0/24")
	ip1.UID, ip2.UID = "zzz", "000"
	remotes := []Node{old, young, same1, same2, ip1, ip2}
	want := map[string]Reason{"a-young": PodCIDRConflict, "s2": PodCIDRConflict, "ip-n": NodeIPConflict}
	winner := map[string]string{"a-young": "Node z-old, older", "s2": "Node s1, created in the same second", "ip-n": "Node ip-m's, created in the same second"}
	for _, self := range []Node{vnode("a", "192.168.1.1", 0, "10.244.0.0/24"), vnode("q", "192.168.1.9", 3, "10.244.9.0/24")} {
		for _, order := range permutations(remotes) {
			c := cfg
			c.Self = self.Name
			// this node anywhere in the input
			nodes := append(append([]Node{}, order[:3]...), self)
			nodes = append(nodes, order[3:]...)
			v := Validate(c, Local{}, nodes)
			if len(v.Refused) != len(want) {
				t.Fatalf("seen from %s, order %s: refused %v, want %v", self.Name, names(order), v.Refused, want)
			}
			for name, r := range want {
				got := v.Refused[name]
				if got.Reason != r || !strings.Contains(got.Detail, winner[name]) {
					t.Fatalf("seen from %s, order %s: %s refused %+v, want %s naming %q", self.Name, names(order), name, got, r, winner[name])
				}
			}
			for _, n := range remotes {
				if !v.Conflicted[n.Name] {
					t.Errorf("%s not marked conflicted", n.Name)
				}
			}
			if v.Self == nil {
				t.Fatalf("seen from %s: this node not usable: %s", self.Name, v.SelfProblem)
			}
		}
	}
}

// This node never yields its own PodCIDR or address to another Node,
// whatever that Node's age (older, the same second with a name and a UID
// that sort first, younger) and whatever the input order: the other Node
// is refused, naming this node's Node, and this node stays usable. A
// third node still gives the range to the Node that precedes (the
// subtlety of the rule: each of two Nodes in conflict keeps its own).
func TestValidateOwnNodeNeverYields(t *testing.T) {
	cfg := Config{Encap: VXLAN, ClusterCIDRs: testCluster}
	self := vnode("node-self", "192.168.1.1", 10, "10.244.1.0/24")
	self.UID = "ffff"
	third := vnode("third", "192.168.1.3", 0, "10.244.3.0/24")
	local := Local{Addrs: []netip.Addr{addr("192.168.1.1")}}
	for _, age := range []struct {
		what string
		min  int
	}{{"older", 9}, {"same second", 10}, {"younger", 11}} {
		for _, tc := range []struct {
			what   string
			name   string
			ip     string
			cidr   string
			local  Local // this node's addresses
			reason Reason
		}{
			{"PodCIDR inside this node's", "0-hostile", "192.168.1.66", "10.244.1.0/25", local, OverlapsOwnPodCIDR},
			{"this node's PodCIDR", "0-hostile", "192.168.1.66", "10.244.1.0/24", local, OverlapsOwnPodCIDR},
			{"PodCIDR around this node's", "0-hostile", "192.168.1.66", "10.244.0.0/23", local, OverlapsOwnPodCIDR},
			{"this node's address", "0-hostile", "192.168.1.1", "10.244.66.0/24", local, OwnNodeIP},
			{"this node's address (not on this machine)", "0-hostile", "192.168.1.1", "10.244.66.0/24", Local{}, NodeIPConflict},
		} {
			h := vnode(tc.name, tc.ip, age.min, tc.cidr)
			h.UID = "0000" // sorts before this node's UID too
			name := age.what + ", " + tc.what
			for _, nodes := range [][]Node{{self, h, third}, {h, third, self}, {third, h, self}} {
				c := cfg
				c.Self = self.Name
				v := Validate(c, tc.local, nodes)
				if v.Self == nil || v.SelfProblem != "" {
					t.Fatalf("%s (order %s): this node yields: %q", name, names(nodes), v.SelfProblem)
				}
				r := v.Refused[h.Name]
				if r.Reason != tc.reason || !strings.Contains(r.Detail, "node-self") {
					t.Fatalf("%s (order %s): hostile %+v, want %s naming node-self", name, names(nodes), r, tc.reason)
				}
				if _, ok := v.Refused["third"]; ok {
					t.Fatalf("%s: third refused: %v", name, v.Refused)
				}
				st := Compute(c, nodes, never)
				if !slices.Contains(st.Routes, Route{Dst: pfx("10.244.1.0/24"), Kind: Blackhole}) {
					t.Errorf("%s: no blackhole for this node's PodCIDR: %v", name, st.Routes)
				}
				for _, rt := range st.Routes {
					if rt.Kind != Blackhole && rt.Dst.Overlaps(pfx("10.244.1.0/24")) {
						t.Errorf("%s: a route into this node's PodCIDR: %v", name, rt)
					}
				}
				// and the per-Node path (a hostile Node that comes, or
				// changes, after the full apply) decides the same
				if !slices.ContainsFunc(nodes, func(n Node) bool { return n.Name == h.Name }) {
					continue
				}
				without := slices.DeleteFunc(slices.Clone(nodes), func(n Node) bool { return n.Name == h.Name })
				plan, _ := NewPlan(c, tc.local, without, never)
				if d, ok := plan.Update(h.Name, &h); ok {
					if plan.Refused()[h.Name].Reason != tc.reason {
						t.Errorf("%s: Plan.Update refused %+v, want %s", name, plan.Refused()[h.Name], tc.reason)
					}
					for _, rt := range d.Upsert {
						if rt.Dst.Overlaps(pfx("10.244.1.0/24")) {
							t.Errorf("%s: Plan.Update routes into this node's PodCIDR: %v", name, rt)
						}
					}
				}
			}
			// seen from the third node, the rule is age, then name
			c := cfg
			c.Self = "third"
			v := Validate(c, Local{}, []Node{third, self, h})
			loser := self.Name
			if age.what == "younger" {
				loser = h.Name
			}
			if _, ok := v.Refused[loser]; !ok || len(v.Refused) != 1 {
				t.Errorf("%s, seen from third: refused %v, want %s alone", name, v.Refused, loser)
			}
		}
	}
}

// Two Nodes A and B claiming one PodCIDR, created in the same second:
// each keeps it on its own node, and every other node gives it to A (the
// name sorting first), whatever the UIDs and the input order.
func TestValidateSameSecondPair(t *testing.T) {
	a := vnode("pair-a", "192.168.1.10", 3, "10.244.10.0/24")
	b := vnode("pair-b", "192.168.1.11", 3, "10.244.10.0/24")
	a.UID, b.UID = "9", "1"
	c1 := vnode("c1", "192.168.1.12", 0, "10.244.12.0/24")
	c2 := vnode("c2", "192.168.1.13", 5, "10.244.13.0/24")
	for _, order := range permutations([]Node{a, b, c1, c2}) {
		for self, loser := range map[string]string{"pair-a": "pair-b", "pair-b": "pair-a", "c1": "pair-b", "c2": "pair-b"} {
			v := Validate(Config{Self: self, Encap: None, ClusterCIDRs: testCluster}, Local{}, order)
			if _, ok := v.Refused[loser]; !ok || len(v.Refused) != 1 || v.Self == nil {
				t.Fatalf("seen from %s, order %s: refused %v (self problem %q), want %s alone", self, names(order), v.Refused, v.SelfProblem, loser)
			}
		}
	}
}

func permutations(nodes []Node) [][]Node {
	if len(nodes) <= 1 {
		return [][]Node{slices.Clone(nodes)}
	}
	var out [][]Node
	for i := range nodes {
		rest := append(slices.Clone(nodes[:i]), nodes[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]Node{nodes[i]}, p...))
		}
	}
	return out
}

func names(nodes []Node) string {
	s := make([]string, len(nodes))
	for i, n := range nodes {
		s[i] = n.Name
	}
	return strings.Join(s, ",")
}

// This node's own problems are reported, and never stop the other Nodes.
func TestValidateSelf(t *testing.T) {
	cfg := Config{Self: "a", Encap: VXLAN, ClusterCIDRs: testCluster}
	b := vnode("b", "192.168.1.2", 1, "10.244.1.0/24")
	for _, tc := range []struct {
		name string
		self *Node
		want string
	}{
		{"deleted", nil, "does not exist"},
		{"no PodCIDR", &Node{Name: "a", IP: addr("192.168.1.1")}, "no spec.podCIDRs"},
		{"outside the cluster", ptr(vnode("a", "192.168.1.1", 0, "10.99.0.0/24")), "not inside the cluster CIDR"},
		{"host bits", &Node{Name: "a", IP: addr("192.168.1.1"), Invalid: "host bits set", PodCIDRs: prefixes("10.244.0.0/24")}, "host bits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []Node{b}
			if tc.self != nil {
				nodes = append(nodes, *tc.self)
			}
			v := Validate(cfg, Local{}, nodes)
			if v.Self != nil || !strings.Contains(v.SelfProblem, tc.want) {
				t.Fatalf("self %v, problem %q, want one with %q", v.Self, v.SelfProblem, tc.want)
			}
			if len(v.Valid) != 1 || v.Valid[0].Name != "b" {
				t.Fatalf("valid %v, want b alone", v.Valid)
			}
			st := Compute(cfg, nodes, never)
			if len(st.Routes) != 1 || st.Routes[0].Dst != pfx("10.244.1.0/24") || st.SelfProblem == "" {
				t.Fatalf("routes %v (problem %q), want b's alone", st.Routes, st.SelfProblem)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseNode(t *testing.T) {
	internal := func(s string) Address { return Address{Internal: true, Address: s} }
	other := func(s string) Address { return Address{Address: s} }
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name       string
		podCIDR    string
		podCIDRs   []string
		addrs      []Address
		annotation *string
		wantCIDRs  string
		wantIP     string
		invalid    string
		note       string
	}{
		{name: "plain", podCIDRs: []string{"10.244.1.0/24"}, addrs: []Address{internal("192.168.1.2")}, wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2"},
		{name: "legacy field", podCIDR: "10.244.1.0/24", addrs: []Address{internal("192.168.1.2")}, wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2"},
		{name: "host bits", podCIDRs: []string{"10.244.1.7/24"}, addrs: []Address{internal("192.168.1.2")}, wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2", invalid: "host bits set"},
		{name: "garbage", podCIDRs: []string{"bogus", "10.244.1.0/24"}, wantCIDRs: "[10.244.1.0/24]", wantIP: "invalid IP", invalid: `"bogus" does not parse`},
		{name: "mapped", podCIDRs: []string{"::ffff:10.244.1.0/120"}, wantCIDRs: "[]", wantIP: "invalid IP", invalid: "not a plain"},
		{name: "annotation listed", podCIDRs: []string{"10.244.1.0/24"}, addrs: []Address{internal("192.168.1.2"), other("10.0.0.2")}, annotation: str("10.0.0.2"), wantCIDRs: "[10.244.1.0/24]", wantIP: "10.0.0.2"},
		{name: "annotation not listed", podCIDRs: []string{"10.244.1.0/24"}, addrs: []Address{internal("192.168.1.2")}, annotation: str("192.168.1.1"), wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2", note: "not one of the Node's status.addresses"},
		{name: "annotation garbage", podCIDRs: []string{"10.244.1.0/24"}, addrs: []Address{internal("192.168.1.2")}, annotation: str("x"), wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2", note: "does not parse"},
		{name: "mapped address", podCIDRs: []string{"10.244.1.0/24"}, addrs: []Address{other("x"), internal("::ffff:192.168.1.2")}, wantCIDRs: "[10.244.1.0/24]", wantIP: "192.168.1.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := ParseNode("n", "u", t0, tc.podCIDR, tc.podCIDRs, tc.addrs, tc.annotation)
			if got := fmt.Sprint(n.PodCIDRs); got != tc.wantCIDRs {
				t.Errorf("PodCIDRs %s, want %s", got, tc.wantCIDRs)
			}
			if got := n.IP.String(); got != tc.wantIP {
				t.Errorf("IP %s, want %s", got, tc.wantIP)
			}
			if (tc.invalid == "") != (n.Invalid == "") || !strings.Contains(n.Invalid, tc.invalid) {
				t.Errorf("Invalid %q, want %q", n.Invalid, tc.invalid)
			}
			if (tc.note == "") != (n.Note == "") || !strings.Contains(n.Note, tc.note) {
				t.Errorf("Note %q, want %q", n.Note, tc.note)
			}
		})
	}
}

// Plan.Update judges one Node alone when it can: a refused Node loses its
// routes with its event and gets them back with the event that fixes it;
// a Node in a conflict, or one that would start one, is left to NewPlan.
func TestPlanUpdateRefusals(t *testing.T) {
	cfg := Config{Self: "a", Encap: IPIP, ClusterCIDRs: testCluster}
	a := vnode("a", "192.168.1.1", 0, "10.244.0.0/24")
	b := vnode("b", "192.168.1.2", 1, "10.244.1.0/24")
	plan, _ := NewPlan(cfg, Local{}, []Node{a, b}, never)

	bad := b
	bad.PodCIDRs = prefixes("0.0.0.0/0")
	d, ok := plan.Update("b", &bad)
	if !ok || len(d.Remove) != 1 || len(d.Upsert) != 0 || plan.Refused()["b"].Reason != ReservedRange {
		t.Fatalf("b made hostile: delta %+v ok %v refused %v", d, ok, plan.Refused())
	}
	if ch := plan.TakeRefusalChanges(); fmt.Sprint(ch) != "[b]" {
		t.Errorf("refusal changes %v, want [b]", ch)
	}
	d, ok = plan.Update("b", &b)
	if !ok || len(d.Upsert) != 1 || len(plan.Refused()) != 0 {
		t.Fatalf("b fixed: delta %+v ok %v refused %v", d, ok, plan.Refused())
	}
	if ch := plan.TakeRefusalChanges(); fmt.Sprint(ch) != "[b]" {
		t.Errorf("refusal changes %v, want [b]", ch)
	}
	// a newcomer claiming b's PodCIDR: only every Node together can say
	thief := vnode("0-thief", "192.168.1.3", 2, "10.244.1.0/25")
	if _, ok := plan.Update(thief.Name, &thief); ok {
		t.Fatal("a conflicting newcomer was patched in alone")
	}
	plan, st := NewPlan(cfg, Local{}, []Node{a, b, thief}, never)
	if st.Refused[thief.Name].Reason != PodCIDRConflict {
		t.Fatalf("thief: %v", st.Refused)
	}
	// b deleted: the thief may win now, so NewPlan decides
	if _, ok := plan.Update("b", nil); ok {
		t.Fatal("the winner of a conflict deleted alone")
	}
	plan, st = NewPlan(cfg, Local{}, []Node{a, thief}, never)
	if len(st.Refused) != 0 || len(st.Routes) != 2 {
		t.Fatalf("after b left: refused %v routes %v", st.Refused, st.Routes)
	}
	// a Node moving onto a free PodCIDR is patched alone
	c := vnode("c", "192.168.1.4", 3, "10.244.4.0/24")
	if d, ok := plan.Update("c", &c); !ok || len(d.Upsert) != 1 {
		t.Fatalf("c: %+v %v", d, ok)
	}
	c.PodCIDRs = prefixes("10.244.5.0/24")
	if d, ok := plan.Update("c", &c); !ok || len(d.Upsert) != 1 || len(d.Remove) != 1 {
		t.Fatalf("c moved: %+v %v", d, ok)
	}
	// and onto its own old place again, after someone else took nothing
	other := vnode("d", "192.168.1.5", 4, "10.244.4.0/24")
	if d, ok := plan.Update("d", &other); !ok || len(d.Upsert) != 1 {
		t.Fatalf("d on c's old PodCIDR: %+v %v", d, ok)
	}
}

func TestPrefixTrie(t *testing.T) {
	tr := &prefixTrie{}
	tr.insert(pfx("10.244.0.0/16"), "cluster")
	tr.insert(pfx("10.244.1.0/24"), "b")
	tr.insert(pfx("fd00::/64"), "v6")
	for _, tc := range []struct {
		p    string
		want string
	}{
		{"10.244.1.0/24", "10.244.0.0/16"}, // the supernet is met first
		{"10.0.0.0/8", "10.244.0.0/16"},
		{"10.245.0.0/16", ""},
		{"0.0.0.0/0", "10.244.0.0/16"},
		{"fd00::1/128", "fd00::/64"},
		{"fd00:1::/64", ""},
		{"::/0", "fd00::/64"},
	} {
		q, _, ok := tr.overlap(pfx(tc.p))
		if got := ""; ok {
			got = q.String()
			if got != tc.want {
				t.Errorf("overlap(%s) = %s, want %s", tc.p, got, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("overlap(%s) = none, want %s", tc.p, tc.want)
		}
	}
	tr.remove(pfx("10.244.0.0/16"))
	if q, owner, ok := tr.overlap(pfx("10.0.0.0/8")); !ok || q != pfx("10.244.1.0/24") || owner != "b" {
		t.Errorf("after removing the /16: %v %s %v", q, owner, ok)
	}
	tr.remove(pfx("10.244.1.0/24"))
	tr.remove(pfx("10.244.1.0/24")) // not there any more: ignored
	if _, _, ok := tr.overlap(pfx("0.0.0.0/0")); ok {
		t.Error("empty IPv4 trie still overlaps")
	}
}

// BenchmarkValidate is the cost of judging a cluster of 10,000 Nodes
// (make bench reads it beside the routed figures): a sort and trie
// lookups, no pairwise scan.
func BenchmarkValidate(b *testing.B) {
	cfg := Config{Self: "n0", Encap: VXLAN, ClusterCIDRs: []netip.Prefix{pfx("10.0.0.0/8")}, ServiceCIDRs: []netip.Prefix{pfx("172.16.0.0/16")}}
	nodes := make([]Node, 10000)
	for i := range nodes {
		nodes[i] = vnode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1), i, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	local := Local{Addrs: []netip.Addr{addr("192.168.0.1")}, Routes: []netip.Prefix{pfx("192.168.0.0/16")}}
	b.ResetTimer()
	for b.Loop() {
		v := Validate(cfg, local, nodes)
		if len(v.Valid) != len(nodes) {
			b.Fatalf("%d valid: %v", len(v.Valid), v.Refused)
		}
	}
}
