package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/ipipvm/vmconf"
	"github.com/podnet/podnet/test/nettest"
)

// startRouted starts podnet-routed --encap=ipip in every node netns, as a
// DaemonSet pod with hostNetwork would run on each node.
func (g *guest) startRouted() error {
	if err := os.MkdirAll("/run/ipipvm", 0o755); err != nil {
		return err
	}
	for _, n := range g.nodes {
		logPath := filepath.Join("/run/ipipvm", "routed-"+n.Name+".log")
		args := []string{
			"--kubeconfig=" + vmconf.KubeconfigPath,
			"--node-name=" + n.Name,
			"--encap=ipip",
			"--cluster-cidr=" + g.cfg.ClusterCIDR,
			"--state-dir=" + n.stateDir,
			"--ipam-data-dir=" + filepath.Join(n.stateDir, "ipam"),
			"--cri-socket=",
			"--health-addr=" + routedHealth,
			"--metrics-addr=" + routedHealth,
			"--resync-interval=3s", // several full resyncs (repair + prune) during the run
			"--log-level=debug",
		}
		r, err := nettest.StartProc(n.netns, false, logPath, filepath.Join(vmconf.BinDir, "podnet-routed"), args...)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		n.routed = r
		g.logf("%s: podnet-routed pid %d: %s", n.Name, r.Cmd.Process.Pid, strings.Join(args, " "))
		if n == g.nodes[0] {
			// The first podnet-routed creates tunl0, which makes the kernel
			// load ipip through /sbin/modprobe. The others start once that
			// is done: real nodes each have their own kernel, and here
			// three simultaneous creates made one podnet-routed exit with
			// EOPNOTSUPP (ErrNoIPIP), apparently because busybox modprobe
			// treats a module that is still loading as loaded.
			if err := waitFor(20*time.Second, func() error {
				if r.Exited() {
					return fmt.Errorf("podnet-routed exited: %v", r.Err())
				}
				return moduleLive("ipip")
			}); err != nil {
				return fmt.Errorf("%s: ipip not loaded after podnet-routed created tunl0: %w", n.Name, err)
			}
			g.logf("%s: ipip module loaded on demand (tunl0 creation by podnet-routed)", n.Name)
		}
	}
	return nil
}

// moduleLive reports whether /proc/modules lists name as Live.
func moduleLive(name string) error {
	data, err := os.ReadFile("/proc/modules")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == name {
			if f[4] == "Live" {
				return nil
			}
			return fmt.Errorf("module %s is %s", name, f[4])
		}
	}
	return fmt.Errorf("module %s not loaded", name)
}

// wantRoutes is n's routes with podnet's protocol, in nettest.FormatRoute's form:
// from podnet-routed, each other node's PodCIDR via its InternalIP over
// tunl0 (onlink: the next hop is not on tunl0's subnet) and a blackhole for
// n's own; from the plugin, once the pod exists, its host route.
func (g *guest) wantRoutes(n *node, without string) []string {
	var want []string
	for _, m := range g.nodes {
		switch {
		case m == n:
			want = append(want, fmt.Sprintf("blackhole %s proto %d", m.cidr, contract.RouteProtocol))
		case m.Name != without:
			want = append(want, fmt.Sprintf("%s via %s dev tunl0 proto %d onlink", m.cidr, m.ip, contract.RouteProtocol))
		}
	}
	if n.podIP.IsValid() {
		// The plugin's host route, same protocol: podnet-routed must leave it.
		want = append(want, fmt.Sprintf("%s/32 dev %s proto %d", n.podIP, n.hostVeth, contract.RouteProtocol))
	}
	slices.Sort(want)
	return want
}

