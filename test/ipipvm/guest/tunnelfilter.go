package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/nettest"
)

// sinkPort is where the target pod listens for the forged packets.
const sinkPort = 7946

// tunnelFilter plays a host on the underlay that is not a Node, and a pod:
// each sends node-a an IPIP packet (a raw IPPROTO_IPIP socket: the kernel
// adds the outer header) whose inner packet is UDP from node-b's pod
// address, forged, to node-a's pod. node-a must drop both and count them
// (podnet_tunnel_dropped_total); the same packet sent by node-b, a Node,
// reaches the pod, so the check is not vacuous.
func (g *guest) tunnelFilter() error {
	a, b := g.nodes[0], g.nodes[1]
	outsider, err := g.outsider()
	if err != nil {
		return err
	}
	var conn net.PacketConn
	if err := a.podNS.Do(func(ns.NetNS) error {
		conn, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", sinkPort))
		return err
	}); err != nil {
		return fmt.Errorf("%s: listen: %w", a.podName, err)
	}
	defer conn.Close()
	var mu sync.Mutex
	got := map[string]string{}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			got[string(buf[:n])] = from.String()
			mu.Unlock()
		}
	}()
	received := func(marker string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		from, ok := got[marker]
		return from, ok
	}
	send := func(from ns.NetNS, marker string) error {
		inner := nettest.IPv4UDP(b.podIP, a.podIP, 40000, sinkPort, []byte(marker))
		return from.Do(func(ns.NetNS) error {
			c, err := net.ListenPacket("ip4:4", "0.0.0.0") // IPPROTO_IPIP
			if err != nil {
				return fmt.Errorf("raw IPIP socket: %w", err)
			}
			defer c.Close()
			_, err = c.WriteTo(inner, &net.IPAddr{IP: a.ip.AsSlice()})
			return err
		})
	}
	dropped := func() (float64, error) {
		m, err := g.routedMetrics(a)
		if err != nil {
			return 0, err
		}
		v, ok := m["podnet_tunnel_dropped_total"]
		if !ok {
			return 0, errors.New("no podnet_tunnel_dropped_total in /metrics")
		}
		return v, nil
	}
	for _, tc := range []struct {
		who  string
		from ns.NetNS
		drop bool
	}{
		{"a host on the underlay that is no Node (" + outsiderIP(a.ip).String() + ")", outsider, true},
		{"node-a's own pod " + a.podName, a.podNS, true},
		{"Node " + b.Name, b.netns, false},
	} {
		marker := "ipip from " + tc.who
		before, err := dropped()
		if err != nil {
			return err
		}
		if err := send(tc.from, marker); err != nil {
			return fmt.Errorf("%s: %w", tc.who, err)
		}
		if !tc.drop {
			if err := waitFor(5*time.Second, func() error {
				if _, ok := received(marker); !ok {
					return errors.New("not received")
				}
				return nil
			}); err != nil {
				return fmt.Errorf("IPIP packet from %s never reached %s: %w", tc.who, a.podName, err)
			}
			from, _ := received(marker)
			g.result("tunnel filter: IPIP from %s (inner source %s forged) reaches %s: received from %s", tc.who, b.podIP, a.podName, from)
			continue
		}
		var after float64
		if err := waitFor(10*time.Second, func() error {
			if after, err = dropped(); err != nil || after <= before {
				return fmt.Errorf("podnet_tunnel_dropped_total %v (was %v), %v", after, before, err)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("%s: IPIP packet from %s not counted as dropped: %w", a.Name, tc.who, err)
		}
		time.Sleep(500 * time.Millisecond) // what was not dropped has arrived by now
		if from, ok := received(marker); ok {
			return fmt.Errorf("IPIP packet from %s with forged inner source %s reached %s (from %s): the tunnel filter let it through", tc.who, b.podIP, a.podName, from)
		}
		g.result("tunnel filter: IPIP from %s dropped by %s (podnet_tunnel_dropped_total %v -> %v), %s received nothing", tc.who, a.Name, before, after, a.podName)
	}
	return nil
}

// outsiderIP is the address of the host that is no Node: .200 of the
// underlay's /24.
func outsiderIP(nodeIP netip.Addr) netip.Addr {
	b := nodeIP.As4()
	b[3] = 200
	return netip.AddrFrom4(b)
}

// outsider makes a netns on the underlay bridge that is no Node: eth0
// with outsiderIP.
func (g *guest) outsider() (ns.NetNS, error) {
	o, err := nettest.NewNamedNetNS("outsider")
	if err != nil {
		return nil, err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "ul-outsider", MTU: underlayMTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(o.Fd())),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("outsider veth: %w", err)
	}
	br, err := netlinksafe.LinkByName(bridgeName)
	if err != nil {
		return nil, err
	}
	l, err := netlinksafe.LinkByName(veth.Name)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetMaster(l, br); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, err
	}
	ip := outsiderIP(g.nodes[0].ip)
	err = o.Do(func() error {
		eth0, err := netlinksafe.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(g.cfg.UnderlayBits, 32)}}
		if err := netlink.AddrAdd(eth0, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(eth0)
	})
	if err != nil {
		return nil, fmt.Errorf("outsider eth0: %w", err)
	}
	g.logf("outsider: netns on bridge %q, eth0 %s/%d (no Node)", bridgeName, ip, g.cfg.UnderlayBits)
	return o.NetNS, nil
}
