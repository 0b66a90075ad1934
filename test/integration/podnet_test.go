package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// podnetList renders a one-plugin podnet conflist. ipam is the JSON of the
// "ipam" object; extra holds more top-level plugin keys.
func podnetList(cniVersion, ipam string, extra map[string]any) string {
	return pluginList("podnet", "podnet", cniVersion, ipam, extra)
}

// pluginList renders a one-plugin conflist of network name with plugin
// type typ.
func pluginList(name, typ, cniVersion, ipam string, extra map[string]any) string {
	plugin := map[string]any{"type": typ, "ipam": json.RawMessage(ipam)}
	for k, v := range extra {
		plugin[k] = v
	}
	list := map[string]any{"cniVersion": cniVersion, "name": name, "plugins": []any{plugin}}
	b, err := json.Marshal(list)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// hostLocal is the ipam JSON of the reference host-local plugin over
// subnets (one range set per subnet: dual-stack when given one of each).
func hostLocal(dataDir string, subnets ...string) string {
	return rangesIPAM("host-local", dataDir, subnets...)
}

// rangesIPAM is the ipam JSON of a host-local-style IPAM plugin typ.
func rangesIPAM(typ, dataDir string, subnets ...string) string {
	var sets []string
	for _, s := range subnets {
		sets = append(sets, fmt.Sprintf(`[{"subnet":%q}]`, s))
	}
	return fmt.Sprintf(`{"type":%q,"dataDir":%q,"ranges":[%s]}`, typ, dataDir, strings.Join(sets, ","))
}

// newPodnet prepares a node and a libcni runtime for podnet + host-local.
func newPodnet(t *testing.T, conflist string) *nettest.Runtime {
	t.Helper()
	node := nettest.NewNode(t)
	bin := nettest.BinDir(t, "podnet")
	return nettest.NewRuntime(t, node, conflist, bin, nettest.RefToolsDir(t), fakeIPAMDir)
}

// reservations lists host-local's reserved addresses in dataDir/network.
func reservations(t *testing.T, dataDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "podnet"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ips []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

// assertClean fails when the node still has a link other than lo, a podnet
// route or a host-local reservation.
func assertClean(t *testing.T, rt *nettest.Runtime, dataDir string) {
	t.Helper()
	if links := rt.Node.Links(); len(links) > 0 {
		t.Errorf("links left in node netns: %v", links)
	}
	if routes := rt.Node.RoutesWithProto(contract.RouteProtocol); len(routes) > 0 {
		t.Errorf("podnet routes left in node netns: %v", routes)
	}
	if dataDir != "" {
		if r := reservations(t, dataDir); len(r) > 0 {
			t.Errorf("IPAM reservations left: %v", r)
		}
	}
}

type podState struct {
	addrs  []string // "ip/len"
	routes []string // "dst via gw" / "dst scope link"
	neighs []string // "ip lladdr state"
	mtu    int
	up     bool
}

func readPod(t *testing.T, podNS ns.NetNS, ifName string) podState {
	t.Helper()
	var st podState
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		st.mtu = link.Attrs().MTU
		st.up = link.Attrs().Flags&net.FlagUp != 0
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				continue
			}
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				return fmt.Errorf("address %s is tentative: DAD was not disabled", a.IPNet)
			}
			st.addrs = append(st.addrs, a.IPNet.String())
		}
		routes, err := netlink.RouteList(link, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			dst := "default"
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones > 0 {
					dst = r.Dst.String()
				}
			}
			if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() && r.Dst.IP.To4() == nil {
				continue // fe80::/64, the kernel's own
			}
			if r.Gw != nil {
				st.routes = append(st.routes, dst+" via "+r.Gw.String())
			} else {
				st.routes = append(st.routes, dst+" scope "+r.Scope.String())
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			neighs, err := netlink.NeighList(link.Attrs().Index, fam)
			if err != nil {
				return err
			}
			for _, n := range neighs {
				if n.State == netlink.NUD_PERMANENT {
					st.neighs = append(st.neighs, n.IP.String()+" "+n.HardwareAddr.String()+" permanent")
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read pod interface %s: %v", ifName, err)
	}
	slices.Sort(st.addrs)
	slices.Sort(st.routes)
	slices.Sort(st.neighs)
	return st
}

// hostVeth returns the node's podnet veth and its routes.
func hostVeth(t *testing.T, rt *nettest.Runtime, name string) (netlink.Link, []netlink.Route) {
	t.Helper()
	var link netlink.Link
	var routes []netlink.Route
	rt.Node.Do(func() error {
		var err error
		link, err = netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("host veth %s: %w", name, err)
		}
		all, err := netlink.RouteList(link, netlink.FAMILY_ALL)
		for _, r := range all {
			if r.Dst != nil && r.Dst.IP.To4() == nil && r.Dst.IP.IsLinkLocalUnicast() {
				continue // fe80::/64, the kernel's own
			}
			routes = append(routes, r)
		}
		return err
	})
	return link, routes
}

