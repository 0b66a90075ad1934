// Command podnet is the routed-veth (Calico-style) CNI plugin: one veth pair
// per pod, the pod's addresses as /32 and /128 with default routes via a
// link-local gateway that the host veth answers for, and a host route per pod
// address to the host veth. The verb flow is internal/podplugin's; this file
// holds what is podnet's own.
package main

import (
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/cnicore"
	"github.com/podnet/podnet/internal/podlink"
	"github.com/podnet/podnet/internal/podplugin"
	"github.com/podnet/podnet/ipam"
)

func main() {
	skel.PluginMainFuncs(newPlugin(ipam.Auto{}, nil).Funcs(), cnicore.VersionInfo(), "podnet: routed veth CNI plugin")
}

func newPlugin(ipamRunner cnicore.IPAM, failAfter func(string) error) *podplugin.Plugin {
	return &podplugin.Plugin{
		Name:      "podnet",
		NewMode:   func([]byte, *cnicore.NetConf) (podplugin.Mode, error) { return routed{}, nil },
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

func (routed) PrepareNode(podlink.PodSide) error { return nil }

func (routed) SetupHost(host netlink.Link, side podlink.PodSide) error {
	return podlink.ConfigureRoutedHost(host, side.HasIPv6())
}

func (routed) FinishHost(host netlink.Link, side podlink.PodSide) error {
	return podlink.AddHostRoutes(host, side.IPs())
}

func (routed) CheckHost(hostName string, side podlink.PodSide) (netlink.Link, error) {
	return podlink.CheckRoutedHost(hostName, side.IPs())
}

func (routed) Result(prev types.Result, alloc *current.Result, hostName string, podIface *current.Interface, side podlink.PodSide) (*current.Result, error) {
	return podlink.RoutedResult(prev, alloc, hostName, podIface, side)
}