// podnetRoutes lists n's routes with podnet's protocol, formatted like
// `ip route show proto 77`.
func podnetRoutes(n *node) ([]string, error) {
	var out []string
	err := n.netns.Do(func(ns.NetNS) error {
		filter := &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		names, err := nettest.LinkIndexNames()
		if err != nil {
			return err
		}
		for _, r := range routes {
			out = append(out, nettest.FormatRoute(r, names, false))
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// waitRoutes waits until n's podnet routes are exactly want.
func (g *guest) waitRoutes(n *node, want []string, limit time.Duration) error {
	var have []string
	err := waitFor(limit, func() error {
		if n.routed.Exited() {
			return fmt.Errorf("podnet-routed exited: %v", n.routed.Err())
		}
		var err error
		if have, err = podnetRoutes(n); err != nil {
			return err
		}
		if !slices.Equal(have, want) {
			return fmt.Errorf("routes %q, want %q", have, want)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	return nil
}

// waitAllRoutes waits for every node's tunl0 routes, then checks what
// podnet-routed set up around them: tunl0 itself, node.json, /readyz.
func (g *guest) waitAllRoutes() error {
	for _, n := range g.nodes {
		want := g.wantRoutes(n, "")
		if err := g.waitRoutes(n, want, routeWait); err != nil {
			return err
		}
		for _, r := range want {
			g.logf("%s: %s", n.Name, r)
		}
	}
	wantMTU := underlayMTU - ipipOverhead
	for _, n := range g.nodes {
		var st *nodestate.State
		// Routes come first; tunl0's MTU, the masquerade table and
		// node.json follow in the same apply.
		err := waitFor(40*time.Second, func() error {
			err := n.netns.Do(func(ns.NetNS) error {
				l, err := netlinksafe.LinkByName("tunl0")
				if err != nil {
					return err
				}
				if l.Type() != "ipip" || l.Attrs().Flags&net.FlagUp == 0 || l.Attrs().MTU != wantMTU {
					return fmt.Errorf("tunl0 is %s, flags %s, mtu %d: want an ipip device, up, mtu %d", l.Type(), l.Attrs().Flags, l.Attrs().MTU, wantMTU)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if st, err = nodestate.Read(n.stateDir); err != nil {
				return err
			}
			if st.MTU != wantMTU || !slices.Equal(st.PodCIDRs, []string{n.cidr.String()}) || st.Encap != "ipip" || st.NodeName != n.Name {
				return fmt.Errorf("node.json %+v, want node %s, podCIDRs [%s], mtu %d, encap ipip", *st, n.Name, n.cidr, wantMTU)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if err := g.routedReady(n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		g.logf("%s: tunl0 up (ipip, mtu %d), node.json %+v, /readyz ok", n.Name, wantMTU, *st)
	}
	return nil
}

func (g *guest) routedReady(n *node) error {
	c := nettest.HTTPClient(n.netns, 3*time.Second)
	return waitFor(10*time.Second, func() error {
		resp, err := c.Get("http://" + routedHealth + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: HTTP %d", resp.StatusCode)
		}
		return nil
	})
}

// repair deletes one of the first node's tunnel routes behind
// podnet-routed's back and expects it back without any Node change.
func (g *guest) repair() error {
	n, peer := g.nodes[0], g.nodes[1]
	err := n.netns.Do(func(ns.NetNS) error {
		tunl0, err := netlinksafe.LinkByName("tunl0")
		if err != nil {
			return err
		}
		dst := net.IPNet{IP: peer.cidr.Addr().AsSlice(), Mask: net.CIDRMask(peer.cidr.Bits(), 32)}
		return netlink.RouteDel(&netlink.Route{LinkIndex: tunl0.Attrs().Index, Dst: &dst, Gw: peer.ip.AsSlice(), Protocol: contract.RouteProtocol})
	})
	if err != nil {
		return fmt.Errorf("%s: delete route to %s: %w", n.Name, peer.cidr, err)
	}
	start := time.Now()
	if err := g.waitRoutes(n, g.wantRoutes(n, ""), 40*time.Second); err != nil {
		return fmt.Errorf("route to %s not restored: %w", peer.cidr, err)
	}
	g.result("repair %s: route %s via %s dev tunl0 back %s after it was deleted", n.Name, peer.cidr, peer.ip, time.Since(start).Round(time.Millisecond))
	// That reconcile ran with the pod in place: podnet-routed must count
	// only its own routes, not the plugin's pod route (same protocol).
	m, err := g.routedMetrics(n)
	if err != nil {
		return err
	}
	if m["podnet_routes_programmed"] != m["podnet_routes_desired"] || m["podnet_routes_desired"] != float64(len(g.nodes)) {
		return fmt.Errorf("%s metrics: podnet_routes_programmed %v, podnet_routes_desired %v, want both %d", n.Name, m["podnet_routes_programmed"], m["podnet_routes_desired"], len(g.nodes))
	}
	g.logf("%s metrics: podnet_routes_programmed %v = podnet_routes_desired, podnet_route_repairs_total %v, podnet_apply_errors_total %v",
		n.Name, m["podnet_routes_programmed"], m["podnet_route_repairs_total"], m["podnet_apply_errors_total"])
	return g.ping(n, peer, pingsPerPair, 3)
}

// routedMetrics scrapes n's podnet-routed /metrics (unlabelled samples).
func (g *guest) routedMetrics(n *node) (map[string]float64, error) {
	code, body, err := nettest.GetIn(n.netns, "http://"+routedHealth+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", code)
	}
	return nettest.ParseMetrics(body)
}

// deleteNode deletes a Node through the API server: the other nodes'
// podnet-routed must withdraw its route and its pods become unreachable.
func (g *guest) deleteNode() error {
	gone := g.byName(g.cfg.DeleteNode)
	if gone == nil {
		g.logf("no node to delete configured")
		return nil
	}
	var from *node
	for _, n := range g.nodes {
		if n != gone {
			from = n
			break
		}
	}
	code, body, err := g.apiCall(from.netns, http.MethodDelete, "/api/v1/nodes/"+gone.Name)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("DELETE node %s: HTTP %d: %s", gone.Name, code, body)
	}
	start := time.Now()
	for _, n := range g.nodes {
		if n == gone {
			continue
		}
		if err := g.waitRoutes(n, g.wantRoutes(n, gone.Name), 20*time.Second); err != nil {
			return fmt.Errorf("route to deleted node %s not withdrawn: %w", gone.Name, err)
		}
	}
	g.result("node delete: Node %s deleted through the API server, route to %s withdrawn on the other nodes after %s", gone.Name, gone.cidr, time.Since(start).Round(time.Millisecond))
	if err := g.ping(from, gone, 1, 1); err == nil {
		return fmt.Errorf("%s still reaches %s (%s) after its Node was deleted", from.podName, gone.podName, gone.podIP)
	}
	g.logf("%s -> %s fails now, as it should", from.podName, gone.podName)
	return nil
}

// stopRouted stops every podnet-routed still running with SIGTERM.
func (g *guest) stopRouted() {
	for _, n := range g.nodes {
		if n.routed == nil || n.routed.Exited() {
			continue
		}
		g.logf("%s: podnet-routed stopped: %v", n.Name, errOrOK(n.routed.Stop(5*time.Second)))
	}
}

func errOrOK(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func routedLogTail(n *node) string {
	if n.routed == nil {
		return "(not started)"
	}
	return nettest.Tail(n.routed.Log, routedLogLines)
}
