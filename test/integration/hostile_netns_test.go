package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// nodeWithUplink is a node netns with an "uplink0" link carrying an
// address and the default route, as a real node's uplink does (a veth:
// this kernel has no dummy links).
func nodeWithUplink(t *testing.T) *nettest.Node {
	t.Helper()
	node := nettest.NewNode(t)
	node.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0peer"}); err != nil {
			return err
		}
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		peer, err := netlink.LinkByName("uplink0peer")
		if err != nil {
			return err
		}
		// no IPv6 on them: its link-local addresses and multicast routes
		// would appear while the test runs and show up in the before/after
		// comparison (/proc/sys/net is the netns of the thread, the node's)
		for _, name := range []string{"uplink0", "uplink0peer"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		addr, _ := netlink.ParseAddr("192.0.2.10/24")
		if err := netlink.AddrAdd(up, addr); err != nil {
			return err
		}
		for _, l := range []netlink.Link{up, peer} {
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: nettest.MustParseCIDR("192.0.2.1/32").IP})
	})
	return node
}

// podnetIPAMConf is badInputConf with podnet-ipam (in-process) on
// 10.244.20.0/24 in dataDir, as a JSON network config.
func podnetIPAMConf(t *testing.T, plugin, dataDir string, edit func(map[string]any)) []byte {
	t.Helper()
	conf := badInputConf(dataDir, t.TempDir())
	conf["type"] = plugin
	conf["ipam"] = map[string]any{
		"type": "podnet-ipam", "dataDir": dataDir,
		"ranges": []any{[]any{map[string]any{"subnet": "10.244.20.0/24"}}},
	}
	if edit != nil {
		edit(conf)
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	return stdin
}

func snapshotNode(t *testing.T, node *nettest.Node) cluster.Snapshot {
	t.Helper()
	s, err := cluster.TakeSnapshot(&cluster.NetNS{Name: "node", NetNS: node.NS})
	if err != nil {
		t.Fatalf("snapshot node: %v", err)
	}
	return s
}

// TestOwnNetnsRefused: CNI_NETNS naming the netns the plugin runs in (the
// node's) is refused with code 8 by every verb of both plugins, before
// anything is touched. Before the fix, ADD left a "169.254.1.1 dev eth0"
// route in the node and DEL with CNI_IFNAME=uplink0 deleted the node's
// uplink.
func TestOwnNetnsRefused(t *testing.T) {
	bin := nettest.BinDir(t, "podnet", "podnet-bridge", "podnet-ipam")
	cniPath := strings.Join([]string{bin, nettest.RefToolsDir(t)}, ":")
	for _, plugin := range []string{"podnet", "podnet-bridge"} {
		for _, c := range []struct{ cmd, ifName string }{
			{"ADD", "eth0"},
			{"ADD", "uplink0"},
			{"DEL", "uplink0"},
			{"DEL", "eth0"},
			{"CHECK", "uplink0"},
		} {
			t.Run(plugin+"/"+c.cmd+"/"+c.ifName, func(t *testing.T) {
				node := nodeWithUplink(t)
				dataDir := t.TempDir()
				stdin := podnetIPAMConf(t, plugin, dataDir, func(conf map[string]any) {
					if c.cmd == "CHECK" {
						conf["prevResult"] = map[string]any{
							"cniVersion": "1.0.0",
							"interfaces": []any{map[string]any{"name": c.ifName, "sandbox": node.NS.Path()}},
							"ips":        []any{map[string]any{"address": "10.244.20.2/32", "interface": 0}},
						}
					}
				})
				before := snapshotNode(t, node)
				res := execPluginInNode(t, node, filepath.Join(bin, plugin), map[string]string{
					"CNI_COMMAND":     c.cmd,
					"CNI_CONTAINERID": "own-netns-0123",
					"CNI_NETNS":       node.NS.Path(),
					"CNI_IFNAME":      c.ifName,
					"CNI_PATH":        cniPath,
				}, stdin)
				cniErr, err := decodeCNIErrorOutput(res.stdout)
				if res.exitCode == 0 || err != nil {
					t.Fatalf("exit %d, stdout %s: want a CNI error (%v)", res.exitCode, res.stdout, err)
				}
				if cniErr.Code != types.ErrInvalidNetNS || !strings.Contains(cniErr.Msg, "network namespace the plugin runs in") {
					t.Errorf("code %d msg %q: want code 8 naming the plugin's own netns", cniErr.Code, cniErr.Msg)
				}
				if d := before.Diff(snapshotNode(t, node)); d != "" {
					t.Errorf("the node changed:\n%s", d)
				}
				if entries, err := os.ReadDir(dataDir); err != nil || len(entries) > 0 {
					t.Errorf("IPAM dataDir touched: %v %v", entries, err)
				}
			})
		}
	}
}

// TestDelFallbackOnlyDeletesOwnPodLink: when DEL does not find the host
// veth, it deletes CNI_IFNAME in the pod only if podnet made it for this
// attachment (the pod end's alias names the owner): a foreign link of that
// name stays, podnet's own goes.
func TestDelFallbackOnlyDeletesOwnPodLink(t *testing.T) {
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	cniPath := strings.Join([]string{bin, nettest.RefToolsDir(t)}, ":")
	node := nettest.NewNode(t)
	stdin := podnetIPAMConf(t, "podnet", t.TempDir(), nil)
	run := func(cmd, id string, podNS ns.NetNS) execResult {
		return execPluginInNode(t, node, filepath.Join(bin, "podnet"), map[string]string{
			"CNI_COMMAND": cmd, "CNI_CONTAINERID": id, "CNI_NETNS": podNS.Path(), "CNI_IFNAME": "eth0", "CNI_PATH": cniPath,
		}, stdin)
	}
	podLinks := func(podNS ns.NetNS) []string {
		names, err := nettest.LinkNames(podNS)
		if err != nil {
			t.Fatal(err)
		}
		return names
	}

	t.Run("foreign link stays", func(t *testing.T) {
		podNS := nettest.NewNetNS(t)
		// a veth pair inside the pod that podnet did not make
		if err := podNS.Do(func(ns.NetNS) error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "other0"})
		}); err != nil {
			t.Fatal(err)
		}
		if res := run("DEL", "foreign-0123", podNS); res.exitCode != 0 {
			t.Fatalf("DEL: exit %d, %s", res.exitCode, res.stdout)
		}
		if got := podLinks(podNS); len(got) != 2 {
			t.Errorf("pod links after DEL: %v, want eth0 and other0 untouched", got)
		}
	})

	t.Run("own pod end goes", func(t *testing.T) {
		podNS := nettest.NewNetNS(t)
		if res := run("ADD", "own-0123", podNS); res.exitCode != 0 {
			t.Fatalf("ADD: exit %d, %s", res.exitCode, res.stdout)
		}
		// the host end renamed: DEL cannot find it by name, so it falls back
		// to the pod end, which carries the owner in its alias
		hosts := node.Links()
		if len(hosts) != 1 {
			t.Fatalf("node links after ADD: %v", hosts)
		}
		node.Do(func() error {
			l, err := netlink.LinkByName(hosts[0])
			if err != nil {
				return err
			}
			return netlink.LinkSetName(l, "renamed0")
		})
		if res := run("DEL", "own-0123", podNS); res.exitCode != 0 {
			t.Fatalf("DEL: exit %d, %s", res.exitCode, res.stdout)
		}
		if got := podLinks(podNS); len(got) != 0 {
			t.Errorf("pod links after DEL: %v, want none", got)
		}
		if got := node.Links(); len(got) != 0 {
			t.Errorf("node links after DEL: %v, want none", got)
		}
	})
}