func TestVersionsAddCheckDel(t *testing.T) {
	for _, ver := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			dataDir := t.TempDir()
			rt := newPodnet(t, podnetList(ver, hostLocal(dataDir, "10.244.1.0/24"), map[string]any{"mtu": 1400}))
			podNS := nettest.NewNetNS(t)
			conf := nettest.RuntimeConf("ctr-"+strings.ReplaceAll(ver, ".", ""), podNS, "eth0",
				[2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", "web-" + ver})

			res, err := rt.Add(conf)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			hostName := veth.HostVethName("default", "web-"+ver, conf.ContainerID, "eth0")

			// The result: host veth, pod interface in its sandbox, a /32.
			if len(res.Interfaces) != 2 || res.Interfaces[0].Name != hostName || res.Interfaces[0].Mac != "ee:ee:ee:ee:ee:ee" {
				t.Fatalf("result interfaces = %+v, want host veth %s first", res.Interfaces, hostName)
			}
			if res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != podNS.Path() {
				t.Fatalf("result pod interface = %+v", res.Interfaces[1])
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.244.1.2/32" || *res.IPs[0].Interface != 1 {
				t.Fatalf("result ips = %+v, want 10.244.1.2/32 on interface 1", res.IPs)
			}

			// The pod side.
			pod := readPod(t, podNS, "eth0")
			wantRoutes := []string{"169.254.1.1/32 scope link", "default via 169.254.1.1"}
			if !slices.Equal(pod.addrs, []string{"10.244.1.2/32"}) || !slices.Equal(pod.routes, wantRoutes) || pod.mtu != 1400 || !pod.up {
				t.Fatalf("pod = %+v, want 10.244.1.2/32, routes %v, mtu 1400, up", pod, wantRoutes)
			}
			if !slices.Equal(pod.neighs, []string{"169.254.1.1 ee:ee:ee:ee:ee:ee permanent"}) {
				t.Fatalf("pod neighbors = %v, want a permanent entry for the gateway", pod.neighs)
			}

			// The host side: MAC, MTU, sysctls, one /32 route with podnet's protocol.
			link, routes := hostVeth(t, rt, hostName)
			if link.Attrs().HardwareAddr.String() != "ee:ee:ee:ee:ee:ee" || link.Attrs().MTU != 1400 || link.Attrs().Flags&net.FlagUp == 0 {
				t.Fatalf("host veth = mac %s mtu %d flags %v", link.Attrs().HardwareAddr, link.Attrs().MTU, link.Attrs().Flags)
			}
			for name, want := range map[string]string{
				"net/ipv4/conf/" + hostName + "/proxy_arp":    "1",
				"net/ipv4/neigh/" + hostName + "/proxy_delay": "0",
				"net/ipv4/conf/" + hostName + "/forwarding":   "1",
			} {
				if got, err := nettest.ReadSysctl(rt.Node.NS, name); err != nil || got != want {
					t.Errorf("%s = %q (%v), want %s", name, got, err, want)
				}
			}
			if len(routes) != 1 || routes[0].Dst.String() != "10.244.1.2/32" || routes[0].Scope != netlink.SCOPE_LINK || routes[0].Protocol != contract.RouteProtocol {
				t.Fatalf("host routes = %v, want 10.244.1.2/32 scope link proto %d", routes, contract.RouteProtocol)
			}

			// Connectivity both ways, with no default route in the node.
			if err := nettest.Ping(podNS, nettest.NodeAddr); err != nil {
				t.Fatal(err)
			}
			if err := nettest.Ping(rt.Node.NS, "10.244.1.2"); err != nil {
				t.Fatal(err)
			}

			if ver != "0.3.1" { // CHECK exists from 0.4.0 on
				if err := rt.Check(conf); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if err := rt.Del(conf); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			assertClean(t, rt, dataDir)
		})
	}
}

