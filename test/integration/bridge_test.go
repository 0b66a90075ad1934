package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// The podnet-bridge tests exec bin/podnet-bridge through libcni inside a
// node netns, with pods in their own netns, like TestVersionsAddCheckDel does
// for podnet. Each test uses its own 10.210.N.0/24.

// brNetwork is the network name of the podnet-bridge conflists.
const brNetwork = "podnet-br"

// bridgeList renders a one-plugin podnet-bridge conflist. ipam is the JSON
// of the "ipam" object; extra holds more top-level plugin keys. Unless extra
// sets "stateDir", it is a private empty directory, so that no node.json of
// the machine is read (the MTU is then 1500: the node netns has no default
// route).
func bridgeList(t *testing.T, cniVersion, ipam string, extra map[string]any) string {
	t.Helper()
	withState := map[string]any{"stateDir": t.TempDir()}
	for k, v := range extra {
		withState[k] = v
	}
	return pluginList(brNetwork, "podnet-bridge", cniVersion, ipam, withState)
}

// brIPAM is the ipam JSON of podnet-ipam over subnets (one range set
// each), with its store in dataDir.
func brIPAM(dataDir string, subnets ...string) string {
	return rangesIPAM("podnet-ipam", dataDir, subnets...)
}

// brPaths are the plugin directories of the bridge tests: the podnet
// binaries, the reference plugins (host-local) and fakeipam.
func brPaths(t *testing.T) []string {
	t.Helper()
	return []string{nettest.BinDir(t, "podnet-bridge", "podnet-ipam"), nettest.RefToolsDir(t), fakeIPAMDir}
}

// newBridgeRuntime prepares a fresh node and a libcni runtime for conflist.
func newBridgeRuntime(t *testing.T, conflist string) *nettest.Runtime {
	t.Helper()
	return nettest.NewRuntime(t, nettest.NewNode(t), conflist, brPaths(t)...)
}

// brReservations lists the addresses IPAM holds for brNetwork in dataDir:
// host-local's <dataDir>/<network>/<ip> and podnet-ipam's
// <dataDir>/<network>/ips/<ip>.
func brReservations(t *testing.T, dataDir string) []string {
	t.Helper()
	var ips []string
	for _, dir := range []string{filepath.Join(dataDir, brNetwork), filepath.Join(dataDir, brNetwork, "ips")} {
		entries, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			if net.ParseIP(e.Name()) != nil {
				ips = append(ips, e.Name())
			}
		}
	}
	slices.Sort(ips)
	return ips
}

// brNode is what the node netns holds, as the bridge tests see it.
type brNode struct {
	bridges []string // links of type bridge
	bridge  netlink.Link
	gwAddrs []string // global addresses on the bridge ("ip/len")
	ports   []string // links whose master is the bridge
	veths   []string // veths in the node
	others  []string // links that are neither lo, a bridge nor a veth
}

// readBrNode reads the node's links; bridgeName is the bridge to describe.
func readBrNode(t *testing.T, node *nettest.Node, bridgeName string) brNode {
	t.Helper()
	var st brNode
	node.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var live []netlink.Link
		for _, l := range links {
			if !veth.IsDetached(l) { // see nettest.LinkNames
				live = append(live, l)
			}
		}
		links = live
		for _, l := range links {
			switch l.(type) {
			case *netlink.Bridge:
				st.bridges = append(st.bridges, l.Attrs().Name)
				if l.Attrs().Name == bridgeName {
					st.bridge = l
				}
			case *netlink.Veth:
				st.veths = append(st.veths, l.Attrs().Name)
			default:
				if l.Attrs().Name != "lo" {
					st.others = append(st.others, l.Attrs().Name)
				}
			}
		}
		if st.bridge == nil {
			return nil
		}
		for _, l := range links {
			if l.Attrs().MasterIndex == st.bridge.Attrs().Index {
				st.ports = append(st.ports, l.Attrs().Name)
			}
		}
		addrs, err := netlink.AddrList(st.bridge, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if !a.IP.IsLinkLocalUnicast() {
				st.gwAddrs = append(st.gwAddrs, a.IPNet.String())
			}
		}
		return nil
	})
	slices.Sort(st.ports)
	slices.Sort(st.veths)
	return st
}

