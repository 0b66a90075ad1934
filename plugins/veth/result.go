package veth

import (
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
)

// routedResult builds the ADD result of a routed attachment: prevResult's
// content (when chained) followed by the host veth and the pod interface,
// the pod addresses as configured, and the routes the pod got.
func routedResult(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result {
	result := chainedBase(prev)
	result.Interfaces = append(result.Interfaces, &current.Interface{Name: hostName, Mac: hostMAC}, podIface)
	addPodIPsAndRoutes(result, len(result.Interfaces)-1, side)
	return result
}

// chainedBase starts a result from prevResult's content, when chained.
func chainedBase(prev *current.Result) *current.Result {
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if prev != nil {
		result.Interfaces = append(result.Interfaces, prev.Interfaces...)
		result.IPs = append(result.IPs, prev.IPs...)
		result.Routes = append(result.Routes, prev.Routes...)
		result.DNS = prev.DNS
	}
	return result
}

// addPodIPsAndRoutes appends the pod's addresses (on interface podIndex)
// and the routes that carry a gateway.
func addPodIPsAndRoutes(result *current.Result, podIndex int, side podSide) {
	for _, a := range side.Addrs {
		gw := side.GatewayV4
		if a.IP.To4() == nil {
			gw = side.GatewayV6
		}
		result.IPs = append(result.IPs, &current.IPConfig{Interface: current.Int(podIndex), Address: *a, Gateway: gw})
	}
	for _, r := range side.routes(0) {
		if r.Gw == nil {
			continue // the scope-link route to the gateway is an implementation detail
		}
		result.Routes = append(result.Routes, &types.Route{Dst: *r.Dst, GW: r.Gw})
	}
}

// podAllocation returns the part of prevResult that belongs to the
// interface ifName in netns sandbox: its addresses and the routes.
func podAllocation(prev *current.Result, ifName, sandbox string) (*current.Result, error) {
	idx := -1
	for i, iface := range prev.Interfaces {
		if iface.Name == ifName && iface.Sandbox == sandbox {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("prevResult has no interface %s in netns %s", ifName, sandbox)
	}
	out := &current.Result{CNIVersion: prev.CNIVersion, Routes: prev.Routes}
	for _, c := range prev.IPs {
		if c.Interface != nil && *c.Interface == idx {
			out.IPs = append(out.IPs, c)
		}
	}
	if len(out.IPs) == 0 {
		return nil, fmt.Errorf("prevResult has no address for interface %s", ifName)
	}
	return out, nil
}

// allocatedIPs lists the addresses of an IPAM result.
func allocatedIPs(alloc *current.Result) []net.IP {
	ips := make([]net.IP, 0, len(alloc.IPs))
	for _, c := range alloc.IPs {
		ips = append(ips, c.Address.IP)
	}
	return ips
}

// gcHostVeths deletes the host veths of network whose attachment is not in
// valid, and returns their names. Routes through them go with them.
func gcHostVeths(network string, valid []types.GCAttachment) ([]string, error) {
	owned, err := ownedHostVeths(network)
	if err != nil {
		return nil, err
	}
	keep := make(map[[2]string]bool, len(valid))
	for _, a := range valid {
		keep[[2]string{a.ContainerID, a.IfName}] = true
	}
	var removed []string
	for o, link := range owned {
		if keep[[2]string{o.ContainerID, o.IfName}] {
			continue
		}
		if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
			return removed, fmt.Errorf("delete stale veth %s of container %s: %w", link.Attrs().Name, o.ContainerID, err)
		}
		removed = append(removed, link.Attrs().Name)
	}
	return removed, nil
}
