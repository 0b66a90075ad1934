package veth

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/contract"
)

// vethSpec describes the veth pair of one attachment.
type vethSpec struct {
	HostName string           // host-side name (HostVethName)
	PodName  string           // CNI_IFNAME, the name inside the pod
	MTU      int              // both ends
	HostMAC  net.HardwareAddr // nil: the kernel picks one
	Owner    Owner            // recorded as the host veth's alias
}

// createVeth creates the pair with the host end in the current (node)
// netns and the pod end born inside podNS under its final name, with a
// random MAC the plugin picks (one netlink request: no create-then-move,
// which costs a netns round trip and an extra rename, and no visit of the
// pod netns to learn the MAC the kernel picked). The host end carries the
// owner as its alias (DEL finds it by it; configurePod gives the pod end
// the same one) and stays down. It returns the host end (its name and
// index: what ADD uses of it) and the pod end's MAC. It fails with
// errHostNameTaken when a link of the host end's name exists, and with
// errIfNameTaken, naming the interface, when the pod already has one by
// its name. h is a netlink handle of the node netns.
func createVeth(h *netlink.Handle, spec vethSpec, podNS ns.NetNS) (netlink.Link, net.HardwareAddr, error) {
	podMAC := randomMAC()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = spec.HostName
	attrs.MTU = spec.MTU
	attrs.HardwareAddr = spec.HostMAC
	// one queue each, asked for: a veth created without a queue count gets
	// one per possible CPU, and the kernel then cuts the count in use back
	// to one while holding the RTNL lock, waiting out an expedited RCU
	// grace period for each end (veth_init_queues). The pair ends up the
	// same, with one queue in use.
	attrs.NumTxQueues = 1
	attrs.NumRxQueues = 1
	veth := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         spec.PodName,
		PeerMTU:          uint32(spec.MTU),
		PeerHardwareAddr: podMAC,
		PeerNamespace:    netlink.NsFd(int(podNS.Fd())),
	}
	if err := h.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			// either name may be the taken one: look
			if _, lerr := (netlinksafe.Handle{Handle: h}).LinkByName(spec.HostName); lerr == nil {
				return nil, nil, fmt.Errorf("create veth %s: %w: %w", spec.HostName, errHostNameTaken, err)
			}
			return nil, nil, fmt.Errorf("netns %s already has an interface named %q: %w", podNS.Path(), spec.PodName, errIfNameTaken)
		}
		return nil, nil, fmt.Errorf("create veth %s: %w", spec.HostName, err)
	}
	// LinkAdd looked the new link up by name for its index
	var host netlink.Link = veth
	if veth.Index == 0 {
		l, err := (netlinksafe.Handle{Handle: h}).LinkByName(spec.HostName)
		if err != nil {
			_ = h.LinkDel(veth)
			return nil, nil, fmt.Errorf("look up new veth %s: %w", spec.HostName, err)
		}
		host = l
	}
	if err := h.LinkSetAlias(host, spec.Owner.Alias()); err != nil {
		_ = h.LinkDel(host)
		return nil, nil, fmt.Errorf("set alias on veth %s: %w", spec.HostName, err)
	}
	return host, podMAC, nil
}

// errHostNameTaken means a link of the host veth's name exists.
var errHostNameTaken = errors.New("an interface with that name already exists")

// errIfNameTaken means CNI_IFNAME already exists in the pod.
var errIfNameTaken = errors.New("CNI_IFNAME is taken in the pod")

// deleteHostVeth deletes the host veth hostName (and with it the pod end and
// every route through it) when it belongs to owner. It returns false when
// there was nothing of owner's to delete; a veth of the same name owned by
// another attachment is left alone.
func deleteHostVeth(hostName string, owner Owner) (bool, error) {
	link, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up host veth %s: %w", hostName, err)
	}
	got, ok := ParseAlias(link.Attrs().Alias)
	if !ok || got != owner {
		return false, nil
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return false, fmt.Errorf("delete host veth %s: %w", hostName, err)
	}
	return true, nil
}

// deleteStaleHostVeth removes a leftover host veth named hostName that is
// owned by another container of the same pod (a previous sandbox whose DEL
// never came) or is a half-created pair of owner, and returns its index (0:
// nothing removed). Links podnet did not create are never touched: their
// name clash is reported.
func deleteStaleHostVeth(hostName string) (int, error) {
	link, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		if isNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("look up host veth %s: %w", hostName, err)
	}
	if _, _, ok := contract.ParseVethAlias(link.Attrs().Alias); !ok {
		return 0, fmt.Errorf("interface %s exists and was not created by podnet; remove or rename it", hostName)
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return 0, fmt.Errorf("delete stale host veth %s: %w", hostName, err)
	}
	return link.Attrs().Index, nil
}

// deletePodLink deletes ifName inside the pod netns if it is still there
// (the host end was not found) and podnet made it for owner: a veth whose
// alias names owner. Any other link by that name is left alone. A missing
// netns or link is not an error. The caller has made sure netnsPath is not
// the node's own netns (refuseOwnNetns).
func deletePodLink(netnsPath, ifName string, owner Owner) error {
	if netnsPath == "" {
		return nil
	}
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		if errors.As(err, &notExist) || errors.As(err, &notNS) {
			return nil
		}
		return fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			if isNotFound(err) {
				return nil
			}
			return fmt.Errorf("look up %s in netns %s: %w", ifName, netnsPath, err)
		}
		if _, isVeth := link.(*netlink.Veth); !isVeth {
			return nil
		}
		if got, ok := ParseAlias(link.Attrs().Alias); !ok || got != owner {
			return nil
		}
		if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete %s in netns %s: %w", ifName, netnsPath, err)
		}
		return nil
	})
}

func isNotFound(err error) bool { return attachment.LinkGone(err) }
