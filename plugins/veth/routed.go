package veth

import (
	"github.com/containernetworking/cni/pkg/skel"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
)

// Routed returns the verbs of the podnet plugin: the routed (Calico-style)
// mode.
func Routed() skel.CNIFuncs { return newRoutedPlugin().funcs() }

func newRoutedPlugin() *plugin {
	return &plugin{
		name:    "podnet",
		newMode: func([]byte, *netConf) (mode, error) { return routed{}, nil },
	}
}

// routed is podnet's mode: proxy-ARP host veth with a fixed MAC, /32 and
// /128 pod addresses, and a node route per pod address.
type routed struct{}

func (routed) hostMAC() net.HardwareAddr { return routedHostMAC() }

func (routed) describePod(ifName string, alloc *current.Result) (podSide, error) {
	return routedPodSide(ifName, allocatedIPs(alloc), podSide{Routes: alloc.Routes}), nil
}

func (routed) prepareNode(podSide, int) error { return nil }

func (routed) setupHost(host netlink.Link, side podSide) error {
	return configureRoutedHost(host, side.hasIPv6())
}

func (routed) finishHost(host netlink.Link, side podSide) error {
	return addHostRoutes(host, side.ips())
}

func (routed) checkHost(hostName string, side podSide) (netlink.Link, error) {
	return checkRoutedHost(hostName, side.ips())
}

func (routed) result(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result {
	return routedResult(prev, hostName, podIface, side)
}
