package routed

// Repairs: every object podnet-routed owns in VXLAN mode (routes and the
// blackhole, podnet.vxlan and its settings, its neighbor and FDB entries,
// the sysctls it sets, node.json), deleted or edited behind its back, is
// put back by the resync, and counted in podnet_repairs_total{object}. A
// sysctl it cannot set, or a tunnel device it cannot create, does not stop
// the rest of the apply.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

const vxlanDev = "podnet.vxlan"

// repairT is how long a repair may take: two resync intervals, plus a
// little for a loaded machine.
const repairT = 2*resync + resync/2

// vxlanSysctls are the sysctls podnet-routed sets on a VXLAN node.
var vxlanSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/podnet.vxlan/rp_filter",
	"net/ipv6/conf/podnet.vxlan/accept_ra",
	"net/ipv6/conf/podnet.vxlan/autoconf",
}

// owned renders everything podnet-routed owns on a VXLAN node, one entry
// per kind of object, so that a difference says what is wrong.
func (n *node) owned() (map[string]string, error) {
	out := map[string]string{}
	routes, err := n.podnetRoutes()
	if err != nil {
		return nil, err
	}
	out["routes"] = strings.Join(routes, "\n")
	err = n.ns.Do(func(ns.NetNS) error {
		var sys []string
		for _, s := range vxlanSysctls {
			b, err := os.ReadFile("/proc/sys/" + s)
			switch {
			case errors.Is(err, os.ErrNotExist): // the device is gone: not repaired yet
				sys = append(sys, s+" missing")
			case err != nil:
				return err
			default:
				sys = append(sys, s+"="+strings.TrimSpace(string(b)))
			}
		}
		out["sysctls"] = strings.Join(sys, " ")
		l, err := netlink.LinkByName(vxlanDev)
		if err != nil {
			out["device"] = "missing: " + err.Error()
			return nil
		}
		v, ok := l.(*netlink.Vxlan)
		if !ok {
			out["device"] = "not vxlan: " + l.Type()
			return nil
		}
		under := ""
		if u, err := netlink.LinkByIndex(v.VtepDevIndex); err == nil {
			under = u.Attrs().Name
		}
		out["device"] = fmt.Sprintf("up=%v mtu=%d mac=%s vni=%d port=%d local=%s learning=%v underlay=%s",
			v.Flags&net.FlagUp != 0, v.MTU, v.HardwareAddr, v.VxlanId, v.Port, v.SrcAddr, v.Learning, under)
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		var as []string
		for _, a := range addrs {
			as = append(as, a.IPNet.String())
		}
		out["addrs"] = strings.Join(as, " ")
		neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		var nbs []string
		for _, e := range neighs {
			nbs = append(nbs, fmt.Sprintf("%s lladdr %s state %#x", e.IP, e.HardwareAddr, e.State))
		}
		slices.Sort(nbs)
		out["neigh"] = strings.Join(nbs, "\n")
		fdb, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		var fs []string
		for _, e := range fdb {
			if e.IP != nil && !e.IP.Equal(net.IPv4zero) {
				fs = append(fs, fmt.Sprintf("%s dst %s state %#x", e.HardwareAddr, e.IP, e.State))
			}
		}
		slices.Sort(fs)
		out["fdb"] = strings.Join(fs, "\n")
		return nil
	})
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(nodestate.Path(n.stateDir))
	if err != nil {
		out["node.json"] = "unreadable: " + err.Error()
	} else {
		out["node.json"] = string(b)
	}
	return out, nil
}

