package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/test/nettest"
)

// The tests in this file feed podnet-ipam, exec'd directly and run by
// bin/podnet (in-process, and exec'd with "execIPAM"), a hostile or broken
// node state file or data directory, always inside a node netns that
// carries nettest.NodeAddr: PodCIDRs no node can have, one covering the
// node's own address, a corrupt node.json, a data directory below a regular
// file. ADD must fail with the documented code, reserving nothing; STATUS
// must answer 50 with the cause.

// hostilePodCIDRs are PodCIDRs podnet-ipam must refuse, from node.json
// as from a configured range.
var hostilePodCIDRs = []string{
	"0.0.0.0/0",
	"0.0.0.0/4",
	"127.0.0.0/24",
	"169.254.0.0/24",
	"224.0.0.0/24",
	// Covers nettest.NodeAddr (192.168.77.1), which the range would hand
	// out: its gateway is 192.168.0.1.
	"192.168.0.0/16",
}

// hsWriteNodeState writes node.json with podCIDRs (or raw content when
// raw is set) into a new state dir and returns the dir and file.
func hsWriteNodeState(t *testing.T, raw string, podCIDRs ...string) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	file = filepath.Join(dir, "node.json")
	if raw == "" {
		b, err := json.Marshal(map[string]any{"podCIDRs": podCIDRs, "mtu": 1400})
		if err != nil {
			t.Fatal(err)
		}
		raw = string(b)
	}
	if err := os.WriteFile(file, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// hsRunIPAM execs podnet-ipam for c from inside node's netns (the child
// inherits the netns of the thread ns.Do switched).
func hsRunIPAM(t *testing.T, node *nettest.Node, n *ipamNet, c ipamCall) execResult {
	t.Helper()
	var res execResult
	if err := node.NS.Do(func(ns.NetNS) error { res = n.run(c); return nil }); err != nil {
		t.Fatalf("enter node netns: %v", err)
	}
	return res
}

// hsCheckError requires res to be a CNI error with code whose msg holds
// every want.
func hsCheckError(t *testing.T, what string, res execResult, code uint, want ...string) {
	t.Helper()
	e, err := ipamError(res)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if e.Code != code {
		t.Errorf("%s: code %d (%q), want %d", what, e.Code, e.Msg, code)
	}
	for _, w := range want {
		if !strings.Contains(e.Msg, w) {
			t.Errorf("%s: msg %q, want it to contain %q", what, e.Msg, w)
		}
	}
}

// hsNothingReserved requires that podnet-ipam did not even create the
// network's store: it refused before opening it.
func hsNothingReserved(t *testing.T, dataDir, network string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dataDir, network)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store %s/%s exists after a refused call (%v): %s", dataDir, network, err, readIPAMStore(t, dataDir, network))
	}
}

// hsPodnet runs bin/podnet in the node netns.
type hsPodnet struct {
	t       *testing.T
	node    *nettest.Node
	bin     string
	dataDir string
	conf    map[string]any
}

// newHSPodnet is bin/podnet (IPAM in-process unless execIPAM) with
// podnet-ipam over ranges in a fresh dataDir, reading node state from
// stateDir.
func newHSPodnet(t *testing.T, node *nettest.Node, execIPAM bool, stateDir string, ranges map[string]any) *hsPodnet {
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	p := &hsPodnet{t: t, node: node, bin: bin, dataDir: t.TempDir()}
	ipam := map[string]any{"type": "podnet-ipam", "dataDir": p.dataDir}
	for k, v := range ranges {
		ipam[k] = v
	}
	p.conf = map[string]any{"cniVersion": "1.1.0", "name": "hostile", "type": "podnet", "stateDir": stateDir, "ipam": ipam}
	if execIPAM {
		p.conf["execIPAM"] = true
	}
	return p
}

func (p *hsPodnet) run(cmd string, podNS ns.NetNS) execResult {
	p.t.Helper()
	stdin, err := json.Marshal(p.conf)
	if err != nil {
		p.t.Fatal(err)
	}
	env := map[string]string{"CNI_COMMAND": cmd, "CNI_PATH": p.bin}
	if podNS != nil {
		env["CNI_CONTAINERID"] = "hostile-0123"
		env["CNI_NETNS"] = podNS.Path()
		env["CNI_IFNAME"] = "eth0"
	}
	return execPluginInNode(p.t, p.node, filepath.Join(p.bin, "podnet"), env, stdin)
}

