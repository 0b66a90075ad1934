package engine

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/ipam/store"
	"github.com/podnet/podnet/routed/policy"
)

// What the node itself knows of its pods, which the API objects cannot
// tell: which host-side interface is which pod's (a packet through it is
// that pod's, whatever its addresses), and which pod holds each of the
// node's addresses (two Pod objects may show one).
//
// Ports: the plugins name a pod's host veth after the pod
// (contract.HostVethName of its namespace, name and interface name) and
// give it the alias podnet:<network>:<container>:<ifname>. The engine
// lists the node's links, keeps those with such an alias, and finds each
// one's pod by deriving the name from the Pod objects of this node: a
// link no Pod object derives to belongs to no pod the engine knows, and
// passes nothing. A plugin's ADD-time wait names its host veth, so a new
// pod's port is known at once.
//
// Holders: the IPAM stores name the pod of each attachment's addresses
// (read at start and at every resync), and a plugin's wait says at once
// which pod got which address.

// portLink is a host-side pod interface as the link list shows it.
type portLink struct {
	ifName  string // the interface name inside the pod (the alias's)
	bridged bool   // a port of a bridge (podnet-bridge)
}

// scanLinks lists the node's host-side pod interfaces in service.
func scanLinks() (map[string]portLink, error) {
	links, err := netlink.LinkList()
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 4; try++ {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return nil, err
	}
	out := map[string]portLink{}
	for _, l := range links {
		if pl, ok := portOf(l); ok {
			out[l.Attrs().Name] = pl
		}
	}
	return out, nil
}

// portOf says whether l is a host-side pod interface in service.
func portOf(l netlink.Link) (portLink, bool) {
	a := l.Attrs()
	if !contract.IsHostVeth(a.Name) {
		return portLink{}, false
	}
	o, detached, ok := contract.ParseVethAlias(a.Alias)
	if !ok || detached {
		return portLink{}, false
	}
	return portLink{ifName: o.IfName, bridged: a.MasterIndex != 0}, true
}

// lookupLink is one link by name (the plugin's wait names it).
func lookupLink(name string) (portLink, bool) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return portLink{}, false
	}
	return portOf(l)
}

// localPortsLocked gives the incremental compile the host-side
// interfaces of the pods whose ports may have changed: every local pod's
// when the links changed, else those of the pods that came or changed.
// Callers hold e.mu.
func (e *Engine) localPortsLocked() {
	if e.portsAll {
		e.inc.SetLocalPorts(portsOf(e.state, e.cfg.NodeName, e.links, e.vethNames))
		e.portsAll = false
		clear(e.portsOf)
		if len(e.vethNames) > 4*len(e.links)+1024 {
			e.vethNames = map[string]string{} // forget pods long gone
		}
		return
	}
	for key := range e.portsOf {
		ps := podPorts(key, e.links, e.vethNames)
		if len(ps) == 0 && e.state.Arriving(key) {
			ps = arrivingPorts(key)
		}
		e.inc.SetPodPorts(key, ps)
	}
	clear(e.portsOf)
}

// podPorts are pod key's interfaces among links; names caches the
// derived names (pod key and interface name -> veth name).
func podPorts(key string, links map[string]portLink, names map[string]string) []policy.LocalPort {
	ns, name, _ := strings.Cut(key, "/")
	var out []policy.LocalPort
	seen := map[string]bool{}
	for _, l := range links {
		if seen[l.ifName] {
			continue
		}
		seen[l.ifName] = true
		ck := key + "\x00" + l.ifName
		veth, ok := names[ck]
		if !ok {
			veth = contract.HostVethName(ns, name, "", l.ifName)
			names[ck] = veth
		}
		if pl, ok := links[veth]; ok && pl.ifName == l.ifName {
			out = append(out, policy.LocalPort{Name: veth, Bridged: pl.bridged})
		}
	}
	slices.SortFunc(out, func(a, b policy.LocalPort) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// portsOf maps node's pods in st to their interfaces among links; names
// caches the derived names (pod key and interface name -> veth name).
func portsOf(st *policy.State, node string, links map[string]portLink, names map[string]string) map[string][]policy.LocalPort {
	ifNames := map[string]bool{}
	for _, l := range links {
		ifNames[l.ifName] = true
	}
	out := map[string][]policy.LocalPort{}
	for _, key := range st.LocalPods(node) {
		ns, name, _ := strings.Cut(key, "/")
		for ifName := range ifNames {
			ck := key + "\x00" + ifName
			veth, ok := names[ck]
			if !ok {
				veth = contract.HostVethName(ns, name, "", ifName)
				names[ck] = veth
			}
			if l, ok := links[veth]; ok && l.ifName == ifName {
				out[key] = append(out[key], policy.LocalPort{Name: veth, Bridged: l.bridged})
			}
		}
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(a, b policy.LocalPort) int { return strings.Compare(a.Name, b.Name) })
	}
	for _, key := range st.LocalPods(node) {
		if len(out[key]) == 0 && st.Arriving(key) {
			out[key] = arrivingPorts(key)
		}
	}
	return out
}

// arrivingPorts is the port of pod key before its ADD: the routed host veth
// the plugins will name after it for the interface kubelet's runtimes
// name eth0. The engine writes the pod's chains and port elements then,
// so that the ADD's wait adds only the pod's addresses (plain set
// elements; a verdict makes the kernel validate the whole table). A link
// of that name is this pod's, whenever it appears; a pod attached
// otherwise (another interface name, podnet-bridge's port) gets its
// ports from its links at the wait.
func arrivingPorts(key string) []policy.LocalPort {
	ns, name, _ := strings.Cut(key, "/")
	return []policy.LocalPort{{Name: contract.HostVethName(ns, name, "", "eth0")}}
}

// LocalView gives st what the engine's compile on this node adds to the
// API objects: the pods' ports (the node's links) and the holders of its
// addresses (the IPAM stores in ipamDirs). --explain-policy on a node
// uses it to compile what the engine there compiles.
func LocalView(st *policy.State, node string, ipamDirs []string) error {
	links, err := scanLinks()
	if err != nil {
		return fmt.Errorf("list the node's links: %w", err)
	}
	st.SetLocalPorts(portsOf(st, node, links, map[string]string{}))
	st.SetHolders(readHolders(ipamDirs))
	return nil
}

// readHolders reads which pod holds each address from the IPAM stores in
// dirs (a store that cannot be read adds nothing: its pods' clashes fall
// to the rule every node applies).
func readHolders(dirs []string) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, dir := range dirs {
		networks, err := store.Networks(dir)
		if err != nil {
			continue
		}
		for _, n := range networks {
			snap, err := store.ReadSnapshot(dir, n)
			if err != nil {
				continue
			}
			for _, r := range snap.Records {
				if r.PodNamespace == "" || r.PodName == "" {
					continue
				}
				for _, a := range r.IPs {
					out[a.Unmap()] = r.PodNamespace + "/" + r.PodName
				}
			}
		}
	}
	return out
}

// holdersLocked are the store's holders with what plugins reported since
// on top. Callers hold e.mu.
func (e *Engine) holdersLocked() map[netip.Addr]string {
	h := maps.Clone(e.storeHolders)
	if h == nil {
		h = map[netip.Addr]string{}
	}
	maps.Copy(h, e.waitHolders)
	return h
}