// brPodLinks lists the links of podNS other than lo.
func brPodLinks(t *testing.T, podNS ns.NetNS) []string {
	t.Helper()
	names, err := nettest.LinkNames(podNS)
	if err != nil {
		t.Fatalf("list links of %s: %v", podNS.Path(), err)
	}
	return names
}

// assertBridgeClean fails unless the node holds no veth, no link other than
// bridges, no podnet route, and IPAM no reservation. The bridge itself is
// shared by the pods and outlives the last one.
func assertBridgeClean(t *testing.T, rt *nettest.Runtime, dataDir string) {
	t.Helper()
	st := readBrNode(t, rt.Node, veth.DefaultBridge)
	if len(st.veths) > 0 || len(st.others) > 0 {
		t.Errorf("links left in node netns: veths %v, others %v", st.veths, st.others)
	}
	if len(st.ports) > 0 {
		t.Errorf("bridge ports left: %v", st.ports)
	}
	if routes := rt.Node.RoutesWithProto(contract.RouteProtocol); len(routes) > 0 {
		t.Errorf("podnet routes left in node netns: %v", routes)
	}
	if r := brReservations(t, dataDir); len(r) > 0 {
		t.Errorf("IPAM reservations left: %v", r)
	}
}

// addBridgePod creates a pod netns and attaches it as containerID/eth0.
func addBridgePod(t *testing.T, rt *nettest.Runtime, containerID string) *nettest.Pod {
	t.Helper()
	podNS := nettest.NewNetNS(t)
	conf := nettest.RuntimeConf(containerID, podNS, "eth0")
	res, err := rt.Add(conf)
	if err != nil {
		t.Fatalf("ADD %s: %v", containerID, err)
	}
	return &nettest.Pod{NS: podNS, RT: conf, Result: res}
}

func brPodIP(p *nettest.Pod) string { return p.Result.IPs[0].Address.IP.String() }

func bridgeHostVeth(containerID string) string {
	return veth.HostVethName("", "", containerID, "eth0")
}

