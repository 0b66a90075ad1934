// Command guest is the IPIP end-to-end test that test/ipipvm boots in a
// QEMU VM (the host kernel has no ipip module). As PID 1's child, as root,
// it builds N "node" network namespaces joined by a bridged veth underlay,
// moves one QEMU user-networking NIC into each node so it reaches the
// host's kube-apiserver at 10.0.2.2, runs podnet-routed --encap=ipip in
// every node against that API server, and checks with real pods made by the
// podnet plugin that pod traffic crosses nodes through tunl0. It prints
// vmconf.PassMarker, or vmconf.FailMarker with the reason after a dump of
// the nodes' state.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/test/ipipvm/vmconf"
	"github.com/podnet/podnet/test/nettest"
)

// Underlay and pod-side constants.
const (
	underlayMTU    = 1400 // not 1500, so a pod MTU taken from node.json is told apart from the mgmt NIC's
	ipipOverhead   = 20
	routedHealth   = "127.0.0.1:9099" // per node netns, so the same address everywhere
	pingsPerPair   = 2
	tcpBytes       = 256 << 10
	routeWait      = 45 * time.Second
	routedLogLines = 40
)

type node struct {
	vmconf.Node
	netns    ns.NetNS
	podNS    ns.NetNS
	podName  string
	cidr     netip.Prefix
	ip       netip.Addr
	mac      net.HardwareAddr // of its QEMU NIC
	stateDir string

	routed   *nettest.Proc
	podIP    netip.Addr // once the pod exists
	hostVeth string
}

type guest struct {
	cfg   vmconf.Config
	nodes []*node
	start time.Time
	step  atomic.Value // string
	// failing is taken by the first failure and never released: a
	// deadline and a step failing at once report once.
	failing sync.Mutex
}

func main() {
	g := &guest{start: time.Now()}
	g.step.Store("load config")
	err := g.load()
	if err == nil {
		d := time.Duration(g.cfg.DeadlineSeconds) * time.Second
		if d <= 0 {
			d = 90 * time.Second
		}
		time.AfterFunc(d, func() {
			g.fail(fmt.Errorf("guest deadline %s passed during step %q", d, g.step.Load()))
		})
		err = g.run()
	}
	if err != nil {
		g.fail(err)
	}
	g.stopRouted()
	g.logf("all checks passed")
	fmt.Println(vmconf.PassMarker)
}

func (g *guest) fail(err error) {
	g.failing.Lock()
	g.logf("FAILED in step %q: %v", g.step.Load(), err)
	g.diagnose()
	fmt.Println(vmconf.FailMarker + strings.ReplaceAll(err.Error(), "\n", " | "))
	os.Exit(1)
}

func (g *guest) logf(format string, args ...any) {
	fmt.Printf("ipipvm [%5.1fs] %s\n", time.Since(g.start).Seconds(), fmt.Sprintf(format, args...))
}

func (g *guest) result(format string, args ...any) {
	fmt.Println(vmconf.ResultPrefix + fmt.Sprintf(format, args...))
}

func (g *guest) run() error {
	steps := []struct {
		name string
		f    func() error
	}{
		{"set up node and pod namespaces", g.setupNodes},
		{"reach the API server", g.checkAPI},
		{"start podnet-routed", g.startRouted},
		{"wait for tunl0 routes", g.waitAllRoutes},
		{"add pods with the podnet plugin", g.addPods},
		{"pod-to-pod traffic through tunl0", g.traffic},
		{"pod egress through podnet-routed's masquerade", g.egress},
		{"route repair", g.repair},
		{"tunnel filter: IPIP only from Nodes", g.tunnelFilter},
		{"node deletion through the API server", g.deleteNode},
		{"delete pods", g.deletePods},
	}
	for _, s := range steps {
		g.step.Store(s.name)
		g.logf("== %s", s.name)
		if err := s.f(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

func (g *guest) load() error {
	data, err := os.ReadFile(vmconf.ConfigPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &g.cfg); err != nil {
		return fmt.Errorf("%s: %w", vmconf.ConfigPath, err)
	}
	if len(g.cfg.Nodes) < 2 {
		return errors.New("config needs at least two nodes")
	}
	for _, c := range g.cfg.Nodes {
		n := &node{Node: c, podName: "pod-" + strings.TrimPrefix(c.Name, "node-"), stateDir: "/run/podnet/" + c.Name}
		if n.cidr, err = netip.ParsePrefix(c.PodCIDR); err != nil {
			return fmt.Errorf("node %s: %w", c.Name, err)
		}
		if n.ip, err = netip.ParseAddr(c.UnderlayIP); err != nil {
			return fmt.Errorf("node %s: %w", c.Name, err)
		}
		if n.mac, err = net.ParseMAC(c.MgmtMAC); err != nil {
			return fmt.Errorf("node %s: %w", c.Name, err)
		}
		g.nodes = append(g.nodes, n)
	}
	return nil
}

// waitFor polls check every 200 ms until it returns nil or limit passes.
func waitFor(limit time.Duration, check func() error) error {
	if err := nettest.Poll(context.Background(), limit, 200*time.Millisecond, check); err != nil {
		return fmt.Errorf("after %s: %w", limit, err)
	}
	return nil
}

func (g *guest) byName(name string) *node {
	for _, n := range g.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}
