package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// The pod filter is an allow-list (issue 31): from a pod's port, on both
// plugins and both families, nothing but what a pod needs passes. Each
// hand-made frame below is sent from inside the attacker pod with an
// AF_PACKET socket (CAP_NET_RAW, which containers have by default) and
// must neither reach the victim pod (a UDP listener on both its
// addresses) nor go uncounted: its reason's counter (drop-<reason>) rises
// by what was sent. Then the attacker's own traffic still flows: UDP from
// its own addresses, a ping over its own link-local address, ARP and ND
// (the node and the bridge resolve it).

// l2Family is the table family where the mode counts the L2 reasons
// (arp, vlan, ethertype): the routed mode's netdev table.
func (m spoofMode) l2Family() nftables.TableFamily {
	if m.family == nftables.TableFamilyBridge {
		return m.family
	}
	return nftables.TableFamilyNetdev
}

// tagged puts VLAN tags (outermost first: TPID, VID) between the MACs and
// the EtherType of frame.
func tagged(frame []byte, tags ...[2]uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	for _, tg := range tags {
		out = binary.BigEndian.AppendUint16(out, tg[0])
		out = binary.BigEndian.AppendUint16(out, tg[1])
	}
	return append(out, frame[12:]...)
}

func ether(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	f := append(append(append([]byte{}, dst...), src...), byte(etherType>>8), byte(etherType))
	return append(f, payload...)
}

// ipv6UDP is an IPv6 packet (hop limit 64) carrying UDP from src:sport to
// dst:dport, with its checksum.
func ipv6UDP(src, dst net.IP, sport, dport int, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], uint16(sport))
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	pseudo := append(append([]byte{}, src.To16()...), dst.To16()...)
	pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(udp)))
	pseudo = append(pseudo, 0, 0, 0, 17)
	sum := checksum(append(pseudo, udp...))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(udp)))
	h[6], h[7] = 17, 64
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(h, udp...)
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		v := uint32(b[i]) << 8
		if i+1 < len(b) {
			v |= uint32(b[i+1])
		}
		sum += v
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// icmpv6 is an IPv6 packet (hop limit 255) carrying ICMPv6 msg, checksum
// filled in.
func icmpv6(src, dst net.IP, msg []byte) []byte {
	msg = append([]byte{}, msg...)
	msg[2], msg[3] = 0, 0
	pseudo := append(append([]byte{}, src.To16()...), dst.To16()...)
	pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(msg)))
	pseudo = append(pseudo, 0, 0, 0, 58)
	binary.BigEndian.PutUint16(msg[2:], checksum(append(pseudo, msg...)))
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(msg)))
	h[6], h[7] = 58, 255
	copy(h[8:], src.To16())
	copy(h[24:], dst.To16())
	return append(h, msg...)
}