func diffOwned(got, want map[string]string) error {
	var diffs []string
	for _, k := range []string{"routes", "device", "addrs", "neigh", "fdb", "sysctls", "node.json"} {
		if got[k] != want[k] {
			diffs = append(diffs, fmt.Sprintf("%s:\n\tgot  %q\n\twant %q", k, got[k], want[k]))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s", strings.Join(diffs, "\n"))
	}
	return nil
}

// labeled reads one labelled series of /metrics (0 when absent).
func (d *daemon) labeled(name, label, value string) (float64, error) {
	code, body, err := d.n.get(d.metricsAddr, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("/metrics %d", code)
	}
	prefix := fmt.Sprintf("%s{%s=%q} ", name, label, value)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, nil
}

func (d *daemon) repairs(t *testing.T, object string) float64 {
	t.Helper()
	v, err := d.labeled("podnet_repairs_total", "object", object)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ipIn runs the ip command in the node netns.
func (n *node) ipIn(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.m.NS.Exec(ctx, "ip", args...)
}

func (n *node) vxlanLink() (l netlink.Link, err error) {
	err = n.ns.Do(func(ns.NetNS) error {
		l, err = netlink.LinkByName(vxlanDev)
		return err
	})
	return l, err
}

// setLearning turns learning on podnet.vxlan on with iproute2, or with a
// netlink changelink of that one attribute where iproute2 cannot.
func setLearning(n *node) error {
	if _, err := n.ipIn("link", "set", vxlanDev, "type", "vxlan", "learning"); err == nil {
		return nil
	}
	l, err := n.vxlanLink()
	if err != nil {
		return err
	}
	return n.ns.Do(func(ns.NetNS) error {
		req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
		msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
		msg.Index = int32(l.Attrs().Index)
		req.AddData(msg)
		info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
		info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
		data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
		data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{1})
		req.AddData(info)
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		return err
	})
}

// TestRepairs breaks each object podnet-routed owns on a VXLAN node and
// checks that the resync puts it back (the kernel state and node.json
// compared whole with their state before) within two resync intervals,
// and counts it in podnet_repairs_total{object}: a route deleted is one
// route repair; routes, neighbors and FDB entries that went with their
// device are none. Ordinary changes (a Node added and deleted, this
// node's network refusing a Node for a while, resyncs) count no route or
// VXLAN entry repair.
func TestRepairs(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	c.addNode("node-b", "172.30.0.2")
	c.addNode("node-c", "172.30.0.3")
	c.createNode("node-a", "172.30.0.1", "10.244.1.0/24")
	c.createNode("node-b", "172.30.0.2", "10.244.2.0/24")
	c.createNode("node-c", "172.30.0.3", "10.244.3.0/24")
	d := a.startDaemon("--encap=vxlan")
	viaB := "10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink"
	viaC := "10.244.3.0/24 via 10.244.3.0 dev podnet.vxlan proto 77 onlink"
	a.expectRoutes(syncT, d, bhA, viaB, viaC)
	d.waitReady(changeT)
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU - 50, Encap: "vxlan"})

	good, err := a.owned()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"device":  "up=true mtu=1350 mac=0e:70:ac:1e:00:01 vni=4096 port=4789 local=172.30.0.1 learning=false underlay=eth0",
		"addrs":   "10.244.1.0/32",
		"neigh":   "10.244.2.0 lladdr 0e:70:ac:1e:00:02 state 0x80\n10.244.3.0 lladdr 0e:70:ac:1e:00:03 state 0x80",
		"fdb":     "0e:70:ac:1e:00:02 dst 172.30.0.2 state 0x80\n0e:70:ac:1e:00:03 dst 172.30.0.3 state 0x80",
		"sysctls": "net/ipv4/ip_forward=1 net/ipv4/conf/podnet.vxlan/rp_filter=2 net/ipv6/conf/podnet.vxlan/accept_ra=0 net/ipv6/conf/podnet.vxlan/autoconf=0",
	} {
		if good[k] != want {
			t.Errorf("%s of node-a before any break:\n\tgot  %q\n\twant %q", k, good[k], want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// The extra address the "local address changed" break points
	// podnet.vxlan at.
	a.addIP("172.30.0.11")

	do := func(f func() error) func() error {
		return func() error { return a.ns.Do(func(ns.NetNS) error { return f() }) }
	}
	link := func(f func(netlink.Link) error) func() error {
		return do(func() error {
			l, err := netlink.LinkByName(vxlanDev)
			if err != nil {
				return err
			}
			return f(l)
		})
	}
	ipCmd := func(args ...string) func() error {
		return func() error {
			out, err := a.ipIn(args...)
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}
	}
	writeSysctl := func(name, value string) func() error {
		return do(func() error { return nettest.WriteSysctl(name, value) })
	}
	neighB := func() *netlink.Neigh {
		return &netlink.Neigh{Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.ParseIP("10.244.2.0"), HardwareAddr: net.HardwareAddr{0x0e, 0x70, 0xac, 0x1e, 0, 2}}
	}
	for _, tc := range []struct {
		name   string
		object string // the podnet_repairs_total object that must rise
		// routes is by how much podnet_repairs_total{object="route"}
		// rises: a route deleted is one repair, the routes that go
		// with a device set down or deleted are that device's repair
		routes float64
		brk    func() error
		// always must hold at every sample between the break and the
		// repair (nil: no constraint)
		always func(map[string]string) error
	}{
		{name: "route deleted", object: "route", routes: 1, brk: func() error { a.delRoutes("10.244.2.0/24"); return nil }},
		{name: "blackhole deleted", object: "route", routes: 1, brk: func() error { a.delRoutes("10.244.1.0/24"); return nil }},
		{name: "device set down", object: "tunnel-device", brk: link(netlink.LinkSetDown)},
		{name: "device MTU changed", object: "tunnel-device", brk: link(func(l netlink.Link) error { return netlink.LinkSetMTU(l, 1300) })},
		{name: "device learning on", object: "tunnel-device", brk: func() error { return setLearning(a) }},
		{name: "device local address changed", object: "tunnel-device", brk: ipCmd("link", "set", vxlanDev, "type", "vxlan", "local", "172.30.0.11")},
		{name: "device MAC changed", object: "tunnel-device", brk: ipCmd("link", "set", vxlanDev, "address", "02:00:00:00:00:01")},
		{name: "device deleted", object: "tunnel-device", brk: link(netlink.LinkDel)},
		{name: "neighbor deleted", object: "vxlan-neighbor", brk: link(func(l netlink.Link) error {
			n := neighB()
			n.LinkIndex = l.Attrs().Index
			return netlink.NeighDel(n)
		})},
		{name: "FDB entry deleted", object: "vxlan-fdb", brk: link(func(l netlink.Link) error {
			return netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				IP: net.ParseIP("172.30.0.3"), HardwareAddr: net.HardwareAddr{0x0e, 0x70, 0xac, 0x1e, 0, 3}})
		})},
		{name: "neighbor MAC changed", object: "vxlan-neighbor", brk: link(func(l netlink.Link) error {
			n := neighB()
			n.LinkIndex = l.Attrs().Index
			n.HardwareAddr = net.HardwareAddr{0x02, 0, 0, 0, 0, 9}
			return netlink.NeighSet(n)
		}), always: func(o map[string]string) error {
			// replaced in place: never a moment without the entry (a
			// delete by IP after the set would remove the new one)
			if !strings.Contains(o["neigh"], "10.244.2.0 lladdr") {
				return fmt.Errorf("the neighbor entry of node-b is gone: %q", o["neigh"])
			}
			return nil
		}},
		{name: "rp_filter reverted", object: "sysctl", brk: writeSysctl("net/ipv4/conf/podnet.vxlan/rp_filter", "1")},
		{name: "accept_ra reverted", object: "sysctl", brk: writeSysctl("net/ipv6/conf/podnet.vxlan/accept_ra", "1")},
		{name: "node.json deleted", object: "node-state", brk: func() error { return os.Remove(nodestate.Path(a.stateDir)) }},
		{name: "node.json edited", object: "node-state", brk: func() error {
			st, err := a.state()
			if err != nil {
				return err
			}
			st.MTU = 9000
			b, err := json.Marshal(st)
			if err != nil {
				return err
			}
			return os.WriteFile(nodestate.Path(a.stateDir), b, 0o644)
		}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			before := d.repairs(t, tc.object)
			// the route and VXLAN entry counters must not rise for
			// another object's break (routes, neighbors and FDB entries
			// that go with a device are its repair)
			others := map[string]float64{}
			for _, o := range []string{"route", "vxlan-neighbor", "vxlan-fdb"} {
				others[o] = d.repairs(t, o)
			}
			if err := tc.brk(); err != nil {
				t.Fatalf("break: %v", err)
			}
			broken, err := a.owned()
			if err != nil {
				t.Fatal(err)
			}
			if diffOwned(broken, good) == nil {
				// already repaired (a netlink-triggered repair can be
				// that fast): the counter still says so
				t.Logf("%s: repaired before the test could look", tc.name)
			}
			start := time.Now()
			var violation error
			took := nettest.Eventually(t, repairT, tc.name+": repaired", func() error {
				if err := d.alive(); err != nil {
					return err
				}
				got, err := a.owned()
				if err != nil {
					return err
				}
				if tc.always != nil && violation == nil {
					if err := tc.always(got); err != nil {
						violation = fmt.Errorf("%s after the break: %w", time.Since(start).Round(time.Millisecond), err)
					}
				}
				return diffOwned(got, good)
			})
			t.Logf("MEASURE %s: repaired after %s (resync %s)", tc.name, took.Round(time.Millisecond), resync)
			if violation != nil {
				t.Error(violation)
			}
			nettest.Eventually(t, changeT, tc.name+": counted", func() error {
				if got := d.repairs(t, tc.object); got <= before {
					return fmt.Errorf("podnet_repairs_total{object=%q} = %v, was %v before the break", tc.object, got, before)
				}
				return nil
			})
			// and it stays repaired over a resync
			time.Sleep(resync + resync/4)
			got, err := a.owned()
			if err != nil {
				t.Fatal(err)
			}
			if err := diffOwned(got, good); err != nil {
				t.Errorf("%s: not stable after its repair: %v", tc.name, err)
			}
			for o, was := range others {
				want := 0.0
				switch {
				case o == "route":
					want = tc.routes
				case o == tc.object:
					continue // checked above
				}
				if rose := d.repairs(t, o) - was; rose != want {
					t.Errorf("%s: podnet_repairs_total{object=%q} rose by %v, want %v", tc.name, o, rose, want)
				}
			}
		})
	}
	if t.Failed() {
		t.FailNow()
	}

	// Ordinary changes are no repairs: a Node that comes and goes, and
	// this node's network taking a Node's PodCIDR for a while (its route
	// goes and comes back at the resyncs), with resyncs in between.
	t.Run("no_tampering_no_route_repair", func(t *testing.T) {
		routesBefore := d.repairs(t, "route")
		m, err := d.metrics()
		if err != nil {
			t.Fatal(err)
		}
		appliesBefore := m["podnet_route_repairs_total"]
		vxlanBefore := map[string]float64{"vxlan-neighbor": d.repairs(t, "vxlan-neighbor"), "vxlan-fdb": d.repairs(t, "vxlan-fdb")}
		viaD := "10.244.4.0/24 via 10.244.4.0 dev podnet.vxlan proto 77 onlink"
		c.createNode("node-d", "172.30.0.4", "10.244.4.0/24")
		a.expectRoutes(changeT, d, bhA, viaB, viaC, viaD)
		time.Sleep(resync + resync/2)
		c.deleteNode("node-d")
		a.expectRoutes(changeT, d, bhA, viaB, viaC)
		// an address of node-a's inside node-c's PodCIDR: node-c is
		// refused at the next resync, and routed again once it goes
		a.addPodAddr("10.244.3.1")
		a.expectRoutes(repairT, d, bhA, viaB)
		c.do(a.ns, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			addr, err := netlink.ParseAddr("10.244.3.1/32")
			if err != nil {
				return err
			}
			return netlink.AddrDel(lo, addr)
		})
		a.expectRoutes(repairT, d, bhA, viaB, viaC)
		time.Sleep(resync + resync/2)
		if got := d.repairs(t, "route"); got != routesBefore {
			t.Errorf("podnet_repairs_total{object=\"route\"} = %v after a Node came and went and the node's network refused one for a while, was %v: none of that is a repair", got, routesBefore)
		}
		m, err = d.metrics()
		if err != nil {
			t.Fatal(err)
		}
		if m["podnet_route_repairs_total"] != appliesBefore {
			t.Errorf("podnet_route_repairs_total = %v, was %v: no route was repaired", m["podnet_route_repairs_total"], appliesBefore)
		}
		for o, was := range vxlanBefore {
			if got := d.repairs(t, o); got != was {
				t.Errorf("podnet_repairs_total{object=%q} = %v after the ordinary changes, was %v", o, got, was)
			}
		}
		got, err := a.owned()
		if err != nil {
			t.Fatal(err)
		}
		if err := diffOwned(got, good); err != nil {
			t.Errorf("not back as before: %v", err)
		}
		// and one route deleted is exactly one repair
		a.delRoutes("10.244.3.0/24")
		a.expectRoutes(repairT, d, bhA, viaB, viaC)
		time.Sleep(resync + resync/2)
		if got := d.repairs(t, "route"); got != routesBefore+1 {
			t.Errorf("podnet_repairs_total{object=\"route\"} = %v after one route deleted, want %v", got, routesBefore+1)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	d.waitReady(changeT)
	expectProgrammed(t, a, d)
	for _, o := range []string{"route", "tunnel-device", "vxlan-neighbor", "vxlan-fdb", "sysctl", "node-state"} {
		t.Logf("podnet_repairs_total{object=%q} = %v", o, d.repairs(t, o))
	}
	if m, err := d.metrics(); err == nil {
		t.Logf("podnet_route_repairs_total = %v", m["podnet_route_repairs_total"])
	}

	// A tunnel device that cannot be created (another VXLAN device holds
	// its VNI and port) does not stop the rest: the blackhole and
	// node.json, deleted meanwhile, come back; readyz says the apply
	// failed; once the port is free the device and its routes come back.
	d.stop()
	c.do(a.ns, func() error {
		l, err := netlink.LinkByName(vxlanDev)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if out, err := a.ipIn("link", "add", "blocker", "type", "vxlan", "id", "4096", "dstport", "4789", "local", "172.30.0.1", "dev", uplinkName); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	a.delRoutes("10.244.1.0/24")
	if err := os.Remove(nodestate.Path(a.stateDir)); err != nil {
		t.Fatal(err)
	}
	d = a.startDaemon("--encap=vxlan")
	a.expectRoutes(syncT, d, bhA)
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU - 50, Encap: "vxlan"})
	nettest.Eventually(t, changeT, "readyz 503 while podnet.vxlan cannot be created", func() error {
		if code, body := d.status("/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
	if logText, _ := os.ReadFile(d.p.Log); !strings.Contains(string(logText), "another device already uses VNI 4096 and port 4789") {
		t.Errorf("the log does not say why podnet.vxlan cannot be created:\n%s", nettest.Tail(d.p.Log, 20))
	}
	if _, err := a.ipIn("link", "del", "blocker"); err != nil {
		t.Fatal(err)
	}
	took := nettest.Eventually(t, repairT, "podnet.vxlan and its routes back once the VNI is free", func() error {
		got, err := a.owned()
		if err != nil {
			return err
		}
		return diffOwned(got, good)
	})
	t.Logf("MEASURE VNI freed: podnet.vxlan, routes, neighbors and FDB back after %s", took.Round(time.Millisecond))
	d.waitReady(changeT)
	expectProgrammed(t, a, d)
}

// expectProgrammed checks that podnet_routes_programmed equals the routes
// podnet-routed owns in the kernel (with no pods on the node: every
// podnet route).
func expectProgrammed(t *testing.T, n *node, d *daemon) {
	t.Helper()
	nettest.Eventually(t, changeT, "podnet_routes_programmed equals the kernel", func() error {
		routes, err := n.podnetRoutes()
		if err != nil {
			return err
		}
		m, err := d.metrics()
		if err != nil {
			return err
		}
		if m["podnet_routes_programmed"] != float64(len(routes)) {
			return fmt.Errorf("podnet_routes_programmed %v, %d podnet routes in the kernel: %q", m["podnet_routes_programmed"], len(routes), routes)
		}
		return nil
	})
}

// TestUnwritableSysctls: podnet-routed whose /proc/sys is read-only (as
// in the shipped DaemonSet without prepare-node) still converges: routes,
// the VXLAN device and node.json; each sysctl it cannot set is a warning
// and podnet_sysctl_errors_total{name} rises at every resync; readyz 200.
func TestUnwritableSysctls(t *testing.T) {
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (util-linux): %v", tool, err)
		}
	}
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	c.addNode("node-b", "172.30.0.2")
	c.createNode("node-a", "172.30.0.1", "10.244.1.0/24")
	c.createNode("node-b", "172.30.0.2", "10.244.2.0/24")
	// what a node may well have: no forwarding, strict rp_filter for new
	// devices
	c.do(a.ns, func() error {
		for k, v := range map[string]string{"net/ipv4/ip_forward": "0", "net/ipv4/conf/default/rp_filter": "1", "net/ipv6/conf/default/accept_ra": "1"} {
			if err := nettest.WriteSysctl(k, v); err != nil {
				return err
			}
		}
		return nil
	})

	kubeconfig, err := c.api.WriteKubeconfig(kapi.RoutedUser, "https://"+tcluster.APIProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(nettest.BinDir(t, "podnet-routed"), "podnet-routed")
	// its own mount namespace, /proc/sys bound read-only on itself
	script := `set -e
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec "$@"`
	args := []string{"--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", bin,
		"--kubeconfig=" + kubeconfig, "--node-name=node-a", "--encap=vxlan", "--cluster-cidr=10.244.0.0/16",
		"--state-dir=" + a.stateDir, "--health-addr=" + tcluster.HealthAddr, "--metrics-addr=" + tcluster.MetricsAddr,
		"--resync-interval=" + resync.String()}
	p := nettest.StartProcT(t, a.ns, filepath.Join(t.TempDir(), "podnet-routed.log"), "unshare", args...)
	d := &daemon{n: a, p: p, healthAddr: tcluster.HealthAddr, metricsAddr: tcluster.MetricsAddr}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- read-only podnet-routed log ----\n%s", nettest.Tail(p.Log, 40))
		}
	})

	a.expectRoutes(syncT, d, bhA, "10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink")
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU - 50, Encap: "vxlan"})
	d.waitReady(changeT)
	owned, err := a.owned()
	if err != nil {
		t.Fatal(err)
	}
	if want := "up=true mtu=1350 mac=0e:70:ac:1e:00:01 vni=4096 port=4789 local=172.30.0.1 learning=false underlay=eth0"; owned["device"] != want {
		t.Errorf("podnet.vxlan %q, want %q", owned["device"], want)
	}
	if want := "0e:70:ac:1e:00:02 dst 172.30.0.2 state 0x80"; owned["fdb"] != want {
		t.Errorf("FDB %q, want %q", owned["fdb"], want)
	}
	// the sysctls stay as they were: podnet-routed could not write them
	if got := sysctl(t, a, "net/ipv4/ip_forward"); got != "0" {
		t.Errorf("ip_forward = %s under a read-only /proc/sys", got)
	}
	names := []string{"net.ipv4.ip_forward", "net.ipv4.conf.podnet.vxlan.rp_filter", "net.ipv6.conf.podnet.vxlan.accept_ra"}
	first := map[string]float64{}
	for _, name := range names {
		v, err := d.labeled("podnet_sysctl_errors_total", "name", name)
		if err != nil {
			t.Fatal(err)
		}
		if v < 1 {
			t.Errorf("podnet_sysctl_errors_total{name=%q} = %v, want >= 1", name, v)
		}
		first[name] = v
	}
	// every resync tries again, and counts again; readyz stays 200
	nettest.Eventually(t, repairT, "sysctl errors counted at the next resync", func() error {
		v, err := d.labeled("podnet_sysctl_errors_total", "name", "net.ipv4.ip_forward")
		if err != nil {
			return err
		}
		if v <= first["net.ipv4.ip_forward"] {
			return fmt.Errorf("podnet_sysctl_errors_total{name=\"net.ipv4.ip_forward\"} still %v", v)
		}
		return nil
	})
	// readyz stays 200 across resyncs (each one fails to set them again)
	nettest.Consistently(t, resync+resync/2, "/readyz 200 with sysctls it cannot set", func() error {
		if code, body := d.status("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
	warned := false
	for _, rec := range d.logLines("cannot set a sysctl; going on without it") {
		if rec["level"] == "WARN" && rec["name"] == "net.ipv4.ip_forward" && strings.Contains(fmt.Sprint(rec["err"]), "read-only file system") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning for net.ipv4.ip_forward in the log:\n%s", nettest.Tail(p.Log, 20))
	}
	// a Node change still converges
	c.addNode("node-c", "172.30.0.3")
	c.createNode("node-c", "172.30.0.3", "10.244.3.0/24")
	a.expectRoutes(changeT, d, bhA, "10.244.2.0/24 via 10.244.2.0 dev podnet.vxlan proto 77 onlink", "10.244.3.0/24 via 10.244.3.0 dev podnet.vxlan proto 77 onlink")
	// node.json deleted: written back although the sysctls still fail
	if err := os.Remove(nodestate.Path(a.stateDir)); err != nil {
		t.Fatal(err)
	}
	a.expectState(repairT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{"10.244.1.0/24"}, MTU: underlayMTU - 50, Encap: "vxlan"})
	d.waitReady(changeT)
}