// addFails runs ADD, requires the error, and that nothing was left: no
// reservation, no link in the node or the pod.
func (p *hsPodnet) addFails(code uint, want ...string) {
	p.t.Helper()
	podNS := nettest.NewNetNS(p.t)
	hsCheckError(p.t, "podnet ADD", p.run("ADD", podNS), code, want...)
	hsNothingReserved(p.t, p.dataDir, "hostile")
	if links := p.node.Links(); len(links) > 0 {
		p.t.Errorf("links left in the node: %v", links)
	}
	if links, err := nettest.LinkNames(podNS); err != nil || len(links) > 0 {
		p.t.Errorf("links left in the pod: %v (%v)", links, err)
	}
}

// hsModes are the ways podnet-ipam runs under bin/podnet.
var hsModes = []struct {
	name     string
	execIPAM bool
}{{"podnet in-process IPAM", false}, {"podnet exec IPAM", true}}

// TestHostileNodeStatePodCIDR: a node.json PodCIDR that no node can have
// is refused with code 11 (like every node state problem of ADD: podnet-
// routed rewrites the file) naming the file and the value, nothing is
// reserved, and STATUS answers 50 with the same cause.
func TestHostileNodeStatePodCIDR(t *testing.T) {
	for _, cidr := range hostilePodCIDRs {
		t.Run(cidr, func(t *testing.T) {
			node := nettest.NewNode(t)
			stateDir, file := hsWriteNodeState(t, "", cidr)
			want := []string{fmt.Sprintf("node state %s: podCIDR %q: not usable as a node's pod range", file, cidr)}
			if cidr == "192.168.0.0/16" {
				want = []string{fmt.Sprintf("node state %s: podCIDR %s", file, cidr), "holds " + nettest.NodeAddr + ", an address of this node"}
			}

			t.Run("podnet-ipam", func(t *testing.T) {
				n := newIPAMNet(t, "hostile", map[string]any{"subnet": "usePodCidr", "stateDir": stateDir})
				hsCheckError(t, "ADD", hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "hostile-0"}), types.ErrTryAgainLater, want...)
				hsCheckError(t, "STATUS", hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}), types.ErrPluginNotAvailable, want...)
				hsNothingReserved(t, n.dataDir, n.name)
			})
			for _, mode := range hsModes {
				t.Run(mode.name, func(t *testing.T) {
					p := newHSPodnet(t, node, mode.execIPAM, stateDir, map[string]any{"ranges": []any{[]any{map[string]any{"subnet": "usePodCidr"}}}})
					p.addFails(types.ErrTryAgainLater, append([]string{`IPAM plugin "podnet-ipam" ADD failed`}, want...)...)
					hsCheckError(t, "podnet STATUS", p.run("STATUS", nil), types.ErrPluginNotAvailable, append([]string{`IPAM plugin "podnet-ipam" STATUS failed`}, want...)...)
				})
			}
		})
	}
}

// TestHostileConfigRanges: the same subnets as configured ranges are an
// invalid config (7) for ADD, and STATUS answers 50 naming the subnet.
func TestHostileConfigRanges(t *testing.T) {
	for _, cidr := range hostilePodCIDRs {
		t.Run(cidr, func(t *testing.T) {
			node := nettest.NewNode(t)
			ranges := rangesOf(cidr)
			want := []string{fmt.Sprintf("range set 0: subnet %q: not usable as a node's pod range", cidr)}
			if cidr == "192.168.0.0/16" {
				want = []string{"range set 0: subnet " + cidr + " holds " + nettest.NodeAddr + ", an address of this node"}
			}

			t.Run("podnet-ipam", func(t *testing.T) {
				n := newIPAMNet(t, "hostile", ranges)
				hsCheckError(t, "ADD", hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "hostile-0"}), types.ErrInvalidNetworkConfig, want...)
				hsCheckError(t, "STATUS", hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}), types.ErrPluginNotAvailable, want...)
				hsNothingReserved(t, n.dataDir, n.name)
			})
			for _, mode := range hsModes {
				t.Run(mode.name, func(t *testing.T) {
					p := newHSPodnet(t, node, mode.execIPAM, t.TempDir(), ranges)
					p.addFails(types.ErrInvalidNetworkConfig, want...)
					hsCheckError(t, "podnet STATUS", p.run("STATUS", nil), types.ErrPluginNotAvailable, want...)
				})
			}
		})
	}
}

