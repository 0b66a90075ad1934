package main

// The benchmark's leak check must be trusted to say "zero leaks": these
// tests inject every kind of leak it looks for (a veth, a route, a
// permanent neighbor entry, an element of the pod filter, reservation files of host-local and
// podnet-ipam, a link left in a pod netns) and a real one (a podnet ADD
// never deleted), and check that it reports each of them, and nothing once
// they are gone. Root is needed for the network namespaces (`make test`
// runs as root).

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/test/nettest"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root for network namespaces (run with `make test` as root)")
	}
}

func do(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLeakCheckCatchesInjectedLeaks(t *testing.T) {
	needRoot(t)
	node := nettest.NewNode(t).NS
	pod := nettest.NewNetNS(t)
	dataDir := t.TempDir()
	writeFile(t, filepath.Join(dataDir, "bench", "lock"))
	// A veth with both ends on the node: part of the baseline, carrier for
	// the neighbor leak below.
	do(t, node, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "base0"}, PeerName: "base0p"}); err != nil {
			return err
		}
		return linkUp("base0")
	})
	base, err := snapshotNode(node, []string{dataDir})
	if err != nil {
		t.Fatal(err)
	}
	pods := []ns.NetNS{pod}
	clean := func(t *testing.T) {
		t.Helper()
		if err := checkLeaks(base, node, []string{dataDir}, pods); err != nil {
			t.Fatalf("no leak injected, but the check says: %v", err)
		}
	}
	clean(t)

	for _, tc := range []struct {
		name   string
		inject func(t *testing.T)
		remove func(t *testing.T)
		want   []string // substrings of the leak report
	}{{
		name: "veth left on the node with its peer in the pod",
		inject: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "leak0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))})
			})
		},
		remove: func(t *testing.T) {
			do(t, node, func() error {
				l, err := netlink.LinkByName("leak0")
				if err != nil {
					return err
				}
				return netlink.LinkDel(l)
			})
		},
		want: []string{"link leak0 veth", "pod link eth0"},
	}, {
		name: "link left in a pod netns only",
		inject: func(t *testing.T) {
			do(t, pod, func() error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"})
			})
		},
		remove: func(t *testing.T) {
			if err := scrubPod(pod); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"pod link eth0", "pod link eth1"},
	}, {
		name: "host route to a pod",
		inject: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.RouteAdd(&netlink.Route{Dst: nettest.MustParseCIDR("10.201.0.7/32"), LinkIndex: linkIndex("base0"), Scope: netlink.SCOPE_LINK, Protocol: 77})
			})
		},
		remove: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.RouteDel(&netlink.Route{Dst: nettest.MustParseCIDR("10.201.0.7/32"), LinkIndex: linkIndex("base0"), Scope: netlink.SCOPE_LINK, Protocol: 77})
			})
		},
		want: []string{"route type 1 10.201.0.7/32 dev base0 proto 77"},
	}, {
		name: "blackhole route",
		inject: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.RouteAdd(&netlink.Route{Dst: nettest.MustParseCIDR("10.201.9.0/24"), Type: unix.RTN_BLACKHOLE})
			})
		},
		remove: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.RouteDel(&netlink.Route{Dst: nettest.MustParseCIDR("10.201.9.0/24"), Type: unix.RTN_BLACKHOLE})
			})
		},
		want: []string{"route type 6 10.201.9.0/24"},
	}, {
		name: "permanent neighbor entry",
		inject: func(t *testing.T) {
			do(t, node, func() error {
				mac, _ := net.ParseMAC("ee:ee:ee:ee:ee:01")
				return netlink.NeighAdd(&netlink.Neigh{LinkIndex: linkIndex("base0"), Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.ParseIP("10.201.0.9"), HardwareAddr: mac})
			})
		},
		remove: func(t *testing.T) {
			do(t, node, func() error {
				return netlink.NeighDel(&netlink.Neigh{LinkIndex: linkIndex("base0"), Family: netlink.FAMILY_V4, IP: net.ParseIP("10.201.0.9")})
			})
		},
		want: []string{"neighbor 10.201.0.9 dev base0"},
	}, {
		name: "pod filter element",
		inject: func(t *testing.T) {
			nft(t, node, "add table inet podnet-pods")
			nft(t, node, "add set inet podnet-pods ports { type iface_index; }")
			nft(t, node, "add element inet podnet-pods ports { base0 }")
		},
		remove: func(t *testing.T) { nft(t, node, "delete element inet podnet-pods ports { base0 }") },
		want:   []string{"pod filter element inet/ports " + fmt.Sprint(inNode(node, func() int { return linkIndex("base0") }))},
	}, {
		name:   "host-local reservation",
		inject: func(t *testing.T) { writeFile(t, filepath.Join(dataDir, "bench", "10.201.0.5")) },
		remove: func(t *testing.T) { _ = os.Remove(filepath.Join(dataDir, "bench", "10.201.0.5")) },
		want:   []string{"file " + filepath.Base(dataDir) + "/bench/10.201.0.5"},
	}, {
		name: "podnet-ipam reservation and owner record",
		inject: func(t *testing.T) {
			writeFile(t, filepath.Join(dataDir, "bench", "ips", "10.201.0.6"))
			writeFile(t, filepath.Join(dataDir, "bench", "owners", "abc:eth0"))
		},
		remove: func(t *testing.T) { _ = os.RemoveAll(filepath.Join(dataDir, "bench")) },
		want:   []string{"bench/ips/10.201.0.6", "bench/owners/abc:eth0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.inject(t)
			err := checkLeaks(base, node, []string{dataDir}, pods)
			if err == nil {
				t.Fatal("leak injected, but the check passed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("leak report %q does not mention %q", err, w)
				}
			}
			tc.remove(t)
			clean(t)
		})
	}

	// An IPAM's own bookkeeping is not a leak.
	for _, f := range []string{"bench/last_reserved_ip.0", "bench/lock", "bench/hints/10.201.0.0-16", "other/hints/cursor"} {
		writeFile(t, filepath.Join(dataDir, f))
	}
	clean(t)
}

