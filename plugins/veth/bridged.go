package veth

import (
	"encoding/json"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/vishvananda/netlink"
)

// DefaultBridge is the bridge used when the config names none.
const DefaultBridge = "podnet0"

// NewBridged is the podnet-bridge plugin.
func NewBridged() *Plugin {
	return &Plugin{Name: "podnet-bridge", NewMode: newBridged}
}

// bridgeConf is podnet-bridge's part of the network config.
type bridgeConf struct {
	Bridge      string `json:"bridge"`
	IsGateway   *bool  `json:"isGateway"`
	HairpinMode bool   `json:"hairpinMode"`
}

// bridged is podnet-bridge's Mode.
type bridged struct {
	conf bridgeConf
	br   *netlink.Bridge
}

func newBridged(stdin []byte, base *NetConf) (Mode, error) {
	var c bridgeConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, Errorf(types.ErrInvalidNetworkConfig, "invalid network config: %v", err)
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := utils.ValidateInterfaceName(c.Bridge); err != nil {
		return nil, Errorf(types.ErrInvalidNetworkConfig, "network %q: bridge name %q: %s", base.Name, c.Bridge, err.Msg)
	}
	if c.IsGateway == nil {
		yes := true
		c.IsGateway = &yes
	}
	return &bridged{conf: c}, nil
}

func (b *bridged) HostMAC() net.HardwareAddr { return nil }

func (b *bridged) PodSide(ifName string, alloc *current.Result) (PodSide, error) {
	return BridgedPodSide(ifName, alloc), nil
}

func (b *bridged) PrepareNode(side PodSide, mtu int) error {
	br, err := EnsureBridge(b.conf.Bridge, mtu)
	if err != nil {
		return err
	}
	b.br = br
	if *b.conf.IsGateway {
		if err := EnsureBridgeGateway(br, BridgeGateways(side)); err != nil {
			return err
		}
	}
	return EnableForwarding(b.conf.Bridge, side.GatewayV4 != nil, side.HasIPv6())
}

func (b *bridged) SetupHost(host netlink.Link, _ PodSide) error {
	return AttachToBridge(host, b.br, b.conf.HairpinMode)
}

func (b *bridged) FinishHost(netlink.Link, PodSide) error { return nil }

func (b *bridged) CheckHost(hostName string, _ PodSide) (netlink.Link, error) {
	return CheckBridgedHost(hostName, b.conf.Bridge)
}

func (b *bridged) Result(prev *current.Result, hostName string, podIface *current.Interface, side PodSide) *current.Result {
	brIface := &current.Interface{Name: b.conf.Bridge, Mac: b.br.Attrs().HardwareAddr.String()}
	return BridgedResult(prev, brIface, hostName, podIface, side)
}
