package integration

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// TestDelDetachesUntilNetnsGone pins the shape of DEL (issue 13): with the
// pod netns still there, DEL detaches the veth pair instead of paying ~20 ms
// for a delete. Right after DEL: both ends are down, the node has no route
// to the pod, IPAM holds nothing and CNI_IFNAME is free in the pod; an ADD
// with the same container ID, ifname and address succeeds at once; and once
// the pod netns is gone, nothing of the pod is left in the node. Without a
// netns, DEL deletes the pair itself.
func TestDelDetachesUntilNetnsGone(t *testing.T) {
	for i, plugin := range []string{"podnet", "podnet-bridge"} {
		t.Run(plugin, func(t *testing.T) {
			dataDir := t.TempDir()
			subnet := fmt.Sprintf("10.244.%d.0/24", 60+i)
			node := nettest.NewNode(t)
			bin := nettest.BinDir(t, plugin, "podnet-ipam")
			rt := nettest.NewRuntime(t, node, pluginList("detach", plugin, "1.1.0", podnetIPAM(dataDir, subnet), nil), bin, nettest.RefToolsDir(t))
			podNS := nettest.NewNetNS(t)
			want := fmt.Sprintf("10.244.%d.7", 60+i)
			conf := nettest.RuntimeConf("detach-0", podNS, "eth0", [2]string{"IP", want})

			res, err := rt.Add(conf)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			hostName := res.Interfaces[hostIfaceIndex(t, res.Interfaces)].Name
			if err := rt.Del(conf); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			// detached, not deleted: down, no route, pod end renamed
			detached := func(what string, netns ns.NetNS, name string) {
				t.Helper()
				var l netlink.Link
				if err := netns.Do(func(ns.NetNS) (err error) { l, err = netlink.LinkByName(name); return err }); err != nil {
					t.Fatalf("%s %s after DEL: %v", what, name, err)
				}
				if !veth.IsDetached(l) || l.Attrs().Flags&net.FlagUp != 0 {
					t.Errorf("%s %s after DEL: flags %v alias %q, want a detached (down) podnet veth", what, name, l.Attrs().Flags, l.Attrs().Alias)
				}
			}
			detached("host end", node.NS, hostName)
			detached("pod end", podNS, veth.DetachedName("eth0"))
			if links := rt.Node.Links(); len(links) > 0 && plugin == "podnet" {
				t.Errorf("live links in the node after DEL: %v", links)
			}
			if routes := node.RoutesWithProto(contract.RouteProtocol); len(routes) > 0 {
				t.Errorf("podnet routes after DEL: %v", routes)
			}
			if podLinks, _ := nettest.AllLinkNames(podNS); slices.Contains(podLinks, "eth0") {
				t.Errorf("eth0 still in the pod after DEL: %v", podLinks)
			}
			assertStoreEmpty(t, dataDir, "detach")

			// the same attachment again, at once, with the same address
			res, err = rt.Add(conf)
			if err != nil {
				t.Fatalf("ADD after DEL: %v", err)
			}
			if got := res.IPs[0].Address.IP.String(); got != want {
				t.Fatalf("ADD after DEL got %s, want %s", got, want)
			}
			if err := nettest.Ping(node.NS, want); plugin == "podnet" && err != nil {
				t.Errorf("node -> re-added pod: %v", err)
			}

			// DEL, then the runtime removes the netns: the kernel takes the pair
			if err := rt.Del(conf); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			podNS.Close()
			if err := nettest.RemoveNetNS(podNS); err != nil {
				t.Fatal(err)
			}
			waitNoVeths(t, node)

			// no netns: DEL deletes the pair itself
			podNS2 := nettest.NewNetNS(t)
			conf2 := nettest.RuntimeConf("detach-1", podNS2, "eth0")
			if _, err := rt.Add(conf2); err != nil {
				t.Fatalf("ADD detach-1: %v", err)
			}
			conf2.NetNS = ""
			if err := rt.Del(conf2); err != nil {
				t.Fatalf("DEL without netns: %v", err)
			}
			if all, _ := nettest.AllLinkNames(node.NS); slices.ContainsFunc(all, contract.IsHostVeth) {
				t.Errorf("DEL without a netns left %v in the node", all)
			}
			assertStoreEmpty(t, dataDir, "detach")

			// GC removes a detached pair it is not told to keep
			podNS3 := nettest.NewNetNS(t)
			conf3 := nettest.RuntimeConf("detach-2", podNS3, "eth0")
			if _, err := rt.Add(conf3); err != nil {
				t.Fatalf("ADD detach-2: %v", err)
			}
			if err := rt.Del(conf3); err != nil {
				t.Fatalf("DEL detach-2: %v", err)
			}
			if all, _ := nettest.AllLinkNames(node.NS); !slices.ContainsFunc(all, contract.IsHostVeth) {
				t.Fatalf("DEL detach-2 did not detach (node links %v)", all)
			}
			if err := rt.GC(nil); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if all, _ := nettest.AllLinkNames(node.NS); slices.ContainsFunc(all, contract.IsHostVeth) {
				t.Errorf("GC left the detached pair: node links %v", all)
			}
		})
	}
}

// hostIfaceIndex is the index of the host veth in an ADD result's
// interfaces (the one without a sandbox whose name has podnet's prefix).
func hostIfaceIndex(t *testing.T, ifaces []*current.Interface) int {
	t.Helper()
	for i, iface := range ifaces {
		if iface.Sandbox == "" && contract.IsHostVeth(iface.Name) {
			return i
		}
	}
	t.Fatalf("no host veth in result interfaces %+v", ifaces)
	return -1
}

// waitNoVeths waits (the kernel tears a dying netns down in the
// background) until the node has no veth left at all.
func waitNoVeths(t *testing.T, node *nettest.Node) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var veths []string
		node.Do(func() error {
			links, err := netlink.LinkList()
			for _, l := range links {
				if _, ok := l.(*netlink.Veth); ok {
					veths = append(veths, l.Attrs().Name)
				}
			}
			return err
		})
		if len(veths) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("veths still in the node 10 s after the pod netns was removed: %v", veths)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
