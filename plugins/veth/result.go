package veth

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

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
