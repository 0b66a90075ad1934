package veth

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/podfilter"
)

// DefaultBridge is the bridge used when the config names none.
const DefaultBridge = "podnet0"

// Bridged returns the verbs of the podnet-bridge plugin: the bridge mode.
func Bridged() skel.CNIFuncs { return newBridgedPlugin().funcs() }

func newBridgedPlugin() *plugin {
	return &plugin{name: "podnet-bridge", newMode: newBridgedMode}
}

// bridgeConf is podnet-bridge's part of the network config.
type bridgeConf struct {
	Bridge      string `json:"bridge"`
	IsGateway   *bool  `json:"isGateway"`
	HairpinMode bool   `json:"hairpinMode"`
}

// bridged is podnet-bridge's mode.
type bridged struct {
	conf bridgeConf
	br   *netlink.Bridge
}

func newBridgedMode(stdin []byte, base *netConf) (mode, error) {
	var c bridgeConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, cniErrorf(types.ErrInvalidNetworkConfig, "invalid network config: %v", err)
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := utils.ValidateInterfaceName(c.Bridge); err != nil {
		return nil, cniErrorf(types.ErrInvalidNetworkConfig, "network %q: bridge name %q: %s", base.Name, c.Bridge, err.Msg)
	}
	if c.IsGateway == nil {
		yes := true
		c.IsGateway = &yes
	}
	return &bridged{conf: c}, nil
}

func (b *bridged) hostMAC() net.HardwareAddr { return nil }

// describePod gives the pod its addresses with their subnet prefix and
// default routes via the IPAM gateway of each family (the subnet's first
// address when IPAM names none).
func (b *bridged) describePod(ifName string, alloc *current.Result) (podSide, error) {
	side := podSide{IfName: ifName, Routes: alloc.Routes}
	for _, c := range alloc.IPs {
		addr := c.Address
		side.Addrs = append(side.Addrs, &addr)
		gw := c.Gateway
		if gw == nil {
			gw = firstAddr(&addr)
		}
		if addr.IP.To4() != nil && side.GatewayV4 == nil {
			side.GatewayV4 = gw.To4()
		} else if addr.IP.To4() == nil && side.GatewayV6 == nil {
			side.GatewayV6 = gw
		}
	}
	return side, nil
}

func (b *bridged) prepareNode(side podSide, mtu int) error {
	br, err := ensureBridge(b.conf.Bridge, mtu)
	if err != nil {
		return err
	}
	b.br = br
	if *b.conf.IsGateway {
		if err := ensureBridgeGateway(br, bridgeGateways(side)); err != nil {
			return err
		}
	}
	return enableForwarding(b.conf.Bridge, side.GatewayV4 != nil, side.hasIPv6())
}

func (b *bridged) guard() podfilter.Guard { return podfilter.Bridged }

// attachHost makes the host veth (still down) a port of the bridge with
// the configured hairpin flag, before podnet-routed hears of the pod.
func (b *bridged) attachHost(h *netlink.Handle, host netlink.Link) error {
	br := b.br
	if err := h.LinkSetMaster(host, br); err != nil {
		return fmt.Errorf("attach %s to bridge %s: %w", host.Attrs().Name, br.Attrs().Name, err)
	}
	if err := h.LinkSetHairpin(host, b.conf.HairpinMode); err != nil {
		return fmt.Errorf("set hairpin mode on %s: %w", host.Attrs().Name, err)
	}
	return nil
}

// setupHost gives the host veth (a port of the bridge since attachHost)
// the host-side settings and brings it up.
func (b *bridged) setupHost(h *netlink.Handle, host netlink.Link, _ podSide) error {
	if err := hardenHostIface(host.Attrs().Name); err != nil {
		return fmt.Errorf("host veth %s: %w", host.Attrs().Name, err)
	}
	if err := noKernelLinkLocal(h, host); err != nil {
		return fmt.Errorf("host veth %s: %w", host.Attrs().Name, err)
	}
	if err := h.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", host.Attrs().Name, err)
	}
	return nil
}

func (b *bridged) finishHost(*netlink.Handle, netlink.Link, podSide) error { return nil }

