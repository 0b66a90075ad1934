package routed

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/test/nettest"
)

// TestPodFilterRepairWhole (issue 31): the pod filter's tables are
// rebuilt whole, every live pod's elements with them, from the records
// the plugins keep: with two routed and two bridged pods on a node,
// `nft delete table` of each kind (inet and bridge podnet-pods, the
// netdev podnet-pods-<k> of a routed pod's port), `nft flush ruleset`
// and single elements deleted.
// podnet-routed runs with a 30 s resync, so only its nftables monitor
// can put things back within the 2 s allowed: every guard is back (every
// pod's elements, the routed pods' L2 chains), a forged datagram after
// that is not delivered and is counted, the pods' own traffic flows, and
// podnet_repairs_total{object="pod-filter"} counts exactly the damaged
// modes (nothing when idle, though the monitor hears podnet's own
// writes). The tunnel filter and masquerade table (inet podnet) comes
// back after the flush as well, and counts once.
func TestPodFilterRepairWhole(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	n := c.rcNode("node-pf", "172.30.0.1", "10.244.1.0/24", routedMode, "--resync-interval=30s")
	br := n.withMode(t, bridgedMode, "10.213.7.0/24")
	r1, r2 := n.attach(t, "r1"), n.attach(t, "r2")
	b1, b2 := br.attach(t, "b1"), br.attach(t, "b2")
	pods := []*rcPod{r1, r2, b1, b2}
	want := wantFilter(t, pods)
	if err := filterWhole(n, want, pods); err != nil {
		t.Fatalf("the filter after ADD: %v", err)
	}
	hasTunnelTable := nftOK(n, "list", "table", "inet", contract.NFTable) == nil
	if !hasTunnelTable {
		t.Fatalf("no table inet %s on the node: the flush below would not test its repair", contract.NFTable)
	}
	recv := map[*rcPod]*udpSink{r2: listenPod(t, r2), b2: listenPod(t, b2)}
	forged := map[*rcPod]netip.Addr{r1: netip.MustParseAddr("10.244.1.250"), b1: netip.MustParseAddr("10.213.7.250")}
	for p, ip := range forged {
		addPodAddr(t, p, ip)
	}
	// the pods' own traffic and a forged datagram before anything is broken
	probe := func(step string) {
		t.Helper()
		for _, pair := range [][2]*rcPod{{r1, r2}, {b1, b2}} {
			from, to := pair[0], pair[1]
			fam := nftables.TableFamilyINet
			if from.n.mode.bridged {
				fam = nftables.TableFamilyBridge
			}
			ctr := contract.PodFilterDropCounter(contract.DropIPv4Source)
			before := podFilterCounter(t, n, fam, ctr)
			payload := fmt.Sprintf("%s-forged-%s", step, from.name)
			sendPodUDP(t, from, forged[from], to.ip, payload)
			own := fmt.Sprintf("%s-own-%s", step, from.name)
			sendPodUDP(t, from, from.ip, to.ip, own)
			recv[to].waitFor(t, own)
			if got := podFilterCounter(t, n, fam, ctr) - before; got < 1 {
				t.Errorf("%s: the forged datagram of %s was not counted (%s rose by %d)", step, from.name, ctr, got)
			}
			if recv[to].has(payload) {
				t.Errorf("%s: %s received the datagram %s forged with source %s", step, to.name, payload, forged[from])
			}
		}
	}
	probe("intact")
	base := n.d.repairs(t, "pod-filter")
	if base != 0 {
		t.Fatalf("pod-filter repairs before anything was broken: %v", base)
	}
	damages := []struct {
		name    string
		nft     []string
		repairs float64 // pod-filter repairs it must count
		tunnel  bool    // inet podnet is gone too
	}{
		{"delete table inet podnet-pods", []string{"delete", "table", "inet", contract.PodFilterTable}, 1, false},
		{"delete table netdev podnet-pods-<k> (a routed pod's)", []string{"delete", "table", "netdev", contract.PodFilterL2TableOf(r1.index)}, 1, false},
		{"delete table bridge podnet-pods", []string{"delete", "table", "bridge", contract.PodFilterTable}, 1, false},
		{"flush ruleset", []string{"flush", "ruleset"}, 2, true},
		{"delete one addrs4 element (inet)", []string{"delete", "element", "inet", contract.PodFilterTable, "addrs4", fmt.Sprintf("{ %s . %s }", r1.veth, r1.ip)}, 1, false},
		{"delete one macs element (bridge)", []string{"delete", "element", "bridge", contract.PodFilterTable, "macs", fmt.Sprintf("{ %s . %s }", b1.veth, want.macs[b1])}, 1, false},
		{"delete one rule (netdev l2)", nil, 1, false},
	}
	for _, d := range damages {
		args := d.nft
		if args == nil { // the routed L2 chain's ARP rule
			args = []string{"delete", "rule", "netdev", contract.PodFilterL2TableOf(r1.index), "l2", "handle", l2RuleHandle(t, n, contract.PodFilterL2TableOf(r1.index), "ARP from another address")}
		}
		before := n.d.repairs(t, "pod-filter")
		beforeNFT := n.d.repairs(t, "nft-table")
		if err := nftOK(n, args...); err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		start := time.Now()
		nettest.Eventually(t, 2*time.Second, d.name+": every guard back", func() error { return filterWhole(n, want, pods) })
		took := time.Since(start)
		if d.tunnel {
			nettest.Eventually(t, 2*time.Second, d.name+": table inet podnet back", func() error {
				return nftOK(n, "list", "table", "inet", contract.NFTable)
			})
		}
		// the counter follows the repair's write
		nettest.Eventually(t, 2*time.Second, d.name+": repairs counted", func() error {
			if got := n.d.repairs(t, "pod-filter") - before; got != d.repairs {
				return fmt.Errorf("podnet_repairs_total{object=\"pod-filter\"} rose by %v, want %v", got, d.repairs)
			}
			return nil
		})
		if d.tunnel {
			if got := n.d.repairs(t, "nft-table") - beforeNFT; got != 1 {
				t.Errorf("%s: podnet_repairs_total{object=\"nft-table\"} rose by %v, want 1", d.name, got)
			}
		}
		t.Logf("%s: every guard back after %s", d.name, took.Round(time.Millisecond))
		probe(strings.ReplaceAll(d.name, " ", "_"))
	}
	// idle: the monitor hears podnet's own writes (the probes' ADD-free
	// traffic writes nothing; the repairs above did), and counts nothing
	settled := n.d.repairs(t, "pod-filter")
	time.Sleep(3 * time.Second)
	if got := n.d.repairs(t, "pod-filter"); got != settled {
		t.Errorf("pod-filter repairs rose from %v to %v with nothing broken", settled, got)
	}
	total := 0.0
	for _, d := range damages {
		total += d.repairs
	}
	if got := n.d.repairs(t, "pod-filter") - base; got != total {
		t.Errorf("pod-filter repairs in all = %v, want %v (one per damaged mode)", got, total)
	}
}