func TestPodFilterAllowList(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 45, true, nil)
			attacker := addSpoofPod(t, rt, "allow-attacker")
			victim := addSpoofPod(t, rt, "allow-victim")
			waitIPv6Settled(t, attacker.NS)
			waitIPv6Settled(t, victim.NS)
			rec := listenUDP(t, victim)
			// where the attacker's frames go: the victim's MAC on the
			// bridge, the host veth (the pod's gateway) when routed
			dst := victim.mac
			if m.family != nftables.TableFamilyBridge {
				rt.Node.Do(func() error {
					l, err := netlink.LinkByName(attacker.host)
					if err != nil {
						return err
					}
					dst = l.Attrs().HardwareAddr
					return nil
				})
			}
			// the pod's own link-local address is the one the filter knows
			if got, want := podLinkLocal(t, attacker), podfilter.EUI64LinkLocal(attacker.mac); !got.Equal(want) {
				t.Fatalf("the pod's link-local address is %s, want the EUI-64 one %s (ADD sets addr_gen_mode)", got, want)
			}
			a4, v4 := netip.MustParseAddr(attacker.v4.String()), netip.MustParseAddr(victim.v4.String())
			forged4 := netip.MustParseAddr(fmt.Sprintf("%s.45.200", m.v4))
			forged6 := net.ParseIP(fmt.Sprintf("%s:45::200", m.v6))
			victimLL := podfilter.EUI64LinkLocal(victim.mac)
			udp4 := func(src netip.Addr, payload string) []byte {
				return ether(dst, attacker.mac, 0x0800, nettest.IPv4UDP(src, v4, 40000, spoofPort, []byte(payload)))
			}
			udp6 := func(src net.IP, payload string) []byte {
				return ether(dst, attacker.mac, 0x86dd, ipv6UDP(src, victim.v6, 40000, spoofPort, []byte(payload)))
			}
			cases := []struct {
				name, reason string
				family       nftables.TableFamily
				frame        []byte
			}{
				{"802.1Q VID 0, IPv4 forged source", contract.DropVLAN, m.l2Family(), tagged(udp4(forged4, "vlan0-forged4"), [2]uint16{0x8100, 0})},
				{"802.1Q VID 0, IPv4 own source", contract.DropVLAN, m.l2Family(), tagged(udp4(a4, "vlan0-own4"), [2]uint16{0x8100, 0})},
				{"802.1Q VID 7, IPv6 own source", contract.DropVLAN, m.l2Family(), tagged(udp6(attacker.v6, "vlan7-own6"), [2]uint16{0x8100, 7})},
				{"802.1ad VID 0, IPv6 forged source", contract.DropVLAN, m.l2Family(), tagged(udp6(forged6, "qinq1-forged6"), [2]uint16{0x88a8, 0})},
				{"802.1Q VID 0 twice, IPv4 forged source", contract.DropVLAN, m.l2Family(), tagged(udp4(forged4, "vlan00-forged4"), [2]uint16{0x8100, 0}, [2]uint16{0x8100, 0})},
				{"802.1ad then 802.1Q, IPv6 forged source", contract.DropVLAN, m.l2Family(), tagged(udp6(forged6, "qinq-forged6"), [2]uint16{0x88a8, 0}, [2]uint16{0x8100, 0})},
				{"EtherType 0x88b5", contract.DropEtherType, m.l2Family(), ether(dst, attacker.mac, 0x88b5, []byte("local experimental ethertype 1....."))},
				{"EtherType 0x8863 (PPPoE discovery)", contract.DropEtherType, m.l2Family(), ether(dst, attacker.mac, 0x8863, make([]byte, 46))},
				{"ARP claiming the victim's IPv4 address", contract.DropARP, m.l2Family(), gratuitousARP(victim.v4, attacker.mac)},
				{"NA claiming the victim's link-local address", contract.DropNeighborAdvert, m.family,
					ether(dst, attacker.mac, 0x86dd, icmpv6(podfilter.EUI64LinkLocal(attacker.mac), net.ParseIP("ff02::1"), neighborAdvertisement(victimLL, attacker.mac)))},
				{"IPv6 UDP from the victim's link-local address", contract.DropLinkLocal, m.family, udp6(victimLL, "ll-victim6")},
				{"IPv6 UDP from ::", contract.DropUnspecified, m.family, udp6(net.IPv6unspecified, "unspec6")},
				{"IPv4 UDP from a forged source", contract.DropIPv4Source, m.family, udp4(forged4, "forged4")},
				{"IPv6 UDP from a forged source", contract.DropIPv6Source, m.family, udp6(forged6, "forged6")},
			}
			const n = 3
			sendUDP(t, attacker.NS, attacker.v4, victim.v4, "true-before4")
			rec.waitFor(t, "true-before4")
			for _, c := range cases {
				ctr := contract.PodFilterDropCounter(c.reason)
				before := counter(t, rt.Node, c.family, ctr)
				sendFrame(t, attacker, c.frame, n)
				nettest.Eventually(t, 2*time.Second, c.name+" counted", func() error {
					if got := counter(t, rt.Node, c.family, ctr) - before; got < n {
						return fmt.Errorf("%s: counter %s rose by %d, want %d", c.name, ctr, got, n)
					}
					return nil
				})
			}
			// the attacker's own traffic flows: UDP from its own
			// addresses (ARP and ND resolve it), its own link-local
			// address towards its gateway (routed) or its neighbor (bridge)
			sendUDP(t, attacker.NS, attacker.v4, victim.v4, "true-after4")
			sendUDP(t, attacker.NS, attacker.v6, victim.v6, "true-after6")
			rec.waitFor(t, "true-after4")
			rec.waitFor(t, "true-after6")
			llPeer := veth.GatewayV6
			if m.family == nftables.TableFamilyBridge {
				llPeer = victimLL.String()
			}
			if err := nettest.Ping(attacker.NS, llPeer+"%eth0"); err != nil {
				t.Errorf("the pod's own link-local traffic: %v", err)
			}
			for _, got := range rec.received() {
				payload := got[strings.Index(got, " ")+1:]
				if !strings.HasPrefix(payload, "true-") {
					t.Errorf("the victim received a forged datagram: %s", got)
				}
			}
		})
	}
}

