package dataplane

import (
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// LocalNetwork is this node's own network as validation compares Nodes
// with it (desired.Local): the addresses of its interfaces, and the
// destinations of the main table's routes that are not podnet's (its
// connected and underlay networks). The routes come from cache (read
// again with dump, or when it holds nothing valid). Addresses of pods'
// host veths are left out: they are the pods'.
func LocalNetwork(cache *RouteCache, dump bool) (desired.Local, error) {
	var local desired.Local
	links, err := netlinksafe.LinkList()
	if err != nil {
		return local, fmt.Errorf("list links: %w", err)
	}
	podLink := map[int]bool{}
	for _, l := range links {
		if contract.IsHostVeth(l.Attrs().Name) {
			podLink[l.Attrs().Index] = true
		}
	}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return local, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !podLink[a.LinkIndex] {
			local.Addrs = append(local.Addrs, ip.Unmap())
		}
	}
	err = withRoutes(func(k netlinkRoutes) error {
		cache.mu.Lock()
		defer cache.mu.Unlock()
		t, err := cache.load(k, dump)
		if err != nil {
			return err
		}
		cache.table = t
		for dst, proto := range t.foreign {
			local.Routes = append(local.Routes, dst)
			if proto == unix.RTPROT_KERNEL {
				local.Connected = append(local.Connected, dst)
			}
		}
		return nil
	})
	return local, err
}