// withMode is a second way to attach pods to n's node: mode's plugin on
// subnet (its own store, not the PodCIDR).
func (n *rcNode) withMode(t *testing.T, mode cniMode, subnet string) *rcNode {
	t.Helper()
	m := &rcNode{node: n.node, d: n.d, args: n.args, mode: mode, podCIDR: netip.MustParsePrefix(subnet)}
	m.useConf(t, subnet)
	return m
}

// filterWant is what the filter must hold for the pods.
type filterWant struct {
	elems []string
	macs  map[*rcPod]string
}

func wantFilter(t *testing.T, pods []*rcPod) filterWant {
	t.Helper()
	w := filterWant{macs: map[*rcPod]string{}}
	for _, p := range pods {
		fam := "inet"
		if p.n.mode.bridged {
			fam = "bridge"
		}
		var mac net.HardwareAddr
		podDo(t, p, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			mac = l.Attrs().HardwareAddr
			return nil
		})
		w.macs[p] = mac.String()
		w.elems = append(w.elems,
			fmt.Sprintf("%s/ports %d", fam, p.index),
			fmt.Sprintf("%s/addrs4 %d . %s", fam, p.index, p.ip),
			fmt.Sprintf("%s/addrs6 %d . %s", fam, p.index, podfilter.EUI64LinkLocal(mac)))
		if p.n.mode.bridged {
			w.elems = append(w.elems, fmt.Sprintf("bridge/macs %d . %s", p.index, mac))
		}
	}
	return w
}