// TestBridgeConcurrentAdds runs 16 ADDs at once on a fresh node: they must
// all succeed and share one bridge that carries the gateway once and has
// the 16 host veths as ports, and whose MAC, the one every result reports,
// stays put; the pods reach each other and the gateway. Then 16 concurrent
// DELs leave the bridge (gateway and MAC unchanged) with no port and IPAM
// empty.
func TestBridgeConcurrentAdds(t *testing.T) {
	const n = 16
	const gw = "10.210.1.1"
	dataDir := t.TempDir()
	rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.1.0/24"), nil))
	pods := make([]*nettest.Pod, n)
	for i := range pods {
		podNS := nettest.NewNetNS(t)
		pods[i] = &nettest.Pod{NS: podNS, RT: nettest.RuntimeConf(fmt.Sprintf("conc-%02d", i), podNS, "eth0")}
	}

	errs := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range pods {
		wg.Go(func() {
			t0 := time.Now()
			p.Result, errs[i] = rt.Add(p.RT)
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	t.Logf("%d concurrent ADDs: %v wall, slowest %v", n, time.Since(start).Round(time.Millisecond), slices.Max(took).Round(time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %s: %v", pods[i].RT.ContainerID, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	st := readBrNode(t, rt.Node, veth.DefaultBridge)
	if !slices.Equal(st.bridges, []string{veth.DefaultBridge}) {
		t.Fatalf("bridges in the node = %v, want exactly [%s]", st.bridges, veth.DefaultBridge)
	}
	if !slices.Equal(st.gwAddrs, []string{gw + "/24"}) {
		t.Errorf("bridge addresses = %v, want the gateway %s/24 exactly once", st.gwAddrs, gw)
	}
	if st.bridge.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("bridge %s is down", veth.DefaultBridge)
	}
	var wantPorts []string
	for _, p := range pods {
		wantPorts = append(wantPorts, bridgeHostVeth(p.RT.ContainerID))
	}
	slices.Sort(wantPorts)
	if !slices.Equal(st.ports, wantPorts) || !slices.Equal(st.veths, wantPorts) {
		t.Errorf("bridge ports = %v, node veths = %v, want the %d host veths %v", st.ports, st.veths, n, wantPorts)
	}
	if len(st.others) > 0 {
		t.Errorf("unexpected links in the node: %v", st.others)
	}
	// The gateway's MAC must not follow the ports (a bridge takes the
	// lowest port MAC unless its own is set): the results report it and
	// the pods cache it.
	brMAC := st.bridge.Attrs().HardwareAddr.String()
	if fwd, err := nettest.ReadSysctl(rt.Node.NS, "net/ipv4/conf/"+veth.DefaultBridge+"/forwarding"); err != nil || fwd != "1" {
		t.Errorf("forwarding on the bridge = %q (%v), want 1", fwd, err)
	}

	_, subnet, _ := net.ParseCIDR("10.210.1.0/24")
	seen := map[string]string{}
	for _, p := range pods {
		res := p.Result
		if len(res.Interfaces) != 3 || res.Interfaces[0].Name != veth.DefaultBridge || res.Interfaces[0].Mac != brMAC ||
			res.Interfaces[1].Name != bridgeHostVeth(p.RT.ContainerID) || res.Interfaces[2].Name != "eth0" || res.Interfaces[2].Sandbox != p.NS.Path() {
			t.Errorf("%s: result interfaces = %+v, want bridge (MAC %s), host veth, eth0 in the pod", p.RT.ContainerID, res.Interfaces, brMAC)
			continue
		}
		if len(res.IPs) != 1 || *res.IPs[0].Interface != 2 || !res.IPs[0].Gateway.Equal(net.ParseIP(gw)) {
			t.Errorf("%s: result ips = %+v, want one address on interface 2 with gateway %s", p.RT.ContainerID, res.IPs, gw)
			continue
		}
		ip := brPodIP(p)
		if other, dup := seen[ip]; dup {
			t.Errorf("%s and %s both got %s", other, p.RT.ContainerID, ip)
		}
		seen[ip] = p.RT.ContainerID
		if ones, _ := res.IPs[0].Address.Mask.Size(); ones != 24 || !subnet.Contains(res.IPs[0].Address.IP) || ip == gw {
			t.Errorf("%s: address %s, want a /24 in %s other than the gateway", p.RT.ContainerID, res.IPs[0].Address.String(), subnet)
		}
		pod := readPod(t, p.NS, "eth0")
		if !slices.Equal(pod.addrs, []string{ip + "/24"}) || !slices.Contains(pod.routes, "default via "+gw) || !pod.up || pod.mtu != 1500 {
			t.Errorf("%s: pod = %+v, want %s/24, a default route via %s, up, mtu 1500", p.RT.ContainerID, pod, ip, gw)
		}
	}
	if got := brReservations(t, dataDir); len(got) != n {
		t.Errorf("IPAM holds %d reservations (%v), want %d", len(got), got, n)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every pod reaches the gateway; a sample of pairs reach each other:
	// each pod its neighbor in both directions, and a few far pairs.
	start = time.Now()
	pings := 0
	for _, p := range pods {
		if err := nettest.Ping(p.NS, gw); err != nil {
			t.Error(err)
		}
		pings++
	}
	pairs := [][2]int{{0, 15}, {3, 11}, {7, 8}, {12, 1}, {5, 10}}
	for i := range n {
		pairs = append(pairs, [2]int{i, (i + 1) % n})
	}
	for _, pr := range pairs {
		if err := nettest.Ping(pods[pr[0]].NS, brPodIP(pods[pr[1]])); err != nil {
			t.Error(err)
		}
		pings++
	}
	t.Logf("%d pings in %v", pings, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	for i, p := range pods {
		wg.Go(func() { errs[i] = rt.Del(p.RT) })
	}
	wg.Wait()
	t.Logf("%d concurrent DELs: %v wall", n, time.Since(start).Round(time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL %s: %v", pods[i].RT.ContainerID, err)
		}
	}
	assertBridgeClean(t, rt, dataDir)
	st = readBrNode(t, rt.Node, veth.DefaultBridge)
	if st.bridge == nil || !slices.Equal(st.gwAddrs, []string{gw + "/24"}) {
		t.Fatalf("after the last DEL: bridge %v with addresses %v, want %s kept with %s/24", st.bridges, st.gwAddrs, veth.DefaultBridge, gw)
	}
	if got := st.bridge.Attrs().HardwareAddr.String(); got != brMAC {
		t.Errorf("bridge MAC changed from %s to %s when the ports left", brMAC, got)
	}
	for _, p := range pods {
		if links := brPodLinks(t, p.NS); len(links) > 0 {
			t.Errorf("%s: links left in the pod: %v", p.RT.ContainerID, links)
		}
	}
}

// TestBridgeHairpin checks the hairpin flag of the bridge port as the kernel
// reports it (IFLA_BRPORT_MODE in the AF_BRIDGE link attributes).
func TestBridgeHairpin(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string]any
		want  bool
	}{
		{"true", map[string]any{"hairpinMode": true}, true},
		{"false", map[string]any{"hairpinMode": false}, false},
		{"unset", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.2.0/24"), tc.extra))
			p := addBridgePod(t, rt, "hairpin-"+tc.name)
			var pi netlink.Protinfo
			rt.Node.Do(func() error {
				l, err := netlink.LinkByName(bridgeHostVeth(p.RT.ContainerID))
				if err != nil {
					return err
				}
				pi, err = netlink.LinkGetProtinfo(l)
				return err
			})
			if pi.Hairpin != tc.want {
				t.Fatalf("hairpin of the bridge port = %v (%s), want %v", pi.Hairpin, pi.String(), tc.want)
			}
			if err := rt.Del(p.RT); err != nil {
				t.Fatal(err)
			}
			assertBridgeClean(t, rt, dataDir)
		})
	}
}

// TestBridgeCheck: CHECK passes on a healthy pod and names what drifted.
func TestBridgeCheck(t *testing.T) {
	const gw = "10.210.3.1"
	for _, b := range []struct {
		name    string
		inNode  bool
		breakIt func(hostName string) error
		wantMsg string
	}{
		{"host veth detached from the bridge", true, func(h string) error {
			l, err := netlink.LinkByName(h)
			if err != nil {
				return err
			}
			return netlink.LinkSetNoMaster(l)
		}, "is not attached to bridge " + veth.DefaultBridge},
		{"pod default route removed", false, func(string) error {
			return netlink.RouteDel(&netlink.Route{Dst: nettest.MustParseCIDR("0.0.0.0/0")})
		}, "route 0.0.0.0/0 via " + gw + " is missing"},
	} {
		t.Run(b.name, func(t *testing.T) {
			dataDir := t.TempDir()
			rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.3.0/24"), nil))
			p := addBridgePod(t, rt, "check")
			if err := rt.Check(p.RT); err != nil {
				t.Fatalf("CHECK of a healthy pod: %v", err)
			}
			target := p.NS
			if b.inNode {
				target = rt.Node.NS
			}
			if err := target.Do(func(ns.NetNS) error { return b.breakIt(bridgeHostVeth("check")) }); err != nil {
				t.Fatal(err)
			}
			err := rt.Check(p.RT)
			if err == nil || !strings.Contains(err.Error(), b.wantMsg) {
				t.Fatalf("CHECK after %s = %v, want an error containing %q", b.name, err, b.wantMsg)
			}
			if err := rt.Del(p.RT); err != nil {
				t.Fatal(err)
			}
			assertBridgeClean(t, rt, dataDir)
		})
	}
}

// TestBridgeDel: DEL is idempotent and works without prevResult, without
// CNI_NETNS and after the pod netns is gone.
func TestBridgeDel(t *testing.T) {
	dataDir := t.TempDir()
	rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.4.0/24"), nil))

	t.Run("twice", func(t *testing.T) {
		p := addBridgePod(t, rt, "del-twice")
		for i := range 2 {
			if err := rt.Del(p.RT); err != nil {
				t.Fatalf("DEL %d: %v", i+1, err)
			}
		}
		assertBridgeClean(t, rt, dataDir)
	})
	t.Run("no prevResult and empty CNI_NETNS", func(t *testing.T) {
		p := addBridgePod(t, rt, "del-noprev")
		rt.ForgetCache(t)
		empty := *p.RT
		empty.NetNS = ""
		if err := rt.Del(&empty); err != nil {
			t.Fatalf("DEL without prevResult and CNI_NETNS: %v", err)
		}
		assertBridgeClean(t, rt, dataDir)
		if links := brPodLinks(t, p.NS); len(links) > 0 {
			t.Errorf("links left in the pod: %v", links)
		}
	})
	t.Run("netns deleted first", func(t *testing.T) {
		p := addBridgePod(t, rt, "del-nonetns")
		p.NS.Close()
		if err := nettest.RemoveNetNS(p.NS); err != nil {
			t.Fatal(err)
		}
		if err := rt.Del(p.RT); err != nil {
			t.Fatalf("DEL with the netns gone: %v", err)
		}
		assertBridgeClean(t, rt, dataDir)
	})
	if st := readBrNode(t, rt.Node, veth.DefaultBridge); st.bridge == nil {
		t.Errorf("bridge %s gone after the DELs (bridges %v)", veth.DefaultBridge, st.bridges)
	}
}

// TestBridgeGC: GC from a runtime without cached attachments removes the
// veths and reservations of every attachment but the valid ones.
func TestBridgeGC(t *testing.T) {
	const gw = "10.210.5.1"
	dataDir := t.TempDir()
	conflist := bridgeList(t, "1.1.0", brIPAM(dataDir, "10.210.5.0/24"), nil)
	rt := newBridgeRuntime(t, conflist)
	var pods []*nettest.Pod
	for i := range 3 {
		pods = append(pods, addBridgePod(t, rt, fmt.Sprintf("gc-%d", i)))
	}
	kept := pods[1]
	gcRT := nettest.NewRuntime(t, rt.Node, conflist, brPaths(t)...)
	if err := gcRT.GC([]types.GCAttachment{{ContainerID: kept.RT.ContainerID, IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	st := readBrNode(t, rt.Node, veth.DefaultBridge)
	want := []string{bridgeHostVeth(kept.RT.ContainerID)}
	if !slices.Equal(st.veths, want) || !slices.Equal(st.ports, want) {
		t.Fatalf("after GC: veths %v, bridge ports %v, want only %v", st.veths, st.ports, want)
	}
	if got := brReservations(t, dataDir); !slices.Equal(got, []string{brPodIP(kept)}) {
		t.Errorf("reservations after GC = %v, want only the kept pod's %s", got, brPodIP(kept))
	}
	for _, p := range []*nettest.Pod{pods[0], pods[2]} {
		if links := brPodLinks(t, p.NS); len(links) > 0 {
			t.Errorf("%s: links left in the collected pod: %v", p.RT.ContainerID, links)
		}
	}
	if err := nettest.Ping(kept.NS, gw); err != nil {
		t.Fatalf("the kept pod must still work: %v", err)
	}
	if err := rt.Check(kept.RT); err != nil {
		t.Errorf("CHECK of the kept pod: %v", err)
	}
	// An empty list collects everything.
	if err := gcRT.GC(nil); err != nil {
		t.Fatalf("GC of everything: %v", err)
	}
	assertBridgeClean(t, rt, dataDir)
}

// TestBridgeIPAMs attaches two pods with each IPAM podnet-bridge is used
// with and checks that they reach each other and the gateway.
func TestBridgeIPAMs(t *testing.T) {
	cases := []struct {
		name   string
		subnet string // the pods' subnet, gateway .1
		conf   func(t *testing.T, dataDir string) string
	}{
		{"podnet-ipam ranges", "10.210.6.0/24", func(t *testing.T, dataDir string) string {
			return bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.6.0/24"), nil)
		}},
		{"podnet-ipam usePodCidr", "10.210.7.0/24", func(t *testing.T, dataDir string) string {
			stateDir := t.TempDir()
			if err := os.WriteFile(filepath.Join(stateDir, "node.json"), []byte(`{"podCIDRs":["10.210.7.0/24"]}`), 0o644); err != nil {
				t.Fatal(err)
			}
			ipam := fmt.Sprintf(`{"type":"podnet-ipam","dataDir":%q,"ranges":[[{"subnet":"usePodCidr"}]]}`, dataDir)
			return bridgeList(t, "1.0.0", ipam, map[string]any{"stateDir": stateDir})
		}},
		{"podnet-ipam exec'd", "10.210.9.0/24", func(t *testing.T, dataDir string) string {
			return bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.9.0/24"), map[string]any{"execIPAM": true})
		}},
		{"host-local", "10.210.8.0/24", func(t *testing.T, dataDir string) string {
			return bridgeList(t, "1.0.0", fmt.Sprintf(`{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.210.8.0/24"}]]}`, dataDir), nil)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			rt := newBridgeRuntime(t, tc.conf(t, dataDir))
			_, subnet, _ := net.ParseCIDR(tc.subnet)
			gw := strings.TrimSuffix(tc.subnet, "0/24") + "1"
			a := addBridgePod(t, rt, "ipam-a")
			b := addBridgePod(t, rt, "ipam-b")
			for _, p := range []*nettest.Pod{a, b} {
				if !subnet.Contains(p.Result.IPs[0].Address.IP) || !p.Result.IPs[0].Gateway.Equal(net.ParseIP(gw)) {
					t.Fatalf("%s: result ips %+v, want an address in %s via %s", p.RT.ContainerID, p.Result.IPs, tc.subnet, gw)
				}
			}
			if got := brReservations(t, dataDir); !slices.Equal(got, brSorted(brPodIP(a), brPodIP(b))) {
				t.Errorf("reservations = %v, want %s and %s", got, brPodIP(a), brPodIP(b))
			}
			st := readBrNode(t, rt.Node, veth.DefaultBridge)
			if !slices.Equal(st.gwAddrs, []string{gw + "/24"}) || len(st.ports) != 2 {
				t.Fatalf("bridge addresses %v, ports %v, want %s/24 and two ports", st.gwAddrs, st.ports, gw)
			}
			// a port's own addresses serve nothing: none of the kernel's
			// making
			for _, p := range []*nettest.Pod{a, b} {
				if got := ipv6Addrs(t, rt.Node.NS, hostIfName(t, p.Result)); len(got) != 0 {
					t.Errorf("bridge port of %s has IPv6 addresses %v, want none", p.RT.ContainerID, got)
				}
			}
			for _, pr := range [][2]*nettest.Pod{{a, b}, {b, a}} {
				if err := nettest.Ping(pr[0].NS, brPodIP(pr[1])); err != nil {
					t.Error(err)
				}
			}
			if err := nettest.Ping(a.NS, gw); err != nil {
				t.Error(err)
			}
			for _, p := range []*nettest.Pod{a, b} {
				if err := rt.Check(p.RT); err != nil {
					t.Errorf("CHECK %s: %v", p.RT.ContainerID, err)
				}
				if err := rt.Del(p.RT); err != nil {
					t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
				}
			}
			assertBridgeClean(t, rt, dataDir)
		})
	}
}

func brSorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// TestBridgeBadInput: a bad bridge name is a config error (7) found before
// anything is created; a link of another type holding the bridge's name
// makes ADD fail with an error naming it, and the rollback leaves nothing.
func TestBridgeBadInput(t *testing.T) {
	cases := []struct {
		name   string
		bridge string
		// prepare runs in the node netns before ADD.
		prepare func() error
		code    uint // 0: any
		msg     []string
		// links are the node links ("name/type") expected after the
		// failed ADD: the ones prepare made.
		links []string
	}{
		{name: "bridge name with slash", bridge: "a/b", code: types.ErrInvalidNetworkConfig, msg: []string{`bridge name "a/b"`}},
		{name: "bridge name of 16 characters", bridge: "podnet0123456789", code: types.ErrInvalidNetworkConfig, msg: []string{`bridge name "podnet0123456789"`, "too long"}},
		{name: "bridge name dot", bridge: ".", code: types.ErrInvalidNetworkConfig, msg: []string{`bridge name "."`}},
		{
			// A veth pair, as this kernel may lack the dummy driver. It is
			// not podnet's (no alias), so nothing may touch it.
			name: "veth holds the bridge name",
			prepare: func() error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth.DefaultBridge}, PeerName: "podnet0peer"})
			},
			msg:   []string{"interface " + veth.DefaultBridge + " exists and is a veth, not a bridge"},
			links: []string{veth.DefaultBridge + "/veth", "podnet0peer/veth"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			extra := map[string]any{}
			if tc.bridge != "" {
				extra["bridge"] = tc.bridge
			}
			rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.10.0/24"), extra))
			if tc.prepare != nil {
				rt.Node.Do(tc.prepare)
			}
			podNS := nettest.NewNetNS(t)
			_, err := rt.Add(nettest.RuntimeConf("bad-bridge", podNS, "eth0"))
			e := nettest.CNIError(err)
			if e == nil {
				t.Fatalf("ADD = %v, want a CNI error", err)
			}
			t.Logf("ADD: code %d: %s", e.Code, e.Msg)
			if tc.code != 0 && e.Code != tc.code {
				t.Errorf("code = %d, want %d (msg %q)", e.Code, tc.code, e.Msg)
			}
			for _, m := range tc.msg {
				if !strings.Contains(e.Msg, m) {
					t.Errorf("msg = %q, want it to contain %q", e.Msg, m)
				}
			}
			var links []string
			rt.Node.Do(func() error {
				all, err := netlink.LinkList()
				for _, l := range all {
					if l.Attrs().Name != "lo" {
						links = append(links, l.Attrs().Name+"/"+l.Type())
					}
				}
				return err
			})
			slices.Sort(links)
			if !slices.Equal(links, tc.links) {
				t.Errorf("node links after the failed ADD = %v, want %v", links, tc.links)
			}
			if r := brReservations(t, dataDir); len(r) > 0 {
				t.Errorf("IPAM reservations left: %v", r)
			}
			if l := brPodLinks(t, podNS); len(l) > 0 {
				t.Errorf("links left in the pod: %v", l)
			}
		})
	}
}

// TestBridgeGatewayMAC: the gateway keeps its MAC while pods come and go.
// A bridge whose own MAC was never set takes the lowest MAC of its ports;
// when that port's pod leaves, the other pods' cached gateway MAC leads
// nowhere until their neighbor entries expire.
func TestBridgeGatewayMAC(t *testing.T) {
	const gw = "10.210.11.1"
	dataDir := t.TempDir()
	rt := newBridgeRuntime(t, bridgeList(t, "1.0.0", brIPAM(dataDir, "10.210.11.0/24"), nil))
	var pods []*nettest.Pod
	for i := range 4 {
		pods = append(pods, addBridgePod(t, rt, fmt.Sprintf("mac-%d", i)))
	}
	// Every pod caches the gateway's MAC.
	for _, p := range pods {
		if err := nettest.Ping(p.NS, gw); err != nil {
			t.Fatal(err)
		}
	}
	// The pod whose host veth has the lowest MAC leaves.
	var low *nettest.Pod
	var lowMAC net.HardwareAddr
	var brMAC string
	rt.Node.Do(func() error {
		br, err := netlink.LinkByName(veth.DefaultBridge)
		if err != nil {
			return err
		}
		brMAC = br.Attrs().HardwareAddr.String()
		for _, p := range pods {
			l, err := netlink.LinkByName(bridgeHostVeth(p.RT.ContainerID))
			if err != nil {
				return err
			}
			if mac := l.Attrs().HardwareAddr; low == nil || string(mac) < string(lowMAC) {
				low, lowMAC = p, mac
			}
		}
		return nil
	})
	t.Logf("bridge MAC %s, lowest port MAC %s (%s)", brMAC, lowMAC, low.RT.ContainerID)
	if err := rt.Del(low.RT); err != nil {
		t.Fatal(err)
	}
	st := readBrNode(t, rt.Node, veth.DefaultBridge)
	if got := st.bridge.Attrs().HardwareAddr.String(); got != brMAC {
		t.Errorf("bridge MAC changed from %s to %s when %s left", brMAC, got, low.RT.ContainerID)
	}
	for _, p := range pods {
		if p == low {
			continue
		}
		if err := nettest.Ping(p.NS, gw); err != nil {
			t.Errorf("after %s left: %v", low.RT.ContainerID, err)
		}
		if err := rt.Del(p.RT); err != nil {
			t.Fatal(err)
		}
	}
	assertBridgeClean(t, rt, dataDir)
}
