package e2e

// The data path in detail (moved here from test/routed, where it had its
// own cluster builder): MTUs from node.json to the pod and the path MTU at
// the pod MTU (a step of TestCluster), the masquerade and its repair
// (TestMasquerade), and which traffic takes the tunnel in cross-subnet
// mode (TestCrossSubnet, in e2e_test.go).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// underlayMTU is the MTU of every underlay link test/cluster makes.
const underlayMTU = 1500

// podMTU is the pod MTU podnet-routed must publish in encap mode.
func podMTU(encap string) int {
	switch encap {
	case "vxlan":
		return underlayMTU - desired.VXLANOverhead
	case "ipip":
		return underlayMTU - 20
	}
	return underlayMTU
}

// checkMTUs checks node.json's MTU and encap on every node, the VXLAN
// device's MTU, and that every pod's eth0 has node.json's MTU.
func checkMTUs(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	want := podMTU(c.Cfg.Encap)
	for _, n := range c.Nodes {
		st, err := n.State()
		if err != nil {
			t.Fatal(err)
		}
		if st.MTU != want || st.Encap != c.Cfg.Encap {
			t.Errorf("%s node.json: mtu %d encap %q, want %d %q", n.Name, st.MTU, st.Encap, want, c.Cfg.Encap)
		}
		if c.Cfg.Encap == "vxlan" {
			if got, err := n.LinkMTU(desired.VXLANDevice); err != nil || got != want {
				t.Errorf("%s: %s MTU %d (%v), want %d", n.Name, desired.VXLANDevice, got, err, want)
			}
		}
		for _, p := range n.Pods {
			if got, err := p.MTU(); err != nil || got != st.MTU {
				t.Errorf("pod %s: eth0 MTU %d (%v), want node.json's %d", p.Name, got, err, st.MTU)
			}
		}
	}
}

// pingDF pings dst once from the pod with don't-fragment and an ICMP
// payload of size bytes (bounded by a 15 s hang guard).
func pingDF(from *cluster.Pod, dst netip.Addr, size int) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	out, err := nettest.ExecIn(ctx, from.NS.NetNS, "ping", "-M", "do", "-c1", "-W2", "-s", strconv.Itoa(size), dst.String())
	if ctx.Err() != nil {
		err = fmt.Errorf("ping hung: %w", ctx.Err())
	}
	return out, time.Since(start), err
}

// checkPathMTU checks that a don't-fragment ping filling the pod MTU
// crosses nodes and that one byte more fails promptly (the pod's own
// interface refuses it) instead of hanging or being answered.
func checkPathMTU(t *testing.T, from, to *cluster.Pod, mtu int) {
	t.Helper()
	fits := mtu - 28 // 20 IPv4 + 8 ICMP
	if out, _, err := pingDF(from, to.IP, fits); err != nil {
		t.Errorf("ping -M do -s %d %s -> %s (pod MTU %d) failed: %v\n%s", fits, from.Name, to.Name, mtu, err, out)
	} else {
		t.Logf("ping -M do -s %d %s -> %s: answered", fits, from.Name, to.Name)
	}
	out, took, err := pingDF(from, to.IP, fits+1)
	switch {
	case err == nil:
		t.Errorf("ping -M do -s %d %s -> %s (one byte over pod MTU %d) was answered:\n%s", fits+1, from.Name, to.Name, mtu, out)
	case strings.Contains(err.Error(), "hung") || took > 5*time.Second:
		t.Errorf("ping -M do -s %d did not fail promptly (%v): %v\n%s", fits+1, took, err, out)
	default:
		why := err.Error()
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "error") || strings.Contains(line, "Frag") || strings.Contains(line, "received") {
				why = strings.TrimSpace(line)
				break
			}
		}
		t.Logf("ping -M do -s %d %s -> %s failed in %v as it must: %s", fits+1, from.Name, to.Name, took.Round(time.Millisecond), why)
	}
}

// testMTU is TestCluster's MTU step: node.json, tunnel and pod MTUs, and
// the path MTU between pods on different nodes, both ways round.
func testMTU(t *testing.T, c *cluster.Cluster) {
	checkMTUs(t, c)
	want := podMTU(c.Cfg.Encap)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	checkPathMTU(t, n1.Pods[0], n2.Pods[0], want)
	checkPathMTU(t, n3.Pods[0], n1.Pods[0], want)
}

// TestMasquerade checks podnet-routed's nft masquerade with real TCP: the
// outside host (on the underlay, with no route to the pod CIDRs) sees pod
// connections coming from the pod's node address, while a pod on another
// node sees the client pod's own address. Then someone deletes podnet's
// nft table: the periodic resync writes it again and pods are masqueraded
// again.
func TestMasquerade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := up(t, "vxlan", 2, false)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	pods := []*cluster.Pod{addPods(t, c, n1, 1)[0], addPods(t, c, n2, 1)[0]}
	requireConnected(t, cluster.PingMatrix(ctx, pods))

	if _, err := cluster.Ping(ctx, c.Outside, pods[0].IP); err == nil {
		t.Fatalf("the outside host reaches pod %s directly: the test set-up is wrong", pods[0].IP)
	}
	rs, err := c.OutsideTCP(ctx, pods)
	if err != nil {
		t.Fatal(err)
	}
	requireTCP(t, "pod → outside TCP, masqueraded to the node address", rs)
	requireTCP(t, "pod → pod TCP across nodes keeps the pod address", cluster.TCPMatrix(ctx, pods))

	// Someone deletes podnet's nft table on node1: the periodic resync
	// (2 s here) writes it again.
	nft, err := nftables.New(nftables.WithNetNSFd(int(n1.NS.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer nft.CloseLasting()
	nft.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable})
	if err := nft.Flush(); err != nil {
		t.Fatalf("delete the nft table: %v", err)
	}
	back := time.Now()
	if err := nettest.Poll(ctx, converge, 100*time.Millisecond, func() error {
		tables, err := nft.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			return err
		}
		for _, tb := range tables {
			if tb.Name == contract.NFTable {
				return nil
			}
		}
		return fmt.Errorf("no table inet %s", contract.NFTable)
	}); err != nil {
		t.Fatalf("the deleted nft table was not written again: %v", err)
	}
	t.Logf("deleted nft table back after %v", time.Since(back).Round(time.Millisecond))
	var last []cluster.TCPResult
	if err := nettest.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		if last, err = c.OutsideTCP(ctx, pods[:1]); err != nil {
			return err
		}
		if !last[0].OK() {
			return errors.New(last[0].String())
		}
		return nil
	}); err != nil {
		t.Fatalf("pod %s -> outside after the table came back: %v", pods[0].Name, err)
	}
	t.Logf("after the table came back: %s", last[0])
}
