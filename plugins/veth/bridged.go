package veth

import (
	"encoding/json"
	"github.com/containernetworking/cni/pkg/skel"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/vishvananda/netlink"
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

func (b *bridged) describePod(ifName string, alloc *current.Result) (podSide, error) {
	return bridgedPodSide(ifName, alloc), nil
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

func (b *bridged) setupHost(host netlink.Link, _ podSide) error {
	return attachToBridge(host, b.br, b.conf.HairpinMode)
}

func (b *bridged) finishHost(netlink.Link, podSide) error { return nil }

func (b *bridged) checkHost(hostName string, _ podSide) (netlink.Link, error) {
	return checkBridgedHost(hostName, b.conf.Bridge)
}

func (b *bridged) result(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result {
	brIface := &current.Interface{Name: b.conf.Bridge, Mac: b.br.Attrs().HardwareAddr.String()}
	return bridgedResult(prev, brIface, hostName, podIface, side)
}