// checkHost verifies that the host veth exists, is up and is a port of the
// bridge.
func (b *bridged) checkHost(hostName string, _ podSide) (netlink.Link, error) {
	bridge := b.conf.Bridge
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %s not found: %w", hostName, err)
	}
	br, err := lookupBridge(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	if host.Attrs().MasterIndex != br.Attrs().Index {
		return nil, fmt.Errorf("host veth %s is not attached to bridge %s", hostName, bridge)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("host veth %s is down", hostName)
	}
	return host, nil
}

// result is the ADD result of a bridged attachment: prevResult's content,
// then the bridge, the host veth and the pod interface.
func (b *bridged) result(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result {
	br := &current.Interface{Name: b.conf.Bridge, Mac: b.br.Attrs().HardwareAddr.String()}
	result := chainedBase(prev)
	result.Interfaces = append(result.Interfaces, br, &current.Interface{Name: hostName}, podIface)
	addPodIPsAndRoutes(result, len(result.Interfaces)-1, side)
	return result
}

// ensureBridge returns the bridge name, creating it (up, with mtu) when it
// does not exist. Concurrent callers racing to create it all succeed. The
// bridge gets hostIfaceSettings before it comes up (an existing bridge
// gets them again: a bridge of an older podnet, or one someone changed):
// the node's own interface on the pods' segment takes no Router
// Advertisement, SLAAC prefix or redirect from a pod.
//
// A new bridge gets a MAC of its own: a bridge whose MAC was never set takes
// the lowest MAC of its ports and changes it as ports come and go, and the
// pods, which cache the gateway's MAC, would then lose the gateway when the
// pod owning that port leaves.
func ensureBridge(name string, mtu int) (*netlink.Bridge, error) {
	br, err := lookupBridge(name)
	if err == nil {
		if err := hardenHostIface(name); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
		return br, setUp(br)
	}
	if !isNotFound(err) {
		return nil, err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	attrs.MTU = mtu
	attrs.HardwareAddr = randomMAC()
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create bridge %s: %w", name, err)
	}
	if br, err = lookupBridge(name); err != nil {
		return nil, err
	}
	if err := hardenHostIface(name); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	return br, setUp(br)
}

func lookupBridge(name string) (*netlink.Bridge, error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, err
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("interface %s exists and is a %s, not a bridge", name, l.Type())
	}
	return br, nil
}

func setUp(l netlink.Link) error {
	if l.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// ensureBridgeGateway puts each gateway address (with its subnet's prefix)
// on the bridge once and turns on forwarding for the bridge's families.
func ensureBridgeGateway(br *netlink.Bridge, gateways []*net.IPNet) error {
	for _, gw := range gateways {
		err := netlink.AddrAdd(br, &netlink.Addr{IPNet: gw, Flags: nodad(gw.IP)})
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add gateway %s to bridge %s: %w", gw, br.Attrs().Name, err)
		}
	}
	return nil
}

// bridgeGateways are the gateway addresses of side with their subnet's
// prefix, as they go on the bridge.
func bridgeGateways(side podSide) []*net.IPNet {
	var out []*net.IPNet
	for _, a := range side.Addrs {
		gw := side.GatewayV6
		if a.IP.To4() != nil {
			gw = side.GatewayV4
		}
		if gw != nil {
			out = append(out, &net.IPNet{IP: gw, Mask: a.Mask})
		}
	}
	return out
}

// enableForwarding turns forwarding on for the bridge (and IPv6 forwarding
// on the node when v6).
func enableForwarding(dev string, v4, v6 bool) error {
	if v4 {
		if err := writeSysctl("net/ipv4/conf/"+dev+"/forwarding", "1"); err != nil {
			return err
		}
	}
	if v6 {
		if err := writeSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

// randomMAC returns a random locally administered unicast MAC.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac) // never fails (crypto/rand)
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

func nodad(ip net.IP) int {
	if ip.To4() == nil {
		return unix.IFA_F_NODAD
	}
	return 0
}

func firstAddr(n *net.IPNet) net.IP {
	ip := n.IP.Mask(n.Mask)
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	out := make(net.IP, len(ip))
	copy(out, ip)
	out[len(out)-1]++
	return out
}