func TestTwoPodsOnOneNode(t *testing.T) {
	dataDir := t.TempDir()
	rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.2.0/24"), nil))
	var pods []*nettest.Pod
	for i := range 2 {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf(fmt.Sprintf("two-%d", i), podNS, "eth0")
		res, err := rt.Add(conf)
		if err != nil {
			t.Fatalf("ADD pod %d: %v", i, err)
		}
		pods = append(pods, &nettest.Pod{NS: podNS, RT: conf, Result: res})
	}
	// IPv4-only pods: no IPv6 address on their host veths (the node
	// keeps no link-local address, fe80::/64 route or DAD per pod); the
	// pod's own link-local address is the EUI-64 one of its MAC
	for _, p := range pods {
		if got := ipv6Addrs(t, rt.Node.NS, hostIfName(t, p.Result)); len(got) != 0 {
			t.Errorf("host veth of an IPv4-only pod has IPv6 addresses %v, want none", got)
		}
		if got, want := ipv6Addrs(t, p.NS, "eth0"), []string{podfilter.EUI64LinkLocal(podMAC(t, p.Result)).String() + "/64"}; !slices.Equal(got, want) {
			t.Errorf("eth0 of an IPv4-only pod has IPv6 addresses %v, want %v", got, want)
		}
	}
	a, b := pods[0], pods[1]
	if err := nettest.Ping(a.NS, b.Result.IPs[0].Address.IP.String()); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Ping(b.NS, a.Result.IPs[0].Address.IP.String()); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if err := rt.Del(p.RT); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, rt, dataDir)
}

