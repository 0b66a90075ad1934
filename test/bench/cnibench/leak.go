package main

// The leak check run after every workload: once every pod has been
// deleted, the node netns must be back to the state it had before the
// measured run (no veth or other link, no route, no permanent neighbor
// entry, no element in the plugins' pod filter), every pod netns must hold
// nothing but lo, and the IPAM data dirs must hold no reservation.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// nodeState is what of a node netns and its IPAM data dirs can leak.
type nodeState struct {
	Links  []string // "name type"
	Routes []string // every table, both families
	Neighs []string // permanent neighbor entries
	Filter []string // elements of the plugins' pod filter (nettest.PodFilterElements)
	Files  []string // files under the data dirs, relative to them
}

// snapshotNode records the node netns and the files under dataDirs. A
// dump the kernel interrupted (a pod netns torn down in the background
// takes its veths with it meanwhile: netlink.ErrDumpInterrupted) is taken
// again, up to 10 times.
func snapshotNode(node ns.NetNS, dataDirs []string) (nodeState, error) {
	for range 9 {
		s, err := snapshotNodeOnce(node, dataDirs)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return s, err
		}
	}
	return snapshotNodeOnce(node, dataDirs)
}

func snapshotNodeOnce(node ns.NetNS, dataDirs []string) (nodeState, error) {
	var s nodeState
	err := node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
			s.Links = append(s.Links, l.Attrs().Name+" "+l.Type())
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if linkScoped(r) {
				continue
			}
			s.Routes = append(s.Routes, routeString(r, names))
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			neighs, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, n := range neighs {
				if n.State&netlink.NUD_PERMANENT != 0 {
					s.Neighs = append(s.Neighs, fmt.Sprintf("%s dev %s lladdr %s", n.IP, names[n.LinkIndex], n.HardwareAddr))
				}
			}
		}
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("snapshot %s: %w", node.Path(), err)
	}
	if s.Filter, err = nettest.PodFilterElements(node); err != nil {
		return s, fmt.Errorf("snapshot %s: %w", node.Path(), err)
	}
	for _, dir := range dataDirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(dir, path)
			s.Files = append(s.Files, filepath.Join(filepath.Base(dir), rel))
			return nil
		})
		if err != nil {
			return s, err
		}
	}
	for _, l := range [][]string{s.Links, s.Routes, s.Neighs, s.Filter, s.Files} {
		sort.Strings(l)
	}
	return s, nil
}

// linkScoped reports the IPv6 link-local and multicast routes the kernel
// keeps for every interface by itself: they come and go with the link (a
// leaked link is reported as such) and with a bridge's carrier, which
// follows whether any pod is attached, so they are not compared.
func linkScoped(r netlink.Route) bool {
	return r.Dst != nil && r.Dst.IP.To4() == nil && (r.Dst.IP.IsLinkLocalUnicast() || r.Dst.IP.IsMulticast())
}

func routeString(r netlink.Route, names map[int]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "type %d ", r.Type)
	if r.Dst == nil {
		b.WriteString("default")
	} else {
		b.WriteString(r.Dst.String())
	}
	if r.Gw != nil {
		b.WriteString(" via " + r.Gw.String())
	}
	if r.LinkIndex > 0 {
		b.WriteString(" dev " + names[r.LinkIndex])
	}
	fmt.Fprintf(&b, " proto %d table %d", r.Protocol, r.Table)
	return b.String()
}

// bookkeeping reports whether a data-dir file is an IPAM's own state
// rather than a reservation: host-local's lock and last_reserved_ip.N,
// podnet-ipam's lock and allocation hints. Everything else that appears
// during a run and stays after DEL (a reservation file, an owner record, a
// temp file) is a leak.
func bookkeeping(rel string) bool {
	base := filepath.Base(rel)
	if base == "lock" || strings.HasPrefix(base, "last_reserved_ip") {
		return true
	}
	return slices.Contains(strings.Split(filepath.ToSlash(rel), "/"), "hints")
}

// checkLeaks compares the node with base (taken before the measured run,
// after the warm-up) and checks that every pod netns holds only lo. It
// returns nil when nothing leaked, else an error listing every leak.
func checkLeaks(base nodeState, node ns.NetNS, dataDirs []string, pods []ns.NetNS) error {
	now, err := snapshotNode(node, dataDirs)
	if err != nil {
		return err
	}
	var leaks []string
	added := func(what string, before, after []string, skip func(string) bool) {
		for _, x := range after {
			if !slices.Contains(before, x) && (skip == nil || !skip(x)) {
				leaks = append(leaks, what+" "+x)
			}
		}
	}
	added("link", base.Links, now.Links, nil)
	added("route", base.Routes, now.Routes, nil)
	added("neighbor", base.Neighs, now.Neighs, nil)
	added("pod filter element", base.Filter, now.Filter, nil)
	added("file", base.Files, now.Files, bookkeeping)
	if err := checkPodLinks(pods); err != nil {
		leaks = append(leaks, err.Error())
	}
	if len(leaks) == 0 {
		return nil
	}
	const show = 12
	more := ""
	if len(leaks) > show {
		more = fmt.Sprintf(" (and %d more)", len(leaks)-show)
		leaks = leaks[:show]
	}
	return fmt.Errorf("%d leaked: %s%s", len(leaks), strings.Join(leaks, "; "), more)
}

// checkPodLinks fails when a pod netns after DEL holds a link other than lo
// and the pod end of a veth pair podnet's DEL detached (down, renamed; it
// goes with the netns, and settle plus the node check see that it did).
func checkPodLinks(pods []ns.NetNS) error {
	var leaks []string
	for _, p := range pods {
		names, err := podLinks(p)
		if err != nil {
			return err
		}
		for _, n := range names {
			leaks = append(leaks, fmt.Sprintf("pod link %s in %s", n, filepath.Base(p.Path())))
		}
	}
	if len(leaks) == 0 {
		return nil
	}
	return errors.New(strings.Join(leaks, "; "))
}

// podLinks lists the links of a pod netns other than lo and a detached
// podnet pod end.
func podLinks(p ns.NetNS) ([]string, error) {
	var out []string
	err := p.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" && !veth.IsDetached(l) {
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	return out, err
}

// scrubPod deletes every link but lo of a pod netns, so that one leak does
// not make every later ADD into that netns fail.
func scrubPod(p ns.NetNS) error {
	return p.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			// Deleting one end of a veth pair takes the other with it.
			if l.Attrs().Name != "lo" {
				if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
					return err
				}
			}
		}
		return nil
	})
}

// linkUp sets lo (or any link) up in the current netns.
func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// nodeAddr is the address every bench node has on lo, as in test/nettest.
var nodeAddr = &net.IPNet{IP: net.IPv4(192, 168, 77, 1), Mask: net.CIDRMask(32, 32)}
