package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// TestPodSpoofAcrossNodes is the tenant's attack of issue 21 on a cluster:
// a pod on node1 that sends with the address of a pod on node2 delivers
// nothing to another pod on node1, while its datagrams from its own
// address arrive (before and after: the path works), and node1's
// podnet-routed counts the drops (podnet_pod_spoofed_dropped_total).
// Someone then flushes the filter's chain on node1: podnet-routed's next
// resync writes it again (podnet_repairs_total{object="pod-filter"}), and
// forged datagrams are dropped again.
func TestPodSpoofAcrossNodes(t *testing.T) {
	ctx := context.Background()
	c := up(t, "vxlan", 2, false)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	attacker, err := n1.AddPod(ctx, "attacker")
	if err != nil {
		t.Fatal(err)
	}
	victim, err := n1.AddPod(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	remote, err := n2.AddPod(ctx, "remote")
	if err != nil {
		t.Fatal(err)
	}
	// the attacker takes the remote pod's address on its eth0, so that it
	// can send from it
	nettest.Do(t, attacker.NS.NetNS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: remote.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	got := make(chan string, 16)
	nettest.Do(t, victim.NS.NetNS, func() error {
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: victim.IP.AsSlice(), Port: 7777})
		if err != nil {
			return err
		}
		t.Cleanup(func() { conn.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				n, from, err := conn.ReadFromUDP(buf)
				if err != nil {
					return
				}
				got <- fmt.Sprintf("%s from %s", buf[:n], from.IP)
			}
		}()
		return nil
	})
	send := func(src netip.Addr, payload string) {
		nettest.Do(t, attacker.NS.NetNS, func() error {
			conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: victim.IP.AsSlice(), Port: 7777})
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte(payload))
			return err
		})
	}
	attack := func(round string) {
		t.Helper()
		before := spoofedDrops(t, n1)
		send(attacker.IP, round+"-true-1")
		for i := 0; i < 5; i++ {
			send(remote.IP, "forged")
		}
		send(attacker.IP, round+"-true-2")
		want := []string{round + "-true-1 from " + attacker.IP.String(), round + "-true-2 from " + attacker.IP.String()}
		for _, w := range want {
			select {
			case g := <-got:
				if g != w {
					t.Fatalf("%s: victim received %q, want %q (a forged datagram went through)", round, g, w)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: victim never received %q: the path does not work, the test proves nothing", round, w)
			}
		}
		select {
		case g := <-got:
			t.Fatalf("%s: victim received %q", round, g)
		case <-time.After(500 * time.Millisecond):
		}
		nettest.Eventually(t, 10*time.Second, "podnet_pod_spoofed_dropped_total counts the forged datagrams", func() error {
			if after := spoofedDrops(t, n1); after < before+5 {
				return fmt.Errorf("podnet_pod_spoofed_dropped_total{mode=\"routed\"} %v, want at least %v", after, before+5)
			}
			return nil
		})
	}
	attack("first")

	// someone empties the filter's chain: the next resync puts it back
	if out, err := n1.NS.Exec(ctx, "nft", "flush", "chain", "inet", "podnet-pods", "prerouting"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	nettest.Eventually(t, 3*resync, "podnet-routed writes the pod filter's chain again", func() error {
		m, err := n1.Metrics()
		if err != nil {
			return err
		}
		if v := m[`podnet_repairs_total{object="pod-filter"}`]; v < 1 {
			return fmt.Errorf(`podnet_repairs_total{object="pod-filter"} %v`, v)
		}
		return nil
	})
	attack("after-repair")
}

func spoofedDrops(t *testing.T, n *cluster.Node) float64 {
	t.Helper()
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m[`podnet_pod_spoofed_dropped_total{mode="routed"}`]
	if !ok {
		t.Fatalf("podnet-routed on %s exports no podnet_pod_spoofed_dropped_total{mode=\"routed\"}", n.Name)
	}
	return v
}
