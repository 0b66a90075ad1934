package e2e

// The tunnel filter of podnet-routed's nft table, tried as a hostile host
// and a hostile pod would: hand-made VXLAN frames carrying a UDP packet
// with a forged pod source. Only a Node's reach a pod; a frame from a
// host on the underlay that is no Node, from a pod, or one that would
// transit through the node is dropped and counted. Then the table is
// broken in several ways and comes back, by content, at the next resync.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// The cluster's VXLAN settings (podnet-routed's defaults).
const (
	vxlanVNI  = 4096
	vxlanPort = 4789
	sinkPort  = 7946
)

// udpSink records the UDP payloads a pod receives on sinkPort.
type udpSink struct {
	conn net.PacketConn
	mu   sync.Mutex
	got  map[string]string // payload -> sender
}

func listenUDP(t *testing.T, p *cluster.Pod) *udpSink {
	t.Helper()
	s := &udpSink{got: map[string]string{}}
	nettest.Do(t, p.NS.NetNS, func() (err error) {
		s.conn, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", sinkPort))
		return err
	})
	t.Cleanup(func() { s.conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := s.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got[string(buf[:n])] = from.String()
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *udpSink) received(marker string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from, ok := s.got[marker]
	return from, ok
}

// sendVXLAN sends, from netns, a VXLAN frame to node's VXLAN port whose
// inner packet is UDP from src to dst:sinkPort with payload marker; the
// inner Ethernet destination is node's VTEP MAC, as a node would address
// it.
func sendVXLAN(t *testing.T, from *cluster.NetNS, node *cluster.Node, src, dst netip.Addr, marker string) {
	t.Helper()
	mac, err := net.ParseMAC(desired.VTEPMAC(node.IP))
	if err != nil {
		t.Fatal(err)
	}
	frame := nettest.VXLANFrame(vxlanVNI, mac, net.HardwareAddr{0x0e, 0x70, 0xde, 0xad, 0xbe, 0xef},
		nettest.IPv4UDP(src, dst, 40000, sinkPort, []byte(marker)))
	nettest.Do(t, from.NetNS, func() error {
		c, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo(frame, &net.UDPAddr{IP: node.IP.AsSlice(), Port: vxlanPort})
		return err
	})
}

func tunnelDropped(t *testing.T, n *cluster.Node) float64 {
	t.Helper()
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m["podnet_tunnel_dropped_total"]
	if !ok {
		t.Fatalf("%s: no podnet_tunnel_dropped_total in /metrics", n.Name)
	}
	return v
}

func TestTunnelFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := up(t, "vxlan", 3, false)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	p1 := addPods(t, c, n1, 2)
	p2, p3 := addPods(t, c, n2, 1)[0], addPods(t, c, n3, 1)[0]
	pods := []*cluster.Pod{p1[0], p1[1], p2, p3}
	requireConnected(t, cluster.PingMatrix(ctx, pods)) // the filter lets the cluster's own traffic through
	target, other := listenUDP(t, p1[0]), listenUDP(t, p3)

	out, err := n1.NS.Exec(ctx, "nft", "list", "table", "inet", "podnet")
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	t.Logf("%s: nft list table inet podnet:\n%s", n1.Name, out)

	// delivered: the frame reaches the pod (a sender that is a Node)
	delivered := func(sink *udpSink, to *cluster.Pod, marker string) {
		t.Helper()
		err := nettest.Poll(ctx, 5*time.Second, 50*time.Millisecond, func() error {
			if _, ok := sink.received(marker); !ok {
				return errors.New("not received")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: frame %q sent by a Node never reached %s: the test's frame is wrong, or the filter drops a Node's traffic", to.Name, marker, to.IP)
		}
		from, _ := sink.received(marker)
		t.Logf("%q: received by %s from %s", marker, to.Name, from)
	}
	// dropped: node's counter moves (the frame got there and was
	// dropped), and the pod never sees it
	dropped := func(node *cluster.Node, sink *udpSink, to *cluster.Pod, marker string, send func()) {
		t.Helper()
		before := tunnelDropped(t, node)
		send()
		err := nettest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
			if v := tunnelDropped(t, node); v <= before {
				return fmt.Errorf("podnet_tunnel_dropped_total still %v", v)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%q: %s did not count a drop: %v", marker, node.Name, err)
		}
		time.Sleep(500 * time.Millisecond) // what was not dropped has arrived by now
		if from, ok := sink.received(marker); ok {
			t.Errorf("%q: %s received it from %s: the filter let it through", marker, to.Name, from)
		} else {
			t.Logf("%q: dropped by %s (podnet_tunnel_dropped_total %v -> %v), %s received nothing", marker, node.Name, before, tunnelDropped(t, node), to.Name)
		}
	}

	// 1. From the outside host (on the underlay, no Node): a pod source of
	// node2 forged, to node1's pod.
	dropped(n1, target, p1[0], "outside", func() { sendVXLAN(t, c.Outside, n1, p2.IP, p1[0].IP, "outside") })
	// The same frame from node2, a Node: delivered.
	sendVXLAN(t, n2.NS, n1, p2.IP, p1[0].IP, "node2")
	delivered(target, p1[0], "node2")

	// 2. Transit: node2 sends node1 a frame for node3's pod. node1 must not
	// relay it. The same frame sent to node3 itself is delivered.
	dropped(n1, other, p3, "transit", func() { sendVXLAN(t, n2.NS, n1, p2.IP, p3.IP, "transit") })
	sendVXLAN(t, n2.NS, n3, p2.IP, p3.IP, "to-node3")
	delivered(other, p3, "to-node3")

	// 3. A pod sends VXLAN to its own node, and to another node (which
	// would take it for its peer's once masqueraded): node1 drops both.
	dropped(n1, target, p1[0], "pod-to-own-node", func() { sendVXLAN(t, p1[1].NS, n1, p2.IP, p1[0].IP, "pod-to-own-node") })
	dropped(n1, other, p3, "pod-to-node3", func() { sendVXLAN(t, p1[1].NS, n3, p2.IP, p3.IP, "pod-to-node3") })

	requireConnected(t, cluster.PingMatrix(ctx, pods))
	if t.Failed() {
		return
	}
	testTableRepair(t, c, n1, pods)
	// after every break and repair, the outside host's forged frame is
	// dropped again
	dropped(n1, target, p1[0], "outside-after-repairs", func() { sendVXLAN(t, c.Outside, n1, p2.IP, p1[0].IP, "outside-after-repairs") })
}

func nftRepairs(t *testing.T, n *cluster.Node) float64 {
	t.Helper()
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m[`podnet_repairs_total{object="nft-table"}`]
	if !ok {
		t.Fatalf("%s: no podnet_repairs_total{object=\"nft-table\"} in /metrics", n.Name)
	}
	return v
}

// testTableRepair breaks node1's table in one way after another (`nft
// flush ruleset` among them): each is found at once by podnet-routed's
// nftables monitor, or by the next periodic resync, which writes the
// table again, by content (`nft -s list table`, without the counter's
// values).
func testTableRepair(t *testing.T, c *cluster.Cluster, n *cluster.Node, pods []*cluster.Pod) {
	ctx := context.Background()
	nft := func(args ...string) (string, error) { return n.NS.Exec(ctx, "nft", args...) }
	listing := func() string {
		out, err := nft("-s", "list", "table", "inet", "podnet")
		if err != nil {
			return "no table: " + out
		}
		return out
	}
	handle := func(chain, match string) string {
		out, err := nft("-a", "list", "chain", "inet", "podnet", chain)
		if err != nil {
			t.Fatalf("nft list chain %s: %v: %s", chain, err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if m := regexp.MustCompile(`# handle (\d+)`).FindStringSubmatch(l); m != nil && strings.Contains(l, match) {
				return m[1]
			}
		}
		t.Fatalf("no rule %q in chain %s:\n%s", match, chain, out)
		return ""
	}
	written := listing()
	peer := c.Nodes[1].IP.String()
	// each break is made when its turn comes: handles change with every
	// rewrite
	for _, tc := range []struct {
		name string
		args func() []string
	}{
		{"table deleted", func() []string { return []string{"delete", "table", "inet", "podnet"} }},
		{"ruleset flushed", func() []string { return []string{"flush", "ruleset"} }},
		{"rule deleted", func() []string {
			return []string{"delete", "rule", "inet", "podnet", "tunnel_outer", "handle", handle("tunnel_outer", "ip saddr @peers4 accept")}
		}},
		{"rule edited", func() []string {
			return []string{"replace", "rule", "inet", "podnet", "tunnel_outer", "handle", handle("tunnel_outer", "fib daddr type != local return"), "accept"}
		}},
		{"peer element deleted", func() []string { return []string{"delete", "element", "inet", "podnet", "peers4", "{ " + peer + " }"} }},
		{"element added", func() []string {
			return []string{"add", "element", "inet", "podnet", "peers4", "{ " + cluster.OutsideIP.String() + " }"}
		}},
	} {
		args := tc.args()
		repairs := len(n.Routed().LogRecords("nft table repaired"))
		counted := nftRepairs(t, n)
		if out, err := nft(args...); err != nil {
			t.Fatalf("%s: nft %s: %v: %s", tc.name, strings.Join(args, " "), err, out)
		}
		broken := time.Now()
		if listing() == written {
			// the break did nothing, or podnet-routed heard of it and
			// wrote the table back before the listing (about 100 ms):
			// its repair log line tells them apart
			if err := nettest.Poll(ctx, 2*time.Second, 50*time.Millisecond, func() error {
				if len(n.Routed().LogRecords("nft table repaired")) > repairs {
					return nil
				}
				return errors.New("no repair logged")
			}); err != nil {
				t.Fatalf("%s: the table did not change", tc.name)
			}
		}
		limit := 2*resync + time.Second // two resync intervals, and the apply's own time
		err := nettest.Poll(ctx, limit, 50*time.Millisecond, func() error {
			if got := listing(); got != written {
				return fmt.Errorf("table now:\n%s", got)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: not written back within two resync intervals (%v): %v\nwant:\n%s", tc.name, 2*resync, err, written)
			continue
		}
		took := time.Since(broken)
		// the repair is logged and counted right after the write
		if err := nettest.Poll(ctx, 5*time.Second, 50*time.Millisecond, func() error {
			if got := len(n.Routed().LogRecords("nft table repaired")); got != repairs+1 {
				return fmt.Errorf("%d \"nft table repaired\" log lines, want one more than the %d before", got, repairs)
			}
			if got := nftRepairs(t, n); got != counted+1 {
				return fmt.Errorf("podnet_repairs_total{object=\"nft-table\"} %v, want one more than the %v before", got, counted)
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		t.Logf("%s: written back after %v", tc.name, took.Round(time.Millisecond))
	}
	requireConnected(t, cluster.PingMatrix(ctx, pods))
}