func TestDualStack(t *testing.T) {
	dataDir := t.TempDir()
	rt := newPodnet(t, podnetList("1.1.0", hostLocal(dataDir, "10.244.3.0/24", "fd00:244:3::/64"), nil))
	podNS := nettest.NewNetNS(t)
	conf := nettest.RuntimeConf("dual", podNS, "eth0")
	res, err := rt.Add(conf)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if len(res.IPs) != 2 || res.IPs[1].Address.String() != "fd00:244:3::2/128" || !res.IPs[1].Gateway.Equal(net.ParseIP(veth.GatewayV6)) {
		t.Fatalf("result ips = %+v", res.IPs)
	}
	pod := readPod(t, podNS, "eth0")
	if !slices.Equal(pod.addrs, []string{"10.244.3.2/32", "fd00:244:3::2/128"}) {
		t.Fatalf("pod addresses = %v", pod.addrs)
	}
	if !slices.Contains(pod.routes, "default via "+veth.GatewayV6) {
		t.Fatalf("pod routes = %v, want an IPv6 default via %s", pod.routes, veth.GatewayV6)
	}
	// the host veth's one IPv6 address is the pod's gateway (none of the
	// kernel's making); the pod's link-local one is the EUI-64 one of its
	// MAC, which the pod filter lets it send from
	if got := ipv6Addrs(t, rt.Node.NS, hostIfName(t, res)); !slices.Equal(got, []string{veth.GatewayV6 + "/64"}) {
		t.Errorf("host veth IPv6 addresses %v, want only %s/64", got, veth.GatewayV6)
	}
	if got, want := ipv6Addrs(t, podNS, "eth0"), []string{"fd00:244:3::2/128", podfilter.EUI64LinkLocal(podMAC(t, res)).String() + "/64"}; !slices.Equal(got, want) {
		t.Errorf("pod IPv6 addresses %v, want %v", got, want)
	}
	if err := nettest.Ping(podNS, nettest.NodeAddr6); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Ping(rt.Node.NS, "fd00:244:3::2"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Check(conf); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := rt.Del(conf); err != nil {
		t.Fatal(err)
	}
	assertClean(t, rt, dataDir)
}

// hostIfName is the host veth of an ADD result (not the bridge).
func hostIfName(t *testing.T, res *current.Result) string {
	t.Helper()
	for _, iface := range res.Interfaces {
		if iface.Sandbox == "" && contract.IsHostVeth(iface.Name) {
			return iface.Name
		}
	}
	t.Fatalf("result %v has no host veth", res)
	return ""
}

// podMAC is the MAC of the pod interface of an ADD result.
func podMAC(t *testing.T, res *current.Result) net.HardwareAddr {
	t.Helper()
	for _, iface := range res.Interfaces {
		if iface.Sandbox != "" {
			mac, err := net.ParseMAC(iface.Mac)
			if err != nil {
				t.Fatalf("pod interface MAC %q: %v", iface.Mac, err)
			}
			return mac
		}
	}
	t.Fatalf("result %v has no pod interface", res)
	return nil
}

// ipv6Addrs lists the IPv6 addresses of link name in netns ("ip/len",
// in the kernel's order).
func ipv6Addrs(t *testing.T, netns ns.NetNS, name string) []string {
	t.Helper()
	var out []string
	if err := netns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
		for _, a := range addrs {
			out = append(out, a.IPNet.String())
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMTUSources(t *testing.T) {
	t.Run("node state file", func(t *testing.T) {
		dataDir, stateDir := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(stateDir, "node.json"), []byte(`{"mtu": 1430}`), 0o644); err != nil {
			t.Fatal(err)
		}
		rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.4.0/24"), map[string]any{"stateDir": stateDir}))
		podNS := nettest.NewNetNS(t)
		if _, err := rt.Add(nettest.RuntimeConf("mtu-state", podNS, "eth0")); err != nil {
			t.Fatal(err)
		}
		if got := readPod(t, podNS, "eth0").mtu; got != 1430 {
			t.Fatalf("pod MTU = %d, want 1430 from node.json", got)
		}
	})
	t.Run("config wins over state file", func(t *testing.T) {
		dataDir, stateDir := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(stateDir, "node.json"), []byte(`{"mtu": 1430}`), 0o644); err != nil {
			t.Fatal(err)
		}
		rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.4.0/24"), map[string]any{"stateDir": stateDir, "mtu": 1300}))
		podNS := nettest.NewNetNS(t)
		if _, err := rt.Add(nettest.RuntimeConf("mtu-conf", podNS, "eth0")); err != nil {
			t.Fatal(err)
		}
		if got := readPod(t, podNS, "eth0").mtu; got != 1300 {
			t.Fatalf("pod MTU = %d, want 1300 from the config", got)
		}
	})
	t.Run("underlay default route", func(t *testing.T) {
		dataDir := t.TempDir()
		rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.4.0/24"), map[string]any{"stateDir": t.TempDir()}))
		// The node's uplink: a veth with MTU 9000 carrying the default route.
		rt.Node.Do(func() error {
			up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0", MTU: 9000}, PeerName: "uplink1"}
			if err := netlink.LinkAdd(up); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(up); err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("172.30.0.2/24")
			if err := netlink.AddrAdd(up, addr); err != nil {
				return err
			}
			return netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP("172.30.0.1")})
		})
		podNS := nettest.NewNetNS(t)
		if _, err := rt.Add(nettest.RuntimeConf("mtu-underlay", podNS, "eth0")); err != nil {
			t.Fatal(err)
		}
		if got := readPod(t, podNS, "eth0").mtu; got != 9000 {
			t.Fatalf("pod MTU = %d, want 9000 from the default-route interface", got)
		}
	})
}

