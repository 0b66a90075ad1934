package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// Deleting a veth costs about 20 ms of kernel time (unregister_netdevice
// waits for an RCU grace period, synchronize_net), whoever asks for it. A
// pod's veth dies anyway with the pod's network namespace, which the runtime
// removes right after DEL, and the kernel tears down a dying netns's links
// in the background, many at a time, behind one grace period. So DEL, when
// it finds the pod end of its veth in CNI_NETNS, detaches the pair instead
// of deleting it: both ends go down (which takes the node's routes through
// the host end with them and stops any packet in either direction) and the
// pod end gives up CNI_IFNAME, so the pod netns can be attached again at
// once; the host end's alias says it is detached. The pair goes away with
// the netns. A veth whose pod end is not where CNI_NETNS says, or DEL
// without a usable netns, is deleted as before.

// vethGone says what DEL did to an attachment's veth pair.
type vethGone int

const (
	// vethNotFound: no host veth of the attachment (already deleted).
	vethNotFound vethGone = iota
	// vethDetached: both ends are down and the pod end renamed; the pair
	// goes away with the pod netns.
	vethDetached
	// vethWasDetached: an earlier DEL detached the pair.
	vethWasDetached
	// vethDeleted: the pair was deleted.
	vethDeleted
)

// DetachedName is the name the pod end of a detached veth takes in the pod
// netns (contract.DetachedVethPrefix + 11 hex characters): it frees ifName, and is the same for the same ifName (a second
// DEL finds nothing left to rename).
func DetachedName(ifName string) string {
	sum := sha256.Sum256([]byte(ifName))
	return contract.DetachedVethPrefix + hex.EncodeToString(sum[:])[:11]
}

// detachOrDeleteVeth takes an attachment's veth pair out of service: it
// detaches it (see above) when podNS holds the pod end, ifName with owner's
// alias, and deletes it otherwise (podNS nil: no usable netns). A host veth
// owned by another attachment, or none, is left alone (vethNotFound). It
// also returns the host veth's index (0 with vethNotFound), which keys the
// attachment's elements in the pod filter.
func detachOrDeleteVeth(hostName string, owner Owner, podNS ns.NetNS, ifName string) (vethGone, int, error) {
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		if isNotFound(err) {
			return vethNotFound, 0, nil
		}
		return vethNotFound, 0, fmt.Errorf("look up host veth %s: %w", hostName, err)
	}
	got, wasDetached, ok := contract.ParseVethAlias(host.Attrs().Alias)
	if !ok || got != owner {
		return vethNotFound, 0, nil
	}
	index := host.Attrs().Index
	if wasDetached {
		return vethWasDetached, index, nil
	}
	if podNS != nil {
		detached, err := detachPodEnd(podNS, ifName, owner, index)
		if err != nil {
			return vethNotFound, 0, err
		}
		if detached {
			if err := netlink.LinkSetDown(host); err != nil && !isNotFound(err) {
				return vethNotFound, 0, fmt.Errorf("set host veth %s down: %w", hostName, err)
			}
			if err := netlink.LinkSetAlias(host, owner.DetachedAlias()); err != nil && !isNotFound(err) {
				return vethNotFound, 0, fmt.Errorf("mark host veth %s detached: %w", hostName, err)
			}
			return vethDetached, index, nil
		}
	}
	if err := netlink.LinkDel(host); err != nil && !isNotFound(err) {
		return vethNotFound, 0, fmt.Errorf("delete host veth %s: %w", hostName, err)
	}
	return vethDeleted, index, nil
}

// detachPodEnd sets the pod end of the pair (ifName in podNS, a veth with
// owner's alias whose peer is the host end hostIndex) down and renames it
// to DetachedName. It returns false, and changes nothing, when the pod end
// is not there or the name is taken.
func detachPodEnd(podNS ns.NetNS, ifName string, owner Owner, hostIndex int) (bool, error) {
	detached := false
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			if isNotFound(err) {
				return nil
			}
			return fmt.Errorf("look up %s in netns %s: %w", ifName, podNS.Path(), err)
		}
		if _, isVeth := link.(*netlink.Veth); !isVeth || link.Attrs().ParentIndex != hostIndex {
			return nil
		}
		if got, ok := ParseAlias(link.Attrs().Alias); !ok || got != owner {
			return nil
		}
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s in netns %s down: %w", ifName, podNS.Path(), err)
		}
		if err := netlink.LinkSetName(link, DetachedName(ifName)); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return nil // an earlier pair of this ifName is still dying: delete this one
			}
			return fmt.Errorf("rename %s in netns %s: %w", ifName, podNS.Path(), err)
		}
		detached = true
		return nil
	})
	return detached, err
}

// IsDetached reports whether l is an end of a veth pair that DEL detached
// and the kernel has not yet removed with the pod netns: a veth that is
// down and either carries the detached alias (host end) or, with podnet's
// alias, the DetachedName of its ifName (pod end).
func IsDetached(l netlink.Link) bool {
	if _, isVeth := l.(*netlink.Veth); !isVeth || l.Attrs().Flags&net.FlagUp != 0 {
		return false
	}
	o, detached, ok := contract.ParseVethAlias(l.Attrs().Alias)
	return ok && (detached || l.Attrs().Name == DetachedName(o.IfName))
}
