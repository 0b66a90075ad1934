package veth

import (
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
)

// NewRouted is the podnet plugin: the routed (Calico-style) mode.
func NewRouted() *Plugin {
	return &Plugin{
		Name:    "podnet",
		NewMode: func([]byte, *NetConf) (Mode, error) { return routed{}, nil },
	}
}

// routed is podnet's Mode: proxy-ARP host veth with a fixed MAC, /32 and
// /128 pod addresses, and a node route per pod address.
type routed struct{}

func (routed) HostMAC() net.HardwareAddr { return RoutedHostMAC() }

func (routed) PodSide(ifName string, alloc *current.Result) (PodSide, error) {
	return RoutedPodSide(ifName, AllocatedIPs(alloc), PodSide{Routes: alloc.Routes}), nil
}

func (routed) PrepareNode(PodSide, int) error { return nil }

func (routed) SetupHost(host netlink.Link, side PodSide) error {
	return ConfigureRoutedHost(host, side.HasIPv6())
}

func (routed) FinishHost(host netlink.Link, side PodSide) error {
	return AddHostRoutes(host, side.IPs())
}

func (routed) CheckHost(hostName string, side PodSide) (netlink.Link, error) {
	return CheckRoutedHost(hostName, side.IPs())
}

func (routed) Result(prev *current.Result, hostName string, podIface *current.Interface, side PodSide) *current.Result {
	return RoutedResult(prev, hostName, podIface, side)
}