// nft runs an nft command (one argument, as nft -f would read it) in netns.
func nft(t *testing.T, netns ns.NetNS, cmd string) {
	t.Helper()
	do(t, netns, func() error {
		if out, err := exec.Command("nft", cmd).CombinedOutput(); err != nil {
			return fmt.Errorf("nft %s: %w\n%s", cmd, err, out)
		}
		return nil
	})
}

func inNode[T any](netns ns.NetNS, f func() T) T {
	var v T
	_ = netns.Do(func(ns.NetNS) error { v = f(); return nil })
	return v
}

func linkIndex(name string) int {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return -1
	}
	return l.Attrs().Index
}

// TestLeakCheckCatchesPodnetPodNeverDeleted runs the bench's own podnet
// stack: one pod ADDed and never deleted must be reported (its veth, its
// host route, its reservation, its pod filter elements); once DELeted,
// the check passes.
func TestLeakCheckCatchesPodnetPodNeverDeleted(t *testing.T) {
	needRoot(t)
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	s := newStack(t.TempDir(), "podnet+podnet-ipam", "podnet", "podnet-ipam", "10.201.0.0/16", []string{bin})
	if err := s.prepare(nettest.NewNode(t).NS, 1); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNetNS(t)
	pods := []ns.NetNS{pod}
	rt := s.rtConf("leaky", pod)
	if _, err := s.add(rt); err != nil {
		t.Fatal(err)
	}
	err := checkLeaks(s.base, s.node, s.dataDirs, pods)
	if err == nil {
		t.Fatal("a pod was never deleted, but the leak check passed")
	}
	for _, w := range []string{" veth", "route type 1 10.201.0.", "/ips/10.201.0.", "pod link eth0", "pod filter element inet/addrs4"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("leak report %q does not mention %q", err, w)
		}
	}
	if _, err := s.del(rt); err != nil {
		t.Fatal(err)
	}
	// podnet's DEL detaches the veth: the pod end is no pod leak, the host
	// end is a node link until the runtime removes the pod netns
	if err := checkPodLinks(pods); err != nil {
		t.Fatalf("after DEL: %v", err)
	}
	if err := checkLeaks(s.base, s.node, s.dataDirs, nil); err == nil || !strings.Contains(err.Error(), " veth") {
		t.Fatalf("after DEL, pod netns still there: leak check %v, want the detached host veth reported", err)
	}
	removePods(pods)
	if _, err := settle(s.node, s.base); err != nil {
		t.Fatal(err)
	}
	if err := checkLeaks(s.base, s.node, s.dataDirs, nil); err != nil {
		t.Fatalf("after DEL and the pod netns removed: %v", err)
	}
}