func TestDelIsIdempotent(t *testing.T) {
	dataDir := t.TempDir()
	rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.5.0/24"), nil))

	t.Run("twice", func(t *testing.T) {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf("del-twice", podNS, "eth0")
		if _, err := rt.Add(conf); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := rt.Del(conf); err != nil {
				t.Fatalf("DEL %d: %v", i+1, err)
			}
		}
		assertClean(t, rt, dataDir)
	})
	t.Run("netns deleted first", func(t *testing.T) {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf("del-nonetns", podNS, "eth0")
		if _, err := rt.Add(conf); err != nil {
			t.Fatal(err)
		}
		podNS.Close()
		if err := nettest.RemoveNetNS(podNS); err != nil {
			t.Fatal(err)
		}
		if err := rt.Del(conf); err != nil {
			t.Fatalf("DEL with the netns gone: %v", err)
		}
		assertClean(t, rt, dataDir)
	})
	t.Run("no prevResult then empty CNI_NETNS", func(t *testing.T) {
		// containerd: stop (netns + prevResult), then remove (neither).
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf("del-noprev", podNS, "eth0", [2]string{"K8S_POD_NAMESPACE", "ns1"}, [2]string{"K8S_POD_NAME", "p1"})
		if _, err := rt.Add(conf); err != nil {
			t.Fatal(err)
		}
		rt.ForgetCache(t)
		if err := rt.Del(conf); err != nil {
			t.Fatalf("DEL without prevResult: %v", err)
		}
		assertClean(t, rt, dataDir)
		empty := *conf
		empty.NetNS = ""
		if err := rt.Del(&empty); err != nil {
			t.Fatalf("DEL with empty CNI_NETNS: %v", err)
		}
		assertClean(t, rt, dataDir)
	})
	t.Run("empty CNI_NETNS while the pod exists", func(t *testing.T) {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf("del-emptyns", podNS, "eth0")
		if _, err := rt.Add(conf); err != nil {
			t.Fatal(err)
		}
		empty := *conf
		empty.NetNS = ""
		if err := rt.Del(&empty); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		assertClean(t, rt, dataDir)
		if err := podNS.Do(func(ns.NetNS) error {
			if _, err := netlink.LinkByName("eth0"); err == nil {
				return fmt.Errorf("eth0 still in the pod")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCheckDetectsDrift(t *testing.T) {
	breakages := []struct {
		name    string
		inNode  bool
		breakIt func(hostName string) error
		wantMsg string
	}{
		{"host route deleted", true, func(h string) error {
			l, err := netlink.LinkByName(h)
			if err != nil {
				return err
			}
			return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: nettest.MustParseCIDR("10.244.6.2/32"), Scope: netlink.SCOPE_LINK})
		}, "host route 10.244.6.2/32"},
		{"host veth down", true, func(h string) error {
			l, err := netlink.LinkByName(h)
			if err != nil {
				return err
			}
			return netlink.LinkSetDown(l)
		}, "is down"},
		{"pod address removed", false, func(string) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrDel(l, &netlink.Addr{IPNet: nettest.MustParseCIDR("10.244.6.2/32")})
		}, "missing address 10.244.6.2/32"},
		{"pod default route removed", false, func(string) error {
			return netlink.RouteDel(&netlink.Route{Dst: nettest.MustParseCIDR("0.0.0.0/0")})
		}, "route 0.0.0.0/0 via 169.254.1.1 is missing"},
		// the IPv6 half of the dual-stack pod
		{"host route v6 deleted", true, func(h string) error {
			l, err := netlink.LinkByName(h)
			if err != nil {
				return err
			}
			return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: nettest.MustParseCIDR("fd00:6::2/128")})
		}, "host route fd00:6::2/128"},
		{"host veth v6 gateway removed", true, func(h string) error {
			l, err := netlink.LinkByName(h)
			if err != nil {
				return err
			}
			return netlink.AddrDel(l, &netlink.Addr{IPNet: nettest.MustParseCIDR(veth.GatewayV6 + "/64")})
		}, "missing the pod's IPv6 gateway address"},
		{"host veth v6 forwarding off", true, func(h string) error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/"+h+"/forwarding", []byte("0"), 0o644)
		}, "IPv6 forwarding"},
		{"pod v6 address removed", false, func(string) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrDel(l, &netlink.Addr{IPNet: nettest.MustParseCIDR("fd00:6::2/128")})
		}, "missing address fd00:6::2/128"},
		{"pod v6 default route removed", false, func(string) error {
			return netlink.RouteDel(&netlink.Route{Dst: nettest.MustParseCIDR("::/0")})
		}, "route ::/0 via " + veth.GatewayV6 + " is missing"},
	}
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			dataDir := t.TempDir()
			rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.6.0/24", "fd00:6::/64"), nil))
			podNS := nettest.NewNetNS(t)
			conf := nettest.RuntimeConf("check", podNS, "eth0")
			if _, err := rt.Add(conf); err != nil {
				t.Fatal(err)
			}
			if err := rt.Check(conf); err != nil {
				t.Fatalf("CHECK of a healthy pod: %v", err)
			}
			hostName := veth.HostVethName("", "", "check", "eth0")
			target := podNS
			if b.inNode {
				target = rt.Node.NS
			}
			if err := target.Do(func(ns.NetNS) error { return b.breakIt(hostName) }); err != nil {
				t.Fatal(err)
			}
			err := rt.Check(conf)
			if err == nil || !strings.Contains(err.Error(), b.wantMsg) {
				t.Fatalf("CHECK after %s = %v, want an error containing %q", b.name, err, b.wantMsg)
			}
			if err := rt.Del(conf); err != nil {
				t.Fatal(err)
			}
			assertClean(t, rt, dataDir)
		})
	}
}