// TestPodFilterKeepsUnrecordedPods: pods attached by a podnet before the
// records (an upgrade) have elements but no record. When the next ADD has
// to write the filter whole (here: the routed mode's netdev tables and the
// bridge's chain are gone, as after an upgrade that adds them), and when
// podnet-routed's Repair does, the elements the table still holds of
// such a live pod stay, and it still reaches its neighbour.
func TestPodFilterKeepsUnrecordedPods(t *testing.T) {
	for _, m := range spoofModes {
		t.Run(m.name, func(t *testing.T) {
			rt := m.runtime(t, 46, false, nil)
			old := addSpoofPod(t, rt, "unrec-old")
			dir, _ := stateDirs.Load(rt)
			rec := fmt.Sprintf("%s/pod-filter/%s/%d", dir, m.guard(rt).Mode(), old.hostIdx)
			if err := os.Remove(rec); err != nil {
				t.Fatalf("the pod's record: %v", err)
			}
			if m.family == nftables.TableFamilyBridge {
				nftCLI(t, rt.Node, "delete", "chain", "bridge", contract.PodFilterTable, "prerouting")
			} else {
				for k := range contract.PodFilterL2Tables {
					nftCLI(t, rt.Node, "delete", "table", "netdev", contract.PodFilterL2Table(k))
				}
			}
			oldElems := slices.Clone(m.wantElements(old))
			second := addSpoofPod(t, rt, "unrec-new")
			if got := elemsOfIndex(filterOf(t, rt.Node), old.hostIdx); !sameElements(got, oldElems) {
				t.Errorf("after an ADD that wrote the filter whole, the unrecorded pod has %v, want %v", got, oldElems)
			}
			rec2 := listenUDP(t, second)
			sendUDP(t, old.NS, old.v4, second.v4, "unrecorded-after-add")
			rec2.waitFor(t, "unrecorded-after-add")
			// and podnet-routed's whole write keeps it too
			nftCLI(t, rt.Node, "delete", "element", famName(m.family), contract.PodFilterTable, "addrs4", fmt.Sprintf("{ %s . %s }", second.host, second.v4))
			var why string
			nettest.Do(t, rt.Node.NS, func() (err error) { why, _, err = m.guard(rt).Repair(); return err })
			if why == "" {
				t.Fatal("Repair found nothing missing")
			}
			if got := elemsOfIndex(filterOf(t, rt.Node), old.hostIdx); !sameElements(got, oldElems) {
				t.Errorf("after Repair (%s), the unrecorded pod has %v, want %v", why, got, oldElems)
			}
			sendUDP(t, old.NS, old.v4, second.v4, "unrecorded-after-repair")
			rec2.waitFor(t, "unrecorded-after-repair")
		})
	}
}