// TestHostileStatusUnusable: STATUS answers 50 with the cause when ADD
// cannot work because the data directory is below a regular file (an I/O
// error, 5, for ADD) or node.json is corrupt (11 for ADD); podnet-ipam used
// to answer STATUS with those codes.
func TestHostileStatusUnusable(t *testing.T) {
	node := nettest.NewNode(t)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badDataDir := filepath.Join(file, "ipam")
	corruptDir, corruptFile := hsWriteNodeState(t, `{"podCIDRs":["10.77.0.0/24"],`)
	goodDir, _ := hsWriteNodeState(t, "", "10.77.0.0/24")

	t.Run("dataDir below a file", func(t *testing.T) {
		n := newIPAMNet(t, "hostile", map[string]any{"subnet": "10.77.0.0/24"})
		n.ipam["dataDir"] = badDataDir
		hsCheckError(t, "podnet-ipam ADD", hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "hostile-0"}), types.ErrIOFailure, file)
		hsCheckError(t, "podnet-ipam STATUS", hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}), types.ErrPluginNotAvailable, file)
		for _, mode := range hsModes {
			p := newHSPodnet(t, node, mode.execIPAM, goodDir, rangesOf("10.77.0.0/24"))
			p.conf["ipam"].(map[string]any)["dataDir"] = badDataDir
			hsCheckError(t, mode.name+" STATUS", p.run("STATUS", nil), types.ErrPluginNotAvailable, `IPAM plugin "podnet-ipam" STATUS failed`, file)
		}
	})
	t.Run("corrupt node.json", func(t *testing.T) {
		want := []string{"parse node state " + corruptFile, "unexpected end of JSON input"}
		n := newIPAMNet(t, "hostile", map[string]any{"subnet": "usePodCidr", "stateDir": corruptDir})
		hsCheckError(t, "podnet-ipam ADD", hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "hostile-0"}), types.ErrTryAgainLater, want...)
		hsCheckError(t, "podnet-ipam STATUS", hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}), types.ErrPluginNotAvailable, want...)
		hsNothingReserved(t, n.dataDir, n.name)
		for _, mode := range hsModes {
			usePodCidr := map[string]any{"ranges": []any{[]any{map[string]any{"subnet": "usePodCidr"}}}}
			p := newHSPodnet(t, node, mode.execIPAM, corruptDir, usePodCidr)
			hsCheckError(t, mode.name+" STATUS (usePodCidr)", p.run("STATUS", nil), types.ErrPluginNotAvailable, want...)
			// With a configured range IPAM does not read node.json, but
			// ADD takes the MTU from it: STATUS must say ADD would fail.
			p = newHSPodnet(t, node, mode.execIPAM, corruptDir, rangesOf("10.77.0.0/24"))
			p.addFails(types.ErrTryAgainLater, want...)
			hsCheckError(t, mode.name+" STATUS (configured range)", p.run("STATUS", nil), types.ErrPluginNotAvailable, want...)
		}
	})
}

// TestHostilePodCIDRPodnetAddrs: the node's addresses that podnet itself
// puts in the PodCIDR, the network address (podnet-routed's VXLAN VTEP)
// and the gateway with the PodCIDR's length (podnet-bridge's bridge), are
// never handed out and do not make the PodCIDR "cover the node's address";
// another address of the node in it does.
func TestHostilePodCIDRPodnetAddrs(t *testing.T) {
	node := nettest.NewNode(t)
	node.AddAddrs("lo", "10.78.0.0/32", "10.78.0.1/24")
	stateDir, file := hsWriteNodeState(t, "", "10.78.0.0/24")
	n := newIPAMNet(t, "podnetaddrs", map[string]any{"subnet": "usePodCidr", "stateDir": stateDir})
	if res := hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}); res.exitCode != 0 {
		t.Fatalf("STATUS: exit %d: %s", res.exitCode, res.stdout)
	}
	r, err := parseIPAMResult(hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "pod-0"}))
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if got := ipConfigs(r); len(got) != 1 || got[0] != "10.78.0.2/24 gw 10.78.0.1" {
		t.Fatalf("ADD = %v, want 10.78.0.2/24 gw 10.78.0.1", got)
	}
	// Another address of the node inside the range: refused from then on.
	node.AddAddrs("lo", "10.78.0.9/32")
	hsCheckError(t, "ADD", hsRunIPAM(t, node, n, ipamCall{cmd: "ADD", cid: "pod-1"}), types.ErrTryAgainLater, file, "podCIDR 10.78.0.0/24", "holds 10.78.0.9")
	hsCheckError(t, "STATUS", hsRunIPAM(t, node, n, ipamCall{cmd: "STATUS"}), types.ErrPluginNotAvailable, "holds 10.78.0.9")
	// Reservations made before stay releasable.
	if res := hsRunIPAM(t, node, n, ipamCall{cmd: "DEL", cid: "pod-0"}); res.exitCode != 0 {
		t.Fatalf("DEL: exit %d: %s", res.exitCode, res.stdout)
	}
	assertStoreEmpty(t, n.dataDir, n.name)
}
