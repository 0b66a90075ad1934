package podplugin

import (
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/cnicore"
	"github.com/podnet/podnet/internal/podlink"
)

// NewRouted is the podnet plugin: the routed (Calico-style) mode.
func NewRouted(ipamRunner cnicore.IPAM, failAfter func(string) error) *Plugin {
	return &Plugin{
		Name:      "podnet",
		NewMode:   func([]byte, *cnicore.NetConf) (Mode, error) { return routed{}, nil },
		IPAM:      ipamRunner,
		FailAfter: failAfter,
	}
}

// routed is podnet's Mode: proxy-ARP host veth with a fixed MAC, /32 and
// /128 pod addresses, and a node route per pod address.
type routed struct{}

func (routed) HostMAC() net.HardwareAddr { return podlink.RoutedHostMAC() }

func (routed) PodSide(ifName string, alloc *current.Result) (podlink.PodSide, error) {
	return podlink.RoutedPodSide(ifName, podlink.AllocatedIPs(alloc), podlink.PodSide{Routes: alloc.Routes}), nil
}

func (routed) PrepareNode(podlink.PodSide, int) error { return nil }

func (routed) SetupHost(host netlink.Link, side podlink.PodSide) error {
	return podlink.ConfigureRoutedHost(host, side.HasIPv6())
}

func (routed) FinishHost(host netlink.Link, side podlink.PodSide) error {
	return podlink.AddHostRoutes(host, side.IPs())
}

func (routed) CheckHost(hostName string, side podlink.PodSide) (netlink.Link, error) {
	return podlink.CheckRoutedHost(hostName, side.IPs())
}

func (routed) Result(prev *current.Result, hostName string, podIface *current.Interface, side podlink.PodSide) *current.Result {
	return podlink.RoutedResult(prev, hostName, podIface, side)
}