// filterWhole says what of the filter is missing: an element, a table,
// the routed pods' L2 chains, the chains' rules.
func filterWhole(n *rcNode, want filterWant, pods []*rcPod) error {
	have, err := nettest.PodFilterElements(n.ns)
	if err != nil {
		return err
	}
	in := map[string]bool{}
	for _, e := range have {
		in[e] = true
	}
	for _, e := range want.elems {
		if !in[e] {
			return fmt.Errorf("element %s missing", e)
		}
	}
	for _, tbl := range [][]string{{"inet", "prerouting"}, {"bridge", "prerouting"}} {
		if err := nftOK(n, "list", "chain", tbl[0], contract.PodFilterTable, tbl[1]); err != nil {
			return err
		}
	}
	for k := range contract.PodFilterL2Tables {
		if err := nftOK(n, "list", "chain", "netdev", contract.PodFilterL2Table(k), "l2"); err != nil {
			return err
		}
	}
	for _, p := range pods {
		if !p.n.mode.bridged {
			if err := nftOK(n, "list", "chain", "netdev", contract.PodFilterL2TableOf(p.index), fmt.Sprintf("port-%d", p.index)); err != nil {
				return err
			}
		}
	}
	// the rules as the plugins write them
	for _, g := range []podfilter.Guard{podfilter.Routed, podfilter.Bridged} {
		var verr error
		n.c.do(n.ns, func() error {
			for _, p := range pods {
				if p.n.mode.bridged == (g == podfilter.Bridged) {
					verr = g.Verify(podfilter.Port{Index: p.index, IPs: []net.IP{p.ip.AsSlice()}, MAC: mustMAC(want.macs[p])})
					if verr != nil {
						return nil
					}
				}
			}
			return nil
		})
		if verr != nil {
			return verr
		}
	}
	return nil
}

func mustMAC(s string) net.HardwareAddr {
	m, _ := net.ParseMAC(s)
	return m
}

// nftOK runs nft in the node netns.
func nftOK(n *rcNode, args ...string) error {
	var out []byte
	err := n.ns.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// l2RuleHandle is the handle of the rule with comment of the L2 chain of
// the routed mode's netdev table table.
func l2RuleHandle(t *testing.T, n *rcNode, table, comment string) string {
	t.Helper()
	var out []byte
	n.c.do(n.ns, func() error {
		var err error
		out, err = exec.Command("nft", "-a", "list", "chain", "netdev", table, "l2").CombinedOutput()
		return err
	})
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `comment "`+comment+`"`) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				return strings.TrimSpace(line[i+len("# handle "):])
			}
		}
	}
	t.Fatalf("no rule %q in:\n%s", comment, out)
	return ""
}

func podFilterCounter(t *testing.T, n *rcNode, fam nftables.TableFamily, name string) uint64 {
	t.Helper()
	v, err := nettest.PodFilterCounter(n.ns, fam, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// addPodAddr gives the pod's eth0 a /32 it will forge datagrams from.
func addPodAddr(t *testing.T, p *rcPod, ip netip.Addr) {
	t.Helper()
	podDo(t, p, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
}

// udpSink collects what a pod receives on UDP port 7777.
type udpSink struct {
	mu  sync.Mutex
	got []string
}

func listenPod(t *testing.T, p *rcPod) *udpSink {
	t.Helper()
	s := &udpSink{}
	var pc net.PacketConn
	podDo(t, p, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", p.ip.String()+":7777")
		return err
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, string(buf[:k]))
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *udpSink) has(payload string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.got {
		if g == payload {
			return true
		}
	}
	return false
}

func (s *udpSink) waitFor(t *testing.T, payload string) {
	t.Helper()
	nettest.Eventually(t, 5*time.Second, "datagram "+payload, func() error {
		if s.has(payload) {
			return nil
		}
		return fmt.Errorf("not received")
	})
}

// sendPodUDP sends one datagram from the pod's address src to dst:7777.
func sendPodUDP(t *testing.T, p *rcPod, src, dst netip.Addr, payload string) {
	t.Helper()
	podDo(t, p, func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: dst.AsSlice(), Port: 7777})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
}

// podDo runs f in the pod's netns.
func podDo(t *testing.T, p *rcPod, f func() error) {
	t.Helper()
	if err := p.ns.Do(f); err != nil {
		t.Fatal(err)
	}
}