func TestGCRemovesStaleAttachments(t *testing.T) {
	dataDir := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "ipam.log")
	// fakeipam hands out one fixed address; GC of podnet is what is tested,
	// and the log proves GC reaches the IPAM plugin.
	ipam := func(ip string) string {
		return fmt.Sprintf(`{"type":"fakeipam","ips":[%q],"log":%q}`, ip, logFile)
	}
	_ = dataDir
	node := nettest.NewNode(t)
	bin := nettest.BinDir(t, "podnet")
	var rts []*nettest.Runtime
	var pods []*nettest.Pod
	for i := range 3 {
		rt := nettest.NewRuntime(t, node, podnetList("1.1.0", ipam(fmt.Sprintf("10.244.7.%d/24", 10+i)), nil), bin, fakeIPAMDir)
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf(fmt.Sprintf("gc-%d", i), podNS, "eth0")
		res, err := rt.Add(conf)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, rt)
		pods = append(pods, &nettest.Pod{NS: podNS, RT: conf, Result: res})
	}
	// A fresh runtime without cached attachments: only the plugin's GC acts.
	gcRT := nettest.NewRuntime(t, node, podnetList("1.1.0", ipam("10.244.7.99/24"), nil), bin, fakeIPAMDir)
	if err := gcRT.GC([]types.GCAttachment{{ContainerID: "gc-1", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	links := node.Links()
	keep := veth.HostVethName("", "", "gc-1", "eth0")
	if !slices.Equal(links, []string{keep}) {
		t.Fatalf("links after GC = %v, want only %s", links, keep)
	}
	routes := node.RoutesWithProto(contract.RouteProtocol)
	if len(routes) != 1 || routes[0].Dst.String() != "10.244.7.11/32" {
		t.Fatalf("podnet routes after GC = %v, want only 10.244.7.11/32", routes)
	}
	if err := nettest.Ping(node.NS, "10.244.7.11"); err != nil {
		t.Fatalf("the kept pod must still work: %v", err)
	}
	log, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(log), "GC ") {
		t.Fatalf("IPAM log = %q (%v), want a GC call", log, err)
	}
	// An empty list releases everything.
	if err := gcRT.GC(nil); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if links := node.Links(); len(links) > 0 {
		t.Fatalf("links after GC of everything = %v", links)
	}
	_ = rts
}

func TestStatus(t *testing.T) {
	dataDir := t.TempDir()
	t.Run("ready with host-local", func(t *testing.T) {
		rt := newPodnet(t, podnetList("1.1.0", hostLocal(dataDir, "10.244.8.0/24"), nil))
		if err := rt.Status(); err != nil {
			t.Fatalf("STATUS: %v", err)
		}
	})
	t.Run("IPAM not ready", func(t *testing.T) {
		rt := newPodnet(t, podnetList("1.1.0", `{"type":"fakeipam","fail":{"STATUS":{"code":50,"msg":"no usable range"}}}`, nil))
		err := rt.Status()
		if e := nettest.CNIError(err); e == nil || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "no usable range") {
			t.Fatalf("STATUS = %v, want code 50 mentioning the IPAM reason", err)
		}
	})
	t.Run("IPAM plugin missing", func(t *testing.T) {
		rt := newPodnet(t, podnetList("1.1.0", `{"type":"no-such-ipam"}`, nil))
		err := rt.Status()
		if e := nettest.CNIError(err); e == nil || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "no-such-ipam") {
			t.Fatalf("STATUS = %v, want code 50 naming the missing plugin", err)
		}
	})
}

func TestConflictingHostRoute(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "ipam.log")
	rt := newPodnet(t, podnetList("1.0.0", fmt.Sprintf(`{"type":"fakeipam","ips":["10.244.9.5/24"],"log":%q}`, logFile), nil))
	// Something else already routes the pod's address.
	rt.Node.Do(func() error {
		other := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "other0"}, PeerName: "other1"}
		if err := netlink.LinkAdd(other); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(other); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: other.Attrs().Index, Dst: nettest.MustParseCIDR("10.244.9.5/32"), Scope: netlink.SCOPE_LINK})
	})
	podNS := nettest.NewNetNS(t)
	_, err := rt.Add(nettest.RuntimeConf("conflict", podNS, "eth0"))
	if err == nil || !strings.Contains(err.Error(), "other0") {
		t.Fatalf("ADD = %v, want an error naming other0", err)
	}
	links := rt.Node.Links()
	slices.Sort(links)
	if !slices.Equal(links, []string{"other0", "other1"}) {
		t.Fatalf("links after failed ADD = %v, want only the pre-existing pair", links)
	}
	log, _ := os.ReadFile(logFile)
	if !strings.Contains(string(log), "DEL conflict eth0") {
		t.Fatalf("IPAM log = %q: the address was not released", log)
	}
}

func TestStaleVethOfSamePodIsReplaced(t *testing.T) {
	dataDir := t.TempDir()
	rt := newPodnet(t, podnetList("1.0.0", hostLocal(dataDir, "10.244.10.0/24"), nil))
	args := [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "db-0"}}
	old := nettest.RuntimeConf("sandbox-old", nettest.NewNetNS(t), "eth0", args...)
	if _, err := rt.Add(old); err != nil {
		t.Fatal(err)
	}
	// The runtime never sent DEL for the old sandbox; the pod is recreated.
	newNS := nettest.NewNetNS(t)
	fresh := nettest.RuntimeConf("sandbox-new", newNS, "eth0", args...)
	res, err := rt.Add(fresh)
	if err != nil {
		t.Fatalf("ADD of the recreated pod: %v", err)
	}
	if err := nettest.Ping(rt.Node.NS, res.IPs[0].Address.IP.String()); err != nil {
		t.Fatal(err)
	}
	// The late DEL of the old sandbox must not touch the new pod's veth.
	if err := rt.Del(old); err != nil {
		t.Fatal(err)
	}
	if err := rt.Check(fresh); err != nil {
		t.Fatalf("CHECK of the new pod after the old sandbox's DEL: %v", err)
	}
	if err := rt.Del(fresh); err != nil {
		t.Fatal(err)
	}
	assertClean(t, rt, dataDir)
}

func TestChainedPrevResult(t *testing.T) {
	dataDir := t.TempDir()
	node := nettest.NewNode(t)
	bin := nettest.BinDir(t, "podnet")
	prev := `{"cniVersion":"1.0.0","interfaces":[{"name":"net1","sandbox":"/x"}],"ips":[{"address":"192.0.2.7/24","interface":0}],"dns":{"nameservers":["192.0.2.53"]}}`
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"podnet","type":"podnet","ipam":%s,"prevResult":%s}`, hostLocal(dataDir, "10.244.11.0/24"), prev)
	cfg, err := libcni.NetworkPluginConfFromBytes([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin, nettest.RefToolsDir(t)}, t.TempDir(), nil)
	podNS := nettest.NewNetNS(t)
	var raw types.Result
	rtc := nettest.RuntimeConf("chained", podNS, "eth0")
	if err := node.NS.Do(func(ns.NetNS) error {
		raw, err = cni.AddNetwork(t.Context(), cfg, rtc)
		return err
	}); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	res, err := current.NewResultFromResult(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Interfaces) != 3 || res.Interfaces[0].Name != "net1" || res.Interfaces[2].Name != "eth0" {
		t.Fatalf("interfaces = %+v, want prevResult's net1 then host veth and eth0", res.Interfaces)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != "192.0.2.7/24" || *res.IPs[1].Interface != 2 {
		t.Fatalf("ips = %+v, want prevResult's address kept and ours on interface 2", res.IPs)
	}
	if len(res.DNS.Nameservers) != 1 {
		t.Fatalf("dns = %+v, want prevResult's kept", res.DNS)
	}
	if err := node.NS.Do(func(ns.NetNS) error { return cni.DelNetwork(t.Context(), cfg, rtc) }); err != nil {
		t.Fatal(err)
	}
}

// TestVethQueueCounts: both plugins create each end of the veth pair with
// one TX and one RX queue. Without a count the kernel gives a veth one queue
// per possible CPU and then cuts the count in use back to one, waiting out
// an expedited RCU grace period under the RTNL lock for each end; asking for
// one skips that. (On a one-CPU machine the default is one too, and this
// test could not tell.)
func TestVethQueueCounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		rt   func(t *testing.T) *nettest.Runtime
	}{
		{"podnet", func(t *testing.T) *nettest.Runtime {
			return newPodnet(t, podnetList("1.0.0", hostLocal(t.TempDir(), "10.244.6.0/24"), map[string]any{"stateDir": t.TempDir()}))
		}},
		{"podnet-bridge", func(t *testing.T) *nettest.Runtime {
			return newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(t.TempDir(), "10.244.7.0/24"), nil))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := tc.rt(t)
			podNS := nettest.NewNetNS(t)
			if _, err := rt.Add(nettest.RuntimeConf("queues", podNS, "eth0")); err != nil {
				t.Fatal(err)
			}
			queues := func(where string, l netlink.Link) {
				t.Helper()
				a := l.Attrs()
				if a.NumTxQueues != 1 || a.NumRxQueues != 1 {
					t.Errorf("%s end %s: %d TX and %d RX queues, want 1 and 1", where, a.Name, a.NumTxQueues, a.NumRxQueues)
				}
			}
			rt.Node.Do(func() error {
				l, err := netlink.LinkByName(veth.HostVethName("", "", "queues", "eth0"))
				if err != nil {
					return err
				}
				queues("host", l)
				return nil
			})
			if err := podNS.Do(func(ns.NetNS) error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				queues("pod", l)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
